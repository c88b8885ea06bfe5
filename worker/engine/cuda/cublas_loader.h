// cuBLAS and cuBLASLt are opened on first use (cublas_loader.cc says why);
// LoadCublas opens them and says why it could not.
#ifndef SHARDTRAIN_WORKER_ENGINE_CUDA_CUBLAS_LOADER_H_
#define SHARDTRAIN_WORKER_ENGINE_CUDA_CUBLAS_LOADER_H_

#include "absl/status/status.h"

namespace shardtrain::engine::cuda {

// Opens libcublasLt and libcublas once per process (later calls return the
// first result): FAILED_PRECONDITION naming the library and the loader's
// reason when one is missing.
absl::Status LoadCublas();

}  // namespace shardtrain::engine::cuda

#endif  // SHARDTRAIN_WORKER_ENGINE_CUDA_CUBLAS_LOADER_H_
