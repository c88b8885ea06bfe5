// The model spec: padded vocabulary, presets, validation messages, and the
// flat parameter layout with its shard units.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

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

// The Llama presets' parameter counts are Meta's published ones.
TEST(ConfigTest, LlamaPresetsHaveTheirPublishedParameterCounts) {
  const ModelConfig big = *ModelPreset("llama3-8b");
  EXPECT_EQ(big.arch, Arch::kLlama);
  EXPECT_EQ(big.kv_heads, 8);
  EXPECT_EQ(big.padded_vocab, 128256);  // already a multiple of 128
  EXPECT_FALSE(big.tie_embeddings);
  EXPECT_EQ(ParamLayout(big).num_params(), 8030261248u);  // Llama 3.1 8B
  const ModelConfig one = *ModelPreset("llama3-1b");
  EXPECT_TRUE(one.tie_embeddings);
  EXPECT_EQ(ParamLayout(one).num_params(), 1235814400u);  // Llama 3.2 1B
  // Qwen3-0.6B: 16 heads of 128 on a width of 1024 (Q = 2048), q/k norms,
  // tied: 596,049,920 parameters (its published 0.6B, 0.44B without the
  // embeddings), the padded vocabulary being its own 151,936.
  const ModelConfig qwen = *ModelPreset("qwen3-0.6b");
  EXPECT_EQ(qwen.head_dim(), 128);
  EXPECT_EQ(qwen.q_dim(), 2048);
  EXPECT_EQ(qwen.padded_vocab, 151936);
  EXPECT_EQ(ParamLayout(qwen).num_params(), 596049920u);
  EXPECT_EQ(ParamLayout(qwen).num_params() - size_t(EmbeddingParams(qwen)), 440467456u);
  const ParamLayout ql(qwen);
  EXPECT_EQ(ql.tensors()[ql.block_tensor(0, kAttnProjW)].shape, (std::vector<int64_t>{1024, 2048}));
  EXPECT_EQ(ql.tensors()[ql.block_tensor(0, kQkvW)].shape, (std::vector<int64_t>{4096, 1024}));
  EXPECT_EQ(ql.tensors()[ql.block_tensor(0, kQNormW)].name, "block.0.attn.q_norm.weight");
  EXPECT_EQ(ql.block_tensor(0, kQNormW), ql.block_tensor(0, kQkvW) + 1);  // no qkv bias
  EXPECT_EQ(ParamLayout(one).block_tensor(0, kQNormW), -1);               // Llama has none
  for (const char* name : {"llama-tiny", "llama3-1b", "llama3-8b", "qwen3-0.6b"}) {
    const ModelConfig c = *ModelPreset(name);
    EXPECT_EQ(static_cast<int64_t>(ParamLayout(c).num_params()),
              EmbeddingParams(c) + c.layers * BlockParams(c) + FinalParams(c))
        << name;
  }
}

TEST(ConfigTest, LlamaValidationNamesTheField) {
  // layers, heads, kv_heads, dim, ffn_dim, context, vocab
  auto message = [](const LlamaShape& s) {
    return std::string(MakeLlamaConfig(s).status().message());
  };
  EXPECT_EQ(message({2, 4, 3, 32, 64, 16, 256}),
            "model.kv_heads: 3 does not divide model.heads: 4");
  EXPECT_EQ(message({2, 4, 0, 32, 64, 16, 256}), "model.kv_heads: must be >= 1, got 0");
  EXPECT_EQ(message({2, 4, 2, 32, 0, 16, 256}), "model.ffn_dim: must be >= 1, got 0");
  EXPECT_EQ(message({2, 4, 2, 12, 64, 16, 256}),
            "model.dim: rotary positions need an even head size, dim / heads = 12 / 4 = 3");
  EXPECT_EQ(message({2, 4, 2, 32, 64, 16, 256, /*rope_theta=*/0}),
            "model.rope_theta: must be a finite number > 0, got 0");
  EXPECT_EQ(message({2, 4, 2, 32, 64, 16, 256, 1e4, /*norm_eps=*/-1}),
            "model.norm_eps: must be a finite number > 0, got -1");
  EXPECT_TRUE(MakeLlamaConfig({2, 4, 2, 32, 64, 16, 256}).ok());
  // A GPT-2 config is refused with a recipe it does not have.
  ModelConfig c = *MakeGptConfig(2, 4, 32, 16, 256);
  c.bias = false;
  EXPECT_NE(ValidateModelConfig(c).message().find("model.arch"), std::string::npos);
}

TEST(ParamLayoutTest, LlamaTensorsFollowTheRecipe) {
  // 2 layers, 4 heads (hs 8), 2 kv heads, dim 32, SwiGLU 48, untied.
  const ModelConfig c = *MakeLlamaConfig({2, 4, 2, 32, 48, 16, 100});
  const ParamLayout layout(c);
  std::vector<std::string> names;
  for (const TensorInfo& t : layout.tensors()) names.push_back(t.name);
  const std::vector<std::string> want = {"wte",
                                         "block.0.ln1.weight",
                                         "block.0.attn.qkv.weight",
                                         "block.0.attn.proj.weight",
                                         "block.0.ln2.weight",
                                         "block.0.mlp.fc.weight",
                                         "block.0.mlp.proj.weight",
                                         "block.1.ln1.weight",
                                         "block.1.attn.qkv.weight",
                                         "block.1.attn.proj.weight",
                                         "block.1.ln2.weight",
                                         "block.1.mlp.fc.weight",
                                         "block.1.mlp.proj.weight",
                                         "lnf.weight",
                                         "lm_head"};
  EXPECT_EQ(names, want);
  EXPECT_EQ(layout.tensors()[layout.block_tensor(1, kQkvW)].shape,
            (std::vector<int64_t>{32 + 2 * 16, 32}));
  EXPECT_EQ(layout.tensors()[layout.block_tensor(1, kFcW)].shape,
            (std::vector<int64_t>{2 * 48, 32}));  // [gate; up]
  EXPECT_EQ(layout.tensors()[layout.block_tensor(1, kFcProjW)].shape,
            (std::vector<int64_t>{32, 48}));
  for (BlockTensor absent : {kLn1B, kQkvB, kAttnProjB, kLn2B, kFcB, kFcProjB}) {
    EXPECT_EQ(layout.block_tensor(1, absent), -1) << absent;
  }
  EXPECT_EQ(layout.wpe(), -1);
  EXPECT_EQ(layout.lnf_b(), -1);
  EXPECT_EQ(layout.tensors()[layout.lm_head()].name, "lm_head");
  EXPECT_EQ(layout.units().back().name, "final");
  EXPECT_EQ(layout.tensors()[layout.lm_head()].unit, static_cast<int>(layout.units().size()) - 1);
  EXPECT_TRUE(layout.tensors()[layout.lm_head()].decay);
  // Tied: the head is wte.
  const ParamLayout tied(*MakeLlamaConfig({2, 4, 2, 32, 48, 16, 100, 1e4, 1e-5, true}));
  EXPECT_EQ(tied.lm_head(), tied.wte());
  EXPECT_EQ(tied.num_params() + 128 * 32, layout.num_params());
}

// Tensor parallelism: the tp ranks' slices partition the whole model, each
// qkv row part ([q; k; v] of different sizes under GQA) and SwiGLU's [gate;
// up] split on its own.
TEST(ParamLayoutTest, TensorParallelSlicesPartitionTheModel) {
  for (const ModelConfig& c :
       {*MakeGptConfig(2, 4, 32, 16, 100), *MakeLlamaConfig({2, 4, 2, 32, 48, 16, 100})}) {
    const int tp = 2;
    const ParamLayout whole(c);
    std::vector<int> owner(whole.num_params(), -1);
    for (int r = 0; r < tp; ++r) {
      ModelSlice slice;
      slice.tp = tp;
      slice.tp_rank = r;
      const ParamLayout part(c, slice);
      size_t covered = 0;
      for (const FlatRun& run : part.GlobalRuns()) {
        for (size_t i = 0; i < run.count; ++i) {
          const size_t g = run.global + i;
          if (owner[g] != -1 && owner[g] != r) continue;  // replicated: every rank holds it
          owner[g] = r;
        }
        covered += run.count;
      }
      EXPECT_EQ(covered, part.num_params());
    }
    EXPECT_EQ(std::count(owner.begin(), owner.end(), -1), 0) << ToString(c);
    // k's rows of rank 1 under GQA: kv head 1 (rows 8..15 of k) of layer 0's qkv.
    if (c.arch == Arch::kLlama) {
      ModelSlice slice;
      slice.tp = tp;
      slice.tp_rank = 1;
      const ParamLayout part(c, slice);
      const TensorInfo& qkv = part.tensors()[part.block_tensor(0, kQkvW)];
      EXPECT_EQ(qkv.shape, (std::vector<int64_t>{(32 + 2 * 16) / 2, 32}));
      const size_t g0 = whole.offset(whole.block_tensor(0, kQkvW));
      std::vector<FlatRun> runs = part.GlobalRuns(qkv.offset, qkv.offset + qkv.numel);
      ASSERT_EQ(runs.size(), 3u);                          // q, k, v parts
      EXPECT_EQ(runs[0].global, g0 + 16 * 32);             // q rows 16..31
      EXPECT_EQ(runs[1].global, g0 + (32 + 8) * 32);       // k rows 8..15
      EXPECT_EQ(runs[2].global, g0 + (32 + 16 + 8) * 32);  // v rows 8..15
      EXPECT_EQ(runs[1].count, 8u * 32);
    }
  }
}

}  // namespace
}  // namespace shardtrain::model
