// The planner's (common/planner.h) FLOPs per micro-batch and the bytes of
// the files a job writes, apart from MakePlan.
#include <algorithm>
#include <vector>

#include "common/model/activations.h"
#include "common/model/config.h"
#include "common/model/lora.h"
#include "common/model/param_layout.h"
#include "common/model/slice.h"
#include "common/planner.h"

namespace shardtrain {

int RecomputedLayers(const model::ActivationPolicy& policy, int layers) {
  if (policy.recompute == model::Recompute::kNone) return 0;
  return policy.recompute_layers < 0 ? layers : std::min(layers, policy.recompute_layers);
}

MicroBatchFlops StageFlops(const model::ModelConfig& cfg, int B, int T,
                           const model::ModelSlice& slice, const model::ActivationPolicy& policy) {
  const int cp = std::max(1, policy.cp);
  const double N = double(B) * T / cp, C = cfg.dim, Qt = double(cfg.q_dim()) / slice.tp,
               tp = slice.tp;
  const int Ls = slice.total_layers(cfg);
  const double attention = 4 * N * T * Qt;  // forward, per block (QK^T and att·V)
  // A block's matrix weights on this rank, by what the forward multiplies:
  // qkv (Q + 2KV rows), the attention's projection (Q columns), and the
  // MLP's each token runs: fc (F, or SwiGLU's 2F) and its projection (F) —
  // in an MoE layer the router (E rows, whole on every tp rank), top_k
  // experts' and the shared experts' (config.mlp_dim).
  const double qkv = cfg.qkv_dim() * C / tp, proj = C * cfg.q_dim() / tp;
  auto mlp_params = [&](double width) { return (cfg.fc_rows(int(width)) + width) * C / tp; };
  double mlp = 0, fc = 0;  // over the slice's blocks; fc: what full recompute refills
  for (int i = 0; i < Ls; ++i) {
    const int l = slice.Layer(cfg, i);
    const double shared = cfg.mlp_dim(l);
    mlp += mlp_params(shared);
    fc += cfg.fc_rows(int(shared)) * C / tp;
    if (cfg.moe_layer(l)) {
      const double routed = mlp_params(cfg.moe.expert_ffn_dim) * cfg.moe.top_k;
      mlp += routed + double(cfg.moe.experts) * C;
      fc += routed + double(cfg.moe.experts) * C;  // the experts run whole before their output
    }
  }
  MicroBatchFlops f;
  const double matmul_params =
      Ls * (qkv + proj) + mlp + (slice.last_stage ? double(cfg.padded_vocab) / slice.tp * C : 0);
  // LoRA: the slice's adapters, each target's tp-local A and B.
  double adapters = 0;
  for (int t = 0; cfg.lora.on() && t < model::kNumLoraTargets; ++t) {
    if (!cfg.lora.has(model::LoraTarget(t))) continue;
    const model::LoraSite s = model::LoraTargetSite(cfg, model::LoraTarget(t), slice.tp);
    adapters += double(Ls) * cfg.lora.rank * double(s.in + s.out);
  }
  f.train = N * model::MatmulTrainingFlops(cfg, matmul_params, adapters) + 3 * Ls * attention;
  const int k = RecomputedLayers(policy, Ls);
  // Flash attention keeps no probabilities: selective has nothing to refill.
  if (policy.recompute == model::Recompute::kSelective && cp == 1 && !policy.flash_attention) {
    f.recompute = k * attention;
  }
  if (policy.recompute == model::Recompute::kFull) {
    // The refill stops at the MLP's activation: not the MLP's projection.
    // (fc over the slice's blocks: the first k's share of it.)
    f.recompute = k * (2 * N * (qkv + proj + fc / std::max(Ls, 1)) + attention);
  }
  if (cp > 1) f.recompute += Ls * attention;  // the ring's backward, every block
  // Flash's backward forms each tile's scores twice (its dQ and its dK/dV
  // kernels) and dout·V^T once more than the materialized backward: three
  // of the forward's (T,T) products, 1.5 × `attention`, every block.
  if (policy.flash_attention) f.recompute += Ls * 1.5 * attention;
  return f;
}

MicroBatchFlops BusiestRecompute(const JobSpec& spec) {
  const auto cfg = spec.model.Config();
  if (!cfg.ok()) return {};
  const int v = spec.parallel.pp_virtual;
  const auto layers = model::StageLayers(*cfg, spec.parallel.pp, spec.parallel.stages, v);
  if (!layers.ok()) return {};
  MicroBatchFlops busiest;
  for (int s = 0; s < spec.parallel.pp; ++s) {
    const MicroBatchFlops f =
        StageFlops(*cfg, spec.batch.micro, spec.batch.seq_len,
                   model::SliceOf(*layers, s, spec.parallel.tp, 0, v), spec.Activations());
    if (s == 0 || f.recompute > busiest.recompute) busiest = f;
  }
  return busiest;
}

int64_t ShardFileBytes(int64_t elements, int64_t ranges) {
  // Header 56, the range table, four sections of 16 bytes each holding
  // params, m and v (4 bytes each per element) and 32 bytes of scalars, and
  // the 8-byte checksum.
  return 56 + 16 * ranges + 4 * 16 + 3 * 4 * elements + 32 + 8;
}

int64_t ModelNumParams(const JobSpec& spec) {
  const absl::StatusOr<model::ModelConfig> config = spec.model.Config();
  return config.ok() ? static_cast<int64_t>(model::ParamLayout(*config).num_params()) : 0;
}

int64_t FinalWeightsBytes(const JobSpec& spec) {
  const absl::StatusOr<model::ModelConfig> config = spec.model.Config();
  return config.ok() ? WeightsFileBytes(ModelNumParams(spec), *config) : 0;
}

int64_t WeightsFileBytes(int64_t num_params, const model::ModelConfig& config) {
  // The header (magic 8, version 4, six int32 of config 24, padding 4,
  // num_params and fingerprint 16), a family's recipe record (32, not for
  // GPT-2 without MoE) and its extension (40: rope scaling, head size, q/k
  // norms, MoE; when any is set), the MoE record (32), the fp32 params, an
  // 8-byte checksum.
  const bool moe = config.moe.on();
  const bool extra = config.rope_scaling.on() || config.head_size > 0 || config.qk_norm || moe;
  return 56 + (config.arch == model::Arch::kGpt2 && !moe ? 0 : 32) + (extra ? 40 : 0) +
         (moe ? 32 : 0) + 4 * num_params + 8;
}

}  // namespace shardtrain
