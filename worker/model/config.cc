#include "worker/model/config.h"

#include "absl/strings/str_cat.h"

namespace shardtrain::model {

int PaddedVocab(int vocab) {
  const int m = vocab > 256 ? 128 : 64;
  return (vocab + m - 1) / m * m;
}

absl::Status ValidateGptConfig(const GptConfig& c) {
  auto positive = [](const char* field, int v) -> absl::Status {
    if (v <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("model.", field, " must be > 0, got ", v));
    }
    return absl::OkStatus();
  };
  for (auto [field, v] : {std::pair<const char*, int>{"layers", c.layers},
                          {"heads", c.heads},
                          {"dim", c.dim},
                          {"context", c.context},
                          {"vocab", c.vocab}}) {
    if (auto s = positive(field, v); !s.ok()) return s;
  }
  if (c.dim % c.heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.dim (", c.dim, ") must be divisible by model.heads (", c.heads, ")"));
  }
  if (c.padded_vocab != PaddedVocab(c.vocab)) {
    return absl::InvalidArgumentError(absl::StrCat("model.padded_vocab must be ",
                                                   PaddedVocab(c.vocab), " for vocab ", c.vocab,
                                                   ", got ", c.padded_vocab));
  }
  return absl::OkStatus();
}

absl::StatusOr<GptConfig> MakeGptConfig(int layers, int heads, int dim, int context, int vocab) {
  GptConfig c{layers, heads, dim, context, vocab, PaddedVocab(vocab)};
  if (auto s = ValidateGptConfig(c); !s.ok()) return s;
  return c;
}

absl::StatusOr<GptConfig> GptPreset(const std::string& name) {
  if (name == "gpt2-124m") return MakeGptConfig(12, 12, 768, 1024, 50257);
  if (name == "gpt2-350m") return MakeGptConfig(24, 16, 1024, 1024, 50257);
  return absl::NotFoundError(
      absl::StrCat("unknown model preset '", name, "' (known: gpt2-124m, gpt2-350m)"));
}

bool operator==(const GptConfig& a, const GptConfig& b) {
  return a.layers == b.layers && a.heads == b.heads && a.dim == b.dim && a.context == b.context &&
         a.vocab == b.vocab && a.padded_vocab == b.padded_vocab;
}

std::string ToString(const GptConfig& c) {
  return absl::StrCat("{layers ", c.layers, ", heads ", c.heads, ", dim ", c.dim, ", context ",
                      c.context, ", vocab ", c.vocab, ", padded_vocab ", c.padded_vocab, "}");
}

}  // namespace shardtrain::model
