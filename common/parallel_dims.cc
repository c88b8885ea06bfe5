#include "common/parallel_dims.h"

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/enum_names.h"
#include "common/model/config.h"

namespace shardtrain {

bool operator==(const MeshCoord& a, const MeshCoord& b) {
  return a.dp == b.dp && a.tp == b.tp && a.pp == b.pp && a.cp == b.cp;
}

std::string_view GroupKindName(GroupKind kind) {
  static constexpr std::string_view kNames[] = {"dp",      "tp", "pp",       "cp",
                                                "replica", "ep", "expert_dp"};
  return NameIn(kNames, kind);
}

absl::StatusOr<ParallelDims> ParallelDims::Create(const Factors& f, int world) {
  std::vector<std::string> problems;
  for (auto [field, v] : {std::pair<const char*, int>{"parallel.dp", f.dp},
                          {"parallel.cp", f.cp},
                          {"parallel.tp", f.tp},
                          {"parallel.pp", f.pp},
                          {"parallel.ep", f.ep}}) {
    if (v < 1) problems.push_back(absl::StrCat(field, ": must be >= 1, got ", v));
  }
  if (problems.empty() && (int64_t{f.dp} * f.cp) % f.ep != 0) {
    problems.push_back(absl::StrCat("parallel.ep: ", f.ep,
                                    " does not divide parallel.dp × parallel.cp = ", f.dp, " × ",
                                    f.cp, " = ", int64_t{f.dp} * f.cp,
                                    " (expert parallelism splits the experts over ranks of the "
                                    "data-parallel replicas)"));
  }
  // Without cp the message names the three factors it always named.
  const std::string names = f.cp == 1 ? "parallel.dp × parallel.tp × parallel.pp"
                                      : "parallel.dp × parallel.cp × parallel.tp × parallel.pp";
  const std::string values = f.cp == 1 ? absl::StrCat(f.dp, " × ", f.tp, " × ", f.pp)
                                       : absl::StrCat(f.dp, " × ", f.cp, " × ", f.tp, " × ", f.pp);
  const int64_t product = int64_t{f.dp} * f.cp * f.tp * f.pp;
  if (problems.empty() && product > kMaxWorld) {
    problems.push_back(absl::StrCat(names, " = ", values, " = ", product, " is too large (at most ",
                                    kMaxWorld, " ranks)"));
  } else if (problems.empty() && product != world) {
    problems.push_back(absl::StrCat(names, " = ", values, " = ", product, " ≠ world ", world));
  }
  if (!problems.empty()) return absl::InvalidArgumentError(absl::StrJoin(problems, "; "));
  return ParallelDims(f);
}

absl::StatusOr<ParallelDims> ParallelDims::Create(const Factors& f) {
  const int64_t product = int64_t{f.dp} * f.cp * f.tp * f.pp;
  return Create(f, product > INT_MAX || product < 0 ? INT_MAX : static_cast<int>(product));
}

MeshCoord ParallelDims::Coord(int rank) const {
  if (rank < 0 || rank >= world()) {
    std::fprintf(stderr, "ParallelDims: rank %d outside world %d\n", rank, world());
    std::abort();
  }
  MeshCoord c;
  c.tp = rank % tp_;
  c.cp = (rank / tp_) % cp_;
  c.dp = (rank / (tp_ * cp_)) % dp_;
  c.pp = rank / (tp_ * cp_ * dp_);
  return c;
}

int ParallelDims::Rank(const MeshCoord& c) const {
  return ((c.pp * dp_ + c.dp) * cp_ + c.cp) * tp_ + c.tp;
}

std::vector<int> ParallelDims::Group(GroupKind kind, int rank) const {
  MeshCoord c = Coord(rank);
  std::vector<int> out;
  if (kind == GroupKind::kEp || kind == GroupKind::kExpertDp) {
    // Members of the replica group, by ReplicaIndex: a block of ep
    // consecutive ones, or a stride of ep.
    const std::vector<int> replica = Group(GroupKind::kReplica, rank);
    const int i = ReplicaIndex(c);
    for (int j = 0; j < static_cast<int>(replica.size()); ++j) {
      const bool same = kind == GroupKind::kEp ? j / ep_ == i / ep_ : j % ep_ == i % ep_;
      if (same) out.push_back(replica[j]);
    }
    return out;
  }
  if (kind == GroupKind::kReplica) {
    for (int d = 0; d < dp_; ++d) {
      for (int k = 0; k < cp_; ++k) {
        c.dp = d;
        c.cp = k;
        out.push_back(Rank(c));
      }
    }
    return out;
  }
  int* coord = kind == GroupKind::kDp   ? &c.dp
               : kind == GroupKind::kTp ? &c.tp
               : kind == GroupKind::kCp ? &c.cp
                                        : &c.pp;
  const int n = kind == GroupKind::kDp   ? dp_
                : kind == GroupKind::kTp ? tp_
                : kind == GroupKind::kCp ? cp_
                                         : pp_;
  for (int i = 0; i < n; ++i) {
    *coord = i;
    out.push_back(Rank(c));
  }
  return out;
}

std::vector<std::vector<int>> ParallelDims::Groups(GroupKind kind) const {
  std::vector<std::vector<int>> out;
  for (int r = 0; r < world(); ++r) {
    std::vector<int> g = Group(kind, r);
    if (g.front() == r) out.push_back(std::move(g));  // each group once, at its first member
  }
  return out;
}

bool ParallelDims::SpeaksForReplica(int rank) const {
  const MeshCoord c = Coord(rank);
  return c.pp == pp_ - 1 && c.tp == 0 && c.cp == 0;
}

absl::Status ParallelDims::CheckSequence(int seq_len) const {
  if (cp_ == 1 || seq_len % (2 * cp_) == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "parallel.cp: 2 × ", cp_, " = ", 2 * cp_, " does not divide batch.seq_len: ", seq_len,
      " (each cp rank holds two of the sequence's 2·cp equal chunks, the r-th and the "
      "(2·cp − 1 − r)-th, so that causal attention costs every rank the same)"));
}

absl::Status ParallelDims::CheckModelFits(const model::ModelConfig& config) const {
  std::vector<std::string> problems;
  const int heads = config.heads, vocab = config.vocab;
  if (heads % tp_ != 0) {
    problems.push_back(absl::StrCat("parallel.tp: ", tp_, " does not divide model.heads: ", heads));
  }
  if (config.kv_heads != heads && config.kv_heads % tp_ != 0) {
    problems.push_back(
        absl::StrCat("parallel.tp: ", tp_, " does not divide model.kv_heads: ", config.kv_heads));
  }
  if (config.ffn_dim % tp_ != 0) {
    problems.push_back(
        config.arch == model::Arch::kGpt2
            ? absl::StrCat("parallel.tp: ", tp_,
                           " does not divide the MLP width 4 × model.dim: ", config.ffn_dim)
            : absl::StrCat("parallel.tp: ", tp_,
                           " does not divide model.ffn_dim: ", config.ffn_dim));
  }
  if (ep_ > 1 && !config.moe.on()) {
    problems.push_back(absl::StrCat("parallel.ep: ", ep_,
                                    " splits experts: it needs model.moe (this model has none)"));
  } else if (config.moe.on() && config.moe.experts % ep_ != 0) {
    problems.push_back(absl::StrCat("parallel.ep: ", ep_,
                                    " does not divide model.moe.experts: ", config.moe.experts));
  }
  if (config.moe.on()) {
    const int He = config.moe.expert_ffn_dim, Fs = config.mlp_dim(config.layers - 1);
    if (He % tp_ != 0) {
      problems.push_back(
          absl::StrCat("parallel.tp: ", tp_, " does not divide model.moe.expert_ffn_dim: ", He));
    } else if (Fs % tp_ != 0) {
      problems.push_back(
          absl::StrCat("parallel.tp: ", tp_, " does not divide the shared experts' width: ", Fs));
    }
  }
  const int vp = model::PaddedVocab(vocab);
  if (vocab >= 1 && vp % tp_ != 0) {
    problems.push_back(absl::StrCat("parallel.tp: ", tp_, " does not divide the padded vocabulary ",
                                    vp, " (model.vocab ", vocab, " rounded up to a multiple of ",
                                    vocab > 256 ? 128 : 64, ")"));
  }
  if (pp_ > config.layers) {
    problems.push_back(
        absl::StrCat("parallel.pp: ", pp_, " exceeds model.layers: ", config.layers));
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(problems, "; "));
}

absl::Status ParallelDims::CheckZero(int zero) const {
  if (zero < 3 || pp_ == 1) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "parallel.zero: 3 cannot be combined with parallel.pp: ", pp_,
      " (ZeRO-3 gathers a unit's parameters around each use, and a pipeline stage interleaves "
      "its micro-batches' forwards and backwards, so every unit would be gathered again for each "
      "micro-batch); use parallel.zero <= 2 with a pipeline"));
}

absl::StatusOr<BatchSplit> SplitBatch(int global, int micro, int dp) {
  for (auto [field, v] : {std::pair<const char*, int>{"batch.global", global},
                          {"batch.micro", micro},
                          {"parallel.dp", dp}}) {
    if (v < 1) return absl::InvalidArgumentError(absl::StrCat(field, ": must be >= 1, got ", v));
  }
  const int64_t per_pass = int64_t{micro} * dp;
  if (global % per_pass != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch.global: ", global, " is not divisible by batch.micro × parallel.dp = ", micro, " × ",
        dp, " = ", per_pass, " (global = micro × dp × gradient accumulation steps)"));
  }
  return BatchSplit{global, micro, dp, static_cast<int>(global / per_pass)};
}

}  // namespace shardtrain
