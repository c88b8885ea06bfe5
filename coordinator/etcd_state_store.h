// The coordinator's durable state in etcd (`shardtrain-coordinator --state
// etcd://...`): the same records as the SQLite store (state_store.h), so
// that a coordinator on another machine has all of it.
//
// Keys, under the options' prefix (default /shardtrain/):
//   schema                     "shardtrain.v1"
//   fencing.key                the key lease tokens derive from (EtcdFencingKey)
//   workers/<id>               v1::WorkerInfo
//   jobs/<id>                  v1::Job
//   plans/<job>                v1::Plan
//   events/<job>/<seq>         v1::JobEvent   (seq and step: 20 digits, so
//   steps/<job>/<step>         v1::StepReport  keys sort as numbers do)
// A record larger than etcd's request limit (kEtcdMaxValueBytes) is written
// as parts in the same Txn: its key then holds "\0" and the part count, the
// parts live at <key>\1<index>. A job and its event are one Txn.
//
// Growth: every step adds one StepReport (~200 bytes) and one event; etcd
// keeps old revisions until compacted (run etcd with
// --auto-compaction-retention) within its 2 GiB default quota.
#ifndef SHARDTRAIN_COORDINATOR_ETCD_STATE_STORE_H_
#define SHARDTRAIN_COORDINATOR_ETCD_STATE_STORE_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/etcd_client.h"
#include "coordinator/fencing.h"
#include "coordinator/state_store.h"

namespace shardtrain::coordinator {

// A leader's writes: each guarded by its leader key (etcd_election.h);
// `fenced` is called (once per refused write) when etcd refused one because
// the key is gone.
struct EtcdWriteGuard {
  EtcdLeaderKey leader;
  std::function<void(const std::string& why)> fenced;
};

// Connects and checks the schema (writing it into an empty prefix).
// UNAVAILABLE naming the endpoints when no member answers; FAILED_PRECONDITION
// when the prefix holds another schema. With `guard`, every record write
// commits only while the guard's leader key exists: otherwise nothing is
// written, `fenced` is called and the write answers UNAVAILABLE with
// kCoordinatorStandby, so clients go to the new leader.
absl::StatusOr<std::unique_ptr<StateStore>> OpenEtcdStateStore(
    const EtcdOptions& options, std::optional<EtcdWriteGuard> guard = std::nullopt);

// The fencing key every coordinator on this etcd shares: the one stored
// there, or a fresh one stored by the first coordinator to ask.
absl::StatusOr<FencingKey> EtcdFencingKey(const EtcdOptions& options);

}  // namespace shardtrain::coordinator

#endif  // SHARDTRAIN_COORDINATOR_ETCD_STATE_STORE_H_
