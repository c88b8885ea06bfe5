// Mesh: one rank's communicators of the data × context × tensor × pipeline
// mesh (common/parallel_dims.h), split once from the world communicator
// when a job starts:
//   dp           the ranks that differ only in the dp coordinate;
//   cp           the ranks that differ only in cp: context parallelism's
//                ring (parallel/context_parallel_group.h);
//   replica      the ranks that differ in dp or cp: gradient all-reduce /
//                ZeRO shards (the strategies in this folder) — dp itself
//                when cp = 1;
//   tp           the ranks that differ only in tp: tensor-parallel layers;
//   pp_forward   the pipeline group, for activations sent to the next stage;
//   pp_backward  the same ranks, for gradients sent to the previous stage;
//   tied         the first and last stage of a pipeline (same dp and tp):
//                the gradients of the tied token embedding (the LM head on
//                the last stage, the encoder on the first).
// Two pipeline communicators because each communicator runs its ops one at
// a time on its own op thread, and a Gloo Send completes only once the peer
// posted the matching Recv: with one communicator, a stage's Recv of the
// gradient its next backward needs would queue behind its Send of an
// activation that the next stage only receives later, serialising the two
// directions (and, under 1F1B, risking a wait cycle). Separate
// communicators give each direction its own queue.
//
// Every accessor returns nullptr for a group of one rank (dp == 1, cp == 1,
// tp == 1, pp == 1; replica when dp · cp == 1; tied when pp == 1 or on a
// middle stage): the strategies treat a
// null communicator as a group of one. Ranks within a group are ordered by
// that coordinate (rank i of the dp group has dp coordinate i; the stage
// index is the rank in the pipeline groups, and the first stage is rank 0 of
// `tied`).
//
// Thread-compatible: built once, then read-only; the communicators follow
// their own rules (worker/comm/communicator.h).
#ifndef SHARDTRAIN_WORKER_PARALLEL_MESH_H_
#define SHARDTRAIN_WORKER_PARALLEL_MESH_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/parallel_dims.h"
#include "worker/comm/communicator.h"

namespace shardtrain::parallel {

class Mesh {
 public:
  // Collective over `world` (not owned; nullptr when dims.world() == 1): every
  // rank must call it, with the same dims, before any other Split on `world`.
  // It splits, in this order, dp, tp, pp_forward, pp_backward, tied, cp and
  // replica (the last two only when cp > 1), skipping the kinds whose
  // groups have one rank (the same on every rank);
  // each split implicitly synchronises the ranks of the world. Colour = the
  // index of this rank's group in ParallelDims::Groups(kind), key = its
  // coordinate. INVALID_ARGUMENT when `world` does not match dims (size,
  // rank, null); Split's errors as they come (DEADLINE_EXCEEDED when a peer
  // never joins, the world poisoned after that).
  static absl::StatusOr<std::unique_ptr<Mesh>> Create(const ParallelDims& dims, int rank,
                                                      comm::Communicator* world);

  const ParallelDims& dims() const { return dims_; }
  int rank() const { return rank_; }
  const MeshCoord& coord() const { return coord_; }
  int stage() const { return coord_.pp; }
  int stages() const { return dims_.pp(); }
  // This stage's neighbours, as ranks within the pipeline communicators; -1
  // at the ends.
  int prev_stage() const { return coord_.pp > 0 ? coord_.pp - 1 : -1; }
  int next_stage() const { return coord_.pp + 1 < dims_.pp() ? coord_.pp + 1 : -1; }

  comm::Communicator* dp() const { return dp_.get(); }
  comm::Communicator* cp() const { return cp_.get(); }
  comm::Communicator* replica() const { return dims_.cp() > 1 ? replica_.get() : dp_.get(); }
  comm::Communicator* tp() const { return tp_.get(); }
  comm::Communicator* pp_forward() const { return pp_forward_.get(); }
  comm::Communicator* pp_backward() const { return pp_backward_.get(); }
  comm::Communicator* tied() const { return tied_.get(); }

 private:
  Mesh(const ParallelDims& dims, int rank) : dims_(dims), rank_(rank), coord_(dims.Coord(rank)) {}

  ParallelDims dims_;
  int rank_;
  MeshCoord coord_;
  std::unique_ptr<comm::Communicator> dp_, tp_, pp_forward_, pp_backward_, tied_, cp_, replica_;
};

}  // namespace shardtrain::parallel

#endif  // SHARDTRAIN_WORKER_PARALLEL_MESH_H_
