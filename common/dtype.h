// Element types of flat buffers (parameters, gradients, activations,
// collectives) and host-side fp16/bf16 <-> fp32 conversion: one definition
// for the engines and the collectives.
#ifndef SHARDTRAIN_COMMON_DTYPE_H_
#define SHARDTRAIN_COMMON_DTYPE_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace shardtrain {

enum class DataType { kFloat32, kBFloat16, kFloat16 };

size_t DataTypeSize(DataType dtype);             // 4 or 2
absl::string_view DataTypeName(DataType dtype);  // "fp32", "bf16", "fp16"

// Round-to-nearest-even conversions; NaN stays NaN, overflow goes to inf.
uint16_t FloatToBFloat16(float f);
float BFloat16ToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);

// Converts `count` elements of `dtype` at `src` to fp32 at `dst`, and back.
// For kFloat32 these are memcpy.
void ToFloat32(DataType dtype, const void* src, float* dst, size_t count);
void FromFloat32(DataType dtype, const float* src, void* dst, size_t count);

}  // namespace shardtrain

#endif  // SHARDTRAIN_COMMON_DTYPE_H_
