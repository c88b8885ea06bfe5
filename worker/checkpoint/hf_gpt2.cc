#include "worker/checkpoint/hf_gpt2.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model/param_layout.h"
#include "common/process.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/checkpoint/weights_file.h"

namespace shardtrain::checkpoint {
namespace {

using Json = nlohmann::json;

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// One of our tensors as GPT-2 names it: its name there and whether GPT-2
// keeps it transposed (Conv1D's (in, out)).
struct HfName {
  std::string name;
  bool transposed = false;
};

HfName ToHfName(const std::string& ours) {
  if (ours == "wte") return {"transformer.wte.weight"};
  if (ours == "wpe") return {"transformer.wpe.weight"};
  if (ours == "lnf.weight") return {"transformer.ln_f.weight"};
  if (ours == "lnf.bias") return {"transformer.ln_f.bias"};
  // block.L.<part>.<weight|bias>
  const size_t dot = ours.find('.', 6);
  const std::string layer = ours.substr(6, dot - 6), rest = ours.substr(dot + 1);
  const std::string h = "transformer.h." + layer + ".";
  const bool weight = rest.size() > 7 && rest.compare(rest.size() - 7, 7, ".weight") == 0;
  const std::string part = rest.substr(0, rest.rfind('.')), kind = weight ? "weight" : "bias";
  if (part == "ln1") return {h + "ln_1." + kind};
  if (part == "ln2") return {h + "ln_2." + kind};
  if (part == "attn.qkv") return {h + "attn.c_attn." + kind, weight};
  if (part == "attn.proj") return {h + "attn.c_proj." + kind, weight};
  if (part == "mlp.fc") return {h + "mlp.c_fc." + kind, weight};
  return {h + "mlp.c_proj." + kind, weight};  // mlp.proj
}

void Transpose(const float* in, int64_t rows, int64_t cols, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
  }
}

}  // namespace

absl::Status WriteSafetensors(const std::string& path,
                              const std::map<std::string, NamedTensor>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::vector<TensorToWrite> list;
  for (const auto& [name, t] : tensors) list.push_back({name, t.shape, t.data});
  return WriteSafetensorsFile(path, list, DataType::kFloat32, metadata);
}

absl::StatusOr<std::map<std::string, NamedTensor>> ReadSafetensors(const std::string& path) {
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(path);
  if (!f.ok()) return f.status();
  std::map<std::string, NamedTensor> out;
  for (const auto& [name, e] : (*f)->tensors()) {
    NamedTensor t;
    t.shape = e.shape;
    t.data.resize(size_t(e.numel()));
    if (absl::Status s = (*f)->Read(name, 0, e.numel(), t.data.data()); !s.ok()) return s;
    out.emplace(name, std::move(t));
  }
  return out;
}

std::map<std::string, NamedTensor> ToHfGpt2(const model::ModelConfig& config,
                                            absl::Span<const float> params) {
  const model::ParamLayout layout(config);
  std::map<std::string, NamedTensor> out;
  for (const model::TensorInfo& t : layout.tensors()) {
    const HfName hf = ToHfName(t.name);
    NamedTensor& o = out[hf.name];
    const float* src = params.data() + t.offset;
    if (t.name == "wte") {  // the real vocabulary's rows only
      o.shape = {config.vocab, config.dim};
      o.data.assign(src, src + int64_t(config.vocab) * config.dim);
    } else if (hf.transposed) {
      o.shape = {t.shape[1], t.shape[0]};
      o.data.resize(t.numel);
      Transpose(src, t.shape[0], t.shape[1], o.data.data());
    } else {
      o.shape = t.shape;
      o.data.assign(src, src + t.numel);
    }
  }
  return out;
}

absl::StatusOr<std::vector<float>> FromHfGpt2(const model::ModelConfig& config,
                                              const std::map<std::string, NamedTensor>& tensors) {
  const model::ParamLayout layout(config);
  std::vector<float> params(layout.num_params(), 0.0f);
  for (const model::TensorInfo& t : layout.tensors()) {
    const HfName hf = ToHfName(t.name);
    auto it = tensors.find(hf.name);
    if (it == tensors.end()) it = tensors.find(hf.name.substr(std::strlen("transformer.")));
    if (it == tensors.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(hf.name, ": missing (the model has ", config.layers, " layers)"));
    }
    const NamedTensor& in = it->second;
    std::vector<int64_t> want = t.shape;
    if (t.name == "wte") want = {config.vocab, config.dim};
    if (hf.transposed) want = {t.shape[1], t.shape[0]};
    if (in.shape != want) {
      return absl::InvalidArgumentError(absl::StrCat(hf.name, ": shape ", ShapeText(in.shape),
                                                     " in the file, ", ShapeText(want),
                                                     " for the model"));
    }
    float* dst = params.data() + t.offset;
    if (hf.transposed) {
      Transpose(in.data.data(), want[0], want[1], dst);
    } else {
      std::copy(in.data.begin(), in.data.end(), dst);
    }
  }
  return params;
}

std::string HfGpt2ConfigJson(const model::ModelConfig& config) {
  Json j = {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"vocab_size", config.vocab},
      {"n_positions", config.context},
      {"n_ctx", config.context},
      {"n_embd", config.dim},
      {"n_layer", config.layers},
      {"n_head", config.heads},
      {"n_inner", nullptr},                 // 4 × n_embd
      {"activation_function", "gelu_new"},  // GELU's tanh approximation, as our engines
      {"layer_norm_epsilon", 1e-5},
      {"resid_pdrop", 0.0},
      {"embd_pdrop", 0.0},
      {"attn_pdrop", 0.0},
      {"initializer_range", 0.02},
      {"tie_word_embeddings", true},
      {"bos_token_id", 50256},
      {"eos_token_id", 50256},
      {"torch_dtype", "float32"},
  };
  return j.dump(2) + "\n";
}

bool LooksLikeSafetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  unsigned char head[9] = {};
  if (!in.read(reinterpret_cast<char*>(head), 9)) return false;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | head[i];
  return n > 1 && n < (uint64_t{100} << 20) && head[8] == '{';
}

}  // namespace shardtrain::checkpoint
