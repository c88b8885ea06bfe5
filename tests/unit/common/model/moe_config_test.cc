// Mixture-of-Experts in the recipe: parameter counts (total and active,
// Mixtral's published ones), the layout of an MoE block and its experts,
// tensor-parallel slices, the activation table, validation, and the job
// spec's model.moe and router section.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "common/model/activations.h"
#include "common/model/config.h"
#include "common/model/param_layout.h"

namespace shardtrain::model {
namespace {

// Mixtral 8x7B: 46,702,792,704 parameters (Hugging Face's count of
// mistralai/Mixtral-8x7B-v0.1; "46.7B total") of which 12,879,925,248 are
// used per token ("12.9B active"): its two of eight experts per layer.
TEST(MoeConfigTest, MixtralHasItsPublishedTotalAndActiveParameters) {
  const ModelConfig c = *ModelPreset("mixtral-8x7b");
  EXPECT_EQ(ModelParams(c), 46702792704);
  EXPECT_EQ(ActiveModelParams(c), 12879925248);
  EXPECT_EQ(static_cast<int64_t>(ParamLayout(c).num_params()), ModelParams(c));
  std::printf("mixtral-8x7b: %.1fB total, %.1fB active\n", ModelParams(c) / 1e9,
              ActiveModelParams(c) / 1e9);
  // Qwen3-30B-A3B: "30.5B in total and 3.3B activated" (its model card);
  // 30,532,122,624 and 3,353,032,704 here, both embeddings counted.
  const ModelConfig qwen = *ModelPreset("qwen3-30b-a3b");
  EXPECT_EQ(ModelParams(qwen), 30532122624);
  EXPECT_EQ(ActiveModelParams(qwen), 3353032704);
  std::printf("qwen3-30b-a3b: %lld total, %lld active\n", static_cast<long long>(ModelParams(qwen)),
              static_cast<long long>(ActiveModelParams(qwen)));
  // Without MoE the active count is the total.
  const ModelConfig dense = *ModelPreset("llama3-1b");
  EXPECT_EQ(ActiveModelParams(dense), ModelParams(dense));
  EXPECT_EQ(ModelParams(dense),
            EmbeddingParams(dense) + dense.layers * BlockParams(dense) + FinalParams(dense));
}

// An MoE block: no dense MLP without shared experts, the router, then every
// expert's fc weights (contiguous, one (E, FC, C) array), their proj
// weights; a dense first layer keeps the dense MLP.
TEST(MoeConfigTest, TheLayoutHoldsTheRouterAndEachExpertsTensors) {
  ModelConfig c = *ModelPreset("moe-tiny");
  c.moe.first_dense_layers = 1;
  ASSERT_TRUE(ValidateModelConfig(c).ok());
  const ParamLayout lay(c);
  EXPECT_EQ(static_cast<int64_t>(lay.num_params()), ModelParams(c));
  EXPECT_GE(lay.block_tensor(0, kFcW), 0);
  EXPECT_EQ(lay.block_tensor(0, kRouterW), -1);
  EXPECT_EQ(lay.block_tensor(1, kFcW), -1);  // no shared experts
  const TensorInfo& router = lay.tensors()[lay.block_tensor(1, kRouterW)];
  EXPECT_EQ(router.name, "block.1.mlp.router.weight");
  EXPECT_EQ(router.shape, (std::vector<int64_t>{4, 128}));
  EXPECT_EQ(lay.local_experts(), 4);
  for (int e = 0; e < 4; ++e) {
    const TensorInfo& fc = lay.tensors()[lay.expert_tensor(1, kExpFcW, e)];
    EXPECT_EQ(fc.name, "block.1.mlp.experts." + std::to_string(e) + ".fc.weight");
    EXPECT_EQ(fc.shape, (std::vector<int64_t>{256, 128}));  // [gate; up] of 128
    EXPECT_EQ(fc.offset, lay.offset(lay.expert_tensor(1, kExpFcW, 0)) + e * fc.numel);
    const TensorInfo& proj = lay.tensors()[lay.expert_tensor(1, kExpProjW, e)];
    EXPECT_EQ(proj.shape, (std::vector<int64_t>{128, 128}));
    EXPECT_EQ(proj.offset, lay.offset(lay.expert_tensor(1, kExpProjW, 0)) + e * proj.numel);
  }
  EXPECT_EQ(lay.expert_tensor(1, kExpFcB, 0), -1);  // Llama: no biases
  // One shared expert: the dense MLP of He again, beside the router.
  c.moe.shared_experts = 2;
  const ParamLayout shared(c);
  EXPECT_EQ(shared.tensors()[shared.block_tensor(1, kFcW)].shape, (std::vector<int64_t>{512, 128}));
  EXPECT_EQ(static_cast<int64_t>(shared.num_params()), ModelParams(c));
  EXPECT_EQ(ActiveBlockParams(c, 1), BlockParams(c, 1) - 2 * (3 * 128 * 128));
}

// tp slices of an MoE model (GELU experts with biases, a shared expert, a
// dense first layer) hold every element of the whole model between them.
TEST(MoeConfigTest, TensorParallelSlicesPartitionAnMoeModel) {
  ModelConfig c = *MakeGptConfig(2, 4, 32, 16, 100);
  c.moe = {4, 2, 64, 1, RouterScoring::kSigmoid, false, 1};
  ASSERT_TRUE(ValidateModelConfig(c).ok());
  const ParamLayout whole(c);
  EXPECT_EQ(static_cast<int64_t>(whole.num_params()), ModelParams(c));
  std::vector<int> owner(whole.num_params(), -1);
  for (int r = 0; r < 2; ++r) {
    ModelSlice slice;
    slice.tp = 2;
    slice.tp_rank = r;
    const ParamLayout part(c, slice);
    size_t covered = 0;
    for (const FlatRun& run : part.GlobalRuns()) {
      for (size_t i = 0; i < run.count; ++i) {
        if (owner[run.global + i] == -1) owner[run.global + i] = r;
      }
      covered += run.count;
    }
    EXPECT_EQ(covered, part.num_params());
    EXPECT_EQ(part.tensors()[part.expert_tensor(1, kExpFcW, 3)].shape,
              (std::vector<int64_t>{32, 32}));
    EXPECT_EQ(part.tensors()[part.expert_tensor(1, kExpProjW, 3)].shape,
              (std::vector<int64_t>{32, 32}));
    EXPECT_TRUE(part.tensors()[part.block_tensor(1, kRouterW)].replicated);
  }
  EXPECT_EQ(std::count(owner.begin(), owner.end(), -1), 0);
}

TEST(MoeConfigTest, ActivationTableHoldsTheRoutersAndExpertsTensorsInMoeLayersOnly) {
  ModelConfig c = *ModelPreset("moe-tiny");
  c.moe.first_dense_layers = 1;
  const int B = 2, T = 8, BT = B * T, K = 2, E = 4;
  const ActivationTable t(c, B, T, {}, DataType::kBFloat16);
  EXPECT_EQ(t.find("block.0.router_scores"), nullptr);
  EXPECT_NE(t.find("block.0.fch"), nullptr);
  EXPECT_EQ(t.find("block.1.fch"), nullptr);  // no shared experts
  EXPECT_EQ(t.at("block.1.router_scores").numel, BT * E);
  EXPECT_EQ(t.at("block.1.moe_h_pre").numel, BT * K * 256);
  EXPECT_EQ(t.at("block.1.moe_y").numel, BT * K * 128);
  // The integers are 4 bytes whatever the compute type.
  EXPECT_EQ(t.at("block.1.router_experts").bytes(), BT * K * 4);
  EXPECT_EQ(t.at("block.1.moe_index").numel, 2 * BT * K + 2 * E + 1);
  EXPECT_EQ(t.at("block.1.moe_xp").bytes(), BT * K * 128 * 2);
  EXPECT_EQ(t.at("moe_dxp").numel, BT * K * 128);
  // Full recomputation refills them from one shared set.
  ActivationPolicy full;
  full.recompute = Recompute::kFull;
  const ActivationTable r(c, B, T, {}, DataType::kFloat32, full);
  EXPECT_EQ(r.find("block.1.moe_xp"), nullptr);
  EXPECT_EQ(r.at("recompute.moe_xp").numel, BT * K * 128);
  EXPECT_EQ(r.at("recompute.fch").numel, BT * 768);  // the dense layer's
}

TEST(MoeConfigTest, ValidationNamesTheFieldAndBothValues) {
  auto message = [](MoeConfig m) {
    ModelConfig c = *ModelPreset("llama-tiny");
    c.moe = m;
    return std::string(ValidateModelConfig(c).message());
  };
  EXPECT_EQ(message({4, 5, 64}), "model.moe.top_k: must be in [1, model.moe.experts: 4], got 5");
  EXPECT_EQ(message({4, 0, 64}), "model.moe.top_k: must be in [1, model.moe.experts: 4], got 0");
  EXPECT_EQ(message({4, 2, 0}).rfind("model.moe.expert_ffn_dim: must be >= 1", 0), 0u);
  EXPECT_EQ(message({4, 2, 64, -1}).rfind("model.moe.shared_experts: must be >= 0", 0), 0u);
  EXPECT_EQ(message({4, 2, 64, 0, RouterScoring::kSoftmax, true, 4}),
            "model.moe.first_dense_layers: must be in [0, model.layers: 4), got 4");
  EXPECT_NE(ToString(*ModelPreset("moe-tiny")).find("moe (experts 4, top_k 2"), std::string::npos);
}

std::string Spec(const std::string& model, const std::string& extra = "", int global = 16) {
  return "name: m\nmodel: " + model +
         "\ndata: {train: data/fortunes.txt}\nbatch: {global: " + std::to_string(global) +
         ", micro: 4, seq_len: 16}\nsteps: 1\n" + extra;
}

TEST(MoeSpecTest, TheSpecReadsWritesAndRefusesIt) {
  const std::string llama = "arch: llama, layers: 2, heads: 4, dim: 32, context: 16, vocab: 256";
  absl::StatusOr<JobSpec> s = ParseJobSpec(
      Spec("{" + llama + ", moe: {experts: 8, top_k: 2, shared_experts: 1, scoring: sigmoid}}",
           "router: {aux_loss_coef: 0.001, z_loss_coef: 0.0001, capacity_factor: 1.25}\n"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->model.moe.experts, 8);
  EXPECT_EQ(s->model.moe.expert_ffn_dim, s->model.ffn_dim);  // the default
  EXPECT_EQ(s->model.moe.scoring, RouterScoring::kSigmoid);
  EXPECT_EQ(s->router.capacity_factor, 1.25);
  EXPECT_EQ(s->model.Config()->moe, s->model.moe);
  absl::StatusOr<JobSpec> again = ParseJobSpec(JobSpecToYaml(*s));
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << JobSpecToYaml(*s);
  EXPECT_EQ(*again, *s);
  // GPT-2 with GELU experts; a preset's MoE, and none.
  s =
      ParseJobSpec(Spec("{layers: 2, heads: 4, dim: 32, context: 16, vocab: 256, "
                        "moe: {experts: 4, top_k: 1, expert_ffn_dim: 64}}"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->router.aux_loss_coef, 0.01);
  // Expert parallelism within the replicas: ep 2 of dp 4, round trip.
  s = ParseJobSpec(Spec("{preset: moe-tiny}", "parallel: {dp: 4, ep: 2}\n"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->Dims()->ep(), 2);
  EXPECT_EQ(*ParseJobSpec(JobSpecToYaml(*s)), *s);
  s = ParseJobSpec(Spec("{preset: moe-tiny}"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->model.moe.experts, 4);
  // A GPU job plans (the coordinator refuses to run it: no CUDA kernels yet).
  EXPECT_TRUE(ParseJobSpec(Spec("{preset: moe-tiny}", "resources: {device: cuda}\n")).ok());
  s = ParseJobSpec(Spec("{preset: moe-tiny, moe: none}"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->model.moe.on());

  struct Bad {
    std::string model, extra, starts;
    int global = 16;
  };
  const std::vector<Bad> bad = {
      {"{preset: moe-tiny, moe: {experts: 4, top_k: 5}}", "",
       "model.moe.top_k: must be in [1, model.moe.experts: 4], got 5"},
      {"{preset: moe-tiny, moe: {experts: 4}}", "", "model.moe.top_k"},
      {"{preset: moe-tiny, moe: {experts: 4, top_k: 2, topk: 2}}", "", "model.moe.topk"},
      {"{preset: moe-tiny, moe: {experts: 4, top_k: 2, scoring: relu}}", "", "model.moe.scoring"},
      {"{preset: moe-tiny}", "router: {capacity_factor: -1}\n", "router.capacity_factor"},
      {"{preset: moe-tiny}", "router: {bias_update_rate: 0.001}\n", "router.bias_update_rate"},
      {"{preset: moe-tiny}", "parallel: {dp: 3, ep: 3}\n",
       "parallel.ep: 3 does not divide model.moe.experts: 4", 12},
      {"{preset: moe-tiny}", "parallel: {dp: 2, ep: 4}\n",
       "parallel.ep: 4 does not divide parallel.dp × parallel.cp = 2 × 1 = 2"},
      {"{preset: llama-tiny}", "parallel: {dp: 2, ep: 2}\n",
       "parallel.ep: 2 splits experts: it "
       "needs model.moe"},
      {"{preset: moe-tiny, moe: {experts: 4, top_k: 2, expert_ffn_dim: 63}}",
       "parallel: {tp: 2}\nresources: {min_workers: 1}\n",
       "parallel.tp: 2 does not divide model.moe.expert_ffn_dim: 63"},
  };
  for (const Bad& b : bad) {
    absl::StatusOr<JobSpec> r = ParseJobSpec(Spec(b.model, b.extra, b.global));
    ASSERT_FALSE(r.ok()) << b.model << " " << b.extra;
    EXPECT_NE(std::string(r.status().message()).find(b.starts), std::string::npos)
        << r.status().message();
  }
}

}  // namespace
}  // namespace shardtrain::model
