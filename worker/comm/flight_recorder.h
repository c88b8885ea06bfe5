// FlightRecorder: the last N collectives a communicator ran, for post-mortem
// debugging of hangs and failures ("which op, which seq, which group, who was
// missing"). Thread-safe: the comm thread writes, anyone may Dump().
#ifndef SHARDTRAIN_WORKER_COMM_FLIGHT_RECORDER_H_
#define SHARDTRAIN_WORKER_COMM_FLIGHT_RECORDER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/comm/types.h"

namespace shardtrain::comm {

enum class OpState { kQueued, kRunning, kDone, kFailed };
absl::string_view OpStateName(OpState state);

struct FlightRecord {
  uint64_t seq = 0;  // per-communicator, from 1, in submission order
  OpType op = OpType::kBarrier;
  std::string group;  // communicator group name
  size_t bytes = 0;   // payload bytes this rank contributes
  DataType dtype = DataType::kFloat32;
  int peer = -1;  // root (Broadcast/Reduce) or peer (Send/Recv)
  absl::Time enqueue_time = absl::InfinitePast();
  absl::Time start_time = absl::InfinitePast();  // InfinitePast: not started
  absl::Time end_time = absl::InfinitePast();    // InfinitePast: not ended
  OpState state = OpState::kQueued;
  std::string error;  // set when state == kFailed
};

class FlightRecorder {
 public:
  explicit FlightRecorder(size_t capacity);

  // Appends a queued record; overwrites the oldest when full.
  void Queued(const FlightRecord& record);
  void Running(uint64_t seq);
  void Done(uint64_t seq);
  void Failed(uint64_t seq, absl::string_view error);

  // The retained records, oldest first.
  std::vector<FlightRecord> Dump() const;
  // One line per record, oldest first, e.g.
  // "seq=12 AllReduce group=world bytes=4000 fp32 peer=-1 state=failed
  //  queued=... ran=3001.2ms error=...".
  std::string DumpText() const;

  size_t capacity() const { return capacity_; }

 private:
  FlightRecord* Find(uint64_t seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::vector<FlightRecord> ring_ ABSL_GUARDED_BY(mu_);
  uint64_t next_index_ ABSL_GUARDED_BY(mu_) = 0;  // total records appended
};

}  // namespace shardtrain::comm

#endif  // SHARDTRAIN_WORKER_COMM_FLIGHT_RECORDER_H_
