// Element types, reduction ops and op kinds shared by every collective
// backend, plus host-side fp16/bf16 <-> fp32 conversion.
#ifndef SHARDTRAIN_WORKER_COMM_TYPES_H_
#define SHARDTRAIN_WORKER_COMM_TYPES_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace shardtrain::comm {

enum class DataType { kFloat32, kBFloat16, kFloat16 };
enum class ReduceOp { kSum, kAvg, kMax };
enum class OpType {
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kSend,
  kRecv,
  kSendRecv,
  kBarrier,
};

size_t DataTypeSize(DataType dtype);
absl::string_view DataTypeName(DataType dtype);
absl::string_view ReduceOpName(ReduceOp op);
absl::string_view OpTypeName(OpType op);

// Round-to-nearest-even conversions; NaN stays NaN, overflow goes to inf.
uint16_t FloatToBFloat16(float f);
float BFloat16ToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);

// Converts `count` elements of `dtype` at `src` to fp32 at `dst`, and back.
// For kFloat32 these are memcpy.
void ToFloat32(DataType dtype, const void* src, float* dst, size_t count);
void FromFloat32(DataType dtype, const float* src, void* dst, size_t count);

}  // namespace shardtrain::comm

#endif  // SHARDTRAIN_WORKER_COMM_TYPES_H_
