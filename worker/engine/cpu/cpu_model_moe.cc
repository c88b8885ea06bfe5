// CpuModel's Mixture-of-Experts layers (model_engine.h's MoE virtuals) over
// moe_layers.h, in fp32 on the host.
#include <cstring>
#include <vector>

#include "worker/engine/cpu/cpu_model.h"
#include "worker/engine/cpu/moe_layers.h"

namespace shardtrain::engine::cpu {
namespace {

float* F(void* p) { return static_cast<float*>(p); }
const float* F(const void* p) { return static_cast<const float*>(p); }

}  // namespace

CpuModel::MoeRouted CpuModel::MoeRoute(LayerActs& a, const void* x, int router, int bias, int N,
                                       int capacity) {
  const model::MoeConfig& m = config().moe;
  const int C = config().dim, E = m.experts, K = m.top_k;
  RouterForward(F(a.router_logits), F(a.router_scores), a.router_experts, F(a.router_gates), F(x),
                param(router), param(bias), N, C, E, K, m.scoring, m.norm_topk_prob, &pool_);
  MoeRouted r;
  r.load.resize(E);
  ExpertLoad(r.load.data(), a.router_experts, N, K, E);
  const MoeIndex ix = moe_index(a);
  const int dropped = BuildPermutation(ix.counts, ix.offsets, ix.pair_of_row, ix.row_of_pair,
                                       a.router_experts, N, K, E, capacity);
  r.kept = N * K - dropped;
  r.offsets.assign(ix.offsets, ix.offsets + E + 1);
  return r;
}

CpuModel::MoeBalance CpuModel::MoeBalanceLosses(const LayerActs& a, const int* load, int N) {
  const model::MoeConfig& m = config().moe;
  const MoeOptions& o = moe_options();
  MoeBalance b;
  if (o.aux_loss_coef > 0) {
    b.aux = AuxLossForward(F(a.router_scores), load, N, m.experts, m.top_k, m.scoring,
                           static_cast<float>(o.aux_loss_coef));
  }
  if (o.z_loss_coef > 0) {
    b.z = ZLossForward(F(a.router_logits), N, m.experts, static_cast<float>(o.z_loss_coef));
  }
  return b;
}

void CpuModel::MoePermute(void* xp, const LayerActs& a, const void* x, int N, int M) {
  PermuteForward(F(xp), F(x), moe_index(a).pair_of_row, M, config().moe.top_k, config().dim,
                 &pool_);
}

void CpuModel::MoeGatherRows(void* dst, const void* src, const int* index, int n) {
  const size_t C = config().dim;
  for (int i = 0; i < n; ++i) std::memcpy(F(dst) + i * C, F(src) + index[i] * C, C * 4);
}

void CpuModel::MoeScatterRows(void* dst, const void* src, const int* index, int n) {
  const size_t C = config().dim;
  for (int i = 0; i < n; ++i) std::memcpy(F(dst) + index[i] * C, F(src) + i * C, C * 4);
}

void CpuModel::MoeCombine(void* out, const LayerActs& a, int N) {
  CombineForward(F(out), F(a.moe_y), F(a.router_gates), moe_index(a).row_of_pair, N,
                 config().moe.top_k, config().dim, &pool_);
}

void CpuModel::MoeCombineBackward(void* dy, void* dgates, const void* dout, const LayerActs& a,
                                  int N, int M) {
  const int C = config().dim, K = config().moe.top_k;
  Zero(dy, int64_t{M} * C);
  Zero(dgates, int64_t{N} * K);
  CombineBackward(F(dy), F(dgates), F(dout), F(a.moe_y), F(a.router_gates),
                  moe_index(a).row_of_pair, N, K, C, &pool_);
}

void CpuModel::MoePermuteBackward(void* dx, const void* dxp, const LayerActs& a, int N) {
  PermuteBackward(F(dx), F(dxp), moe_index(a).row_of_pair, N, config().moe.top_k, config().dim,
                  &pool_);
}

void CpuModel::MoeRouterBackward(void* dx, void* dscores, void* dlogits, const void* dgates,
                                 const LayerActs& a, const int* load, const void* x, int router,
                                 int N, float dloss) {
  const model::MoeConfig& m = config().moe;
  const int C = config().dim, E = m.experts, K = m.top_k;
  const MoeOptions& o = moe_options();
  Zero(dscores, int64_t{N} * E);
  Zero(dlogits, int64_t{N} * E);
  if (o.aux_loss_coef > 0) {
    AuxLossBackward(F(dscores), F(a.router_scores), load, N, E, K, m.scoring,
                    static_cast<float>(o.aux_loss_coef), dloss, &pool_);
  }
  if (o.z_loss_coef > 0) {
    ZLossBackward(F(dlogits), F(a.router_logits), N, E, static_cast<float>(o.z_loss_coef), dloss,
                  &pool_);
  }
  RouterBackward(F(dx), grad(router), F(dscores), F(dlogits), F(dgates), F(x), param(router),
                 F(a.router_scores), a.router_experts, N, C, E, K, m.scoring, m.norm_topk_prob,
                 &pool_);
}

}  // namespace shardtrain::engine::cpu
