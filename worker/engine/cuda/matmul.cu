// Matmul (torch.nn.Linear) through cuBLASLt, forward and backward (kernels.h;
// the CPU twin is engine/cpu/layers.cc).
//
// Row-major <-> column-major. cuBLASLt is column-major: a row-major (R,K)
// matrix with row stride ld is, read by cuBLASLt, the column-major (K,R)
// matrix with leading dimension ld, i.e. its transpose. So a row-major
// product X = A·B is computed as the column-major X^T = B^T·A^T, with every
// row-major operand passed as it lies in memory:
//   forward  out (N,OC)      = inp (N,C) · W (OC,C)^T
//         -> out^T (OC,N)    = W · inp^T   : A = W as (C,OC) transposed,
//                                            B = inp as (C,N), m=OC n=N k=C
//   dinp     dinp (N,C)     += dout (N,OC) · W (OC,C)
//         -> dinp^T (C,N)   += W^T · dout^T : A = W as (C,OC), B = dout as
//                                            (OC,N) ld ld_dout, m=C n=N k=OC
//   dweight  dW (OC,C)      += dout^T (OC,N) · inp (N,C)
//         -> dW^T (C,OC)    += inp^T · dout : A = inp as (C,N), B = dout as
//                                            (OC,N) transposed, m=C n=OC k=N
// Every GEMM computes in fp32 (CUBLAS_COMPUTE_32F, fp32 scale; never TF32).
// A and B are ctx.dtype; out and dinp are ctx.dtype; dweight is fp32 (the
// master gradient; fp32 C/D with bf16/fp16 A/B is a supported cuBLASLt
// combination). The bias is added by the CUBLASLT_EPILOGUE_BIAS epilogue;
// dbias is a deterministic column-sum kernel.
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "worker/engine/cuda/kernel_util.cuh"
#include "worker/engine/cuda/kernels.h"

namespace shardtrain::engine::cuda {
namespace {

using internal::CublasStatus;
using internal::Load;

// The largest power of two <= 256 that divides the address of every column
// of a matrix at p with leading dimension ld elements of elem_bytes bytes:
// what the heuristic may assume (its default is 256 for every operand).
uint32_t Alignment(const void* p, int64_t ld, size_t elem_bytes) {
  const uint64_t address = reinterpret_cast<uintptr_t>(p);
  const uint64_t stride = static_cast<uint64_t>(ld) * elem_bytes;
  uint32_t align = 256;
  while (align > 1 && (address % align != 0 || stride % align != 0)) align /= 2;
  return align;
}

size_t ElemBytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

// A column-major matrix as stored: rows x cols with leading dimension ld.
struct LtMatrix {
  const void* ptr;
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};

// D = op(A)·op(B) + beta·D (+ bias per row of D when bias != null), fp32
// compute and scale, on ctx.stream with ctx's workspace. Descriptors live on
// the stack (the *Init calls): nothing is allocated.
absl::Status LtMatmul(const KernelCtx& ctx, const std::string& what, bool trans_a,
                      const LtMatrix& a, bool trans_b, const LtMatrix& b, const LtMatrix& d,
                      float beta, const void* bias) {
  cublasLtMatmulDescOpaque_t op_storage;
  cublasLtMatmulDesc_t op = &op_storage;
  SHARDTRAIN_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatmulDescInit(op, CUBLAS_COMPUTE_32F, CUDA_R_32F), what + ": MatmulDescInit"));
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  SHARDTRAIN_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)),
      what + ": TRANSA"));
  SHARDTRAIN_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)),
      what + ": TRANSB"));
  if (bias != nullptr) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bias_type = d.type;
    SHARDTRAIN_RETURN_IF_ERROR(
        CublasStatus(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                    sizeof(epilogue)),
                     what + ": EPILOGUE"));
    // The heuristic reads the pointer's value for its alignment.
    SHARDTRAIN_RETURN_IF_ERROR(CublasStatus(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
        what + ": BIAS_POINTER"));
    SHARDTRAIN_RETURN_IF_ERROR(
        CublasStatus(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                    &bias_type, sizeof(bias_type)),
                     what + ": BIAS_DATA_TYPE"));
  }

  cublasLtMatrixLayoutOpaque_t a_storage, b_storage, d_storage;
  cublasLtMatrixLayout_t a_layout = &a_storage, b_layout = &b_storage, d_layout = &d_storage;
  SHARDTRAIN_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatrixLayoutInit(a_layout, a.type, a.rows, a.cols, a.ld), what + ": layout of A"));
  SHARDTRAIN_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatrixLayoutInit(b_layout, b.type, b.rows, b.cols, b.ld), what + ": layout of B"));
  SHARDTRAIN_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatrixLayoutInit(d_layout, d.type, d.rows, d.cols, d.ld), what + ": layout of D"));

  cublasLtMatmulPreferenceOpaque_t pref_storage;
  cublasLtMatmulPreference_t pref = &pref_storage;
  SHARDTRAIN_RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulPreferenceInit(pref), what + ": PreferenceInit"));
  const uint64_t workspace_bytes = ctx.workspace_bytes;
  SHARDTRAIN_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &workspace_bytes, sizeof(workspace_bytes)),
      what + ": MAX_WORKSPACE_BYTES"));
  const uint32_t align_a = Alignment(a.ptr, a.ld, ElemBytes(a.type));
  const uint32_t align_b = Alignment(b.ptr, b.ld, ElemBytes(b.type));
  const uint32_t align_d = Alignment(d.ptr, d.ld, ElemBytes(d.type));
  SHARDTRAIN_RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulPreferenceSetAttribute(
                       pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)),
                   what + ": MIN_ALIGNMENT_A_BYTES"));
  SHARDTRAIN_RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulPreferenceSetAttribute(
                       pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)),
                   what + ": MIN_ALIGNMENT_B_BYTES"));
  SHARDTRAIN_RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulPreferenceSetAttribute(
                       pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d)),
                   what + ": MIN_ALIGNMENT_C_BYTES"));
  SHARDTRAIN_RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulPreferenceSetAttribute(
                       pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d)),
                   what + ": MIN_ALIGNMENT_D_BYTES"));

  cublasLtMatmulHeuristicResult_t heuristic;
  int returned = 0;
  // C and D are the same matrix (in place), so D's layout serves for both.
  SHARDTRAIN_RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulAlgoGetHeuristic(ctx.lt, op, a_layout, b_layout, d_layout,
                                                  d_layout, pref, 1, &heuristic, &returned),
                   what + ": cublasLtMatmulAlgoGetHeuristic"));
  if (returned == 0) {
    return absl::InternalError(absl::StrCat(what, ": cuBLASLt has no algorithm for m=", d.rows,
                                            " n=", d.cols, " (alignments A ", align_a, " B ",
                                            align_b, " D ", align_d, ")"));
  }
  const float alpha = 1.0f;
  void* d_ptr = const_cast<void*>(d.ptr);
  return CublasStatus(cublasLtMatmul(ctx.lt, op, &alpha, a.ptr, a_layout, b.ptr, b_layout, &beta,
                                     d_ptr, d_layout, d_ptr, d_layout, &heuristic.algo,
                                     ctx.workspace, ctx.workspace_bytes, ctx.stream),
                      what + ": cublasLtMatmul");
}

absl::Status CheckMatmulSizes(const char* kernel, int N, int C, int OC, const char* ld_name,
                              int ld) {
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kernel, "N", N));
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kernel, "C", C));
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kernel, "OC", OC));
  if (ld < OC || ld < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": ", ld_name, " must be >= max(OC, 1), got ", ld, " with OC ", OC));
  }
  return absl::OkStatus();
}

}  // namespace

// out (N,OC) with row stride ld_out = inp (N,C) · weight (OC,C)^T + bias (OC);
// bias may be null. Overwrites out; saves nothing (backward needs inp and weight).
absl::Status MatmulForward(const KernelCtx& ctx, void* out, const void* inp, const void* weight,
                           const void* bias, int N, int C, int OC, int ld_out) {
  constexpr const char* kName = "MatmulForward";
  SHARDTRAIN_RETURN_IF_ERROR(CheckMatmulSizes(kName, N, C, OC, "ld_out", ld_out));
  if (N == 0 || OC == 0) return absl::OkStatus();
  if (C == 0) return absl::InvalidArgumentError("MatmulForward: C must be >= 1");
  const cudaDataType_t t = internal::CudaDataType(ctx.dtype);
  const LtMatrix a{weight, t, static_cast<uint64_t>(C), static_cast<uint64_t>(OC), C};
  const LtMatrix b{inp, t, static_cast<uint64_t>(C), static_cast<uint64_t>(N), C};
  const LtMatrix d{out, t, static_cast<uint64_t>(OC), static_cast<uint64_t>(N), ld_out};
  return LtMatmul(ctx, kName, /*trans_a=*/true, a, /*trans_b=*/false, b, d, /*beta=*/0.0f, bias);
}

namespace {

// A block per (tile of kColumnTile columns, chunk of rows) of dout (N,OC)
// with row stride ld_dout (ColumnChunks; deterministic): dbias[o] +=
// Σ_r dout[r, o].
template <typename F>
__global__ void ColumnSumKernel(float* dbias, float* partials, const F* dout, int N, int OC,
                                int ld_dout, int chunk_rows) {
  const int o = blockIdx.x * internal::kColumnTile + threadIdx.x;
  int r0, r1;
  internal::ChunkRows(N, chunk_rows, &r0, &r1);
  float acc[1] = {0.0f};
  if (o < OC) {
    for (int r = r0 + threadIdx.y; r < r1; r += internal::kRowLanes) {
      acc[0] += Load(dout[int64_t{r} * ld_dout + o]);
    }
  }
  internal::FinishColumnChunk<1>(acc, o, OC, dbias, nullptr, partials);
}

}  // namespace

// dinp (N,C) += dout · weight (skipped when dinp is null); dweight (OC,C,
// fp32) += dout^T · inp; dbias (OC, fp32) += column sums of dout (skipped
// when null). dout (N,OC) has row stride ld_dout.
absl::Status MatmulBackward(const KernelCtx& ctx, void* dinp, float* dweight, float* dbias,
                            const void* dout, int ld_dout, const void* inp, const void* weight,
                            int N, int C, int OC) {
  constexpr const char* kName = "MatmulBackward";
  SHARDTRAIN_RETURN_IF_ERROR(CheckMatmulSizes(kName, N, C, OC, "ld_dout", ld_dout));
  if (N == 0 || OC == 0) return absl::OkStatus();  // every gradient gets += 0
  const cudaDataType_t t = internal::CudaDataType(ctx.dtype);
  if (dbias != nullptr) {
    SHARDTRAIN_RETURN_IF_ERROR(internal::DispatchDtype(ctx.dtype, [&](auto tag) {
      using F = typename decltype(tag)::type;
      const internal::ColumnChunks chunks =
          internal::PlanColumnChunks(N, OC, 1, ctx.workspace_bytes);
      float* const partials = static_cast<float*>(ctx.workspace);
      ColumnSumKernel<F><<<internal::ColumnChunkGrid(chunks, OC),
                           dim3(internal::kColumnTile, internal::kRowLanes), 0, ctx.stream>>>(
          dbias, partials, static_cast<const F*>(dout), N, OC, ld_dout, chunks.rows);
      SHARDTRAIN_RETURN_IF_ERROR(internal::CheckLaunch("MatmulBackward (dbias)"));
      return internal::AddColumnPartials<1>(ctx.stream, chunks, dbias, nullptr, partials, OC,
                                            "MatmulBackward (dbias partials)");
    }));
  }
  if (C == 0) return absl::OkStatus();  // dinp and dweight are empty
  const LtMatrix dout_m{dout, t, static_cast<uint64_t>(OC), static_cast<uint64_t>(N), ld_dout};
  if (dinp != nullptr) {
    const LtMatrix a{weight, t, static_cast<uint64_t>(C), static_cast<uint64_t>(OC), C};
    const LtMatrix d{dinp, t, static_cast<uint64_t>(C), static_cast<uint64_t>(N), C};
    SHARDTRAIN_RETURN_IF_ERROR(LtMatmul(ctx, "MatmulBackward (dinp)", /*trans_a=*/false, a,
                                        /*trans_b=*/false, dout_m, d, /*beta=*/1.0f, nullptr));
  }
  const LtMatrix a{inp, t, static_cast<uint64_t>(C), static_cast<uint64_t>(N), C};
  const LtMatrix d{dweight, CUDA_R_32F, static_cast<uint64_t>(C), static_cast<uint64_t>(OC), C};
  return LtMatmul(ctx, "MatmulBackward (dweight)", /*trans_a=*/false, a, /*trans_b=*/true, dout_m,
                  d, /*beta=*/1.0f, nullptr);
}

}  // namespace shardtrain::engine::cuda
