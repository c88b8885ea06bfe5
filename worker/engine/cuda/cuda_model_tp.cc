// The CUDA GPT's tensor-parallel exchanges (tensor_parallel.h): the column/
// row pairs' sums, sequence parallelism's all-gathers and reduce-scatters,
// and the vocabulary-parallel cross-entropy's combination of the ranks'
// log-sum-exps — through the host for a group of host memory (Gloo), in the
// engine's buffers for one of device memory (NCCL).
#include <algorithm>
#include <cmath>
#include <vector>

#include "worker/engine/cuda/cuda_model.h"
#include "worker/engine/cuda/cuda_model_internal.h"
#include "worker/engine/cuda/kernels.h"

namespace shardtrain::engine::cuda {

// Each tp rank has its columns' log-sum-exp (host_lse_) and, where it holds
// the target, lse - logit[target] (host_losses_): the row's log-sum-exp over
// the whole vocabulary is max + log Σ exp(lse_r - max) over the ranks, the
// target logit the sum of lse_r - loss_r over the one rank holding it. Only
// these N floats each cross the host (engine/cpu/vocab_parallel.h exchanges
// the same); the result goes back to s.lse for the backward.
void CudaModel::CombineVocabShards(SlotActs& s, int N) {
  std::vector<float> max(host_lse_), sum(N), target(N);
  TpHostAllReduce(max.data(), N, /*max=*/true);
  for (int r = 0; r < N; ++r) {
    sum[r] = vocab_.real > 0 ? std::exp(host_lse_[r] - max[r]) : 0.0f;
    const int t = shifted_targets_[r];
    target[r] = t >= 0 && t < vocab_.real ? host_lse_[r] - host_losses_[r] : 0.0f;
  }
  // One sum of both halves: [sum | target] (the same values as two sums).
  sum.insert(sum.end(), target.begin(), target.end());
  TpHostAllReduce(sum.data(), 2 * N, /*max=*/false);
  std::copy(sum.begin() + N, sum.end(), target.begin());
  for (int r = 0; r < N; ++r) {
    host_lse_[r] = max[r] + std::log(sum[r]);
    host_losses_[r] = host_lse_[r] - target[r];
  }
  CheckCuda(
      cudaMemcpyAsync(s.lse, host_lse_.data(), sizeof(float) * N, cudaMemcpyHostToDevice, stream()),
      "cudaMemcpyAsync (lse to the device)");
  CheckCuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize (lse)");
}

// The tp collectives go through the host in fp32 (tensor_parallel.h): a
// 16-bit compute type is converted on the device first and back after, so
// every rank rounds the same fp32 values. ToHostF32 / FromHostF32 move n
// elements of the compute type at x to tp_host_[at, at + n) and back,
// through tp_scratch_ (fp32 compute: directly).
void CudaModel::ToHostF32(const void* x, int64_t n, size_t at) {
  const bool fp32 = compute() == DataType::kFloat32;
  if (!fp32 && (tp_scratch_ == nullptr || size_t(n) > tp_scratch_->count())) {
    Fail("CudaModel: a tp exchange larger than the tp scratch");
  }
  const float* dev = static_cast<const float*>(x);
  if (!fp32) {
    Check(ConvertToFloat32(k(), tp_scratch_->as<float>(), x, n));
    dev = tp_scratch_->as<float>();
  }
  if (tp_host_.size() < at + size_t(n)) tp_host_.resize(at + size_t(n));
  math_->CopyToHost(tp_host_.data() + at, dev, size_t(n));
}

void CudaModel::FromHostF32(void* x, int64_t n, size_t at) {
  const bool fp32 = compute() == DataType::kFloat32;
  if (!fp32 && (tp_scratch_ == nullptr || size_t(n) > tp_scratch_->count())) {
    Fail("CudaModel: a tp exchange larger than the tp scratch");
  }
  float* dev = fp32 ? static_cast<float*>(x) : tp_scratch_->as<float>();
  math_->CopyFromHost(dev, tp_host_.data() + at, size_t(n));
  if (!fp32) Check(ConvertFromFloat32(k(), x, dev, n));
}

// n host floats summed (or maxed) over tp: directly, or through
// lse_scratch_ when the group takes device memory.
void CudaModel::TpHostAllReduce(float* host, int n, bool max) {
  if (!tp()->device_memory()) {
    if (max) {
      tp()->AllReduceMax(host, size_t(n));
    } else {
      tp()->AllReduceSum(host, size_t(n));
    }
    return;
  }
  float* dev = lse_scratch_->as<float>();
  math_->CopyFromHost(dev, host, size_t(n));
  if (max) {
    tp()->AllReduceMax(dev, size_t(n));
  } else {
    tp()->AllReduceSum(dev, size_t(n));
  }
  math_->CopyToHost(host, dev, size_t(n));  // the stream waits for the sum
}

// In device memory (tp()->device_memory(), NCCL): fp32 compute exchanges the
// buffers themselves; a 16-bit one converts to fp32 in tp_scratch_ first
// and back after, so the values summed are those of the host path. The
// group orders each collective on the compute stream (no host wait).
float* CudaModel::TpScratch(size_t at) const { return tp_scratch_->as<float>() + at; }

void CudaModel::TpAllReduceSum(void* x, int64_t n) {
  if (tp()->device_memory()) {
    if (compute() == DataType::kFloat32) {
      tp()->AllReduceSum(static_cast<float*>(x), size_t(n));
      return;
    }
    Check(ConvertToFloat32(k(), TpScratch(0), x, n));
    tp()->AllReduceSum(TpScratch(0), size_t(n));
    Check(ConvertFromFloat32(k(), x, TpScratch(0), n));
    return;
  }
  ToHostF32(x, n, 0);
  tp()->AllReduceSum(tp_host_.data(), size_t(n));
  FromHostF32(x, n, 0);
}

// full (tp·n) = every rank's local (n); local at tp_host_[0, n), the
// gathered full at [n, n + tp·n). In device memory (16-bit) in place: local
// converted into its block of the gathered scratch.
void CudaModel::TpAllGather(void* full, const void* local, int64_t n) {
  const size_t tp_n = size_t(n) * size_t(tp()->size());
  if (tp()->device_memory()) {
    if (compute() == DataType::kFloat32) {
      tp()->AllGather(static_cast<const float*>(local), static_cast<float*>(full), size_t(n));
      return;
    }
    float* mine = TpScratch(size_t(n) * size_t(tp()->rank()));
    Check(ConvertToFloat32(k(), mine, local, n));
    tp()->AllGather(mine, TpScratch(0), size_t(n));
    Check(ConvertFromFloat32(k(), full, TpScratch(0), int64_t(tp_n)));
    return;
  }
  ToHostF32(local, n, 0);
  tp_host_.resize(size_t(n) + tp_n);
  tp()->AllGather(tp_host_.data(), tp_host_.data() + n, size_t(n));
  FromHostF32(full, int64_t(tp_n), size_t(n));
}

// local (n) = the sum over ranks of their full[rank·n, +n); full at
// tp_host_[0, tp·n), the local sum at [tp·n, tp·n + n).
void CudaModel::TpReduceScatter(void* local, const void* full, int64_t n) {
  const size_t tp_n = size_t(n) * size_t(tp()->size());
  if (tp()->device_memory()) {
    if (compute() == DataType::kFloat32) {
      tp()->ReduceScatterSum(static_cast<const float*>(full), static_cast<float*>(local),
                             size_t(n));
      return;
    }
    Check(ConvertToFloat32(k(), TpScratch(0), full, int64_t(tp_n)));
    tp()->ReduceScatterSum(TpScratch(0), TpScratch(tp_n), size_t(n));
    Check(ConvertFromFloat32(k(), local, TpScratch(tp_n), n));
    return;
  }
  ToHostF32(full, int64_t(tp_n), 0);
  tp_host_.resize(tp_n + size_t(n));
  tp()->ReduceScatterSum(tp_host_.data(), tp_host_.data() + tp_n, size_t(n));
  FromHostF32(local, n, tp_n);
}

}  // namespace shardtrain::engine::cuda
