#include "common/dtype.h"

#include <cmath>
#include <cstring>

#include "common/enum_names.h"

namespace shardtrain {

size_t DataTypeSize(DataType dtype) { return dtype == DataType::kFloat32 ? 4 : 2; }

absl::string_view DataTypeName(DataType dtype) {
  static constexpr absl::string_view kNames[] = {"fp32", "bf16", "fp16"};
  return NameIn(kNames, dtype);
}

uint16_t FloatToBFloat16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float BFloat16ToFloat(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (x < 0x38800000u) {                                               // subnormal or zero in fp16
    if (x < 0x33000000u) return static_cast<uint16_t>(sign);           // < half min subnormal / 2
    // value = mant24 * 2^(exp-150); in units of the fp16 subnormal 2^-24
    // that is mant24 >> (126 - exp), with 14 <= 126 - exp <= 24 here.
    const uint32_t exp = x >> 23;
    const uint32_t mant = (x & 0x7fffffu) | 0x800000u;
    const uint32_t total_shift = 126 - exp;
    uint32_t result = mant >> total_shift;
    const uint32_t rem = mant & ((1u << total_shift) - 1);
    const uint32_t half = 1u << (total_shift - 1);
    if (rem > half || (rem == half && (result & 1u))) ++result;
    return static_cast<uint16_t>(sign | result);
  }
  uint32_t h = ((x - 0x38000000u) >> 13);  // rebias exponent 127 -> 15
  const uint32_t rem = x & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {
      float f = std::ldexp(static_cast<float>(mant), -24);
      std::memcpy(&u, &f, 4);
      u |= sign;
    }
  } else {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void ToFloat32(DataType dtype, const void* src, float* dst, size_t count) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  switch (dtype) {
    case DataType::kFloat32:
      if (count) std::memcpy(dst, src, count * 4);
      return;
    case DataType::kBFloat16:
      for (size_t i = 0; i < count; ++i) dst[i] = BFloat16ToFloat(s[i]);
      return;
    case DataType::kFloat16:
      for (size_t i = 0; i < count; ++i) dst[i] = HalfToFloat(s[i]);
      return;
  }
}

void FromFloat32(DataType dtype, const float* src, void* dst, size_t count) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  switch (dtype) {
    case DataType::kFloat32:
      if (count) std::memcpy(dst, src, count * 4);
      return;
    case DataType::kBFloat16:
      for (size_t i = 0; i < count; ++i) d[i] = FloatToBFloat16(src[i]);
      return;
    case DataType::kFloat16:
      for (size_t i = 0; i < count; ++i) d[i] = FloatToHalf(src[i]);
      return;
  }
}

}  // namespace shardtrain
