// The activation table in bytes: statistics in fp32 whatever the compute
// type, every other tensor in the compute type, each aligned to 16 bytes
// within its kind.
#include "common/model/activations.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "common/model/slice.h"

namespace shardtrain::model {
namespace {

bool IsStat(const std::string& name) {
  for (const char* suffix : {"_mean", "_rstd"}) {
    const std::string s(suffix);
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0)
      return true;
  }
  return name == "losses" || name == "lse" || IntBlockActivation(name.substr(name.rfind('.') + 1));
}

TEST(ActivationTableTest, StatisticsStayFp32AndTheRestTakeTheComputeType) {
  const ModelConfig cfg = *MakeGptConfig(/*layers=*/2, /*heads=*/2, /*dim=*/6, /*context=*/8,
                                         /*vocab=*/11);
  for (DataType dt : {DataType::kFloat32, DataType::kBFloat16, DataType::kFloat16}) {
    SCOPED_TRACE(std::string(DataTypeName(dt)));
    const ActivationTable t(cfg, /*B=*/3, /*T=*/5, {}, dt);
    EXPECT_EQ(t.compute(), dt);
    int64_t saved = 0, scratch = 0, stats = 0;
    for (const ActivationTensor& a : t.tensors()) {
      EXPECT_EQ(a.dtype, IsStat(a.name) ? DataType::kFloat32 : dt) << a.name;
      EXPECT_EQ(a.offset % 16, 0) << a.name;
      int64_t& end = a.kind == ActivationKind::kSaved ? saved : scratch;
      EXPECT_EQ(a.offset, end) << a.name;  // packed in order, each rounded up to 16 bytes
      end += (a.numel * int64_t(DataTypeSize(a.dtype)) + 15) / 16 * 16;
      if (IsStat(a.name)) ++stats;
    }
    EXPECT_EQ(stats, 2 * 2 * 2 + 4);  // ln1/ln2 mean+rstd per layer, lnf's two, losses, lse
    EXPECT_EQ(t.saved_bytes(), saved);
    EXPECT_EQ(t.scratch_bytes(), scratch);
    EXPECT_EQ(t.bytes(3), 3 * saved + scratch);
  }
  // 15 rows: an fp32 statistic is 60 bytes (64 aligned); a (15, 6) bf16
  // tensor 180 (192), in fp32 360 (368).
  const ActivationTable bf(cfg, 3, 5, {}, DataType::kBFloat16);
  EXPECT_EQ(bf.at("block.0.ln1_mean").bytes(), 60);
  EXPECT_EQ(bf.at("block.0.ln1").bytes(), 180);
  EXPECT_EQ(bf.at("block.0.ln1_mean").offset - bf.at("block.0.ln1").offset, 192);
  const ActivationTable f(cfg, 3, 5);
  EXPECT_EQ(f.at("block.0.ln1_mean").offset - f.at("block.0.ln1").offset, 368);
}

// The table against Korthikanti et al. 2022 ("Reducing Activation
// Recomputation in Large Transformer Models", Table 2): activation bytes
// per transformer layer of a GPT-3 175B layer (h = 12288, a = 96, s = 2048,
// b = 1, t = 8, 16-bit), our saved "block.<l>.*" tensors beside each
// formula. Every difference is explained term by term and must add up to
// the byte:
//   - the paper keeps two dropout masks of s·b·h bytes (attention output,
//     MLP output) outside the tp region, and in the attention core a dropout
//     mask (a·s²·b bytes) and the dropout's output (2·a·s²·b) beside the
//     softmax (2·a·s²·b): shardtrain's GPT has no dropout, so keeps neither:
//     −2sbh (÷ t under sequence parallelism) and −3as²b/t;
//   - shardtrain keeps each LayerNorm's mean and rstd in fp32 (2 norms × 2
//     × 4 bytes per token), which the paper leaves out: +16sb (÷ t under
//     sequence parallelism);
//   - the paper's LN inputs and the QKV and fc inputs are our residual3 (of
//     the previous layer), residual2, ln1 and ln2: the same 8sbh.
TEST(ActivationTableTest, MatchesKorthikantiTable2ForAGpt3Layer) {
  const int64_t h = 12288, a = 96, s = 2048, b = 1, t = 8;
  const ModelConfig cfg = *MakeGptConfig(/*layers=*/96, a, h, /*context=*/s, /*vocab=*/50257);
  const ModelSlice middle{/*first_layer=*/1,     /*num_layers=*/1,
                          /*first_stage=*/false,
                          /*last_stage=*/false,  t,
                          /*tp_rank=*/0};
  const double sbh = double(s * b * h), as2b = double(a * s * s * b), sb = double(s * b);
  struct Row {
    const char* what;
    ActivationPolicy policy;
    double paper;    // the paper's formula, bytes
    double dropout;  // what the paper keeps for dropout (we have none)
    double stats;    // our fp32 LayerNorm statistics
  };
  const Row rows[] = {
      {"tensor parallel (baseline)",
       {Recompute::kNone, -1, false},
       sbh * (10 + 24.0 / t + 5.0 * a * s / (h * t)),
       2 * sbh + 3 * as2b / t,
       16 * sb},
      {"tp + sequence parallel",
       {Recompute::kNone, -1, true},
       sbh * (34 + 5.0 * a * s / h) / t,
       2 * sbh / t + 3 * as2b / t,
       16 * sb / t},
      {"tp + selective recompute",
       {Recompute::kSelective, -1, false},
       sbh * (10 + 24.0 / t),
       2 * sbh,
       16 * sb},
      {"tp + sp + selective recompute",
       {Recompute::kSelective, -1, true},
       sbh * 34 / t,
       2 * sbh / t,
       16 * sb / t},
      {"full recompute", {Recompute::kFull, -1, false}, 2 * sbh, 0, 0},
  };
  std::printf("%-30s %16s %16s %7s  %s\n", "GPT-3 175B layer, t = 8", "paper (bytes)",
              "ours (bytes)", "ratio", "difference");
  for (const Row& r : rows) {
    const ActivationTable table(cfg, int(b), int(s), middle, DataType::kBFloat16, r.policy);
    int64_t ours = 0;
    for (const ActivationTensor& x : table.tensors()) {
      if (x.kind == ActivationKind::kSaved && x.name.rfind("block.1.", 0) == 0) ours += x.bytes();
    }
    std::printf("%-30s %16.0f %16lld %7.4f  %+.0f = no dropout %+.0f, fp32 statistics %+.0f\n",
                r.what, r.paper, static_cast<long long>(ours), double(ours) / r.paper,
                double(ours) - r.paper, -r.dropout, r.stats);
    EXPECT_EQ(double(ours), r.paper - r.dropout + r.stats) << r.what;
  }
}

// Flash attention (the CUDA engine, 16-bit, heads of 64 or 128): att is
// each row's logsumexp (B·NH·T fp32) instead of the T² probabilities, the
// attention scratch backward's row dot products (the same size), and
// selective recomputation refills nothing, so keeps what none keeps.
TEST(ActivationTableTest, FlashAttentionKeepsRowStatisticsInsteadOfProbabilities) {
  const ModelConfig cfg = *MakeGptConfig(/*layers=*/2, /*heads=*/2, /*dim=*/128, /*context=*/64,
                                         /*vocab=*/11);
  EXPECT_TRUE(FlashAttentionApplies(DataType::kBFloat16, cfg.head_dim()));
  EXPECT_FALSE(FlashAttentionApplies(DataType::kFloat32, cfg.head_dim()));
  EXPECT_FALSE(FlashAttentionApplies(DataType::kBFloat16, 32));
  const int B = 3, T = 64;
  ActivationPolicy flash;
  flash.flash_attention = true;
  const ActivationTable plain(cfg, B, T, {}, DataType::kBFloat16);
  const ActivationTable t(cfg, B, T, {}, DataType::kBFloat16, flash);
  const int64_t rows = int64_t{B} * cfg.heads * T;
  EXPECT_EQ(plain.at("block.0.att").numel, rows * T);
  EXPECT_EQ(t.at("block.0.att").numel, rows);
  EXPECT_EQ(t.at("block.0.att").dtype, DataType::kFloat32);
  EXPECT_EQ(t.at("att_scratch").numel, rows);
  EXPECT_EQ(t.at("att_scratch").dtype, DataType::kFloat32);
  // Per layer the saved set shrinks by the probabilities less the rows:
  // B·NH·T·(2T − 4) bytes (16-byte alignment aside: both are multiples).
  EXPECT_EQ(plain.saved_bytes() - t.saved_bytes(), 2 * rows * (2 * T - 4));
  ActivationPolicy selective = flash;
  selective.recompute = Recompute::kSelective;
  const ActivationTable s(cfg, B, T, {}, DataType::kBFloat16, selective);
  EXPECT_EQ(s.bytes(1), t.bytes(1));
  EXPECT_EQ(s.find("recompute.att"), nullptr);
  std::printf(
      "[activations] B=%d T=%d bf16 per micro-batch: materialized %lld bytes saved, "
      "flash %lld\n",
      B, T, static_cast<long long>(plain.saved_bytes()), static_cast<long long>(t.saved_bytes()));
}

// An interleaved slice (two chunks: layers 1 and 3 of 4 on the last stage):
// each chunk's saved set is contiguous — its block, its input ("encoded",
// "encoded.1") and, with the last chunk, the model's end — and bytes() of
// per-chunk slots sums each chunk's sets.
TEST(ActivationTableTest, InterleavedChunksKeepContiguousSets) {
  const ModelConfig c = *MakeGptConfig(4, 2, 16, 8, 64);
  const ModelSlice last = SliceOf({1, 1, 1, 1}, 1, 1, 0, /*chunks=*/2);
  const ActivationTable t(c, 2, 8, last);
  ASSERT_EQ(t.chunks(), 2);
  const auto [b0, e0] = t.chunk_saved(0);
  const auto [b1, e1] = t.chunk_saved(1);
  EXPECT_EQ(b0, 0);
  EXPECT_EQ(e0, b1);
  EXPECT_EQ(e1, t.saved_bytes());
  auto in = [&](const char* name, int64_t b, int64_t e) {
    const ActivationTensor& x = t.at(name);
    return x.offset >= b && x.offset + x.bytes() <= e;
  };
  EXPECT_TRUE(in("block.1.qkv", b0, e0));
  EXPECT_TRUE(in("encoded", b0, e0));
  EXPECT_TRUE(in("block.3.residual3", b1, e1));
  EXPECT_TRUE(in("encoded.1", b1, e1));
  EXPECT_TRUE(in("logits", b1, e1));
  EXPECT_EQ(t.find("block.2.qkv"), nullptr);
  EXPECT_EQ(t.bytes(std::vector<int>{3, 1}), 3 * (e0 - b0) + (e1 - b1) + t.scratch_bytes());
  EXPECT_EQ(t.bytes(std::vector<int>{2, 2}), t.bytes(2));
}

}  // namespace
}  // namespace shardtrain::model
