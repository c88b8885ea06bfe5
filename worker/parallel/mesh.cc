#include "worker/parallel/mesh.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace shardtrain::parallel {
namespace {

// The index of `rank`'s group in dims.Groups(kind): the split colour.
int GroupIndex(const ParallelDims& dims, GroupKind kind, int rank) {
  const std::vector<std::vector<int>> groups = dims.Groups(kind);
  for (size_t i = 0; i < groups.size(); ++i) {
    if (std::find(groups[i].begin(), groups[i].end(), rank) != groups[i].end()) {
      return static_cast<int>(i);
    }
  }
  return comm::Communicator::kNoColor;  // unreachable: every rank is in one group
}

absl::Status Annotate(const absl::Status& status, const char* group) {
  return absl::Status(status.code(),
                      absl::StrCat("mesh: splitting the ", group, " group: ", status.message()));
}

}  // namespace

Mesh::~Mesh() {
  while (!channels_.empty()) channels_.pop_back();
}

absl::StatusOr<std::unique_ptr<Mesh>> Mesh::Create(const ParallelDims& dims, int rank,
                                                   comm::Communicator* world, int chunks) {
  if (rank < 0 || rank >= dims.world()) {
    return absl::InvalidArgumentError(
        absl::StrCat("mesh: rank ", rank, " outside world ", dims.world()));
  }
  if (world == nullptr) {
    if (dims.world() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh: no world communicator for a world of ", dims.world()));
    }
  } else if (world->size() != dims.world() || world->rank() != rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("mesh: world communicator is rank ", world->rank(), " of ", world->size(),
                     ", the mesh wants rank ", rank, " of ", dims.world()));
  }
  std::unique_ptr<Mesh> mesh(new Mesh(dims, rank));
  if (world == nullptr) return mesh;
  const MeshCoord c = mesh->coord_;

  auto split = [&](int color, int key, const char* group,
                   std::unique_ptr<comm::Communicator>* out) -> absl::Status {
    absl::StatusOr<std::unique_ptr<comm::Communicator>> sub = world->Split(color, key);
    if (!sub.ok()) return Annotate(sub.status(), group);
    *out = *std::move(sub);
    return absl::OkStatus();
  };
  if (dims.dp() > 1) {
    absl::Status s = split(GroupIndex(dims, GroupKind::kDp, rank), c.dp, "dp", &mesh->dp_);
    if (!s.ok()) return s;
  }
  if (dims.tp() > 1) {
    absl::Status s = split(GroupIndex(dims, GroupKind::kTp, rank), c.tp, "tp", &mesh->tp_);
    if (!s.ok()) return s;
  }
  if (dims.pp() > 1) {
    const int pp_group = GroupIndex(dims, GroupKind::kPp, rank);
    absl::Status s = split(pp_group, c.pp, "pp", &mesh->pp_);
    // Neighbour pairs from stages of one parity: the pair (first, first + 1)
    // of pipeline g has colour g·pp + first; key 0 the lower stage.
    const int pp = dims.pp();
    auto pair = [&](int parity, const char* group) -> absl::Status {
      const int first = c.pp % 2 == parity ? c.pp : c.pp - 1;  // the pair's lower stage
      const bool joins = first >= 0 && first + 1 < pp;
      std::unique_ptr<comm::Communicator> got;
      absl::Status st = split(joins ? pp_group * pp + first : comm::Communicator::kNoColor,
                              c.pp - first, group, &got);
      if (!st.ok() || !joins) return st;
      (first == c.pp ? mesh->pp_next_ : mesh->pp_prev_) = std::move(got);
      return absl::OkStatus();
    };
    if (s.ok()) s = pair(0, "pp pairs (even, odd)");
    if (s.ok() && pp > 2) s = pair(1, "pp pairs (odd, even)");
    // The ring's edge k joins stage k and stage (k + 1) % pp; its round is
    // k % 2, but 2 for the last edge of an odd ring, so that no stage is on
    // two edges of one round. A channel's colour is its pipeline's and its
    // edge's; key 0 the sender (activations: stage k, gradients: k + 1).
    const int rounds = pp % 2 == 0 ? 2 : 3;
    auto round_of = [&](int k) { return pp % 2 == 1 && k == pp - 1 ? 2 : k % 2; };
    auto channels = [&](bool activations, const char* group) -> absl::Status {
      for (int r = 0; r < rounds; ++r) {
        const int out_edge = c.pp, in_edge = (c.pp + pp - 1) % pp;  // edges from and to here
        int edge = -1;
        if (round_of(out_edge) == r) edge = out_edge;
        if (round_of(in_edge) == r) edge = in_edge;
        const bool sends = (edge == out_edge) == activations;  // gradients run backwards
        std::unique_ptr<comm::Communicator> got;
        absl::Status st = split(edge < 0 ? comm::Communicator::kNoColor : pp_group * pp + edge,
                                sends ? 0 : 1, group, &got);
        if (!st.ok()) return st;
        if (edge < 0) continue;
        comm::Communicator* c = got.get();
        mesh->channels_.push_back(std::move(got));
        if (activations) {
          (sends ? mesh->act_out_ : mesh->act_in_) = c;
        } else {
          (sends ? mesh->grad_out_ : mesh->grad_in_) = c;
        }
      }
      return absl::OkStatus();
    };
    if (s.ok() && chunks > 1) s = channels(true, "pp activation channels");
    if (s.ok() && chunks > 1) s = channels(false, "pp gradient channels");
    // Only the ends of each pipeline join `tied`; middle stages pass kNoColor.
    const bool end = c.pp == 0 || c.pp == dims.pp() - 1;
    if (s.ok()) {
      s = split(end ? pp_group : comm::Communicator::kNoColor, c.pp, "tied", &mesh->tied_);
    }
    if (!s.ok()) return s;
  }
  if (dims.cp() > 1) {
    absl::Status s = split(GroupIndex(dims, GroupKind::kCp, rank), c.cp, "cp", &mesh->cp_);
    if (s.ok()) {
      s = split(GroupIndex(dims, GroupKind::kReplica, rank), dims.ReplicaIndex(c), "replica",
                &mesh->replica_);
    }
    if (!s.ok()) return s;
  }
  if (dims.ep() > 1) {
    absl::Status s =
        split(GroupIndex(dims, GroupKind::kEp, rank), dims.EpRank(c), "ep", &mesh->ep_);
    if (s.ok() && dims.replicas() > dims.ep()) {
      s = split(GroupIndex(dims, GroupKind::kExpertDp, rank), dims.ExpertDpRank(c), "expert_dp",
                &mesh->expert_dp_);
    }
    if (!s.ok()) return s;
  }
  return mesh;
}

}  // namespace shardtrain::parallel
