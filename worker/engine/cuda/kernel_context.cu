// KernelContext: the cuBLASLt and cuBLAS handles and the cuBLASLt workspace
// every launcher of kernels.h runs with.
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "worker/engine/cuda/cublas_loader.h"
#include "worker/engine/cuda/kernel_util.cuh"
#include "worker/engine/cuda/kernels.h"

namespace shardtrain::engine::cuda {
namespace {

using internal::CublasStatus;
using internal::CudaStatus;

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // 32 MiB, as llm.c

// Frees what ctx holds (null members are skipped) and clears it.
void Release(KernelCtx& ctx) {
  if (ctx.blas != nullptr) cublasDestroy(ctx.blas);
  if (ctx.lt != nullptr) cublasLtDestroy(ctx.lt);
  if (ctx.workspace != nullptr) cudaFree(ctx.workspace);
  ctx = KernelCtx{};
}

// Creates ctx's handles and workspace for ctx.stream; on error ctx holds
// what was created so far (for Release).
absl::Status Init(KernelCtx& ctx) {
  SHARDTRAIN_RETURN_IF_ERROR(
      CublasStatus(cublasLtCreate(&ctx.lt), "KernelContext::Create: cublasLtCreate"));
  SHARDTRAIN_RETURN_IF_ERROR(
      CublasStatus(cublasCreate(&ctx.blas), "KernelContext::Create: cublasCreate"));
  SHARDTRAIN_RETURN_IF_ERROR(CublasStatus(cublasSetStream(ctx.blas, ctx.stream),
                                          "KernelContext::Create: cublasSetStream"));
  // Default math: with CUBLAS_COMPUTE_32F no TF32 (only CUBLAS_TF32_TENSOR_OP_MATH allows it).
  SHARDTRAIN_RETURN_IF_ERROR(CublasStatus(cublasSetMathMode(ctx.blas, CUBLAS_DEFAULT_MATH),
                                          "KernelContext::Create: cublasSetMathMode"));
  SHARDTRAIN_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&ctx.workspace, kWorkspaceBytes),
                                        absl::StrCat("KernelContext::Create: cudaMalloc of the ",
                                                     kWorkspaceBytes, "-byte cuBLASLt workspace")));
  ctx.workspace_bytes = kWorkspaceBytes;
  return absl::OkStatus();
}

}  // namespace

absl::Status KernelContext::Create(cudaStream_t stream, DataType dtype, KernelContext* out) {
  if (out == nullptr) return absl::InvalidArgumentError("KernelContext::Create: out is null");
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    cudaGetLastError();  // clear the error for later calls
    return absl::FailedPreconditionError(absl::StrCat(
        "KernelContext::Create: no CUDA device (cudaGetDeviceCount: ",
        e == cudaSuccess ? "0 devices"
                         : absl::StrCat(cudaGetErrorName(e), ": ", cudaGetErrorString(e)),
        ")"));
  }
  SHARDTRAIN_RETURN_IF_ERROR(LoadCublas());
  KernelCtx ctx;
  ctx.stream = stream;
  ctx.dtype = dtype;
  if (absl::Status s = Init(ctx); !s.ok()) {
    Release(ctx);
    return s;
  }
  const char* fused = std::getenv("SHARDTRAIN_CUDA_FUSED");
  ctx.fused = fused == nullptr || std::string(fused) != "0";
  Release(out->ctx_);
  out->algos_ = std::make_unique<internal::LtAlgoCache>();
  ctx.algos = out->algos_.get();
  out->ctx_ = ctx;
  return absl::OkStatus();
}

KernelContext::KernelContext() = default;
KernelContext::~KernelContext() { Release(ctx_); }

}  // namespace shardtrain::engine::cuda
