// What the benchmarks that fork one process per rank share: each rank's
// world communicator, Gloo over 127.0.0.1 rendezvousing through files in a
// directory. Header-only; a benchmark including it links shardtrain_comm.
#ifndef SHARDTRAIN_BENCH_BENCH_RANKS_H_
#define SHARDTRAIN_BENCH_BENCH_RANKS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/rendezvous_store.h"

namespace shardtrain::bench {

// Rank `rank` of `world` over the store in `store_dir` (a directory every
// rank sees), its keys under `prefix`; collectives time out after
// `timeout`. Null (OK) for a world of one: the strategies take that as no
// communicator.
inline absl::StatusOr<std::unique_ptr<comm::Communicator>> LoopbackWorld(
    const std::string& store_dir, int rank, int world, const std::string& prefix,
    absl::Duration timeout = absl::Seconds(600), const std::string& group = "world") {
  if (world <= 1) return std::unique_ptr<comm::Communicator>();
  comm::GlooOptions g;
  g.hostname = "127.0.0.1";
  g.timeout = timeout;
  g.prefix = prefix;
  g.group_name = group;
  return comm::CreateGlooCommunicator(std::make_shared<comm::FileStore>(store_dir), rank, world, g);
}

}  // namespace shardtrain::bench

#endif  // SHARDTRAIN_BENCH_BENCH_RANKS_H_
