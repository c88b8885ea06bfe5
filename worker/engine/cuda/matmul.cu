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
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "worker/engine/cuda/kernel_util.cuh"
#include "worker/engine/cuda/kernels.h"

namespace shardtrain::engine::cuda {
namespace {

using internal::CublasStatus;
using internal::Load;
using internal::LtAlgoCache;
using internal::LtAlgoKey;

// The largest power of two <= 256 that divides the address of every column
// of a matrix at p with leading dimension ld elements of elem_bytes bytes:
// what the heuristic may assume (its default is 256 for every operand).
// A vector (ld 0) by its address alone; null: 256.
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

// What runs after the product (cuBLASLt's epilogue): `bias` is BIAS's vector
// (D's type, one per row of D) or a bias gradient's output (BGRADB: one per
// column of D, D's type, overwritten); `aux` is the GELU input (GELU_AUX:
// written; DGELU: read), D's type with leading dimension aux_ld.
struct LtEpilogue {
  cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  const void* aux = nullptr;
  int64_t aux_ld = 0;
};

template <typename T>
absl::Status SetDesc(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t attr, const T& value,
                     const std::string& what, const char* name) {
  return CublasStatus(cublasLtMatmulDescSetAttribute(op, attr, &value, sizeof(value)),
                      absl::StrCat(what, ": ", name));
}
template <typename T>
absl::Status SetPref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
                     const T& value, const std::string& what, const char* name) {
  return CublasStatus(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)),
                      absl::StrCat(what, ": ", name));
}

// D = op(A)·op(B) + beta·D, then the epilogue, fp32 compute and scale, on
// ctx.stream with the first workspace_bytes of ctx's workspace.
// Descriptors live on the stack (the *Init calls): nothing is allocated but
// the algorithm cache's entry the first time a shape is seen (the
// heuristic's choice, kept in ctx.algos for every later call; the key holds
// everything the choice depends on: shapes, types, alignments, epilogue,
// workspace). UNIMPLEMENTED when cuBLASLt has no algorithm for an epilogue
// other than DEFAULT/BIAS or refuses it (CUBLAS_STATUS_NOT_SUPPORTED):
// nothing ran, and the caller computes it another way.
absl::Status LtMatmul(const KernelCtx& ctx, const std::string& what, bool trans_a,
                      const LtMatrix& a, bool trans_b, const LtMatrix& b, const LtMatrix& d,
                      float beta, const LtEpilogue& epilogue = {},
                      size_t workspace_bytes = SIZE_MAX, float alpha = 1.0f) {
  workspace_bytes = std::min(workspace_bytes, ctx.workspace_bytes);
  const bool optional =
      epilogue.kind != CUBLASLT_EPILOGUE_DEFAULT && epilogue.kind != CUBLASLT_EPILOGUE_BIAS;
  cublasLtMatmulDescOpaque_t op_storage;
  cublasLtMatmulDesc_t op = &op_storage;
  SHARDTRAIN_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatmulDescInit(op, CUBLAS_COMPUTE_32F, CUDA_R_32F), what + ": MatmulDescInit"));
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  SHARDTRAIN_RETURN_IF_ERROR(SetDesc(op, CUBLASLT_MATMUL_DESC_TRANSA, op_a, what, "TRANSA"));
  SHARDTRAIN_RETURN_IF_ERROR(SetDesc(op, CUBLASLT_MATMUL_DESC_TRANSB, op_b, what, "TRANSB"));
  if (epilogue.kind != CUBLASLT_EPILOGUE_DEFAULT) {
    SHARDTRAIN_RETURN_IF_ERROR(
        SetDesc(op, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue.kind, what, "EPILOGUE"));
  }
  // The heuristic reads the pointers' values for their alignment.
  if (epilogue.bias != nullptr) {
    SHARDTRAIN_RETURN_IF_ERROR(
        SetDesc(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, epilogue.bias, what, "BIAS_POINTER"));
    const cudaDataType_t bias_type = d.type;
    SHARDTRAIN_RETURN_IF_ERROR(
        SetDesc(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type, what, "BIAS_DATA_TYPE"));
  }
  if (epilogue.aux != nullptr) {
    SHARDTRAIN_RETURN_IF_ERROR(
        SetDesc(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, epilogue.aux, what, "AUX_POINTER"));
    SHARDTRAIN_RETURN_IF_ERROR(
        SetDesc(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, epilogue.aux_ld, what, "AUX_LD"));
  }

  cublasLtMatrixLayoutOpaque_t a_storage, b_storage, d_storage;
  cublasLtMatrixLayout_t a_layout = &a_storage, b_layout = &b_storage, d_layout = &d_storage;
  SHARDTRAIN_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatrixLayoutInit(a_layout, a.type, a.rows, a.cols, a.ld), what + ": layout of A"));
  SHARDTRAIN_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatrixLayoutInit(b_layout, b.type, b.rows, b.cols, b.ld), what + ": layout of B"));
  SHARDTRAIN_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatrixLayoutInit(d_layout, d.type, d.rows, d.cols, d.ld), what + ": layout of D"));

  const uint32_t align_a = Alignment(a.ptr, a.ld, ElemBytes(a.type));
  const uint32_t align_b = Alignment(b.ptr, b.ld, ElemBytes(b.type));
  const uint32_t align_d = Alignment(d.ptr, d.ld, ElemBytes(d.type));
  const uint32_t align_bias = Alignment(epilogue.bias, 0, 1);
  const uint32_t align_aux = Alignment(epilogue.aux, epilogue.aux_ld, ElemBytes(d.type));
  const LtAlgoKey key = {trans_a,
                         trans_b,
                         a.type,
                         b.type,
                         d.type,
                         int64_t(a.rows),
                         int64_t(a.cols),
                         a.ld,
                         int64_t(b.rows),
                         int64_t(b.cols),
                         b.ld,
                         int64_t(d.rows),
                         int64_t(d.cols),
                         d.ld,
                         align_a,
                         align_b,
                         align_d,
                         align_bias,
                         align_aux,
                         epilogue.kind,
                         epilogue.aux_ld,
                         int64_t(workspace_bytes)};
  const LtAlgoCache::Entry* cached = ctx.algos == nullptr ? nullptr : ctx.algos->Find(key);
  LtAlgoCache::Entry entry;
  if (cached != nullptr) {
    entry = *cached;
  } else {
    cublasLtMatmulPreferenceOpaque_t pref_storage;
    cublasLtMatmulPreference_t pref = &pref_storage;
    SHARDTRAIN_RETURN_IF_ERROR(
        CublasStatus(cublasLtMatmulPreferenceInit(pref), what + ": PreferenceInit"));
    const uint64_t max_workspace = workspace_bytes;
    SHARDTRAIN_RETURN_IF_ERROR(SetPref(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                       max_workspace, what, "MAX_WORKSPACE_BYTES"));
    SHARDTRAIN_RETURN_IF_ERROR(
        SetPref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a, what, "ALIGNMENT_A"));
    SHARDTRAIN_RETURN_IF_ERROR(
        SetPref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b, what, "ALIGNMENT_B"));
    SHARDTRAIN_RETURN_IF_ERROR(
        SetPref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d, what, "ALIGNMENT_C"));
    SHARDTRAIN_RETURN_IF_ERROR(
        SetPref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d, what, "ALIGNMENT_D"));
    cublasLtMatmulHeuristicResult_t heuristic;
    int returned = 0;
    // C and D are the same matrix (in place), so D's layout serves for both.
    const cublasStatus_t found = cublasLtMatmulAlgoGetHeuristic(
        ctx.lt, op, a_layout, b_layout, d_layout, d_layout, pref, 1, &heuristic, &returned);
    // An optional epilogue this cuBLASLt refuses in any way (unsupported,
    // or an attribute it rejects) is one it does not have: said once on
    // stderr, then the caller's separate kernels, every time after.
    if (found != CUBLAS_STATUS_SUCCESS && !optional) {
      return CublasStatus(found, what + ": cublasLtMatmulAlgoGetHeuristic");
    }
    entry.found = found == CUBLAS_STATUS_SUCCESS && returned > 0;
    if (entry.found) entry.algo = heuristic.algo;
    if (!entry.found && optional) {
      std::fprintf(stderr,
                   "%s: cuBLASLt has no algorithm with epilogue %d for m=%llu n=%llu (%s); "
                   "the separate kernels run instead\n",
                   what.c_str(), static_cast<int>(epilogue.kind),
                   static_cast<unsigned long long>(d.rows), static_cast<unsigned long long>(d.cols),
                   found == CUBLAS_STATUS_SUCCESS ? "none returned" : cublasGetStatusName(found));
    }
    if (ctx.algos != nullptr) ctx.algos->Insert(key, entry);
  }
  if (!entry.found) {
    const std::string shape = absl::StrCat("m=", d.rows, " n=", d.cols, " (alignments A ", align_a,
                                           " B ", align_b, " D ", align_d, ")");
    if (optional) {
      return absl::UnimplementedError(
          absl::StrCat(what, ": cuBLASLt has no algorithm with epilogue ",
                       static_cast<int>(epilogue.kind), " for ", shape));
    }
    return absl::InternalError(absl::StrCat(what, ": cuBLASLt has no algorithm for ", shape));
  }
  void* d_ptr = const_cast<void*>(d.ptr);
  const cublasStatus_t ran =
      cublasLtMatmul(ctx.lt, op, &alpha, a.ptr, a_layout, b.ptr, b_layout, &beta, d_ptr, d_layout,
                     d_ptr, d_layout, &entry.algo, ctx.workspace, workspace_bytes, ctx.stream);
  if (optional && ran != CUBLAS_STATUS_SUCCESS) {  // refused before it ran
    if (ctx.algos != nullptr) ctx.algos->Insert(key, LtAlgoCache::Entry{});  // not again
    return absl::UnimplementedError(absl::StrCat(what, ": cuBLASLt refused epilogue ",
                                                 static_cast<int>(epilogue.kind), " (",
                                                 cublasGetStatusName(ran), ")"));
  }
  return CublasStatus(ran, what + ": cublasLtMatmul");
}

// The forward's operands: out (N,OC) row stride ld_out = inp (N,C) ·
// weight (OC,C)^T as the column-major out^T = W · inp^T (see the top).
struct ForwardOperands {
  ForwardOperands(const KernelCtx& ctx, void* out, const void* inp, const void* weight, int N,
                  int C, int OC, int ld_out)
      : a{weight, internal::CudaDataType(ctx.dtype), uint64_t(C), uint64_t(OC), C},
        b{inp, internal::CudaDataType(ctx.dtype), uint64_t(C), uint64_t(N), C},
        d{out, internal::CudaDataType(ctx.dtype), uint64_t(OC), uint64_t(N), ld_out} {}
  LtMatrix a, b, d;
};

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
  const ForwardOperands m(ctx, out, inp, weight, N, C, OC, ld_out);
  LtEpilogue e;
  if (bias != nullptr) {
    e.kind = CUBLASLT_EPILOGUE_BIAS;
    e.bias = bias;
  }
  return LtMatmul(ctx, kName, /*trans_a=*/true, m.a, /*trans_b=*/false, m.b, m.d, /*beta=*/0.0f, e);
}

absl::Status MatmulGeluForward(const KernelCtx& ctx, void* act, void* pre, const void* inp,
                               const void* weight, const void* bias, int N, int C, int OC) {
  constexpr const char* kName = "MatmulGeluForward";
  SHARDTRAIN_RETURN_IF_ERROR(CheckMatmulSizes(kName, N, C, OC, "OC", OC));
  if (!ctx.fused || OC % 8 != 0) {
    return absl::UnimplementedError(
        absl::StrCat(kName, ": ", ctx.fused ? "OC not a multiple of 8" : "fusions off"));
  }
  if (N == 0 || OC == 0) return absl::OkStatus();
  if (C == 0) return absl::InvalidArgumentError("MatmulGeluForward: C must be >= 1");
  const ForwardOperands m(ctx, act, inp, weight, N, C, OC, OC);
  LtEpilogue e;
  e.kind = bias != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  e.bias = bias;
  e.aux = pre;
  e.aux_ld = OC;
  return LtMatmul(ctx, kName, /*trans_a=*/true, m.a, /*trans_b=*/false, m.b, m.d, /*beta=*/0.0f, e);
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

// dbias (OC, fp32) += column sums of dout (N,OC) with row stride ld_dout.
absl::Status ColumnSum(const KernelCtx& ctx, float* dbias, const void* dout, int N, int OC,
                       int ld_dout) {
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) {
    using F = typename decltype(tag)::type;
    const internal::ColumnChunks chunks = internal::PlanColumnChunks(N, OC, 1, ctx.workspace_bytes);
    float* const partials = static_cast<float*>(ctx.workspace);
    ColumnSumKernel<F><<<internal::ColumnChunkGrid(chunks, OC),
                         dim3(internal::kColumnTile, internal::kRowLanes), 0, ctx.stream>>>(
        dbias, partials, static_cast<const F*>(dout), N, OC, ld_dout, chunks.rows);
    SHARDTRAIN_RETURN_IF_ERROR(internal::CheckLaunch("MatmulBackward (dbias)"));
    return internal::AddColumnPartials<1>(ctx.stream, chunks, dbias, nullptr, partials, OC,
                                          "MatmulBackward (dbias partials)");
  });
}

// dweight (OC,C, fp32) += dout^T · inp (N,C), and dbias (OC, fp32; null:
// none) += the column sums of dout: with ctx.fused by the same GEMM's
// BGRADB epilogue (it reads dout anyway; the sums land in the workspace's
// tail, overwritten, and are added to dbias), else — or where cuBLASLt has
// no such algorithm — by ColumnSum. C >= 1.
absl::Status WeightGradient(const KernelCtx& ctx, float* dweight, float* dbias,
                            const LtMatrix& dout_m, const void* inp, int N, int C, int OC) {
  if (dweight == nullptr && dbias == nullptr) return absl::OkStatus();  // a frozen weight
  const cudaDataType_t t = internal::CudaDataType(ctx.dtype);
  const LtMatrix a{inp, t, static_cast<uint64_t>(C), static_cast<uint64_t>(N), C};
  const LtMatrix d{dweight, CUDA_R_32F, static_cast<uint64_t>(C), static_cast<uint64_t>(OC), C};
  const size_t tail = (size_t(OC) * sizeof(float) + 255) / 256 * 256;
  if (dbias != nullptr && dweight != nullptr && ctx.fused && 4 * tail <= ctx.workspace_bytes) {
    float* sums =
        reinterpret_cast<float*>(static_cast<char*>(ctx.workspace) + (ctx.workspace_bytes - tail));
    LtEpilogue e;
    e.kind = CUBLASLT_EPILOGUE_BGRADB;
    e.bias = sums;
    const absl::Status s =
        LtMatmul(ctx, "MatmulBackward (dweight, dbias)", /*trans_a=*/false, a,
                 /*trans_b=*/true, dout_m, d, /*beta=*/1.0f, e, ctx.workspace_bytes - tail);
    if (s.ok()) {
      KernelCtx f32 = ctx;
      f32.dtype = DataType::kFloat32;
      return AddInPlace(f32, dbias, sums, OC);
    }
    if (!absl::IsUnimplemented(s)) return s;
  }
  if (dbias != nullptr)
    SHARDTRAIN_RETURN_IF_ERROR(
        ColumnSum(ctx, dbias, dout_m.ptr, N, OC, static_cast<int>(dout_m.ld)));
  if (dweight == nullptr) return absl::OkStatus();
  return LtMatmul(ctx, "MatmulBackward (dweight)", /*trans_a=*/false, a, /*trans_b=*/true, dout_m,
                  d, /*beta=*/1.0f);
}

}  // namespace

// dinp (N,C) += dout · weight (skipped when dinp is null; = when
// overwrite_dinp); dweight (OC,C, fp32) += dout^T · inp; dbias (OC, fp32)
// += column sums of dout (skipped when null). dout (N,OC) has row stride
// ld_dout.
absl::Status MatmulBackward(const KernelCtx& ctx, void* dinp, float* dweight, float* dbias,
                            const void* dout, int ld_dout, const void* inp, const void* weight,
                            int N, int C, int OC, bool overwrite_dinp) {
  constexpr const char* kName = "MatmulBackward";
  SHARDTRAIN_RETURN_IF_ERROR(CheckMatmulSizes(kName, N, C, OC, "ld_dout", ld_dout));
  if (OC == 0 && overwrite_dinp && dinp != nullptr) {  // a sum of nothing
    SHARDTRAIN_RETURN_IF_ERROR(internal::CudaStatus(
        cudaMemsetAsync(dinp, 0, size_t(N) * size_t(C) * DataTypeSize(ctx.dtype), ctx.stream),
        "MatmulBackward: cudaMemsetAsync (dinp)"));
  }
  if (N == 0 || OC == 0) return absl::OkStatus();  // every gradient gets += 0
  if (C == 0) {                                    // dinp and dweight are empty
    return dbias == nullptr ? absl::OkStatus() : ColumnSum(ctx, dbias, dout, N, OC, ld_dout);
  }
  const cudaDataType_t t = internal::CudaDataType(ctx.dtype);
  const LtMatrix dout_m{dout, t, static_cast<uint64_t>(OC), static_cast<uint64_t>(N), ld_dout};
  if (dinp != nullptr) {
    const LtMatrix a{weight, t, static_cast<uint64_t>(C), static_cast<uint64_t>(OC), C};
    const LtMatrix d{dinp, t, static_cast<uint64_t>(C), static_cast<uint64_t>(N), C};
    SHARDTRAIN_RETURN_IF_ERROR(LtMatmul(ctx, "MatmulBackward (dinp)", /*trans_a=*/false, a,
                                        /*trans_b=*/false, dout_m, d,
                                        /*beta=*/overwrite_dinp ? 0.0f : 1.0f));
  }
  return WeightGradient(ctx, dweight, dbias, dout_m, inp, N, C, OC);
}

absl::Status MatmulDGeluBackward(const KernelCtx& ctx, void* dpre, float* dweight, float* dbias,
                                 const void* dout, int ld_dout, const void* act, const void* pre,
                                 const void* weight, int N, int C, int OC) {
  constexpr const char* kName = "MatmulDGeluBackward";
  SHARDTRAIN_RETURN_IF_ERROR(CheckMatmulSizes(kName, N, C, OC, "ld_dout", ld_dout));
  if (!ctx.fused || C % 8 != 0) {
    return absl::UnimplementedError(
        absl::StrCat(kName, ": ", ctx.fused ? "C not a multiple of 8" : "fusions off"));
  }
  if (N == 0 || OC == 0 || C == 0) {
    return absl::InvalidArgumentError(absl::StrCat(kName, ": N, C and OC must be >= 1"));
  }
  const cudaDataType_t t = internal::CudaDataType(ctx.dtype);
  const LtMatrix dout_m{dout, t, static_cast<uint64_t>(OC), static_cast<uint64_t>(N), ld_dout};
  const LtMatrix a{weight, t, static_cast<uint64_t>(C), static_cast<uint64_t>(OC), C};
  const LtMatrix d{dpre, t, static_cast<uint64_t>(C), static_cast<uint64_t>(N), C};
  LtEpilogue e;
  e.kind = CUBLASLT_EPILOGUE_DGELU;
  e.aux = pre;
  e.aux_ld = C;
  // First: UNIMPLEMENTED here leaves every output untouched.
  SHARDTRAIN_RETURN_IF_ERROR(LtMatmul(ctx, "MatmulDGeluBackward (dpre)", /*trans_a=*/false, a,
                                      /*trans_b=*/false, dout_m, d, /*beta=*/0.0f, e));
  return WeightGradient(ctx, dweight, dbias, dout_m, act, N, C, OC);
}

// ---- LoRA adapters: each product one GEMM of the forms above (row-major
// operands as they lie), alpha and beta doing the scale and the +=.

absl::Status LoraForward(const KernelCtx& ctx, void* out, int ld_out, void* xa, const void* inp,
                         const void* A, const void* B, float scale, int N, int IC, int OC, int r) {
  constexpr const char* kName = "LoraForward";
  SHARDTRAIN_RETURN_IF_ERROR(CheckMatmulSizes(kName, N, IC, OC, "ld_out", ld_out));
  if (N == 0 || OC == 0) return absl::OkStatus();
  if (IC == 0 || r < 1) return absl::InvalidArgumentError("LoraForward: IC and r must be >= 1");
  // xa (N, r) = inp · A^T
  const ForwardOperands down(ctx, xa, inp, A, N, IC, r, r);
  SHARDTRAIN_RETURN_IF_ERROR(LtMatmul(ctx, "LoraForward (xa)", true, down.a, false, down.b, down.d,
                                      /*beta=*/0.0f));
  // out += scale · xa · B^T
  const ForwardOperands up(ctx, out, xa, B, N, r, OC, ld_out);
  return LtMatmul(ctx, "LoraForward (out)", true, up.a, false, up.b, up.d, /*beta=*/1.0f, {},
                  SIZE_MAX, scale);
}

absl::Status LoraBackward(const KernelCtx& ctx, void* dinp, float* dA, float* dB, void* g, void* xa,
                          const void* dout, int ld_dout, const void* inp, const void* A,
                          const void* B, float scale, int N, int IC, int OC, int r) {
  constexpr const char* kName = "LoraBackward";
  SHARDTRAIN_RETURN_IF_ERROR(CheckMatmulSizes(kName, N, IC, OC, "ld_dout", ld_dout));
  if (N == 0 || OC == 0) return absl::OkStatus();
  if (IC == 0 || r < 1) return absl::InvalidArgumentError("LoraBackward: IC and r must be >= 1");
  const cudaDataType_t t = internal::CudaDataType(ctx.dtype);
  const auto u = [](int64_t x) { return static_cast<uint64_t>(x); };
  // xa (N, r) = inp · A^T again (not saved).
  const ForwardOperands down(ctx, xa, inp, A, N, IC, r, r);
  SHARDTRAIN_RETURN_IF_ERROR(
      LtMatmul(ctx, "LoraBackward (xa)", true, down.a, false, down.b, down.d, /*beta=*/0.0f));
  const LtMatrix dout_m{dout, t, u(OC), u(N), ld_dout};
  const LtMatrix xa_m{xa, t, u(r), u(N), r};
  // dB (OC, r) += scale · dout^T · xa: dB^T (r, OC) += xa^T · dout.
  SHARDTRAIN_RETURN_IF_ERROR(LtMatmul(ctx, "LoraBackward (dB)", false, xa_m, true, dout_m,
                                      LtMatrix{dB, CUDA_R_32F, u(r), u(OC), r}, /*beta=*/1.0f, {},
                                      SIZE_MAX, scale));
  // g (N, r) = scale · dout · B: g^T (r, N) = B^T · dout^T, B as (r, OC).
  SHARDTRAIN_RETURN_IF_ERROR(
      LtMatmul(ctx, "LoraBackward (g)", false, LtMatrix{B, t, u(r), u(OC), r}, false, dout_m,
               LtMatrix{g, t, u(r), u(N), r}, /*beta=*/0.0f, {}, SIZE_MAX, scale));
  const LtMatrix g_m{g, t, u(r), u(N), r};
  // dA (r, IC) += g^T · inp: dA^T (IC, r) += inp^T · g.
  SHARDTRAIN_RETURN_IF_ERROR(LtMatmul(ctx, "LoraBackward (dA)", false,
                                      LtMatrix{inp, t, u(IC), u(N), IC}, true, g_m,
                                      LtMatrix{dA, CUDA_R_32F, u(IC), u(r), IC}, /*beta=*/1.0f));
  if (dinp == nullptr) return absl::OkStatus();
  // dinp (N, IC) += g · A: dinp^T (IC, N) += A^T · g^T, A as (IC, r).
  return LtMatmul(ctx, "LoraBackward (dinp)", false, LtMatrix{A, t, u(IC), u(r), IC}, false, g_m,
                  LtMatrix{dinp, t, u(IC), u(N), IC}, /*beta=*/1.0f);
}

}  // namespace shardtrain::engine::cuda
