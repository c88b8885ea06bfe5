// StageLayers and SliceOf (common/model/slice.h): explicit splits are
// validated with errors naming parallel.stages / parallel.pp; balanced splits
// equal a brute-force search over every split, counting each stage's
// parameters with ParamLayout of its slice.
#include "common/model/slice.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "common/model/config.h"
#include "common/model/param_layout.h"

namespace shardtrain::model {
namespace {

std::string Message(const absl::StatusOr<std::vector<int>>& s) {
  return std::string(s.status().message());
}

// A stage's parameters as StageLayers documents them: the slice's own layout
// (blocks, embeddings, final norm) less wpe on a last stage that is not also
// the first (the tied head needs wte only).
int64_t StageParams(const ModelConfig& c, const std::vector<int>& split, int s) {
  const ModelSlice slice = SliceOf(split, s, 1, 0);
  int64_t n = static_cast<int64_t>(ParamLayout(c, slice).num_params());
  if (slice.last_stage && !slice.first_stage && c.positions == PositionKind::kLearned &&
      c.tie_embeddings) {
    n -= int64_t{c.context} * c.dim;
  }
  return n;
}

// Every split of c.layers into pp stages of >= 1 layer, in lexicographic
// order; the first with the smallest largest stage.
std::vector<int> BruteForce(const ModelConfig& c, int pp) {
  std::vector<int> best, cur;
  int64_t best_max = -1;
  std::function<void(int)> rec = [&](int left) {
    if (static_cast<int>(cur.size()) == pp - 1) {
      cur.push_back(left);
      int64_t mx = 0;
      for (int s = 0; s < pp; ++s) mx = std::max(mx, StageParams(c, cur, s));
      if (best_max < 0 || mx < best_max) best_max = mx, best = cur;
      cur.pop_back();
      return;
    }
    for (int n = 1; n <= left - (pp - 1 - static_cast<int>(cur.size())); ++n) {
      cur.push_back(n);
      rec(left - n);
      cur.pop_back();
    }
  };
  rec(c.layers);
  return best;
}

TEST(StageLayersTest, BalancedEqualsBruteForce) {
  // Small and large vocabularies: the ends' embeddings outweigh a few
  // blocks, so the end stages get fewer layers.
  // Llama (tied and untied): no wpe, the untied head on the last stage.
  for (int vocab : {64, 300, 5000}) {
    for (int layers : {1, 2, 3, 5, 8, 9}) {
      for (int family = 0; family < 3; ++family) {
        // layers, heads 4, kv_heads 2, dim 32, ffn_dim 80, context 16, vocab.
        const ModelConfig c = family == 0
                                  ? *MakeGptConfig(layers, 4, 32, 16, vocab)
                                  : *MakeLlamaConfig({layers, 4, 2, 32, 80, 16, vocab, 1e4, 1e-5,
                                                      /*tie_embeddings=*/family == 2});
        for (int pp = 1; pp <= std::min(layers, 4); ++pp) {
          absl::StatusOr<std::vector<int>> got = StageLayers(c, pp);
          ASSERT_TRUE(got.ok()) << got.status();
          EXPECT_EQ(*got, BruteForce(c, pp))
              << "family " << family << " vocab " << vocab << " layers " << layers << " pp " << pp;
        }
      }
    }
  }
}

TEST(StageLayersTest, Gpt2SmallEndsGetFewerLayers) {
  const ModelConfig c = *ModelPreset("gpt2-124m");
  EXPECT_EQ(*StageLayers(c, 1), std::vector<int>({12}));
  // wte is 50304 × 768 ≈ 38.6M elements ≈ 5.5 blocks (7.1M each).
  EXPECT_EQ(*StageLayers(c, 2), std::vector<int>({6, 6}));
  const std::vector<int> four = *StageLayers(c, 4);
  EXPECT_EQ(four.front() + four[1] + four[2] + four.back(), 12);
  EXPECT_LT(four.front(), four[1]);
  EXPECT_LT(four.back(), four[2]);
}

TEST(StageLayersTest, ExplicitSplitIsKeptWhenValid) {
  const ModelConfig c = *MakeGptConfig(5, 4, 32, 16, 100);
  EXPECT_EQ(*StageLayers(c, 3, {1, 3, 1}), std::vector<int>({1, 3, 1}));
}

TEST(StageLayersTest, ErrorsNameTheField) {
  const ModelConfig c = *MakeGptConfig(5, 4, 32, 16, 100);
  EXPECT_EQ(Message(StageLayers(c, 2, {1, 2, 2})),
            "parallel.stages: has 3 entries, expected one per pipeline stage (parallel.pp: 2)");
  EXPECT_EQ(Message(StageLayers(c, 2, {5, 0})), "parallel.stages[1]: must be >= 1 layer, got 0");
  EXPECT_EQ(Message(StageLayers(c, 2, {2, 2})),
            "parallel.stages: layers sum to 4, expected model.layers: 5");
  EXPECT_EQ(Message(StageLayers(c, 6)), "parallel.pp: 6 exceeds model.layers: 5");
  EXPECT_EQ(Message(StageLayers(c, 0)), "parallel.pp: must be >= 1, got 0");
}

TEST(SliceOfTest, StagesAreContiguousAndEndsMarked) {
  const std::vector<int> split = {2, 3, 1};
  const ModelSlice a = SliceOf(split, 0, 2, 1), b = SliceOf(split, 1, 2, 0),
                   z = SliceOf(split, 2, 2, 1);
  EXPECT_EQ(a.first_layer, 0);
  EXPECT_EQ(a.num_layers, 2);
  EXPECT_TRUE(a.first_stage);
  EXPECT_FALSE(a.last_stage);
  EXPECT_EQ(a.tp, 2);
  EXPECT_EQ(a.tp_rank, 1);
  EXPECT_EQ(b.first_layer, 2);
  EXPECT_EQ(b.num_layers, 3);
  const ModelConfig gpt2 = *MakeGptConfig(6, 4, 32, 16, 256);
  // layers 6, heads 4, kv_heads 2, dim 32, ffn_dim 64, context 16, vocab 256, untied.
  const ModelConfig llama = *MakeLlamaConfig({6, 4, 2, 32, 64, 16, 256});
  EXPECT_FALSE(b.has_embeddings(gpt2));
  EXPECT_EQ(z.first_layer, 5);
  EXPECT_EQ(z.num_layers, 1);
  EXPECT_TRUE(z.last_stage);
  // The last stage holds a tied head's embeddings, not an untied one's.
  EXPECT_TRUE(z.has_embeddings(gpt2));
  EXPECT_FALSE(z.has_embeddings(llama));
  EXPECT_TRUE(a.has_embeddings(llama));
  EXPECT_TRUE(SliceOf({4}, 0, 1, 0).whole());
}

// Interleaved (parallel.pp_virtual): pp · v equal virtual stages, stage s
// holding chunks c·pp + s; its layout holds the chunks' blocks in layer
// order, block_tensor finds each.
TEST(SliceOfTest, InterleavedChunksAreVirtualStages) {
  const ModelConfig c = *MakeGptConfig(8, 4, 32, 16, 100);
  const absl::StatusOr<std::vector<int>> split = StageLayers(c, 2, {}, 2);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(*split, (std::vector<int>{2, 2, 2, 2}));
  const ModelSlice s0 = SliceOf(*split, 0, 1, 0, 2), s1 = SliceOf(*split, 1, 1, 0, 2);
  std::vector<int> layers0, layers1;
  for (int i = 0; i < s0.total_layers(c); ++i) layers0.push_back(s0.Layer(c, i));
  for (int i = 0; i < s1.total_layers(c); ++i) layers1.push_back(s1.Layer(c, i));
  EXPECT_EQ(layers0, (std::vector<int>{0, 1, 4, 5}));
  EXPECT_EQ(layers1, (std::vector<int>{2, 3, 6, 7}));
  EXPECT_TRUE(s0.first_stage && !s0.last_stage && s1.last_stage && !s1.first_stage);
  EXPECT_FALSE(s0.whole());
  EXPECT_EQ(s1.LocalLayer(c, 6), 2);
  EXPECT_EQ(s1.LocalLayer(c, 4), -1);
  EXPECT_EQ(s0.LocalLayer(c, 8), -1);
  const ParamLayout layout(c, s1);
  EXPECT_EQ(layout.num_layers(), 4);
  // embeddings (the tied head), block.2, block.3, block.6, block.7, final
  EXPECT_EQ(layout.units()[3].name, "block.6");
  EXPECT_EQ(layout.tensors()[layout.block_tensor(7, kLn1W)].name, "block.7.ln1.weight");
  EXPECT_EQ(Message(StageLayers(c, 3, {}, 2)),
            "parallel.pp_virtual: 2 model chunks per stage need parallel.pp > 1, no "
            "parallel.stages (every chunk has model.layers / (pp × pp_virtual) layers) and "
            "model.layers a multiple of pp × pp_virtual; got pp 3, 0 stages entries, 8 layers");
}

}  // namespace
}  // namespace shardtrain::model
