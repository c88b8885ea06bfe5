#include "worker/comm/types.h"

#include "common/enum_names.h"

namespace shardtrain::comm {

absl::string_view ReduceOpName(ReduceOp op) {
  static constexpr absl::string_view kNames[] = {"sum", "avg", "max"};
  return NameIn(kNames, op);
}

absl::string_view OpTypeName(OpType op) {
  static constexpr absl::string_view kNames[] = {
      "AllReduce", "Broadcast", "Reduce",   "AllGather", "ReduceScatter",
      "Send",      "Recv",      "SendRecv", "Barrier",   "AllToAllV"};
  return NameIn(kNames, op);
}

}  // namespace shardtrain::comm
