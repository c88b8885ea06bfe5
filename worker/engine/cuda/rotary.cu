// Rotary position embedding (RoPE), in place on q's and k's heads of the
// qkv rows, and its inverse (the backward) (kernels.h; the CPU twin is
// engine/cpu/layers.cc).
#include <limits>

#include "absl/strings/str_cat.h"
#include "worker/engine/cuda/kernel_util.cuh"
#include "worker/engine/cuda/kernels.h"

namespace shardtrain::engine::cuda {
namespace {

using internal::Load;
using internal::Store;

constexpr int kThreads = 256;

// One thread per pair (row, head, i) of the (B·T, heads, hs/2) pairs: the
// pair (2i, 2i+1) of head `head` in row `row` of x (row stride ld) rotated by
// the angle of table[pos[row mod T] (pos null: row mod T), i] (its [cos,
// sin]); sign -1 rotates back.
template <typename F>
__global__ void RotaryKernel(F* x, const float* table, int64_t pairs, int T, int heads, int half,
                             int ld, float sign, const int* pos) {
  const int64_t p = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (p >= pairs) return;
  const int64_t per_row = int64_t{heads} * half;
  const int64_t row = p / per_row;
  const int rem = static_cast<int>(p % per_row);
  const int head = rem / half, i = rem % half;
  const int64_t t = pos != nullptr ? int64_t{pos[row % T]} : row % T;
  const float* angle = table + (t * half + i) * 2;
  const float c = angle[0], s = sign * angle[1];
  F* v = x + row * ld + int64_t{head} * 2 * half + 2 * i;
  const float x0 = Load(v[0]), x1 = Load(v[1]);
  v[0] = Store<F>(x0 * c - x1 * s);
  v[1] = Store<F>(x0 * s + x1 * c);
}

}  // namespace

// x (B,T,ld), the first heads·hs columns of each row rotated in place by
// table (context, hs/2, 2) at the row's position; inverse: by minus the angle.
absl::Status RotaryForward(const KernelCtx& ctx, void* x, const float* table, int B, int T,
                           int heads, int hs, int ld, bool inverse, const int* pos) {
  constexpr const char* kName = "RotaryForward";
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kName, "B", B));
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kName, "T", T));
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kName, "heads", heads));
  if (hs < 0 || hs % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kName, ": hs must be even and >= 0 (rotary rotates pairs), got ", hs));
  }
  if (int64_t{heads} * hs > ld) {
    return absl::InvalidArgumentError(
        absl::StrCat(kName, ": heads·hs (", int64_t{heads} * hs, ") exceeds the row stride ", ld));
  }
  const int64_t pairs = int64_t{B} * T * heads * (hs / 2);
  if (pairs == 0) return absl::OkStatus();
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckPointer(kName, "x", x));
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckPointer(kName, "table", table));
  const int64_t blocks = internal::BlocksFor(pairs, kThreads);
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckGrid(kName, blocks));
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) {
    using F = typename decltype(tag)::type;
    RotaryKernel<F><<<static_cast<int>(blocks), kThreads, 0, ctx.stream>>>(
        static_cast<F*>(x), table, pairs, T, heads, hs / 2, ld, inverse ? -1.0f : 1.0f, pos);
    return internal::CheckLaunch(kName);
  });
}

}  // namespace shardtrain::engine::cuda
