// The CUDA GPT's context parallelism (context_parallel.h): attention by
// blocks of keys on the device (kernels.h's twins of engine/cpu/layers.h),
// the positions of every cp rank's columns in device memory (the block
// kernels' causal masks, the encoder's learned positions, rotary's angles),
// and the ring's passes — through the host for a group of host memory
// (Gloo: each block copied out before its pass starts and in after it
// finishes), in the engine's buffers for one of device memory (NCCL).
#include <cstddef>

#include "worker/engine/cuda/cuda_model.h"
#include "worker/engine/cuda/cuda_model_internal.h"
#include "worker/engine/cuda/kernels.h"

namespace shardtrain::engine::cuda {

const int* CudaModel::CpPositions(int r) const {
  if (cp_positions_ == nullptr) Fail("CudaModel: cp positions without context parallelism");
  return cp_positions_->as<int>() + int64_t{r} * max_seq_len();
}

const int* CudaModel::DevicePositions() const {
  return cp() == nullptr ? nullptr : CpPositions(cp()->rank());
}

void CudaModel::AttentionBlockForward(void* out, float* lse, void* blk_out, float* blk_lse,
                                      void* scores, const void* qkv, const void* kv,
                                      const int* pos_q, const int* pos_k, int b, int t, int Ct,
                                      int NHt, int KVHt, bool first) {
  Check(cuda::AttentionBlockForward(k(), out, lse, blk_out, blk_lse, scores, qkv, kv, pos_q, pos_k,
                                    b, t, t, Ct, NHt, KVHt, first));
}

void CudaModel::AttentionRowDot(float* D, const void* dout, const void* out, int b, int t, int Ct,
                                int NHt) {
  Check(cuda::AttentionRowDot(k(), D, dout, out, b, t, Ct, NHt));
}

void CudaModel::AttentionBlockBackward(void* dqkv, void* dkv, void* scores, void* dscores,
                                       const void* dout, const void* qkv, const void* kv,
                                       const float* lse, const float* D, const int* pos_q,
                                       const int* pos_k, int b, int t, int Ct, int NHt, int KVHt) {
  Check(cuda::AttentionBlockBackward(k(), dqkv, dkv, scores, dscores, dout, qkv, kv, lse, D, pos_q,
                                     pos_k, b, t, t, Ct, NHt, KVHt));
}

void CudaModel::CopyKv(void* kv, const void* qkv, int b, int t, int Ct, int KVt) {
  Check(cuda::CopyKv(k(), kv, qkv, b, t, Ct, KVt));
}

void CudaModel::AddKvGrad(void* dqkv, const void* dkv, int b, int t, int Ct, int KVt) {
  Check(cuda::AddKvGrad(k(), dqkv, dkv, b, t, Ct, KVt));
}

// A group of device memory takes the engine's buffers (its pass ordered on
// the compute stream). One of host memory: `send` is copied to the host
// once the kernels that wrote it are done, the pass moves host buffers, and
// FinishRingPass copies what arrived into `recv` on the compute stream.
void CudaModel::StartRingPass(const void* send, void* recv, int64_t count) {
  if (cp()->device_memory()) {
    ModelEngine::StartRingPass(send, recv, count);
    return;
  }
  const size_t bytes = size_t(count) * DataTypeSize(compute());
  if (ring_send_.size() < bytes) ring_send_.resize(bytes);
  if (ring_recv_.size() < bytes) ring_recv_.resize(bytes);
  CheckCuda(cudaMemcpyAsync(ring_send_.data(), send, bytes, cudaMemcpyDeviceToHost, stream()),
            "cudaMemcpyAsync (a cp block to the host)");
  CheckCuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize (cp block)");
  ring_pending_ = recv;
  ring_pending_bytes_ = bytes;
  cp()->StartRingPass(ring_send_.data(), ring_recv_.data(), size_t(count), compute());
}

void CudaModel::FinishRingPass() {
  if (cp()->device_memory()) {
    ModelEngine::FinishRingPass();
    return;
  }
  cp()->FinishRingPass();
  if (ring_pending_ == nullptr) return;
  // From pageable memory: returns once the bytes are staged, so the next
  // pass may write ring_recv_ again.
  CheckCuda(cudaMemcpyAsync(ring_pending_, ring_recv_.data(), ring_pending_bytes_,
                            cudaMemcpyHostToDevice, stream()),
            "cudaMemcpyAsync (a cp block to the device)");
  ring_pending_ = nullptr;
}

}  // namespace shardtrain::engine::cuda
