// Block-wise 8-bit quantization of optimizer state, as bitsandbytes keeps
// Adam's moments (Dettmers et al., "8-bit Optimizers via Block-wise
// Quantization"): an array of n floats is cut into blocks of
// kQuant8BlockSize elements (the last one may be partial); each block keeps
// one fp32 absmax (its largest |x|) and each element one uint8 code, an index
// into a sorted 256-entry map of values in [-1, 1]:
//   quantize    code = the map entry nearest to x / absmax
//   dequantize  x ≈ map[code] · absmax
// A block whose absmax is 0 (all zeros) dequantizes to exact zeros whatever
// its codes, so zero-filled codes and absmax are a zero state.
//
// The maps are bitsandbytes' dynamic-tree maps (create_dynamic_map in
// bitsandbytes/functional.py, max_exponent_bits = 7, total_bits = 8): the
// signed one for Adam's first moment m, the unsigned one for the second
// moment v (never negative). Each decade 10^(i-6), i = 0..6, holds 2^i
// (signed, mirrored below zero) or 2^(i+1) (unsigned) evenly spaced entries,
// so small values keep their relative precision.
//
// Everything here is a pure function of its arguments; the maps are
// immutable and safe to share between threads.
#ifndef SHARDTRAIN_WORKER_OPTIM_QUANT8_H_
#define SHARDTRAIN_WORKER_OPTIM_QUANT8_H_

#include <array>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "worker/engine/thread_pool.h"

namespace shardtrain::optim {

// Elements per quantization block (bitsandbytes' block size for 8-bit Adam).
inline constexpr size_t kQuant8BlockSize = 2048;

// 256 values sorted ascending (strictly): code c stands for map[c].
using Quant8Map = std::array<float, 256>;

// bitsandbytes' create_dynamic_map(signed=is_signed, max_exponent_bits=7,
// total_bits=8), computed in float32 the way torch does it (linspace, the
// means of neighbouring boundaries, times the decade 10^(i-6), each step
// rounded to float). Signed: 127 negative entries (the smallest is
// -0.99296875; -1 has no entry), 0, 127 positive ones and 1. Unsigned: 0,
// 254 positive entries and 1. Equal to bitsandbytes' tensors to the last bit
// where torch's linspace rounds as its scalar CPU kernel does (its vectorised
// path may differ by an ulp in a few entries).
Quant8Map CreateDynamicMap(bool is_signed);

// CreateDynamicMap(true), for Adam's first moment; built once.
const Quant8Map& SignedDynamicMap();
// CreateDynamicMap(false), for Adam's second moment; built once.
const Quant8Map& UnsignedDynamicMap();

// Number of blocks of n elements: ceil(n / kQuant8BlockSize).
size_t Quant8Blocks(size_t n);

// Bytes of 8-bit AdamW state for n parameters: one code per element for m
// and one for v, and one fp32 absmax per block for each:
// 2·n + 8·Quant8Blocks(n) (fp32 AdamW keeps 8·n).
size_t Int8StateBytes(size_t n);

// The code of the map entry nearest to y (a value already divided by its
// block's absmax). Ties go to the smaller entry (the lower code); y below
// map[0] gets code 0, above map[255] code 255, NaN code 255. Distances are
// |y - entry| computed in float.
uint8_t QuantizeValue(const Quant8Map& map, float y);

// Quantizes one block (x.size() <= kQuant8BlockSize, codes.size() ==
// x.size()): returns its absmax, the largest |x[i]| (NaNs are ignored), and
// sets codes[i] = QuantizeValue(map, x[i] / absmax). When the absmax is 0
// every code is the code of 0. Inputs must be finite for a meaningful
// result.
float QuantizeBlock(const Quant8Map& map, absl::Span<const float> x, absl::Span<uint8_t> codes);

// Dequantizes one block: x[i] = map[codes[i]] · absmax, or +0 for every
// element when absmax == 0 (codes.size() == x.size()).
void DequantizeBlock(const Quant8Map& map, absl::Span<const uint8_t> codes, float absmax,
                     absl::Span<float> x);

// The 8-bit form of n elements (a view: the caller owns the memory).
// codes[i] is element i's code; absmax[b] scales block b, the elements
// [b·kQuant8BlockSize, min((b+1)·kQuant8BlockSize, n)).
struct Quant8Span {
  absl::Span<uint8_t> codes;  // n
  absl::Span<float> absmax;   // Quant8Blocks(n)
};

// Quantizes x block by block into out (QuantizeBlock on each), the blocks
// spread over `pool` (null: serial); the result does not depend on the pool.
// InvalidArgument when out.codes.size() != x.size() or out.absmax.size() !=
// Quant8Blocks(x.size()); nothing is written then.
absl::Status Quantize8(const Quant8Map& map, absl::Span<const float> x, Quant8Span out,
                       engine::ThreadPool* pool);

// Dequantizes codes/absmax block by block into x (DequantizeBlock on each),
// over `pool` (null: serial). InvalidArgument when codes.size() != x.size()
// or absmax.size() != Quant8Blocks(x.size()); nothing is written then.
absl::Status Dequantize8(const Quant8Map& map, absl::Span<const uint8_t> codes,
                         absl::Span<const float> absmax, absl::Span<float> x,
                         engine::ThreadPool* pool);

}  // namespace shardtrain::optim

#endif  // SHARDTRAIN_WORKER_OPTIM_QUANT8_H_
