// Helpers shared by the CUDA engine's sources (cuda_model.cc, cuda_model_tp.cc); not part of
// the engine's interface.
#ifndef SHARDTRAIN_WORKER_ENGINE_CUDA_CUDA_MODEL_INTERNAL_H_
#define SHARDTRAIN_WORKER_ENGINE_CUDA_CUDA_MODEL_INTERNAL_H_

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

namespace shardtrain::engine::cuda {

// Aborts naming the CUDA call (the engine's passes cannot return errors).
inline void CheckCuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "CudaModel: %s: %s\n", what, cudaGetErrorString(e));
    std::abort();
  }
}

}  // namespace shardtrain::engine::cuda

#endif  // SHARDTRAIN_WORKER_ENGINE_CUDA_CUDA_MODEL_INTERNAL_H_
