// The launchers' shared size checks and error translation (kernel_util.cuh).
#include <string>

#include "absl/strings/str_cat.h"
#include "worker/engine/cuda/kernel_util.cuh"

namespace shardtrain::engine::cuda::internal {

absl::Status CheckNonNegative(const char* kernel, const char* what, int64_t v) {
  if (v >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(kernel, ": ", what, " must be >= 0, got ", v));
}

absl::Status CheckGrid(const char* kernel, int64_t blocks) {
  if (blocks <= kMaxGridX) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(kernel, ": ", blocks, " blocks exceed the grid limit of ", kMaxGridX));
}

absl::Status CheckPointer(const char* kernel, const char* what, const void* p) {
  if (p != nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(kernel, ": ", what, " is null"));
}

absl::Status CheckLaunch(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(kernel, ": CUDA error ", static_cast<int>(e), " ",
                                          cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

absl::Status CublasStatus(cublasStatus_t s, const std::string& what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": cuBLAS status ", static_cast<int>(s), " ",
                                          cublasGetStatusName(s), " (", cublasGetStatusString(s),
                                          ")"));
}

absl::Status CudaStatus(cudaError_t e, const std::string& call) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, ": CUDA error ", static_cast<int>(e), " ",
                                          cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

}  // namespace shardtrain::engine::cuda::internal
