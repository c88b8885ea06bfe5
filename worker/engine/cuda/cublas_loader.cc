// cuBLAS and cuBLASLt opened on first use instead of linked.
//
// Why: cuBLASLt carries about 92 KiB of static TLS, and a library linked into
// a program adds its static TLS to every thread's stack; civetweb (the
// /metrics server) starts its threads with 100 KiB stacks, so a worker that
// merely linked cuBLAS could not serve /metrics at all ("Cannot create first
// worker thread"). A library opened with dlopen keeps its TLS off the
// threads' stacks, and a CPU-only machine runs the worker without cuBLAS
// installed. The kernels call cuBLAS as usual: this file defines the entry
// points they use, each forwarding to the library's own symbol. The
// definitions repeat cuBLAS's headers' declarations, so the compiler checks
// every signature.
//
// Where from: the folder the CUDA runtime was loaded from first (the
// toolkit's lib64, or a bundle's), then the loader's usual search
// (LD_LIBRARY_PATH, ld.so.cache). cuBLASLt is opened before cuBLAS, which
// needs it.
#include "worker/engine/cuda/cublas_loader.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"

namespace shardtrain::engine::cuda {
namespace {

#define SHARDTRAIN_STR2(x) #x
#define SHARDTRAIN_STR(x) SHARDTRAIN_STR2(x)
const char* const kLtName = "libcublasLt.so." SHARDTRAIN_STR(CUBLAS_VER_MAJOR);
const char* const kBlasName = "libcublas.so." SHARDTRAIN_STR(CUBLAS_VER_MAJOR);

struct Libraries {
  void* lt = nullptr;
  void* blas = nullptr;
  std::string error;  // empty when both opened
};

// The folder (with a trailing '/') of the loaded CUDA runtime, or "".
std::string CudartFolder() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cudaGetDeviceCount), &info) == 0 ||
      info.dli_fname == nullptr) {
    return "";
  }
  std::string path = info.dli_fname;
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

void* Open(const std::string& folder, const char* name, std::string* error) {
  if (!folder.empty()) {
    if (void* h = dlopen((folder + name).c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  }
  if (void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL)) return h;
  const char* why = dlerror();
  *error = absl::StrCat("cannot load ", name, " (cuBLAS ", CUBLAS_VER_MAJOR,
                        " from the CUDA toolkit; put its folder on LD_LIBRARY_PATH): ",
                        why == nullptr ? "not found" : why);
  return nullptr;
}

const Libraries& Load() {
  static Libraries libs;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string folder = CudartFolder();
    libs.lt = Open(folder, kLtName, &libs.error);
    if (libs.lt != nullptr) libs.blas = Open(folder, kBlasName, &libs.error);
  });
  return libs;
}

// The symbol `name` of cuBLASLt (lt) or cuBLAS, or null.
void* Symbol(bool lt, const char* name) {
  const Libraries& libs = Load();
  void* lib = lt ? libs.lt : libs.blas;
  return lib == nullptr ? nullptr : dlsym(lib, name);
}

}  // namespace

absl::Status LoadCublas() {
  const Libraries& libs = Load();
  if (!libs.error.empty()) return absl::FailedPreconditionError(libs.error);
  return absl::OkStatus();
}

}  // namespace shardtrain::engine::cuda

// Each entry point: resolved once, then called; `fail` is what it returns when
// the library or the symbol is missing. `name` may be one of cublas_v2.h's
// macros (cublasCreate is cublasCreate_v2): SHARDTRAIN_STR expands it, so the
// symbol looked up is the one the definition defines.
#define SHARDTRAIN_CUBLAS_FORWARD(lt, ret, fail, name, params, args)                  \
  extern "C" ret name params {                                                        \
    using Fn = ret(*) params;                                                         \
    static const Fn fn =                                                              \
        reinterpret_cast<Fn>(shardtrain::engine::cuda::Symbol(lt, SHARDTRAIN_STR(name))); \
    if (fn == nullptr) return fail;                                                   \
    return fn args;                                                                   \
  }

// cuBLASLt
SHARDTRAIN_CUBLAS_FORWARD(true, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, cublasLtCreate,
                          (cublasLtHandle_t * handle), (handle))
SHARDTRAIN_CUBLAS_FORWARD(true, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, cublasLtDestroy,
                          (cublasLtHandle_t handle), (handle))
SHARDTRAIN_CUBLAS_FORWARD(true, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED,
                          cublasLtMatmulDescInit_internal,
                          (cublasLtMatmulDesc_t desc, size_t size, cublasComputeType_t compute,
                           cudaDataType_t scale),
                          (desc, size, compute, scale))
SHARDTRAIN_CUBLAS_FORWARD(true, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED,
                          cublasLtMatmulDescSetAttribute,
                          (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                           const void* buf, size_t bytes),
                          (desc, attr, buf, bytes))
SHARDTRAIN_CUBLAS_FORWARD(true, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED,
                          cublasLtMatrixLayoutInit_internal,
                          (cublasLtMatrixLayout_t layout, size_t size, cudaDataType type,
                           uint64_t rows, uint64_t cols, int64_t ld),
                          (layout, size, type, rows, cols, ld))
SHARDTRAIN_CUBLAS_FORWARD(true, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED,
                          cublasLtMatmulPreferenceInit_internal,
                          (cublasLtMatmulPreference_t pref, size_t size), (pref, size))
SHARDTRAIN_CUBLAS_FORWARD(true, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED,
                          cublasLtMatmulPreferenceSetAttribute,
                          (cublasLtMatmulPreference_t pref,
                           cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                           size_t bytes),
                          (pref, attr, buf, bytes))
SHARDTRAIN_CUBLAS_FORWARD(true, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED,
                          cublasLtMatmulAlgoGetHeuristic,
                          (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                           cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                           cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                           cublasLtMatmulPreference_t pref, int requested,
                           cublasLtMatmulHeuristicResult_t results[], int* returned),
                          (handle, desc, a, b, c, d, pref, requested, results, returned))
SHARDTRAIN_CUBLAS_FORWARD(true, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, cublasLtMatmul,
                          (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                           const void* alpha, const void* a, cublasLtMatrixLayout_t a_desc,
                           const void* b, cublasLtMatrixLayout_t b_desc, const void* beta,
                           const void* c, cublasLtMatrixLayout_t c_desc, void* d,
                           cublasLtMatrixLayout_t d_desc, const cublasLtMatmulAlgo_t* algo,
                           void* workspace, size_t workspace_bytes, cudaStream_t stream),
                          (handle, desc, alpha, a, a_desc, b, b_desc, beta, c, c_desc, d, d_desc,
                           algo, workspace, workspace_bytes, stream))

// cuBLAS
SHARDTRAIN_CUBLAS_FORWARD(false, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, cublasCreate,
                          (cublasHandle_t * handle), (handle))
SHARDTRAIN_CUBLAS_FORWARD(false, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, cublasDestroy,
                          (cublasHandle_t handle), (handle))
SHARDTRAIN_CUBLAS_FORWARD(false, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, cublasSetStream,
                          (cublasHandle_t handle, cudaStream_t stream), (handle, stream))
SHARDTRAIN_CUBLAS_FORWARD(false, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED, cublasSetMathMode,
                          (cublasHandle_t handle, cublasMath_t mode), (handle, mode))
SHARDTRAIN_CUBLAS_FORWARD(false, cublasStatus_t, CUBLAS_STATUS_NOT_INITIALIZED,
                          cublasGemmStridedBatchedEx,
                          (cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const void* alpha,
                           const void* a, cudaDataType a_type, int lda, long long int stride_a,
                           const void* b, cudaDataType b_type, int ldb, long long int stride_b,
                           const void* beta, void* c, cudaDataType c_type, int ldc,
                           long long int stride_c, int batch, cublasComputeType_t compute,
                           cublasGemmAlgo_t algo),
                          (handle, transa, transb, m, n, k, alpha, a, a_type, lda, stride_a, b,
                           b_type, ldb, stride_b, beta, c, c_type, ldc, stride_c, batch, compute,
                           algo))
SHARDTRAIN_CUBLAS_FORWARD(false, const char*, "cuBLAS not loaded", cublasGetStatusName,
                          (cublasStatus_t status), (status))
SHARDTRAIN_CUBLAS_FORWARD(false, const char*, "cuBLAS not loaded", cublasGetStatusString,
                          (cublasStatus_t status), (status))
