#include "worker/checkpoint/weights_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/model/param_layout.h"
#include "common/process.h"
#include "common/storage_fault.h"

namespace shardtrain::checkpoint {
namespace {

constexpr char kMagic[8] = {'S', 'T', 'W', 'G', 'H', 'T', 'S', '\0'};

struct Header {
  char magic[8];
  uint32_t version;
  int32_t cfg[6];
  uint64_t num_params;
  uint64_t fingerprint;
};

// Version 2's recipe record, after the header.
struct Recipe {
  int32_t arch, kv_heads, ffn_dim, tie_embeddings;
  double norm_eps, rope_theta;
};

// Version 3's, after the recipe: what later recipes added — rotary
// scaling, a head size other than dim / heads, q/k norms (a model with any
// of them; one without is written as version 2, as before).
struct RecipeExtra {
  double factor, low_freq_factor, high_freq_factor;  // rope_scaling (factor 0: off)
  int32_t original_context, head_size, qk_norm, reserved;
};

// Version 4's, after the extension (a model with MoE layers, of either
// family: its recipe record then names the arch).
struct MoeRecord {
  int32_t experts, top_k, expert_ffn_dim, shared_experts, sigmoid, norm_topk_prob,
      first_dense_layers, router_bias;
};

bool NeedsExtra(const model::ModelConfig& c) {
  return c.rope_scaling.on() || c.head_size > 0 || c.qk_norm || c.moe.on();
}

uint64_t Fnv1a(const void* data, size_t n) {
  const auto* b = static_cast<const unsigned char*>(data);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

}  // namespace

absl::Status SaveWeights(const std::string& path, const model::ModelConfig& config,
                         absl::Span<const float> params) {
  if (auto s = model::ValidateModelConfig(config); !s.ok()) return s;
  const model::ParamLayout layout(config);
  if (params.size() != layout.num_params()) {
    return absl::InvalidArgumentError(absl::StrCat("SaveWeights(", path, "): ", params.size(),
                                                   " params, layout of ", ToString(config), " has ",
                                                   layout.num_params()));
  }
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  const bool moe = config.moe.on();
  const bool gpt2 = config.arch == model::Arch::kGpt2 && !moe;  // version 1: no recipe record
  const bool extra = NeedsExtra(config);
  h.version = moe ? 4 : gpt2 ? 1 : extra ? 3 : 2;
  const model::MoeConfig& mc = config.moe;
  const MoeRecord moe_record{mc.experts,
                             mc.top_k,
                             mc.expert_ffn_dim,
                             mc.shared_experts,
                             mc.scoring == model::RouterScoring::kSigmoid ? 1 : 0,
                             mc.norm_topk_prob ? 1 : 0,
                             mc.first_dense_layers,
                             mc.router_bias ? 1 : 0};
  RecipeExtra rope{};
  rope.factor = config.rope_scaling.factor;
  rope.low_freq_factor = config.rope_scaling.low_freq_factor;
  rope.high_freq_factor = config.rope_scaling.high_freq_factor;
  rope.original_context = config.rope_scaling.original_context;
  rope.head_size = config.head_size;
  rope.qk_norm = config.qk_norm ? 1 : 0;
  Recipe recipe{};
  recipe.arch = static_cast<int32_t>(config.arch);
  recipe.kv_heads = config.kv_heads;
  recipe.ffn_dim = config.ffn_dim;
  recipe.tie_embeddings = config.tie_embeddings ? 1 : 0;
  recipe.norm_eps = config.norm_eps;
  recipe.rope_theta = config.rope_theta;
  const int32_t cfg[6] = {config.layers,  config.heads, config.dim,
                          config.context, config.vocab, config.padded_vocab};
  std::memcpy(h.cfg, cfg, sizeof cfg);
  h.num_params = params.size();
  h.fingerprint = layout.Fingerprint();
  const uint64_t checksum = Fnv1a(params.data(), params.size() * sizeof(float));

  const std::string_view pieces[] = {
      {reinterpret_cast<const char*>(&h), sizeof h},
      {reinterpret_cast<const char*>(&recipe), gpt2 ? 0 : sizeof recipe},
      {reinterpret_cast<const char*>(&rope), extra ? sizeof rope : 0},
      {reinterpret_cast<const char*>(&moe_record), moe ? sizeof moe_record : 0},
      {reinterpret_cast<const char*>(params.data()), params.size() * sizeof(float)},
      {reinterpret_cast<const char*>(&checksum), sizeof checksum}};
  int64_t bytes = 0;
  for (std::string_view piece : pieces) bytes += static_cast<int64_t>(piece.size());
  if (absl::Status s = CheckFreeSpace(path, bytes); !s.ok()) return s;
  return WriteFileAtomically(path, pieces);
}

absl::StatusOr<LoadedWeights> LoadWeights(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("cannot open weights file ", path, ": ", std::strerror(errno)));
  }
  struct Closer {
    std::FILE* f;
    ~Closer() { std::fclose(f); }
  } closer{f};
  Header h{};
  if (std::fread(&h, sizeof h, 1, f) != 1) {
    return absl::DataLossError(absl::StrCat("weights file ", path, " is truncated (no header)"));
  }
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) {
    return absl::DataLossError(absl::StrCat("weights file ", path, " has wrong magic"));
  }
  if (h.version < 1 || h.version > 4) {
    return absl::DataLossError(absl::StrCat("weights file ", path, " has unsupported version ",
                                            h.version, " (this build reads 1 to 4)"));
  }
  LoadedWeights out;
  absl::StatusOr<model::ModelConfig> config;
  if (h.version == 1) {
    config = model::MakeGptConfig(h.cfg[0], h.cfg[1], h.cfg[2], h.cfg[3], h.cfg[4]);
  } else {
    Recipe r{};
    if (std::fread(&r, sizeof r, 1, f) != 1) {
      return absl::DataLossError(absl::StrCat("weights file ", path, " is truncated (no recipe)"));
    }
    const bool gpt2 = h.version == 4 && r.arch == static_cast<int32_t>(model::Arch::kGpt2);
    if (r.arch != static_cast<int32_t>(model::Arch::kLlama) && !gpt2) {
      return absl::DataLossError(
          absl::StrCat("weights file ", path, " has an unknown model family ", r.arch));
    }
    model::LlamaShape shape;
    shape.layers = h.cfg[0];
    shape.heads = h.cfg[1];
    shape.dim = h.cfg[2];
    shape.context = h.cfg[3];
    shape.vocab = h.cfg[4];
    shape.kv_heads = r.kv_heads;
    shape.ffn_dim = r.ffn_dim;
    shape.tie_embeddings = r.tie_embeddings != 0;
    shape.norm_eps = r.norm_eps;
    shape.rope_theta = r.rope_theta;
    if (h.version >= 3) {
      RecipeExtra rope{};
      if (std::fread(&rope, sizeof rope, 1, f) != 1) {
        return absl::DataLossError(
            absl::StrCat("weights file ", path, " is truncated (no recipe extension)"));
      }
      shape.rope_scaling = {rope.factor, rope.low_freq_factor, rope.high_freq_factor,
                            rope.original_context};
      shape.head_dim = rope.head_size;
      shape.qk_norm = rope.qk_norm != 0;
    }
    if (h.version == 4) {
      MoeRecord m{};
      if (std::fread(&m, sizeof m, 1, f) != 1) {
        return absl::DataLossError(
            absl::StrCat("weights file ", path, " is truncated (no MoE record)"));
      }
      shape.moe = {m.experts,
                   m.top_k,
                   m.expert_ffn_dim,
                   m.shared_experts,
                   m.sigmoid != 0 ? model::RouterScoring::kSigmoid : model::RouterScoring::kSoftmax,
                   m.norm_topk_prob != 0,
                   m.first_dense_layers,
                   m.router_bias != 0};
    }
    if (gpt2) {
      config =
          model::MakeGptConfig(shape.layers, shape.heads, shape.dim, shape.context, shape.vocab);
      if (config.ok()) {
        config->moe = shape.moe;
        if (absl::Status s = model::ValidateModelConfig(*config); !s.ok()) config = s;
      }
    } else {
      config = model::MakeLlamaConfig(shape);
    }
  }
  if (!config.ok() || config->padded_vocab != h.cfg[5]) {
    return absl::DataLossError(absl::StrCat(
        "weights file ", path, " has an invalid config: ",
        config.ok() ? absl::StrCat("padded_vocab ", h.cfg[5]) : config.status().message()));
  }
  out.config = *config;
  const model::ParamLayout layout(out.config);
  if (h.num_params != layout.num_params() || h.fingerprint != layout.Fingerprint()) {
    return absl::DataLossError(absl::StrCat(
        "weights file ", path, " does not match the parameter layout of ", ToString(out.config),
        " (", h.num_params, " params stored, ", layout.num_params(), " expected)"));
  }
  out.params.resize(h.num_params);
  uint64_t checksum = 0;
  if (std::fread(out.params.data(), sizeof(float), h.num_params, f) != h.num_params ||
      std::fread(&checksum, sizeof checksum, 1, f) != 1) {
    return absl::DataLossError(absl::StrCat("weights file ", path, " is truncated"));
  }
  if (checksum != Fnv1a(out.params.data(), out.params.size() * sizeof(float))) {
    return absl::DataLossError(
        absl::StrCat("weights file ", path, " fails its checksum (corrupted)"));
  }
  return out;
}

}  // namespace shardtrain::checkpoint
