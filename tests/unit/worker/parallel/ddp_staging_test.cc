// DDP through a host copy of the gradients (Ddp's staged path, the one GPU
// ranks take: copy out once backward is done, all-reduce the same buckets
// on the host, copy back) on 2 thread ranks with Gloo: the losses and the
// parameters after 3 steps of 2 micro-batches equal those of the unstaged
// all-reduce bit for bit (the same buckets, summed in the same ring order).
#include <cstring>
#include <vector>

#include "common/model/config.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/comm/test_util.h"
#include "worker/engine/cpu/gpt.h"
#include "worker/parallel/ddp.h"

namespace shardtrain::parallel {
namespace {

constexpr int kB = 2, kT = 8, kAccum = 2, kSteps = 3;

struct RankResult {
  std::vector<double> losses;  // rank 0's, per micro-batch
  std::vector<float> params;   // rank 0's, after the last step
};

void RankRun(comm::Communicator& comm, bool staged, RankResult* run) {
  auto config = model::MakeGptConfig(2, 2, 16, kT, 64);
  ASSERT_TRUE(config.ok());
  auto gpt = engine::cpu::Gpt::Create(*config, kB, kT, 1);
  ASSERT_TRUE(gpt.ok());
  engine::cpu::Gpt& m = **gpt;
  // A small bucket: several all-reduces per step, as on a real model.
  auto ddp = Ddp::Create(&m, optim::AdamWOptions(), &comm, /*bucket_bytes=*/4096, staged);
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  (*ddp)->InitParams(5);
  std::vector<int> in(kB * kT), tgt(kB * kT);
  for (int step = 0; step < kSteps; ++step) {
    for (int micro = 0; micro < kAccum; ++micro) {
      for (int i = 0; i < kB * kT; ++i) {
        in[i] = (step * 31 + micro * 7 + comm.rank() * 13 + i * 5) % 64;
        tgt[i] = (in[i] * 3 + 1) % 64;
      }
      (*ddp)->BeginMicroBatch(micro, kAccum);
      const float loss = m.Forward(in.data(), tgt.data());
      m.Backward(1.0f / kAccum);
      ASSERT_TRUE((*ddp)->EndMicroBatch().ok());
      if (comm.rank() == 0) run->losses.push_back(loss);
    }
    auto stats = (*ddp)->Step(1e-2f, 1.0f);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_GT(stats->comm_bytes, 0);
  }
  if (comm.rank() == 0) run->params.assign(m.params().f32().begin(), m.params().f32().end());
}

TEST(DdpStagingTest, HostStagedAllReduceEqualsTheDirectOneBitForBit) {
  RankResult direct, staged;
  comm::testing::RunRanks(2, [&](comm::Communicator& c) { RankRun(c, false, &direct); });
  comm::testing::RunRanks(2, [&](comm::Communicator& c) { RankRun(c, true, &staged); });
  ASSERT_EQ(direct.losses.size(), size_t{kSteps * kAccum});
  ASSERT_EQ(staged.losses, direct.losses);
  ASSERT_EQ(staged.params.size(), direct.params.size());
  EXPECT_EQ(
      std::memcmp(staged.params.data(), direct.params.data(), direct.params.size() * sizeof(float)),
      0);
  std::printf("[ddp-staging] %zu losses and %zu parameters equal; last loss %.7f\n",
              staged.losses.size(), staged.params.size(), staged.losses.back());
}

}  // namespace
}  // namespace shardtrain::parallel
