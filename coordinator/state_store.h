// Durable state of the coordinator, behind a small interface so the core can
// be tested with an in-memory fake and run on SQLite for real.
//
// Records are protobuf messages stored whole (serialized): the wire types are
// the durable schema, so an acknowledged job reads back exactly as it was
// written. Every Put/Append returns only after the write is durable
// (SQLite: WAL + synchronous=FULL, one transaction per call).
//
// Thread-safety: implementations are NOT thread-safe; the coordinator calls
// them under its own mutex.
#ifndef SHARDTRAIN_COORDINATOR_STATE_STORE_H_
#define SHARDTRAIN_COORDINATOR_STATE_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shardtrain/v1/types.pb.h"

namespace shardtrain::coordinator {

// Everything the coordinator reloads after a restart.
struct StoredState {
  std::vector<v1::WorkerInfo> workers;  // by worker id
  std::vector<v1::Job> jobs;            // by submission order
  std::vector<v1::JobEvent> events;     // by (job, seq)
  std::vector<v1::StepReport> steps;    // by (job, step): the latest report of each step
  std::vector<v1::Plan> plans;          // latest plan of each job
};

// Implementations are thread-safe (calls are serialized).
class StateStore {
 public:
  virtual ~StateStore() = default;

  // Inserts or replaces the record with the same id. Durable on OK.
  virtual absl::Status PutWorker(const v1::WorkerInfo& worker) = 0;
  virtual absl::Status PutJob(const v1::Job& job) = 0;
  virtual absl::Status PutPlan(const v1::Plan& plan) = 0;
  // Stores `job` and appends `event` in one transaction, so a state change
  // and the event announcing it are never seen apart.
  virtual absl::Status PutJobWithEvent(const v1::Job& job, const v1::JobEvent& event) = 0;
  // Replaces the stored report of (job, step): history keeps one per step.
  virtual absl::Status PutStep(const v1::StepReport& step) = 0;

  // Reads everything back (used once, at start-up).
  virtual absl::StatusOr<StoredState> Load() = 0;
};

// SQLite in `dir`/state.db (created if absent). UNAVAILABLE when the file
// cannot be opened or is not a shardtrain state database.
absl::StatusOr<std::unique_ptr<StateStore>> OpenSqliteStateStore(const std::string& dir);

// Keeps everything in memory; for tests. Load() returns what was put.
std::unique_ptr<StateStore> NewMemoryStateStore();

}  // namespace shardtrain::coordinator

#endif  // SHARDTRAIN_COORDINATOR_STATE_STORE_H_
