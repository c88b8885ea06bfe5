// ModelEngine's Mixture-of-Experts MLP (model_engine.h): the router, the
// dispatcher's permutation, the grouped experts and the combine, in that
// order for every device, with the shared experts (a dense MLP) beside them
// and Megatron-LM's tensor-parallel regions around both: every tp rank
// routes the same gathered input alike, each runs its slice of every
// expert's hidden units, and the combined output is a partial sum reduced
// with the shared experts' (ReduceRowParallel, by the caller).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "worker/engine/model_engine.h"
#include "worker/engine/model_engine_internal.h"

namespace shardtrain::engine {

using model::kFcB, model::kFcProjW, model::kFcW, model::kRouterW;

ModelEngine::MoeIndex ModelEngine::moe_index(const LayerActs& a) const {
  // moe_index's layout (activations.h): sized for the engine's B·T tokens.
  const int64_t NK = int64_t{B_} * T_ * config().moe.top_k;
  const int E = config().moe.experts;
  int* base = a.moe_index;
  return {base, base + NK, base + 2 * NK, base + 2 * NK + E + 1};
}

void ModelEngine::MoeMlpForward(int l, LayerActs& a, const void* x, int N, bool record) {
  const model::ModelConfig& cfg = config();
  const model::MoeConfig& moe = cfg.moe;
  const int C = cfg.dim, K = moe.top_k, E = moe.experts;
  // Capacity per expert: ceil(factor · N·K / E) pairs of this micro-batch.
  const int capacity = moe_.capacity_factor > 0
                           ? static_cast<int>(std::ceil(moe_.capacity_factor * N * K / E))
                           : 0;
  MoeRouted routed = MoeRoute(a, x, layout_.block_tensor(l, kRouterW), N, capacity);
  a.moe_rows = routed.kept;
  a.moe_load = routed.load;
  if (cp_ != nullptr) SumOverCp(a.moe_load);
  MoePermute(a, x, N, routed.kept);
  const bool with_bias2 = layout_.slice().tp_rank == 0;
  MoeExperts(l, a, moe_index(a).offsets, routed.kept, with_bias2);
  MoeCombine(moe_out_, a, N);
  if (cfg.mlp_dim(l) > 0) {  // the shared experts, added before the reduction
    MlpInForward(l, a, x, N);
    const int Ft = cfg.mlp_dim(l) / layout_.slice().tp;
    MatmulForward(proj_out_, a.fch_act, layout_.block_tensor(l, kFcProjW), -1, N, Ft, C, C);
    ResidualForward(moe_out_, moe_out_, proj_out_, int64_t{N} * C);
  }
  if (!record) return;
  const MoeBalance balance = MoeBalanceLosses(a, a.moe_load.data(), N);
  // The slice's MoE layers in order: this one's index among them.
  int index = 0;
  for (int i = 0; i < layout_.num_layers() && layout_.layer(i) < l; ++i) {
    index += cfg.moe_layer(layout_.layer(i)) ? 1 : 0;
  }
  if (moe_stats_.load.size() <= static_cast<size_t>(index)) moe_stats_.load.resize(index + 1);
  std::vector<int64_t>& load = moe_stats_.load[index];
  load.resize(E, 0);
  for (int e = 0; e < E; ++e) load[e] += routed.load[e];
  if (index == 0) moe_stats_.forwards++;
  moe_stats_.aux_loss += balance.aux;
  moe_stats_.z_loss += balance.z;
  moe_stats_.pairs += int64_t{N} * K;
  moe_stats_.dropped += int64_t{N} * K - routed.kept;
}

void ModelEngine::MoeMlpBackward(int l, LayerActs& a, const void* dout, const void* ln2, int N) {
  const model::ModelConfig& cfg = config();
  const int C = cfg.dim, K = cfg.moe.top_k, tp = layout_.slice().tp;
  const int M = a.moe_rows;
  const int64_t NC = int64_t{N} * C, NlC = int64_t{LocalRows(N)} * C;
  const bool shared = cfg.mlp_dim(l) > 0;
  // Everything that reads dout first: under sequence parallelism it and the
  // gathered input share sp_full_.
  if (shared) MlpOutBackward(l, a, dout, N);
  MoeCombineBackward(moe_dy_, moe_dgates_, dout, a, N, M);
  // The gates' gradient reads the experts' outputs, partial sums over tp:
  // summed, every rank's router sees the whole model's.
  if (tp_ != nullptr) TpAllReduceSum(moe_dgates_, int64_t{N} * K);
  MoeExpertsBackward(l, moe_dxp_, moe_dh_, moe_dh_pre_, moe_dy_, a, moe_index(a).offsets, M);
  const void* x = GatherFromSequenceRegionForward(ln2, NlC);
  if (shared) {
    const int FCt = cfg.fc_rows(cfg.mlp_dim(l) / tp);
    MatmulBackwardOverwrite(dln_, dfch_, FCt, x, layout_.block_tensor(l, kFcW),
                            layout_.block_tensor(l, kFcB), N, C, FCt);
  } else {
    Zero(dln_, NC);
  }
  MoePermuteBackward(dln_, moe_dxp_, a, N);
  // The router's input gradient is whole on every tp rank: added on rank 0
  // only (dln_ is summed over tp next); the others' goes to scratch.
  void* router_dx = layout_.slice().tp_rank == 0 ? dln_ : moe_dxp_;
  MoeRouterBackward(router_dx, moe_dscores_, moe_dlogits_, moe_dgates_, a, a.moe_load.data(), x,
                    layout_.block_tensor(l, kRouterW), N, loss_scale_);
}

void ModelEngine::SumOverCp(std::vector<int>& load) {
  // Exact in fp32 (counts below 2^24). A group of device memory would need
  // device buffers: MoE runs on the CPU engine only so far.
  const int n = static_cast<int>(load.size());
  std::vector<float> mine(load.begin(), load.end()), send = mine, recv(n);
  std::vector<double> sum(mine.begin(), mine.end());
  for (int pass = 1; pass < cp_->size(); ++pass) {
    cp_->StartRingPass(send.data(), recv.data(), n, DataType::kFloat32);
    cp_->FinishRingPass();
    for (int e = 0; e < n; ++e) sum[e] += recv[e];
    send.swap(recv);
  }
  for (int e = 0; e < n; ++e) load[e] = static_cast<int>(sum[e]);
}

MoeStats ModelEngine::TakeMoeStats() {
  MoeStats out = std::move(moe_stats_);
  moe_stats_ = MoeStats{};
  return out;
}

// The defaults: a device without MoE layers (its Create refuses them).
ModelEngine::MoeRouted ModelEngine::MoeRoute(LayerActs&, const void*, int, int, int) {
  Fail("ModelEngine: this device has no MoE layers");
}
void ModelEngine::MoePermute(LayerActs&, const void*, int, int) {
  Fail("ModelEngine: this device has no MoE layers");
}
void ModelEngine::MoeExperts(int, LayerActs&, const int*, int, bool) {
  Fail("ModelEngine: this device has no MoE layers");
}
void ModelEngine::MoeCombine(void*, const LayerActs&, int) {
  Fail("ModelEngine: this device has no MoE layers");
}
void ModelEngine::MoeCombineBackward(void*, void*, const void*, const LayerActs&, int, int) {
  Fail("ModelEngine: this device has no MoE layers");
}
void ModelEngine::MoeExpertsBackward(int, void*, void*, void*, const void*, const LayerActs&,
                                     const int*, int) {
  Fail("ModelEngine: this device has no MoE layers");
}
void ModelEngine::MoePermuteBackward(void*, const void*, const LayerActs&, int) {
  Fail("ModelEngine: this device has no MoE layers");
}
ModelEngine::MoeBalance ModelEngine::MoeBalanceLosses(const LayerActs&, const int*, int) {
  Fail("ModelEngine: this device has no MoE layers");
}
void ModelEngine::MoeRouterBackward(void*, void*, void*, const void*, const LayerActs&, const int*,
                                    const void*, int, int, float) {
  Fail("ModelEngine: this device has no MoE layers");
}

}  // namespace shardtrain::engine
