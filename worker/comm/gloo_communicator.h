// Gloo backend of Communicator: CPU buffers, TCP transport.
//
// Construction performs the rendezvous (connectFullMesh) through a
// RendezvousStore under the key prefix `<options.prefix>/<group_name>`, so
// one store can serve many jobs, generations and sub-groups.
//
// Execution: one communication thread per communicator runs ops in FIFO
// order (deterministic; async ops overlap with the caller's compute). Every
// op carries a timeout. An op with OpArgs::after first waits for that event
// on this thread (its timeout covers the wait); Work::BlockStream is a host
// wait (the default of Work).
//
// Algorithms:
//   AllReduce     ring reduce-scatter + ring all-gather over unbound buffers
//                 (every 1 MiB segment of a step in flight at once); measured
//                 faster than gloo::allreduce on loopback (bench), which stays
//                 selectable via GlooOptions::allreduce_algorithm.
//   AllGather     ring over unbound buffers, received in place.
//   Broadcast     pipelined chain from the root over unbound buffers.
//   Reduce        gloo::reduce; Barrier gloo::barrier (these two cannot be
//                 aborted early by the peer watcher; they fail at timeout).
//   ReduceScatter a ring built from unbound send/recv (n-1 steps, each step
//                 pipelined in 1 MiB segments, reducing segment j while
//                 segment j+1 is in flight); fp32 input is read in place and
//                 the last step writes straight into the output. No legacy
//                 Gloo algorithm ever runs on the context (they slow later
//                 collectives 40-70x).
//   Send/Recv     unbound buffers; pairs match per (peer, tag) in order.
// fp16 / bf16: reductions (AllReduce, Reduce, ReduceScatter) convert to an
// fp32 scratch buffer, reduce in fp32 on the wire, and round back once at the
// end (so 16-bit inputs cost fp32 bandwidth but lose no precision to
// intermediate rounding). Broadcast, AllGather and Send/Recv move the 16-bit
// bytes unchanged. Avg = fp32 sum scaled by 1/size.
//
// Failure: on a Gloo exception or timeout the communicator (1) closes its
// connections so peers blocked on it fail at once and bumps the store
// counter `<prefix>/<group>/failures`, which a watcher thread of every other
// rank polls while an op runs longer than peer_failure_poll_interval and
// which aborts their pending waits (Gloo itself never fails a send that
// waits for a dead peer's recv-ready message), (2) writes
// `<prefix>/<group>/fail/<rank>` = "<seq> <op>" to the store and reads the
// other ranks' reports for up to `failure_report_grace`, (3) returns a status
// naming the op, seq, group and the ranks that had not arrived at that seq
// (no report, or a report for an earlier seq), (4) logs the flight recorder
// to stderr and (5) poisons itself.
#ifndef SHARDTRAIN_WORKER_COMM_GLOO_COMMUNICATOR_H_
#define SHARDTRAIN_WORKER_COMM_GLOO_COMMUNICATOR_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"
#include "worker/comm/rendezvous_store.h"

namespace gloo::transport {
class Device;
}  // namespace gloo::transport

namespace shardtrain::comm {

struct GlooOptions {
  // Address the TCP transport binds to and advertises (never resolved from
  // the machine's hostname).
  std::string hostname = "127.0.0.1";
  // Default timeout of every op, of the rendezvous and of Split.
  absl::Duration timeout = absl::Seconds(30);
  // Store namespace of this job and generation, e.g. "job42/gen3".
  std::string prefix = "default";
  // Name of the group; sub-groups get "<parent>.split<k>.c<color>".
  std::string group_name = "world";
  // Number of ops the flight recorder keeps.
  size_t flight_recorder_capacity = 256;
  // While an op runs longer than this, the rank polls the group's failure
  // counter in the store at this interval (one Get per interval, only during
  // long ops) so that a failure elsewhere aborts it early.
  absl::Duration peer_failure_poll_interval = absl::Milliseconds(100);
  // Failure counters of enclosing groups (store keys) that this group also
  // watches and bumps: Split adds its parent's (and so every ancestor's), so
  // that a failure in one sub-group of a mesh aborts the ranks blocked in
  // the others — they may not share a group with the failed rank at all.
  std::vector<std::string> failure_domains;
  // How long a failing rank waits for the others' failure reports.
  absl::Duration failure_report_grace = absl::Seconds(1);
  // kRing: our ring (reduce-scatter + all-gather over unbound buffers, all
  // segments of a step in flight). kGlooRing: gloo::allreduce (kept for
  // comparison in bench/collective_bench).
  enum class AllreduceAlgorithm { kRing, kGlooRing };
  AllreduceAlgorithm allreduce_algorithm = AllreduceAlgorithm::kRing;
  // Log the status and the flight recorder to stderr on failure.
  bool dump_on_failure = true;
};

// Creates the communicator of `rank` in a group of `size` (blocking until all
// ranks have joined, or DEADLINE_EXCEEDED after options.timeout).
// Side effect: sets SIGPIPE to SIG_IGN if it still has the default action
// (Gloo writes to sockets with writev; a dead peer would otherwise kill this
// process with SIGPIPE instead of failing the collective).
// `store` is shared with sub-groups and must stay valid while any of them
// exists. Errors: INVALID_ARGUMENT (rank/size), UNAVAILABLE (transport),
// DEADLINE_EXCEEDED (peers did not join).
absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(
    std::shared_ptr<RendezvousStore> store, int rank, int size, const GlooOptions& options);

// As above, reusing an existing TCP device (one per process is enough).
absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(
    std::shared_ptr<RendezvousStore> store, int rank, int size, const GlooOptions& options,
    std::shared_ptr<gloo::transport::Device> device);

}  // namespace shardtrain::comm

#endif  // SHARDTRAIN_WORKER_COMM_GLOO_COMMUNICATOR_H_
