// CudaModel's Mixture-of-Experts layers (model_engine.h's MoE virtuals): the
// router's scores, top-K and gates, the permutation and the combine as
// kernels (moe.cu), the experts as ModelEngine's per-expert matmuls. The
// bookkeeping that decides rows — the load, the permutation's index — is
// built on the host from the chosen experts (engine/cpu/moe_layers.h's
// functions, so every device numbers rows alike) and copied to the device,
// as are the balancing losses, computed on the host from the scores and
// logits (N·E values a layer).
#include <cuda_runtime_api.h>

#include <vector>

#include "common/dtype.h"
#include "worker/engine/cpu/moe_layers.h"
#include "worker/engine/cuda/cuda_model.h"
#include "worker/engine/cuda/cuda_model_internal.h"
#include "worker/engine/cuda/kernels.h"

namespace shardtrain::engine::cuda {
namespace {

bool Sigmoid(const model::MoeConfig& m) { return m.scoring == model::RouterScoring::kSigmoid; }

}  // namespace

std::vector<float> CudaModel::HostFloats(const void* x, int64_t n) const {
  std::vector<char> raw(size_t(n) * DataTypeSize(compute()));
  CheckCuda(cudaMemcpyAsync(raw.data(), x, raw.size(), cudaMemcpyDeviceToHost, stream()),
            "cudaMemcpyAsync (MoE to host)");
  CheckCuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize (MoE to host)");
  std::vector<float> out(static_cast<size_t>(n));
  ToFloat32(compute(), raw.data(), out.data(), out.size());
  return out;
}

void CudaModel::DeviceFromFloats(void* x, const std::vector<float>& host) {
  std::vector<char> raw(host.size() * DataTypeSize(compute()));
  FromFloat32(compute(), host.data(), raw.data(), host.size());
  CheckCuda(cudaMemcpyAsync(x, raw.data(), raw.size(), cudaMemcpyHostToDevice, stream()),
            "cudaMemcpyAsync (MoE to device)");
  CheckCuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize (MoE to device)");
}

CudaModel::MoeRouted CudaModel::MoeRoute(LayerActs& a, const void* x, int router, int bias, int N,
                                         int capacity) {
  const model::MoeConfig& m = config().moe;
  const int C = config().dim, E = m.experts, K = m.top_k;
  MatmulForward(a.router_logits, x, router, -1, N, C, E, E);
  Check(cuda::MoeRouterForward(k(), a.router_scores, a.router_experts, a.router_gates,
                               a.router_logits, bias < 0 ? nullptr : param(bias), N, E, K,
                               Sigmoid(m), m.norm_topk_prob));
  // The choice to the host; the load and the permutation from it, back.
  std::vector<int> experts(size_t(N) * K);
  CheckCuda(cudaMemcpyAsync(experts.data(), a.router_experts, sizeof(int) * experts.size(),
                            cudaMemcpyDeviceToHost, stream()),
            "cudaMemcpyAsync (experts)");
  CheckCuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize (experts)");
  MoeRouted r;
  r.load.resize(E);
  cpu::ExpertLoad(r.load.data(), experts.data(), N, K, E);
  // moe_index's layout (activations.h), sized for the engine's B·T tokens.
  const int64_t NK = int64_t{max_batch()} * max_seq_len() * K;
  std::vector<int> index(size_t(2 * NK + 2 * E + 1), 0);
  int* row_of_pair = index.data();
  int* pair_of_row = row_of_pair + NK;
  int* offsets = pair_of_row + NK;
  int* counts = offsets + E + 1;
  const int dropped = cpu::BuildPermutation(counts, offsets, pair_of_row, row_of_pair,
                                            experts.data(), N, K, E, capacity);
  CheckCuda(cudaMemcpyAsync(a.moe_index, index.data(), sizeof(int) * index.size(),
                            cudaMemcpyHostToDevice, stream()),
            "cudaMemcpyAsync (moe_index)");
  CheckCuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize (moe_index)");
  r.kept = N * K - dropped;
  r.offsets.assign(offsets, offsets + E + 1);
  return r;
}

CudaModel::MoeBalance CudaModel::MoeBalanceLosses(const LayerActs& a, const int* load, int N) {
  const model::MoeConfig& m = config().moe;
  const MoeOptions& o = moe_options();
  const int E = m.experts;
  MoeBalance b;
  if (o.aux_loss_coef > 0) {
    const std::vector<float> scores = HostFloats(a.router_scores, int64_t{N} * E);
    b.aux = cpu::AuxLossForward<float>(scores.data(), load, N, E, m.top_k, m.scoring,
                                       static_cast<float>(o.aux_loss_coef));
  }
  if (o.z_loss_coef > 0) {
    const std::vector<float> logits = HostFloats(a.router_logits, int64_t{N} * E);
    b.z = cpu::ZLossForward<float>(logits.data(), N, E, static_cast<float>(o.z_loss_coef));
  }
  return b;
}

void CudaModel::MoePermute(void* xp, const LayerActs& a, const void* x, int N, int M) {
  (void)N;
  Check(cuda::MoeGatherRows(k(), xp, x, moe_index(a).pair_of_row, M, config().dim,
                            config().moe.top_k));
}

const int* CudaModel::DeviceRowIndex(const int* index, int n) {
  CheckCuda(cudaMemcpyAsync(moe_rows_->data(), index, sizeof(int) * size_t(n),
                            cudaMemcpyHostToDevice, stream()),
            "cudaMemcpyAsync (row index)");
  CheckCuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize (row index)");
  return moe_rows_->as<int>();
}

void CudaModel::MoeGatherRows(void* dst, const void* src, const int* index, int n) {
  Check(cuda::MoeGatherRows(k(), dst, src, DeviceRowIndex(index, n), n, config().dim, 1));
}

void CudaModel::MoeScatterRows(void* dst, const void* src, const int* index, int n) {
  Check(cuda::MoeScatterRows(k(), dst, src, DeviceRowIndex(index, n), n, config().dim));
}

void CudaModel::MoeCombine(void* out, const LayerActs& a, int N) {
  Check(cuda::MoeCombineForward(k(), out, a.moe_y, a.router_gates, moe_index(a).row_of_pair, N,
                                config().moe.top_k, config().dim));
}

void CudaModel::MoeCombineBackward(void* dy, void* dgates, const void* dout, const LayerActs& a,
                                   int N, int M) {
  const int C = config().dim, K = config().moe.top_k;
  Zero(dy, int64_t{M} * C);
  Zero(dgates, int64_t{N} * K);
  Check(cuda::MoeCombineBackward(k(), dy, dgates, dout, a.moe_y, a.router_gates,
                                 moe_index(a).row_of_pair, N, K, C));
}

void CudaModel::MoePermuteBackward(void* dx, const void* dxp, const LayerActs& a, int N) {
  Check(cuda::MoePermuteBackward(k(), dx, dxp, moe_index(a).row_of_pair, N, config().moe.top_k,
                                 config().dim));
}

void CudaModel::MoeRouterBackward(void* dx, void* dscores, void* dlogits, const void* dgates,
                                  const LayerActs& a, const int* load, const void* x, int router,
                                  int N, float dloss) {
  const model::MoeConfig& m = config().moe;
  const int C = config().dim, E = m.experts, K = m.top_k;
  const MoeOptions& o = moe_options();
  // The balancing losses' gradients (host), the kernels' starting values.
  std::vector<float> ds(size_t(N) * E, 0.0f), dl(size_t(N) * E, 0.0f);
  if (o.aux_loss_coef > 0) {
    const std::vector<float> scores = HostFloats(a.router_scores, int64_t{N} * E);
    cpu::AuxLossBackward<float>(ds.data(), scores.data(), load, N, E, K, m.scoring,
                                static_cast<float>(o.aux_loss_coef), dloss, host_pool());
  }
  if (o.z_loss_coef > 0) {
    const std::vector<float> logits = HostFloats(a.router_logits, int64_t{N} * E);
    cpu::ZLossBackward<float>(dl.data(), logits.data(), N, E, static_cast<float>(o.z_loss_coef),
                              dloss, host_pool());
  }
  DeviceFromFloats(dscores, ds);
  DeviceFromFloats(dlogits, dl);
  Check(cuda::MoeRouterBackward(k(), dlogits, dscores, dgates, a.router_scores, a.router_experts, N,
                                E, K, Sigmoid(m), m.norm_topk_prob));
  // dx += dlogits · wr, dwr += dlogits^T · x.
  MatmulBackward(dx, dlogits, E, x, router, -1, N, C, E);
}

void CudaModel::EpAllToAll(const void* send, const std::vector<size_t>& send_counts, void* recv,
                           const std::vector<size_t>& recv_counts) {
  if (ep()->device_memory()) {  // the buffers themselves, ordered on the compute stream
    ep()->AllToAllVDevice(send, send_counts, recv, recv_counts, compute());
    return;
  }
  size_t out = 0, in = 0;
  for (size_t c : send_counts) out += c;
  for (size_t c : recv_counts) in += c;
  const std::vector<float> host_send = HostFloats(send, static_cast<int64_t>(out));
  std::vector<float> host_recv(in);
  ep()->AllToAllV(host_send.data(), send_counts, host_recv.data(), recv_counts);
  DeviceFromFloats(recv, host_recv);
}

void CudaModel::EpAllToAllHost(const float* send, const std::vector<size_t>& send_counts,
                               float* recv, const std::vector<size_t>& recv_counts) {
  if (!ep()->device_memory()) {
    ModelEngine::EpAllToAllHost(send, send_counts, recv, recv_counts);
    return;
  }
  size_t out = 0, in = 0;
  for (size_t c : send_counts) out += c;
  for (size_t c : recv_counts) in += c;
  const size_t room = ep_counts_->count() / 2;
  if (out > room || in > room) Fail("CudaModel::EpAllToAllHost: more counts than ep_counts_ holds");
  float* d_send = ep_counts_->as<float>();
  float* d_recv = d_send + room;
  math_->CopyFromHost(d_send, send, out);
  ep()->AllToAllVDevice(d_send, send_counts, d_recv, recv_counts, DataType::kFloat32);
  math_->CopyToHost(recv, d_recv, in);  // the stream waits for the exchange
}

}  // namespace shardtrain::engine::cuda
