#include "worker/comm/failure_report.h"

#include <signal.h>

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace shardtrain::comm {

FailureReports ExchangeFailureReports(RendezvousStore& store, const std::string& group_prefix,
                                      int rank, int size, uint64_t seq, OpType op,
                                      absl::Duration grace) {
  const std::string prefix = absl::StrCat(group_prefix, "/fail/");
  store.Set(absl::StrCat(prefix, rank), absl::StrCat(seq, " ", OpTypeName(op))).IgnoreError();
  const bool collective = op != OpType::kSend && op != OpType::kRecv && op != OpType::kSendRecv;
  FailureReports out;
  const absl::Time deadline = absl::Now() + grace;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    absl::StatusOr<std::string> v =
        store.Get(absl::StrCat(prefix, r), std::max(absl::ZeroDuration(), deadline - absl::Now()));
    if (!v.ok()) {
      out.not_arrived.push_back(r);
      continue;
    }
    out.reports.push_back(absl::StrCat("rank ", r, " failed at seq ", *v));
    std::vector<std::string> parts = absl::StrSplit(*v, ' ');
    uint64_t their_seq = 0;
    if (collective && absl::SimpleAtoi(parts[0], &their_seq) && their_seq < seq) {
      out.not_arrived.push_back(r);
    }
  }
  return out;
}

absl::Status FailureStatus(OpType op, uint64_t seq, const std::string& group_prefix, int rank,
                           int size, size_t bytes, DataType dtype, absl::Duration elapsed,
                           const absl::Status& cause, const FailureReports& reports) {
  std::string msg = absl::StrCat(OpTypeName(op), " seq=", seq, " group=", group_prefix, " (rank ",
                                 rank, " of ", size, ", ", bytes, " bytes ", DataTypeName(dtype),
                                 ") failed after ", absl::FormatDuration(elapsed), ": ",
                                 cause.message(), "; ranks not arrived (dead, hung or behind): [",
                                 absl::StrJoin(reports.not_arrived, ","), "]");
  if (!reports.reports.empty()) {
    absl::StrAppend(&msg, "; peer reports: ", absl::StrJoin(reports.reports, "; "));
  }
  return absl::Status(cause.code() == absl::StatusCode::kDeadlineExceeded
                          ? absl::StatusCode::kDeadlineExceeded
                          : absl::StatusCode::kAborted,
                      msg);
}

void IgnoreSigpipe() {
  struct sigaction old {};
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL &&
      !(old.sa_flags & SA_SIGINFO)) {
    signal(SIGPIPE, SIG_IGN);
  }
}

}  // namespace shardtrain::comm
