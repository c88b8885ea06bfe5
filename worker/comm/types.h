// Reduction ops and op kinds shared by every collective backend; the
// element types and their host conversions are common/dtype.h's, named here
// too for the collectives' code.
#ifndef SHARDTRAIN_WORKER_COMM_TYPES_H_
#define SHARDTRAIN_WORKER_COMM_TYPES_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "common/dtype.h"

namespace shardtrain::comm {

using ::shardtrain::BFloat16ToFloat;
using ::shardtrain::DataType;
using ::shardtrain::DataTypeName;
using ::shardtrain::DataTypeSize;
using ::shardtrain::FloatToBFloat16;
using ::shardtrain::FloatToHalf;
using ::shardtrain::FromFloat32;
using ::shardtrain::HalfToFloat;
using ::shardtrain::ToFloat32;

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
  kAllToAllV,
};

absl::string_view ReduceOpName(ReduceOp op);
absl::string_view OpTypeName(OpType op);

}  // namespace shardtrain::comm

#endif  // SHARDTRAIN_WORKER_COMM_TYPES_H_
