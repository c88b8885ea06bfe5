// Mesh: one rank's communicators of the data × context × tensor × pipeline
// mesh (common/parallel_dims.h), split once from the world communicator
// when a job starts:
//   dp           the ranks that differ only in the dp coordinate;
//   cp           the ranks that differ only in cp: context parallelism's
//                ring (parallel/context_parallel_group.h);
//   replica      the ranks that differ in dp or cp: gradient all-reduce /
//                ZeRO shards (the strategies in this folder) — dp itself
//                when cp = 1;
//   ep           the ranks of a replica group that split an MoE layer's
//                experts (ParallelDims' kEp: only when parallel.ep > 1);
//   expert_dp    the ranks holding the same experts (kExpertDp): their
//                gradients' sum (only when dp · cp > ep > 1);
//   tp           the ranks that differ only in tp: tensor-parallel layers;
//   pp           the pipeline group (its collectives: sums over stages);
//   pp_prev      this stage and the previous one (rank 1 of 2): the
//                activations that arrive and the gradients sent back;
//   pp_next      this stage and the next one (rank 0 of 2): the activations
//                sent on and the gradients that come back;
//   act_in, act_out, grad_in, grad_out
//                an interleaved pipeline's one-way channels (only when
//                created with chunks > 1): activations from the previous
//                stage (stage 0: from the last) and to the next (the last:
//                to stage 0), gradients back the other way; the sender is
//                rank 0 of each (pipeline.h says why one-way);
//   tied         the first and last stage of a pipeline (same dp and tp):
//                the gradients of the tied token embedding (the LM head on
//                the last stage, the encoder on the first).
// One communicator per neighbour pair carries both directions, as
// Megatron-LM's p2p does: each communicator runs its ops one at a time, so
// the pipeline groups a send to a neighbour with the receive from it that
// its next action needs into one SendRecv (pipeline.h); two ranks never
// wait on each other's queued ops, and on NCCL both directions of a pair
// share one communicator's order on the device.
//
// Every accessor returns nullptr for a group of one rank (dp == 1, cp == 1,
// tp == 1, pp == 1; replica when dp · cp == 1; tied when pp == 1 or on a
// middle stage; pp_prev on the first stage, pp_next on the last): the
// strategies treat a
// null communicator as a group of one. Ranks within a group are ordered by
// that coordinate (rank i of the dp group has dp coordinate i; the stage
// index is the rank in `pp`, the lower stage is rank 0 of a pair, and the
// first stage is rank 0 of `tied`).
//
// Thread-compatible: built once, then read-only; the communicators follow
// their own rules (worker/comm/communicator.h).
#ifndef SHARDTRAIN_WORKER_PARALLEL_MESH_H_
#define SHARDTRAIN_WORKER_PARALLEL_MESH_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/parallel_dims.h"
#include "worker/comm/communicator.h"

namespace shardtrain::parallel {

class Mesh {
 public:
  // Collective over `world` (not owned; nullptr when dims.world() == 1): every
  // rank must call it, with the same dims, before any other Split on `world`.
  // It splits, in this order, dp, tp, pp, the pairs from even stages
  // ((0, 1), (2, 3), ...), the pairs from odd stages ((1, 2), ...; only when
  // pp > 2), the channels (only with chunks > 1, below), tied, cp and
  // replica (only when cp > 1), ep and expert_dp (only when ep > 1), skipping
  // the kinds whose groups have one rank (the same on every rank);
  // each split implicitly synchronises the ranks of the world. Colour = the
  // index of this rank's group in ParallelDims::Groups(kind), key = its
  // coordinate. INVALID_ARGUMENT when `world` does not match dims (size,
  // rank, null); Split's errors as they come (DEADLINE_EXCEEDED when a peer
  // never joins, the world poisoned after that).
  // chunks > 1 (parallel.pp_virtual, with pp > 1): after the pairs it also
  // splits the channels, activations then gradients, each in two rounds of
  // the ring's edges (three when pp is odd, the edge from the last stage to
  // stage 0 in the third).
  static absl::StatusOr<std::unique_ptr<Mesh>> Create(const ParallelDims& dims, int rank,
                                                      comm::Communicator* world, int chunks = 1);

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
  comm::Communicator* ep() const { return ep_.get(); }
  comm::Communicator* expert_dp() const { return expert_dp_.get(); }
  comm::Communicator* tp() const { return tp_.get(); }
  comm::Communicator* pp() const { return pp_.get(); }
  comm::Communicator* pp_prev() const { return pp_prev_.get(); }
  comm::Communicator* pp_next() const { return pp_next_.get(); }
  comm::Communicator* tied() const { return tied_.get(); }
  comm::Communicator* act_in() const { return act_in_; }
  comm::Communicator* act_out() const { return act_out_; }
  comm::Communicator* grad_in() const { return grad_in_; }
  comm::Communicator* grad_out() const { return grad_out_; }

  // Gives the channels back in the reverse of the order they were split,
  // the same on every rank (a communicator's shutdown waits for its peer's).
  ~Mesh();

 private:
  Mesh(const ParallelDims& dims, int rank) : dims_(dims), rank_(rank), coord_(dims.Coord(rank)) {}

  ParallelDims dims_;
  int rank_;
  MeshCoord coord_;
  std::unique_ptr<comm::Communicator> dp_, tp_, pp_, pp_prev_, pp_next_, tied_, cp_, replica_, ep_,
      expert_dp_;
  // The channels in split order; act_in_ .. grad_out_ point into it.
  std::vector<std::unique_ptr<comm::Communicator>> channels_;
  comm::Communicator *act_in_ = nullptr, *act_out_ = nullptr, *grad_in_ = nullptr,
                     *grad_out_ = nullptr;
};

}  // namespace shardtrain::parallel

#endif  // SHARDTRAIN_WORKER_PARALLEL_MESH_H_
