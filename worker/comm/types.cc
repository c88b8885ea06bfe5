#include "worker/comm/types.h"

namespace shardtrain::comm {

absl::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

absl::string_view OpTypeName(OpType op) {
  switch (op) {
    case OpType::kAllReduce:
      return "AllReduce";
    case OpType::kBroadcast:
      return "Broadcast";
    case OpType::kReduce:
      return "Reduce";
    case OpType::kAllGather:
      return "AllGather";
    case OpType::kReduceScatter:
      return "ReduceScatter";
    case OpType::kSend:
      return "Send";
    case OpType::kRecv:
      return "Recv";
    case OpType::kSendRecv:
      return "SendRecv";
    case OpType::kBarrier:
      return "Barrier";
  }
  return "?";
}

}  // namespace shardtrain::comm
