#include "common/model/config.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardtrain::model {

int PaddedVocab(int vocab) {
  const int m = vocab > 256 ? 128 : 64;
  return (vocab + m - 1) / m * m;
}

namespace {

struct Preset {
  const char* name;
  int layers, heads, dim, context, vocab;
};
constexpr Preset kPresets[] = {
    {"gpt2-124m", 12, 12, 768, 1024, 50257},
    {"gpt2-350m", 24, 16, 1024, 1024, 50257},
    {"gpt2-774m", 36, 20, 1280, 1024, 50257},
    {"gpt2-1558m", 48, 25, 1600, 1024, 50257},
};

}  // namespace

absl::Status ValidateModelConfig(const ModelConfig& c) {
  auto positive = [](const char* field, int v) -> absl::Status {
    if (v < 1) {
      return absl::InvalidArgumentError(absl::StrCat("model.", field, ": must be >= 1, got ", v));
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
        absl::StrCat("model.dim: ", c.dim, " is not divisible by model.heads: ", c.heads));
  }
  if (c.padded_vocab != PaddedVocab(c.vocab)) {
    return absl::InvalidArgumentError(absl::StrCat("model.padded_vocab must be ",
                                                   PaddedVocab(c.vocab), " for vocab ", c.vocab,
                                                   ", got ", c.padded_vocab));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> MakeGptConfig(int layers, int heads, int dim, int context, int vocab) {
  ModelConfig c{layers, heads, dim, context, vocab, PaddedVocab(vocab)};
  if (auto s = ValidateModelConfig(c); !s.ok()) return s;
  return c;
}

absl::StatusOr<ModelConfig> ModelPreset(const std::string& name) {
  for (const Preset& p : kPresets) {
    if (name == p.name) return MakeGptConfig(p.layers, p.heads, p.dim, p.context, p.vocab);
  }
  return absl::NotFoundError(absl::StrCat("unknown preset \"", absl::CEscape(name), "\" (known: ",
                                          absl::StrJoin(ModelPresetNames(), ", "), ")"));
}

std::vector<std::string> ModelPresetNames() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.push_back(p.name);
  return names;
}

bool operator==(const ModelConfig& a, const ModelConfig& b) {
  return a.layers == b.layers && a.heads == b.heads && a.dim == b.dim && a.context == b.context &&
         a.vocab == b.vocab && a.padded_vocab == b.padded_vocab;
}

std::string ToString(const ModelConfig& c) {
  return absl::StrCat("{layers ", c.layers, ", heads ", c.heads, ", dim ", c.dim, ", context ",
                      c.context, ", vocab ", c.vocab, ", padded_vocab ", c.padded_vocab, "}");
}

}  // namespace shardtrain::model
