// Mesh (worker/parallel/mesh.h) on thread ranks with Gloo over 127.0.0.1:
// every rank's dp, tp, pp, pp_prev, pp_next and tied communicators hold
// exactly the ranks ParallelDims names for its groups, in coordinate order,
// and an all-reduce on each sums over those ranks only. Groups of one rank
// are null; so is everything in a world of one.
#include "worker/parallel/mesh.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/worker/comm/test_util.h"

namespace shardtrain::parallel {
namespace {

using comm::testing::RunRanks;

// A one-hot row: element `rank` is rank + 1. Summed over a group, element r
// is r + 1 exactly for the members r and 0 elsewhere.
std::vector<float> OneHot(int rank, int world) {
  std::vector<float> v(world, 0.0f);
  v[rank] = static_cast<float>(rank + 1);
  return v;
}

std::vector<float> Expected(const std::vector<int>& members, int world) {
  std::vector<float> v(world, 0.0f);
  for (int r : members) v[r] = static_cast<float>(r + 1);
  return v;
}

// Checks `c` against `members` (ordered) for this `rank`, then all-reduces.
void CheckGroup(const char* name, comm::Communicator* c, const std::vector<int>& members, int rank,
                int world) {
  SCOPED_TRACE(testing::Message() << name << " of rank " << rank);
  if (members.size() <= 1) {
    EXPECT_EQ(c, nullptr);
    return;
  }
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->size(), static_cast<int>(members.size()));
  const int index =
      static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
  EXPECT_EQ(c->rank(), index);
  std::vector<float> v = OneHot(rank, world);
  ASSERT_TRUE(c->AllReduce(v.data(), v.size(), DataType::kFloat32, comm::ReduceOp::kSum).ok());
  EXPECT_EQ(v, Expected(members, world));
}

// An interleaved pipeline's one-way channels: each stage sends its rank on
// act_out (grad_out) and must receive the previous (next) stage's on act_in
// (grad_in), around the ring; the sender is rank 0 of each.
void CheckChannels(const Mesh& m, const std::vector<int>& pipe, int rank) {
  const int s = m.stage(), pp = m.stages();
  for (bool act : {true, false}) {
    comm::Communicator* out = act ? m.act_out() : m.grad_out();
    comm::Communicator* in = act ? m.act_in() : m.grad_in();
    ASSERT_NE(out, nullptr);
    ASSERT_NE(in, nullptr);
    EXPECT_EQ(out->size(), 2);
    EXPECT_EQ(out->rank(), 0);
    EXPECT_EQ(in->size(), 2);
    EXPECT_EQ(in->rank(), 1);
    const float mine = static_cast<float>(rank);
    float got = -1;
    std::shared_ptr<comm::Work> sent = out->SendAsync(&mine, 1, DataType::kFloat32, 1);
    ASSERT_TRUE(in->Recv(&got, 1, DataType::kFloat32, 0).ok());
    ASSERT_TRUE(sent->Wait().ok());
    const int from = act ? (s + pp - 1) % pp : (s + 1) % pp;
    EXPECT_EQ(got, static_cast<float>(pipe[from])) << (act ? "activations" : "gradients");
  }
}

void CheckMesh(int dp, int tp, int pp, int chunks = 1) {
  absl::StatusOr<ParallelDims> dims = ParallelDims::Create(dp, tp, pp);
  ASSERT_TRUE(dims.ok()) << dims.status();
  const int world = dims->world();
  RunRanks(world, [&](comm::Communicator& w) {
    const int rank = w.rank();
    absl::StatusOr<std::unique_ptr<Mesh>> mesh = Mesh::Create(*dims, rank, &w, chunks);
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    const Mesh& m = **mesh;
    EXPECT_EQ(m.coord(), dims->Coord(rank));
    EXPECT_EQ(m.stage(), dims->Coord(rank).pp);
    EXPECT_EQ(m.stages(), pp);
    EXPECT_EQ(m.prev_stage(), m.stage() == 0 ? -1 : m.stage() - 1);
    EXPECT_EQ(m.next_stage(), m.stage() == pp - 1 ? -1 : m.stage() + 1);
    CheckGroup("dp", m.dp(), dims->Group(GroupKind::kDp, rank), rank, world);
    CheckGroup("tp", m.tp(), dims->Group(GroupKind::kTp, rank), rank, world);
    const std::vector<int> pipe = dims->Group(GroupKind::kPp, rank);
    CheckGroup("pp", m.pp(), pipe, rank, world);
    // The neighbour pairs, the lower stage first (pp_prev before pp_next: a
    // stage's partner below has finished its own pp_prev by then).
    const int s = m.stage();
    CheckGroup("pp_prev", m.pp_prev(),
               s > 0 ? std::vector<int>{pipe[s - 1], pipe[s]} : std::vector<int>{}, rank, world);
    CheckGroup("pp_next", m.pp_next(),
               s + 1 < pp ? std::vector<int>{pipe[s], pipe[s + 1]} : std::vector<int>{}, rank,
               world);
    // tied: the two ends of the pipeline; nobody else, and no one at pp 1.
    const bool end = m.stage() == 0 || m.stage() == pp - 1;
    const std::vector<int> tied =
        pp > 1 && end ? std::vector<int>{pipe.front(), pipe.back()} : std::vector<int>{};
    CheckGroup("tied", m.tied(), tied, rank, world);
    if (chunks > 1) {
      CheckChannels(m, pipe, rank);
    } else {
      EXPECT_EQ(m.act_in(), nullptr);
      EXPECT_EQ(m.grad_out(), nullptr);
    }
  });
}

TEST(MeshTest, Dp2Tp2Pp2) { CheckMesh(2, 2, 2); }
TEST(MeshTest, Tp2Pp2) { CheckMesh(1, 2, 2); }
TEST(MeshTest, Dp2Pp3) { CheckMesh(2, 1, 3); }
TEST(MeshTest, Pp4TiesOnlyTheEnds) { CheckMesh(1, 1, 4); }
TEST(MeshTest, Dp4) { CheckMesh(4, 1, 1); }
// Interleaved: the ring's channels, pp 2 (both directions between the same
// two ranks), odd pp 3 (three rounds) and pp 4.
TEST(MeshTest, Dp2Pp2Channels) { CheckMesh(2, 1, 2, /*chunks=*/2); }
TEST(MeshTest, Pp3Channels) { CheckMesh(1, 1, 3, /*chunks=*/2); }
TEST(MeshTest, Pp4Channels) { CheckMesh(1, 1, 4, /*chunks=*/3); }

TEST(MeshTest, WorldOfOneHasNoCommunicators) {
  absl::StatusOr<ParallelDims> dims = ParallelDims::Create(1, 1, 1);
  ASSERT_TRUE(dims.ok());
  absl::StatusOr<std::unique_ptr<Mesh>> mesh = Mesh::Create(*dims, 0, nullptr);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ((*mesh)->dp(), nullptr);
  EXPECT_EQ((*mesh)->tp(), nullptr);
  EXPECT_EQ((*mesh)->pp(), nullptr);
  EXPECT_EQ((*mesh)->pp_prev(), nullptr);
  EXPECT_EQ((*mesh)->pp_next(), nullptr);
  EXPECT_EQ((*mesh)->tied(), nullptr);
  EXPECT_EQ((*mesh)->prev_stage(), -1);
  EXPECT_EQ((*mesh)->next_stage(), -1);
}

TEST(MeshTest, WorldThatDoesNotMatchIsRejected) {
  absl::StatusOr<ParallelDims> two = ParallelDims::Create(1, 1, 2);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(Mesh::Create(*two, 0, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Mesh::Create(*two, 2, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<ParallelDims> four = ParallelDims::Create(2, 1, 2);
  ASSERT_TRUE(four.ok());
  RunRanks(2, [&](comm::Communicator& w) {
    EXPECT_EQ(Mesh::Create(*four, w.rank(), &w).status().code(),
              absl::StatusCode::kInvalidArgument);
  });
}

}  // namespace
}  // namespace shardtrain::parallel
