// ParallelDims: the data × context × tensor × pipeline mesh of a job, as one
// validated value (torchtitan's ParallelDims): dp · cp · tp · pp == world,
// each factor >= 1, checked once where the value is made, with errors naming
// every factor.
// Everything that needs a rank's place in the mesh or the members of its
// groups — the planner, the scheduler, the job runner, step aggregation —
// asks this value instead of recomputing the layout.
//
// Layout (Megatron's order): tp fastest, then cp, then dp, then pp:
//   rank = ((pp_i · dp + dp_i) · cp + cp_i) · tp + tp_i
// so a tensor-parallel group is contiguous, a context-parallel group strides
// by tp, a data-parallel group by tp · cp, and a pipeline group by
// tp · cp · dp. With cp = 1 (the default) the layout is the dp × tp × pp one.
//
// Expert parallelism (ep) is carved out of the replica group, not added to
// the world (torchtitan's and DeepSpeed's rule): ep divides dp · cp, and the
// replica group's ranks [b·ep, (b+1)·ep) in ReplicaIndex order form an ep
// group (kEp: they split an MoE layer's experts and exchange tokens), the
// ranks with the same ReplicaIndex % ep an expert-data-parallel group
// (kExpertDp, dp · cp / ep ranks: the experts' gradients are summed over
// it, as the dense ones over the replica group).
//
// Context parallelism (cp) splits each sequence over cp ranks that see the
// same sequences (the same dp coordinate): their parameters are replicated,
// so gradients are summed over the ranks that differ in dp or cp — the
// `replica` group, dp · cp ranks, over which DDP reduces and ZeRO shards.
//
// Also here, the rules that tie the mesh to a model and to a batch:
//   CheckModelFits   tp divides model.heads, model.kv_heads, the MLP width
//                    (4·dim, or model.ffn_dim), the experts' (MoE) and the
//                    padded vocabulary Vp; ep divides the experts (and
//                    ep > 1 only with MoE layers)
//                    (tensor parallelism splits heads, MLP rows and
//                    vocabulary rows); pp <= model.layers;
//   CheckSequence    2·cp divides batch.seq_len (each cp rank holds two of
//                    its 2·cp chunks: model::ContextChunks);
//   CheckZero        ZeRO-3 only without a pipeline (pp = 1);
//   SplitBatch       global = micro × dp × accumulation.
//
// Thread-compatible: an immutable value.
#ifndef SHARDTRAIN_COMMON_PARALLEL_DIMS_H_
#define SHARDTRAIN_COMMON_PARALLEL_DIMS_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/config.h"

namespace shardtrain {

// A rank's coordinates in the mesh.
struct MeshCoord {
  int dp = 0, tp = 0, pp = 0, cp = 0;
};
bool operator==(const MeshCoord& a, const MeshCoord& b);

// The kinds of group a rank belongs to: the ranks that differ from it only
// in that coordinate; kReplica, only in dp or cp (dp · cp ranks, ordered by
// dp · cp_size + cp: the group gradients are reduced and ZeRO-sharded over).
enum class GroupKind { kDp, kTp, kPp, kCp, kReplica, kEp, kExpertDp };
// "dp", "tp", "pp", "cp", "replica", "ep", "expert_dp"
std::string_view GroupKindName(GroupKind kind);

// The largest world a job may ask for: 2^20 ranks, far above any cluster
// yet small enough that per-rank and per-stage tables built from a spec
// (the pipeline's stage split, the plan) stay megabytes and milliseconds.
inline constexpr int64_t kMaxWorld = int64_t{1} << 20;

class ParallelDims {
 public:
  // The four factors, by name (cp = 1: no context parallelism).
  // ep: expert parallelism within dp · cp (1: none; not a factor of world).
  struct Factors {
    int dp = 1, cp = 1, tp = 1, pp = 1, ep = 1;
  };
  // INVALID_ARGUMENT when a factor is < 1 ("parallel.tp: must be >= 1, got
  // 0") or the product is not `world` ("parallel.dp × parallel.cp ×
  // parallel.tp × parallel.pp = 2 × 1 × 1 × 3 = 6 ≠ world 4"); every problem
  // found, joined by "; ".
  static absl::StatusOr<ParallelDims> Create(const Factors& f, int world);
  // The mesh of a job that takes exactly dp · cp · tp · pp ranks.
  static absl::StatusOr<ParallelDims> Create(const Factors& f);
  // The same without context parallelism (cp = 1).
  static absl::StatusOr<ParallelDims> Create(int dp, int tp, int pp, int world) {
    return Create(Factors{dp, 1, tp, pp}, world);
  }
  static absl::StatusOr<ParallelDims> Create(int dp, int tp, int pp) {
    return Create(Factors{dp, 1, tp, pp});
  }

  int dp() const { return dp_; }
  int cp() const { return cp_; }
  int tp() const { return tp_; }
  int pp() const { return pp_; }
  int ep() const { return ep_; }
  int world() const { return dp_ * cp_ * tp_ * pp_; }
  // Ranks that hold one replica's gradients: dp · cp.
  int replicas() const { return dp_ * cp_; }
  Factors factors() const { return Factors{dp_, cp_, tp_, pp_, ep_}; }
  // A rank's index in its kReplica group: dp · cp() + cp.
  int ReplicaIndex(const MeshCoord& c) const { return c.dp * cp_ + c.cp; }
  // Its index in its kEp group (the slice of the experts it holds), and in
  // its kExpertDp group.
  int EpRank(const MeshCoord& c) const { return ReplicaIndex(c) % ep_; }
  int ExpertDpRank(const MeshCoord& c) const { return ReplicaIndex(c) / ep_; }

  // Precondition: 0 <= rank < world() (aborts otherwise: a programming error).
  MeshCoord Coord(int rank) const;
  // Precondition: each coordinate within its factor.
  int Rank(const MeshCoord& c) const;

  // The ranks of `rank`'s group of `kind`, in the order of that coordinate
  // (so a rank's index in its dp group is its dp coordinate).
  std::vector<int> Group(GroupKind kind, int rank) const;
  // Every group of `kind`, numbered in rank order of their first members.
  std::vector<std::vector<int>> Groups(GroupKind kind) const;

  bool IsFirstStage(int rank) const { return Coord(rank).pp == 0; }
  bool IsLastStage(int rank) const { return Coord(rank).pp == pp_ - 1; }
  // True for the one rank per data-parallel replica that speaks for it in
  // step reports: the loss is computed on the last pipeline stage (and
  // identical across its tp ranks, and averaged over its cp ranks by the
  // trainer), so the rank with tp = 0 and cp = 0 there.
  bool SpeaksForReplica(int rank) const;

  // The mesh against a model's shape: tp divides model.heads, the MLP
  // width 4·dim and the padded vocabulary Vp = model::PaddedVocab(vocab)
  // (the vocabulary-parallel embedding and cross-entropy split its rows);
  // pp does not exceed model.layers. INVALID_ARGUMENT naming the field first
  // ("parallel.tp: 3 does not divide model.heads: 4", "parallel.tp: 3 does
  // not divide the padded vocabulary 256 (model.vocab 256 rounded up to a
  // multiple of 64)"), every problem found joined by "; ".
  absl::Status CheckModelFits(const model::ModelConfig& config) const;

  // The mesh against a ZeRO stage: ZeRO-3 is refused with a pipeline (pp >
  // 1). ZeRO-3 gathers a unit's parameters around each use; a pipeline stage
  // interleaves the forwards and backwards of its micro-batches, so its
  // units would be gathered again for every micro-batch. INVALID_ARGUMENT
  // naming parallel.zero and parallel.pp.
  absl::Status CheckZero(int zero) const;

  // The mesh against the sequence length: 2·cp divides batch.seq_len (each
  // cp rank holds chunks r and 2·cp − 1 − r of 2·cp, for causal attention's
  // balance). INVALID_ARGUMENT naming parallel.cp and batch.seq_len.
  absl::Status CheckSequence(int seq_len) const;

  // The same mesh with another data-parallel degree (elastic recovery).
  absl::StatusOr<ParallelDims> WithDp(int dp) const { return Create(Factors{dp, cp_, tp_, pp_}); }

 private:
  explicit ParallelDims(const Factors& f) : dp_(f.dp), cp_(f.cp), tp_(f.tp), pp_(f.pp), ep_(f.ep) {}
  int dp_, cp_, tp_, pp_, ep_;
};

// How one optimizer step's batch is split: global = micro × dp × accum.
struct BatchSplit {
  int global = 0;  // sequences per optimizer step
  int micro = 0;   // sequences per forward/backward on one rank
  int dp = 0;      // data-parallel replicas
  int accum = 0;   // micro-batches per step on each replica (gradient accumulation)

  // Sequences one replica processes per step, and the first of them within
  // the step's global batch (replica d owns [d·per_replica, (d+1)·per_replica)).
  int per_replica() const { return micro * accum; }
  int first_sample(int dp_rank) const { return dp_rank * per_replica(); }
};
// INVALID_ARGUMENT naming the fields ("batch.global: 12 is not divisible by
// batch.micro × parallel.dp = 2 × 4 = 8 (global = micro × dp × gradient
// accumulation steps)") unless each is >= 1 and global % (micro·dp) == 0.
absl::StatusOr<BatchSplit> SplitBatch(int global, int micro, int dp);

}  // namespace shardtrain

#endif  // SHARDTRAIN_COMMON_PARALLEL_DIMS_H_
