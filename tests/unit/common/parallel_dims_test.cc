// ParallelDims (the dp × cp × tp × pp mesh) and SplitBatch: the layout by hand,
// groups that partition the world, and every refusal naming its fields.
#include "common/parallel_dims.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "common/model/slice.h"

namespace shardtrain {
namespace {

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(ParallelDimsTest, MegatronOrderByHand) {
  // dp 2, tp 2, pp 2: tp fastest, then dp, then pp.
  const ParallelDims d = *ParallelDims::Create(2, 2, 2, 8);
  EXPECT_EQ(d.world(), 8);
  const MeshCoord want[8] = {{0, 0, 0}, {0, 1, 0}, {1, 0, 0}, {1, 1, 0},
                             {0, 0, 1}, {0, 1, 1}, {1, 0, 1}, {1, 1, 1}};
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(d.Coord(r), want[r]) << r;
    EXPECT_EQ(d.Rank(want[r]), r);
  }
  EXPECT_EQ(d.Group(GroupKind::kTp, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(d.Group(GroupKind::kDp, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(d.Group(GroupKind::kPp, 5), (std::vector<int>{1, 5}));
  EXPECT_EQ(d.Groups(GroupKind::kDp),
            (std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(d.Groups(GroupKind::kPp),
            (std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  // The loss of replica dp is reported by its last stage's tp rank 0.
  std::vector<int> speakers;
  for (int r = 0; r < 8; ++r) {
    if (d.SpeaksForReplica(r)) speakers.push_back(r);
  }
  EXPECT_EQ(speakers, (std::vector<int>{4, 6}));
  EXPECT_TRUE(d.IsFirstStage(3));
  EXPECT_TRUE(d.IsLastStage(4));
}

// Every mesh up to 4 × 4 × 4: coordinates round-trip, each group kind
// partitions the world, a group's members differ only in its coordinate and
// are listed in that coordinate's order.
TEST(ParallelDimsTest, GroupsPartitionTheWorld) {
  for (int dp = 1; dp <= 4; ++dp) {
    for (int tp = 1; tp <= 4; ++tp) {
      for (int pp = 1; pp <= 4; ++pp) {
        SCOPED_TRACE(testing::Message() << dp << "x" << tp << "x" << pp);
        const ParallelDims d = *ParallelDims::Create(dp, tp, pp);
        ASSERT_EQ(d.world(), dp * tp * pp);
        for (int r = 0; r < d.world(); ++r) ASSERT_EQ(d.Rank(d.Coord(r)), r);
        for (GroupKind kind : {GroupKind::kDp, GroupKind::kTp, GroupKind::kPp}) {
          const int size = kind == GroupKind::kDp ? dp : kind == GroupKind::kTp ? tp : pp;
          std::set<int> seen;
          const auto groups = d.Groups(kind);
          ASSERT_EQ(int(groups.size()), d.world() / size);
          for (const std::vector<int>& g : groups) {
            ASSERT_EQ(int(g.size()), size);
            for (int i = 0; i < size; ++i) {
              ASSERT_TRUE(seen.insert(g[i]).second) << "rank in two groups";
              const MeshCoord a = d.Coord(g[0]), b = d.Coord(g[i]);
              const int index = kind == GroupKind::kDp   ? b.dp
                                : kind == GroupKind::kTp ? b.tp
                                                         : b.pp;
              ASSERT_EQ(index, i);
              ASSERT_EQ(kind == GroupKind::kDp || a.dp == b.dp, true);
              ASSERT_EQ(kind == GroupKind::kTp || a.tp == b.tp, true);
              ASSERT_EQ(kind == GroupKind::kPp || a.pp == b.pp, true);
              ASSERT_EQ(d.Group(kind, g[i]), g);
            }
          }
          ASSERT_EQ(int(seen.size()), d.world());
        }
      }
    }
  }
}

// Context parallelism: tp fastest, then cp, then dp, then pp. dp2 × cp2 ×
// tp2 × pp2 = 16 by hand: rank = ((pp·2 + dp)·2 + cp)·2 + tp.
TEST(ParallelDimsTest, ContextParallelOrderByHand) {
  const ParallelDims d = *ParallelDims::Create(ParallelDims::Factors{2, 2, 2, 2});
  ASSERT_EQ(d.world(), 16);
  EXPECT_EQ(d.replicas(), 4);
  EXPECT_EQ(d.Coord(6), (MeshCoord{1, 0, 0, 1}));  // dp 1, tp 0, pp 0, cp 1
  EXPECT_EQ(d.Coord(13), (MeshCoord{1, 1, 1, 0}));
  for (int r = 0; r < 16; ++r) ASSERT_EQ(d.Rank(d.Coord(r)), r);
  EXPECT_EQ(d.Group(GroupKind::kCp, 0), (std::vector<int>{0, 2}));
  EXPECT_EQ(d.Group(GroupKind::kDp, 0), (std::vector<int>{0, 4}));
  EXPECT_EQ(d.Group(GroupKind::kTp, 2), (std::vector<int>{2, 3}));
  EXPECT_EQ(d.Group(GroupKind::kPp, 0), (std::vector<int>{0, 8}));
  // The replica group: dp × cp, in the order dp · cp + cp (ReplicaIndex).
  EXPECT_EQ(d.Group(GroupKind::kReplica, 9), (std::vector<int>{9, 11, 13, 15}));
  for (int r : d.Group(GroupKind::kReplica, 9)) {
    EXPECT_EQ(d.Group(GroupKind::kReplica, 9)[d.ReplicaIndex(d.Coord(r))], r);
  }
  EXPECT_EQ(d.Groups(GroupKind::kReplica).size(), 4u);
  // One speaker per dp replica: last stage, tp 0, cp 0.
  std::vector<int> speakers;
  for (int r = 0; r < 16; ++r) {
    if (d.SpeaksForReplica(r)) speakers.push_back(r);
  }
  EXPECT_EQ(speakers, (std::vector<int>{8, 12}));
  // Without cp the layout is the dp × tp × pp one.
  const ParallelDims plain = *ParallelDims::Create(ParallelDims::Factors{2, 1, 2, 2});
  const ParallelDims old = *ParallelDims::Create(2, 2, 2);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(plain.Coord(r), old.Coord(r));
  // The sequence: 2·cp divides it.
  EXPECT_TRUE(d.CheckSequence(8).ok());
  const absl::Status odd = d.CheckSequence(6);
  EXPECT_EQ(odd.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(odd.message().find("parallel.cp: 2 × 2 = 4 does not divide batch.seq_len: 6"),
            std::string::npos)
      << odd;
  const absl::Status zero = ParallelDims::Create(ParallelDims::Factors{1, 0, 1, 1}).status();
  EXPECT_NE(zero.message().find("parallel.cp: must be >= 1, got 0"), std::string::npos) << zero;
  const absl::Status world = ParallelDims::Create(ParallelDims::Factors{2, 2, 1, 1}, 8).status();
  EXPECT_NE(world.message().find(
                "parallel.dp × parallel.cp × parallel.tp × parallel.pp = 2 × 2 × 1 × 1 = 4 ≠ "
                "world 8"),
            std::string::npos)
      << world;
}

// Chunks r and 2·cp − 1 − r of 2·cp, in that order.
TEST(ParallelDimsTest, ContextChunkPositions) {
  EXPECT_EQ(model::ContextChunkPositions(8, 2, 0), (std::vector<int>{0, 1, 6, 7}));
  EXPECT_EQ(model::ContextChunkPositions(8, 2, 1), (std::vector<int>{2, 3, 4, 5}));
  EXPECT_EQ(model::ContextChunkPositions(4, 1, 0), (std::vector<int>{0, 1, 2, 3}));
  std::vector<int> all;
  for (int r = 0; r < 3; ++r) {
    for (int p : model::ContextChunkPositions(12, 3, r)) all.push_back(p);
  }
  std::sort(all.begin(), all.end());
  for (int i = 0; i < 12; ++i) EXPECT_EQ(all[i], i);
}

TEST(ParallelDimsTest, RefusalsNameEveryFactor) {
  EXPECT_EQ(Message(ParallelDims::Create(2, 1, 3, 4).status()),
            "parallel.dp × parallel.tp × parallel.pp = 2 × 1 × 3 = 6 ≠ world 4");
  EXPECT_EQ(Message(ParallelDims::Create(0, 1, -2, 4).status()),
            "parallel.dp: must be >= 1, got 0; parallel.pp: must be >= 1, got -2");
  EXPECT_NE(Message(ParallelDims::Create(1 << 20, 1 << 20, 1).status()).find("is too large"),
            std::string::npos);
  // A world of 2^20 ranks is the largest: one more pipeline stage is refused
  // (a spec's stage split is built per stage; 2^27 stages took minutes).
  EXPECT_TRUE(ParallelDims::Create(1, 1 << 10, 1 << 10).ok());
  EXPECT_EQ(Message(ParallelDims::Create(1, 1, (1 << 20) + 1).status()),
            "parallel.dp × parallel.tp × parallel.pp = 1 × 1 × 1048577 = 1048577 is too large (at "
            "most 1048576 ranks)");
  EXPECT_EQ(ParallelDims::Create(2, 1, 3, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParallelDims::Create(2, 2, 1)->WithDp(3)->world(), 6);
}

// A GPT-2 shape as CheckModelFits reads it, unvalidated (dim 10 is not a
// multiple of 4 heads: the fit is checked on its own).
model::ModelConfig Shape(int layers, int heads, int dim, int vocab) {
  model::ModelConfig c;
  c.layers = layers;
  c.heads = c.kv_heads = heads;
  c.dim = dim;
  c.ffn_dim = 4 * dim;
  c.vocab = vocab;
  c.padded_vocab = model::PaddedVocab(vocab);
  return c;
}

TEST(ParallelDimsTest, ModelFit) {
  const ParallelDims d = *ParallelDims::Create(1, 3, 5);
  EXPECT_TRUE(ParallelDims::Create(1, 4, 2)->CheckModelFits(Shape(2, 4, 8, 256)).ok());
  // heads 4, dim 10 (MLP 40), vocab 256 (Vp 256), layers 4: all four
  // problems, each by its field.
  EXPECT_EQ(Message(d.CheckModelFits(Shape(4, 4, 10, 256))),
            "parallel.tp: 3 does not divide model.heads: 4; parallel.tp: 3 does not divide the MLP "
            "width 4 × model.dim: 40; parallel.tp: 3 does not divide the padded vocabulary 256 "
            "(model.vocab 256 rounded up to a multiple of 64); parallel.pp: 5 exceeds "
            "model.layers: 4");
  // Vp 192 (vocab 130 rounded up to a multiple of 64) is a multiple of 3.
  EXPECT_TRUE(d.CheckModelFits(Shape(5, 6, 6, 130)).ok());
  // gpt2's 50257 pads to 50304 = 2^7 · 3 · 131: tp 8 divides it, tp 256 does not.
  EXPECT_TRUE(ParallelDims::Create(1, 8, 1)->CheckModelFits(Shape(12, 64, 768, 50257)).ok());
  EXPECT_EQ(Message(ParallelDims::Create(1, 256, 1)->CheckModelFits(Shape(12, 256, 768, 50257))),
            "parallel.tp: 256 does not divide the padded vocabulary 50304 (model.vocab 50257 "
            "rounded up to a multiple of 128)");
  // Llama: tp splits the key/value heads and SwiGLU's width too.
  // layers 4, heads 8, kv_heads 2, dim 64, ffn_dim 96, context 16, vocab 256.
  const model::ModelConfig llama = *model::MakeLlamaConfig({4, 8, 2, 64, 96, 16, 256});
  EXPECT_TRUE(ParallelDims::Create(1, 2, 1)->CheckModelFits(llama).ok());
  EXPECT_EQ(Message(ParallelDims::Create(1, 4, 1)->CheckModelFits(llama)),
            "parallel.tp: 4 does not divide model.kv_heads: 2");
  // ffn_dim 90: tp 4 divides neither.
  const model::ModelConfig narrow = *model::MakeLlamaConfig({4, 8, 2, 64, 90, 16, 256});
  EXPECT_EQ(Message(ParallelDims::Create(1, 4, 1)->CheckModelFits(narrow)),
            "parallel.tp: 4 does not divide model.kv_heads: 2; parallel.tp: 4 does not divide "
            "model.ffn_dim: 90");
}

TEST(ParallelDimsTest, ZeroThreeOnlyWithoutAPipeline) {
  for (int zero = 0; zero <= 3; ++zero) {
    EXPECT_TRUE(ParallelDims::Create(2, 2, 1)->CheckZero(zero).ok()) << zero;
  }
  for (int zero = 0; zero <= 2; ++zero) {
    EXPECT_TRUE(ParallelDims::Create(1, 1, 2)->CheckZero(zero).ok()) << zero;
  }
  const std::string m = Message(ParallelDims::Create(2, 1, 4)->CheckZero(3));
  EXPECT_EQ(m.rfind("parallel.zero: 3 cannot be combined with parallel.pp: 4 (", 0), 0u) << m;
  EXPECT_NE(m.find("gathered again for each micro-batch"), std::string::npos) << m;
  EXPECT_NE(m.find("use parallel.zero <= 2"), std::string::npos) << m;
}

TEST(SplitBatchTest, GlobalIsMicroTimesDpTimesAccumulation) {
  const BatchSplit s = *SplitBatch(24, 2, 3);
  EXPECT_EQ(s.accum, 4);
  EXPECT_EQ(s.per_replica(), 8);
  EXPECT_EQ(s.first_sample(0), 0);
  EXPECT_EQ(s.first_sample(2), 16);
  EXPECT_EQ(Message(SplitBatch(12, 2, 4).status()),
            "batch.global: 12 is not divisible by batch.micro × parallel.dp = 2 × 4 = 8 (global = "
            "micro × dp × gradient accumulation steps)");
  EXPECT_EQ(Message(SplitBatch(12, 0, 4).status()), "batch.micro: must be >= 1, got 0");
  EXPECT_EQ(Message(SplitBatch(12, 2, 0).status()), "parallel.dp: must be >= 1, got 0");
}

}  // namespace
}  // namespace shardtrain
