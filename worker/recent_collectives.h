// RecentCollectives: the flight recorder of the rank a daemon runs, readable
// from the heartbeat thread, so that heartbeats carry what the rank's
// collectives are doing (`shardtrain why`) without waiting on training.
//
// Thread-safe. The job thread attaches its communicator's recorder (and
// detaches it before destroying the communicator); the heartbeat thread
// snapshots. FlightRecorder::Dump is itself safe against the comm thread and
// holds its lock only to copy the ring, so a snapshot never waits on a
// collective.
#ifndef SHARDTRAIN_WORKER_RECENT_COLLECTIVES_H_
#define SHARDTRAIN_WORKER_RECENT_COLLECTIVES_H_

#include <cstddef>
#include <mutex>
#include <vector>

#include "shardtrain/v1/types.pb.h"
#include "worker/comm/flight_recorder.h"

namespace shardtrain::worker {

// The wire form of one flight-recorder record (start_ms/end_ms: Unix ms, 0
// when not started / not ended).
v1::CollectiveRecord ToCollectiveRecord(const comm::FlightRecord& f);

class RecentCollectives {
 public:
  // The most records a heartbeat carries.
  static constexpr size_t kMaxRecords = 16;

  // `recorder` must stay alive until Detach() returns.
  void Attach(const comm::FlightRecorder* recorder);
  // After it returns no snapshot reads the recorder any more.
  void Detach();
  // The newest `max` records, oldest first; empty when nothing is attached.
  std::vector<v1::CollectiveRecord> Snapshot(size_t max = kMaxRecords) const;

 private:
  mutable std::mutex mu_;
  const comm::FlightRecorder* recorder_ = nullptr;  // GUARDED_BY(mu_)
};

// Attaches a recorder for its scope (nothing when either pointer is null).
class ScopedRecorderAttach {
 public:
  ScopedRecorderAttach(RecentCollectives* recent, const comm::FlightRecorder* recorder);
  ~ScopedRecorderAttach();
  ScopedRecorderAttach(const ScopedRecorderAttach&) = delete;
  ScopedRecorderAttach& operator=(const ScopedRecorderAttach&) = delete;

 private:
  RecentCollectives* const recent_;
};

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_RECENT_COLLECTIVES_H_
