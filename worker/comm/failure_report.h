// Post-failure exchange shared by the backends: a failing rank publishes
// "<seq> <op>" under `<group_prefix>/fail/<rank>` and reads the other ranks'
// reports for up to `grace`. Ranks with no report (dead, hung) or, for a
// collective, a report for an earlier seq (behind) "had not arrived".
#ifndef SHARDTRAIN_WORKER_COMM_FAILURE_REPORT_H_
#define SHARDTRAIN_WORKER_COMM_FAILURE_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/comm/rendezvous_store.h"
#include "worker/comm/types.h"

namespace shardtrain::comm {

struct FailureReports {
  std::vector<int> not_arrived;      // ranks, ascending
  std::vector<std::string> reports;  // "rank 1 failed at seq 5 AllReduce"
};

FailureReports ExchangeFailureReports(RendezvousStore& store, const std::string& group_prefix,
                                      int rank, int size, uint64_t seq, OpType op,
                                      absl::Duration grace);

// The status a failed op returns: DEADLINE_EXCEEDED if `cause` was a timeout,
// else ABORTED; the message names op, seq, group, this rank, the payload,
// the elapsed time, the cause and the ranks that had not arrived.
absl::Status FailureStatus(OpType op, uint64_t seq, const std::string& group_prefix, int rank,
                           int size, size_t bytes, DataType dtype, absl::Duration elapsed,
                           const absl::Status& cause, const FailureReports& reports);

// Gloo's TCP transport writes with writev(2), so a write to a peer that just
// died raises SIGPIPE, whose default action kills this process before the
// error can be reported. Ignores it (only if nobody installed a handler).
void IgnoreSigpipe();

}  // namespace shardtrain::comm

#endif  // SHARDTRAIN_WORKER_COMM_FAILURE_REPORT_H_
