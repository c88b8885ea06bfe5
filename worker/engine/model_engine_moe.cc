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

using model::kFcB, model::kFcProjW, model::kFcW, model::kRouterB, model::kRouterW;

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
  const int capacity =
      moe_.capacity_factor > 0 ? static_cast<int>(std::ceil(moe_.capacity_factor * N * K / E)) : 0;
  MoeRouted routed = MoeRoute(a, x, layout_.block_tensor(l, kRouterW),
                              layout_.block_tensor(l, kRouterB), N, capacity);
  a.moe_rows = routed.kept;
  a.moe_load = routed.load;
  a.moe_offsets = routed.offsets;
  if (cp_ != nullptr) SumOverCp(a.moe_load);
  const bool with_bias2 = layout_.slice().tp_rank == 0;
  if (ep_ == nullptr) {
    MoePermute(a.moe_xp, a, x, N, routed.kept);
    MoeExperts(l, a, a.moe_y, a.moe_offsets.data(), routed.kept, with_bias2);
  } else {
    // The pairs to their experts' ranks and the outputs back (moe_dxp_ and
    // moe_dy_ are free in forward).
    std::vector<int> kept(E);
    for (int e = 0; e < E; ++e) kept[e] = routed.offsets[e + 1] - routed.offsets[e];
    EpPlan(a, kept);
    MoePermute(moe_dxp_, a, x, N, routed.kept);
    EpDispatch(a, moe_dxp_, moe_xfer_, a.moe_xp);
    MoeExperts(l, a, moe_dy_, a.ep_offsets.data(), a.ep_rows, with_bias2);
    EpReturn(a, moe_dy_, moe_xfer_, a.moe_y);
  }
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
  if (ep_ == nullptr) {
    MoeExpertsBackward(l, moe_dxp_, moe_dh_, moe_dh_pre_, moe_dy_, a, a.moe_offsets.data(), M);
  } else {
    // The outputs' gradients to the experts' ranks, the inputs' back.
    EpDispatch(a, moe_dy_, moe_xfer_, moe_dxp_);
    MoeExpertsBackward(l, moe_dy_, moe_dh_, moe_dh_pre_, moe_dxp_, a, a.ep_offsets.data(),
                       a.ep_rows);
    EpReturn(a, moe_dy_, moe_xfer_, moe_dxp_);
  }
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
  // Exact in fp32 (counts below 2^24), in host memory: a group of device
  // memory would need device buffers (CudaModel::Create refuses it).
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

void ModelEngine::EpPlan(LayerActs& a, const std::vector<int>& kept) {
  const int ep = ep_->size(), El = config().moe.experts / ep;
  // Pairs per (destination rank, its local expert) out; per (source rank,
  // local expert) in, exchanged first.
  std::vector<float> out_counts(kept.begin(), kept.end()), in_counts(size_t(ep) * El);
  EpAllToAllHost(out_counts.data(), std::vector<size_t>(ep, El), in_counts.data(),
                 std::vector<size_t>(ep, El));
  const int C = config().dim;
  a.ep_send.assign(ep, 0);
  a.ep_recv.assign(ep, 0);
  for (int r = 0; r < ep; ++r) {
    for (int e = 0; e < El; ++e) {
      a.ep_send[r] += size_t(kept[r * El + e]) * C;
      a.ep_recv[r] += size_t(in_counts[r * El + e]) * C;
    }
  }
  // Received rows: source-major (rank r's block: its pairs for each local
  // expert in turn). Regrouped: expert-major (expert e: every rank's pairs
  // for it in rank order), the order the grouped GEMMs read.
  std::vector<int> block(size_t(ep) * El + 1, 0);  // source-major offset of (r, e)
  for (int i = 0; i < ep * El; ++i) block[i + 1] = block[i] + static_cast<int>(in_counts[i]);
  a.ep_rows = block.back();
  a.ep_gather.clear();
  a.ep_offsets.assign(1, 0);
  for (int e = 0; e < El; ++e) {
    for (int r = 0; r < ep; ++r) {
      for (int i = block[r * El + e]; i < block[r * El + e + 1]; ++i) a.ep_gather.push_back(i);
    }
    a.ep_offsets.push_back(static_cast<int>(a.ep_gather.size()));
  }
}

void ModelEngine::EpAllToAll(const void* send, const std::vector<size_t>& send_counts, void* recv,
                             const std::vector<size_t>& recv_counts) {
  // Host fp32 rows (the CPU engine's compute type).
  ep_->AllToAllV(static_cast<const float*>(send), send_counts, static_cast<float*>(recv),
                 recv_counts);
}

void ModelEngine::EpAllToAllHost(const float* send, const std::vector<size_t>& send_counts,
                                 float* recv, const std::vector<size_t>& recv_counts) {
  ep_->AllToAllV(send, send_counts, recv, recv_counts);
}

void ModelEngine::EpDispatch(const LayerActs& a, const void* send, void* staging,
                             void* recv_grouped) {
  EpAllToAll(send, a.ep_send, staging, a.ep_recv);
  MoeGatherRows(recv_grouped, staging, a.ep_gather.data(), a.ep_rows);
}

void ModelEngine::EpReturn(const LayerActs& a, const void* grouped, void* staging, void* out) {
  MoeScatterRows(staging, grouped, a.ep_gather.data(), a.ep_rows);
  EpAllToAll(staging, a.ep_recv, out, a.ep_send);
}

MoeStats ModelEngine::TakeMoeStats() {
  MoeStats out = std::move(moe_stats_);
  moe_stats_ = MoeStats{};
  return out;
}

// The defaults of the rest: a device without MoE layers (its Create
// refuses them).
ModelEngine::MoeRouted ModelEngine::MoeRoute(LayerActs&, const void*, int, int, int, int) {
  Fail("ModelEngine: this device has no MoE layers");
}
void ModelEngine::MoePermute(void*, const LayerActs&, const void*, int, int) {
  Fail("ModelEngine: this device has no MoE layers");
}
// The experts through the device's own layers, every device alike: expert
// by expert on its block of rows, one GEMM per block and matrix, an empty
// block skipped (engine/cpu/moe_layers.h's ExpertsForward/Backward are the
// same computation as one layer, the finite-difference tests' reference).
void ModelEngine::MoeExperts(int l, LayerActs& a, void* y, const int* offsets, int rows,
                             bool with_bias2) {
  (void)rows;  // offsets[local experts] rows in all
  const model::ModelConfig& cfg = config();
  const int C = cfg.dim, He = cfg.moe.expert_ffn_dim / layout_.slice().tp, FCe = cfg.fc_rows(He);
  const size_t esz = DataTypeSize(table_.compute());
  auto at = [&](void* p, int64_t row, int width) {
    return static_cast<char*>(p) + row * width * static_cast<int64_t>(esz);
  };
  for (int e = 0; e < layout_.local_experts(); ++e) {
    const int r0 = offsets[e], n = offsets[e + 1] - offsets[e];
    if (n == 0) continue;
    void* h_pre = at(a.moe_h_pre, r0, FCe);
    void* h = at(a.moe_h, r0, He);
    MatmulForward(h_pre, at(a.moe_xp, r0, C), layout_.expert_tensor(l, model::kExpFcW, e),
                  layout_.expert_tensor(l, model::kExpFcB, e), n, C, FCe, FCe);
    if (cfg.mlp == model::MlpKind::kSwiGlu) {
      SwiGluForward(h, h_pre, n, He);
    } else {
      GeluForward(h, h_pre, int64_t{n} * He);
    }
    MatmulForward(at(y, r0, C), h, layout_.expert_tensor(l, model::kExpProjW, e),
                  with_bias2 ? layout_.expert_tensor(l, model::kExpProjB, e) : -1, n, He, C, C);
  }
}
void ModelEngine::MoeGatherRows(void*, const void*, const int*, int) {
  Fail("ModelEngine: this device has no MoE layers");
}
void ModelEngine::MoeScatterRows(void*, const void*, const int*, int) {
  Fail("ModelEngine: this device has no MoE layers");
}
void ModelEngine::MoeCombine(void*, const LayerActs&, int) {
  Fail("ModelEngine: this device has no MoE layers");
}
void ModelEngine::MoeCombineBackward(void*, void*, const void*, const LayerActs&, int, int) {
  Fail("ModelEngine: this device has no MoE layers");
}
void ModelEngine::MoeExpertsBackward(int l, void* dxp, void* dh, void* dh_pre, const void* dy,
                                     const LayerActs& a, const int* offsets, int rows) {
  const model::ModelConfig& cfg = config();
  const int C = cfg.dim, He = cfg.moe.expert_ffn_dim / layout_.slice().tp, FCe = cfg.fc_rows(He);
  const size_t esz = DataTypeSize(table_.compute());
  auto at = [&](const void* p, int64_t row, int width) {
    return const_cast<char*>(static_cast<const char*>(p)) + row * width * static_cast<int64_t>(esz);
  };
  Zero(dxp, int64_t{rows} * C);
  for (int e = 0; e < layout_.local_experts(); ++e) {
    const int r0 = offsets[e], n = offsets[e + 1] - offsets[e];
    if (n == 0) continue;
    // dh = dy · W2 (its weight's and bias's gradients +=), through the
    // activation into dh_pre, then dxp = dh_pre · W1 (W1's, b1's +=).
    void* dh_e = at(dh, r0, He);
    void* dh_pre_e = at(dh_pre, r0, FCe);
    MatmulBackwardOverwrite(dh_e, at(dy, r0, C), C, at(a.moe_h, r0, He),
                            layout_.expert_tensor(l, model::kExpProjW, e),
                            layout_.expert_tensor(l, model::kExpProjB, e), n, He, C);
    Zero(dh_pre_e, int64_t{n} * FCe);
    if (cfg.mlp == model::MlpKind::kSwiGlu) {
      SwiGluBackward(dh_pre_e, at(a.moe_h_pre, r0, FCe), dh_e, n, He);
    } else {
      GeluBackward(dh_pre_e, at(a.moe_h_pre, r0, FCe), dh_e, int64_t{n} * He);
    }
    MatmulBackwardOverwrite(at(dxp, r0, C), dh_pre_e, FCe, at(a.moe_xp, r0, C),
                            layout_.expert_tensor(l, model::kExpFcW, e),
                            layout_.expert_tensor(l, model::kExpFcB, e), n, C, FCe);
  }
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
