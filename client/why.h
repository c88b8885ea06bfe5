// `shardtrain why JOB`: from the flight-recorder records the ranks' last
// heartbeats carried (GetJobDiagnostics), which rank is missing from which
// collective, or, when none is stuck, which rank is the slowest. Pure: no
// I/O, unit-tested on hand-made diagnostics.
#ifndef SHARDTRAIN_CLIENT_WHY_H_
#define SHARDTRAIN_CLIENT_WHY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/v1/coordinator.pb.h"

namespace shardtrain::client {

struct WhyOptions {
  // A collective counts as stuck once a rank has been running it this long.
  int64_t stuck_after_ms = 3'000;
  // A rank's heartbeat is stale (its worker stopped or hangs) when it is
  // older than this and than 3x the freshest other rank's plus 1 s.
  int64_t stale_heartbeat_ms = 3'000;
};

enum class WhyKind {
  kNotRunning,  // the job is not RUNNING: state and failure reason say why
  kNoRecords,   // no rank has reported a collective yet
  kMissing,     // some ranks wait in `collective`, `missing` never joined it
  kSlowest,     // nothing stuck: `slowest` waited least in recent collectives
};

struct RankView {
  int rank = 0;
  std::string worker_id;
  v1::WorkerState worker_state = v1::WORKER_STATE_UNSPECIFIED;
  int64_t since_heartbeat_ms = -1;  // -1: never
  bool stale = false;               // heartbeat older than WhyOptions allows
  int64_t newest_seq = 0;           // 0: no records
  std::string newest_state;         // state of that record
  int done = 0;                     // finished collectives among the records
  double mean_wait_ms = 0;          // mean duration of those (0 when none)
};

struct WhyVerdict {
  WhyKind kind = WhyKind::kNoRecords;
  std::string summary;  // one or two lines, what the user reads first
  std::vector<RankView> ranks;
  // kMissing: the collective and who is (not) in it.
  v1::CollectiveRecord collective;
  std::vector<int> missing;
  std::vector<int> waiting;
  double waited_s = 0;  // longest wait of a waiting rank in it
  // kSlowest.
  int slowest = -1;
};

WhyVerdict AnalyzeWhy(const v1::JobDiagnostics& d, const WhyOptions& options = {});

// "1.3 MB", "512 B".
std::string HumanBytes(int64_t bytes);
// The verdict for people: the summary, then a table of the ranks.
std::string WhyText(const v1::JobDiagnostics& d, const WhyVerdict& v);
// One JSON object: {"job_id", "state", "generation", "verdict":
// "not_running"|"no_records"|"missing"|"slowest", "summary", "collective"
// (missing), "missing_ranks", "waiting_ranks", "waited_s", "slowest_rank",
// "failure_reason", "ranks": [{"rank", "worker_id", "worker_state",
// "since_heartbeat_ms", "newest_seq", "newest_state", "mean_wait_ms"}]}.
std::string WhyJson(const v1::JobDiagnostics& d, const WhyVerdict& v);

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_WHY_H_
