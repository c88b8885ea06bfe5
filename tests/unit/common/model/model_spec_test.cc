// The model spec: padded vocabulary, presets, validation messages, and the
// flat parameter layout with its shard units.
#include <gtest/gtest.h>

#include "common/model/config.h"
#include "common/model/param_layout.h"

namespace shardtrain::model {
namespace {

ModelConfig Tiny(int vocab = 100) {
  auto c = MakeGptConfig(2, 4, 32, 16, vocab);
  EXPECT_TRUE(c.ok());
  return *c;
}

TEST(ConfigTest, PaddedVocabAndPresets) {
  EXPECT_EQ(PaddedVocab(50257), 50304);
  EXPECT_EQ(PaddedVocab(256), 256);
  EXPECT_EQ(PaddedVocab(100), 128);
  EXPECT_EQ(PaddedVocab(300), 384);
  auto p = ModelPreset("gpt2-124m");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->layers, 12);
  EXPECT_EQ(p->padded_vocab, 50304);
  // llm.c's parameter count for GPT-2 124M with the padded vocab.
  EXPECT_EQ(ParamLayout(*p).num_params(), 124475904u);
  EXPECT_EQ(ModelPreset("gpt9").status().code(), absl::StatusCode::kNotFound);
  auto bad = MakeGptConfig(2, 3, 32, 16, 100);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("model.heads"), std::string::npos);
}

TEST(ParamLayoutTest, UnitsAreContiguousAndDecayOnlyOn2D) {
  const ParamLayout layout(Tiny());
  const auto& units = layout.units();
  ASSERT_EQ(units.size(), 4u);  // embeddings, block.0, block.1, final
  EXPECT_EQ(units[0].name, "embeddings");
  EXPECT_EQ(units[1].name, "block.0");
  EXPECT_EQ(units[3].name, "final");
  size_t next = 0;
  for (const UnitInfo& u : units) {
    EXPECT_EQ(u.offset, next) << u.name;
    size_t t_next = u.offset;
    for (int i = u.first_tensor; i < u.first_tensor + u.num_tensors; ++i) {
      const TensorInfo& t = layout.tensors()[i];
      EXPECT_EQ(t.offset, t_next) << t.name;
      EXPECT_EQ(&layout.units()[t.unit], &u);
      t_next += t.numel;
    }
    next = u.offset + u.numel;
    EXPECT_EQ(t_next, next);
  }
  EXPECT_EQ(next, layout.num_params());
  for (const TensorInfo& t : layout.tensors()) {
    EXPECT_EQ(t.decay, t.shape.size() == 2) << t.name;
  }
  EXPECT_TRUE(layout.tensors()[layout.wte()].decay);
  EXPECT_FALSE(layout.tensors()[layout.block_tensor(1, kQkvB)].decay);
  EXPECT_EQ(layout.tensors()[layout.block_tensor(1, kFcProjW)].name, "block.1.mlp.proj.weight");
  EXPECT_EQ(*layout.FindTensor("lnf.bias"), layout.lnf_b());
}

}  // namespace
}  // namespace shardtrain::model
