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
#include "worker/checkpoint/weights_file.h"

namespace shardtrain::checkpoint {
namespace {

using Json = nlohmann::json;

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

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
  Json header = Json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (Numel(t.shape) != int64_t(t.data.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": ", t.data.size(), " values for shape ", ShapeText(t.shape)));
    }
    const uint64_t bytes = t.data.size() * sizeof(float);
    header[name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  char length[8];
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) length[i] = char((n >> (8 * i)) & 0xff);  // little-endian
  std::vector<std::string_view> pieces = {std::string_view(length, 8), text};
  for (const auto& [name, t] : tensors) {
    pieces.emplace_back(reinterpret_cast<const char*>(t.data.data()),
                        t.data.size() * sizeof(float));
  }
  return WriteFileAtomically(path, pieces);
}

absl::StatusOr<std::map<std::string, NamedTensor>> ReadSafetensors(const std::string& path) {
  std::string bytes;
  if (absl::Status s = ReadFile(path, &bytes); !s.ok()) return s;
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat(path, ": not a valid safetensors file: ", why));
  };
  if (bytes.size() < 8) return bad("shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  if (n > bytes.size() - 8) return bad(absl::StrCat("header length ", n, " exceeds the file"));
  Json header = Json::parse(bytes.begin() + 8, bytes.begin() + 8 + int64_t(n), nullptr, false);
  if (!header.is_object()) return bad("the header is not a JSON object");
  const uint64_t data_size = bytes.size() - 8 - n;
  const char* data = bytes.data() + 8 + n;
  std::map<std::string, NamedTensor> out;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const Json& e = it.value();
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") ||
        !e.contains("data_offsets") || !e["shape"].is_array() || !e["data_offsets"].is_array() ||
        e["data_offsets"].size() != 2) {
      return bad(absl::StrCat("tensor ", it.key(), ": needs dtype, shape and data_offsets"));
    }
    if (e["dtype"] != "F32") {
      return absl::UnimplementedError(absl::StrCat(path, ": tensor ", it.key(), " is ",
                                                   e["dtype"].dump(), "; only F32 is read"));
    }
    NamedTensor t;
    for (const Json& d : e["shape"]) {
      if (!d.is_number_unsigned()) return bad(absl::StrCat("tensor ", it.key(), ": bad shape"));
      t.shape.push_back(d.get<int64_t>());
    }
    if (!e["data_offsets"][0].is_number_unsigned() || !e["data_offsets"][1].is_number_unsigned()) {
      return bad(absl::StrCat("tensor ", it.key(), ": bad data_offsets"));
    }
    const uint64_t begin = e["data_offsets"][0], end = e["data_offsets"][1];
    if (begin > end || end > data_size || end - begin != uint64_t(Numel(t.shape)) * sizeof(float)) {
      return bad(absl::StrCat("tensor ", it.key(), ": data_offsets [", begin, ", ", end,
                              ") do not hold shape ", ShapeText(t.shape), " of F32 within ",
                              data_size, " data bytes"));
    }
    t.data.resize((end - begin) / sizeof(float));
    std::memcpy(t.data.data(), data + begin, end - begin);
    out.emplace(it.key(), std::move(t));
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

absl::StatusOr<std::vector<float>> LoadModelWeights(const std::string& path,
                                                    const model::ModelConfig& config) {
  std::error_code ec;
  std::string file = path;
  if (std::filesystem::is_directory(path, ec)) file = path + "/model.safetensors";
  if (!std::filesystem::exists(file, ec)) {
    return absl::NotFoundError(absl::StrCat(file, " does not exist"));
  }
  if (LooksLikeSafetensors(file)) {
    if (config.arch != model::Arch::kGpt2) {
      return absl::UnimplementedError(
          absl::StrCat(file, ": Hugging Face weights are read in GPT-2's layout only; a ",
                       model::ArchName(config.arch),
                       " model starts from a shardtrain weights file (the job's final weights)"));
    }
    absl::StatusOr<std::map<std::string, NamedTensor>> tensors = ReadSafetensors(file);
    if (!tensors.ok()) return tensors.status();
    absl::StatusOr<std::vector<float>> params = FromHfGpt2(config, *tensors);
    if (!params.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": ", params.status().message()));
    }
    return params;
  }
  absl::StatusOr<LoadedWeights> w = LoadWeights(file);
  if (!w.ok()) return w.status();
  const model::ModelConfig& c = w->config;
  if (c != config) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": weights of ", model::ToString(c),
                                                   " where the model is ",
                                                   model::ToString(config)));
  }
  return std::move(w->params);
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
