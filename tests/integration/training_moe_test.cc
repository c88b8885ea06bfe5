// A mixture of experts fine-tuned from a Hugging Face checkpoint through the
// real path (training_test's third part, the same executable): a tiny
// Qwen3-MoE-shaped checkpoint written by PyTorch, a spec that names only
// model.init (the CLI reads the shape and the balancing coefficient from
// config.json), 50 steps on 4 worker processes with the experts split over
// ep 2 (dp 4: each expert group kept by 2 ranks), `shardtrain export` to
// Hugging Face's layout, and that export read back on one rank gives the
// last checkpoint's validation loss.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "tests/integration/harness.h"
#include "tests/integration/training_util.h"

namespace shardtrain::testing {
namespace {

std::string Python() {
  const char* env = std::getenv("SHARDTRAIN_PYTHON");
  return env != nullptr && *env != '\0' ? env : "/usr/bin/python3";
}

TEST_F(TrainingTest, Qwen3MoeFineTunesFromHuggingFaceOnFourWorkersAndExports) {
  const std::string script = SourceDir() + "/tests/unit/worker/checkpoint/hf_llama_logits.py";
  if (std::system((Python() + " -c 'import torch' >/dev/null 2>&1").c_str()) != 0) {
    GTEST_SKIP() << Python() << " cannot import torch (scripts/setup installs python3-torch)";
  }
  TempDir dir;
  // The checkpoint: random BF16 weights in Qwen3MoeForCausalLM's names
  // (q/k norms, head 16 on dim 32, a dense first layer, 4 experts of which
  // each token takes 2, router_aux_loss_coef 0.001), byte-level vocabulary.
  const std::string hf = dir.path() + "/qwen3-moe";
  std::filesystem::create_directories(hf);
  std::ofstream(hf + "/shape.txt")
      << "layers 3\nheads 4\nkv_heads 2\ndim 32\nffn_dim 48\nvocab 256\nrope_theta 1000000\n"
         "norm_eps 1e-06\ntie 0\nbatch 1\nseq_len 8\nhead_dim 16\nqk_norm 1\nexperts 4\ntop_k 2\n"
         "expert_ffn 16\nnorm_topk 1\nfirst_dense 1\nshards 2\n";
  ASSERT_EQ(std::system((Python() + " " + script + " " + hf + " >/dev/null").c_str()), 0);

  const std::string spec = dir.path() + "/finetune.yaml";
  std::ofstream(spec) << "name: qwen3-moe-finetune\nmodel: {init: " << hf << "}\n"
                      << "data: {train: " << kData << ", val: " << SourceDir()
                      << "/data/fortunes-val.txt}\n"
                         "batch: {global: 16, micro: 4, seq_len: 32}\n"
                         "parallel: {dp: 4, ep: 2}\n"
                         "optimizer: {lr: 0.003, warmup_steps: 5}\n"
                         "eval: {every: 25, batches: 2}\nsteps: 50\n"
                         "checkpoint: {every: 25}\n";
  // The shape and the coefficient come from config.json: 0.001 × top 2
  // over the 2 MoE layers.
  const std::string ckpt = dir.path() + "/ckpt";
  CommandResult plan =
      RunCommand({SHARDTRAIN_CLI_BIN, "plan", spec, "--set", "checkpoint.dir=" + ckpt});
  ASSERT_EQ(plan.exit_code, 0) << plan.out << plan.err;
  EXPECT_NE(
      plan.err.find("model from " + hf + "/config.json: arch llama, layers 3, heads 4, dim 32"),
      std::string::npos)
      << plan.err;
  EXPECT_NE(plan.err.find("moe {experts: 4, top_k: 2, expert_ffn_dim: 16, norm_topk_prob: true, "
                          "first_dense_layers: 1}"),
            std::string::npos)
      << plan.err;
  EXPECT_NE(plan.err.find("router.aux_loss_coef 0.001 (router_aux_loss_coef × top_k / MoE layers)"),
            std::string::npos)
      << plan.err;
  CommandResult r = RunCommand({SHARDTRAIN_CLI_BIN, "local", spec, "--workers", "4", "--threads",
                                "1", "--output", "json", "--set", "checkpoint.dir=" + ckpt},
                               seconds(600));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::vector<double> losses = Losses(r.out);
  ASSERT_EQ(losses.size(), 50u);
  const std::map<int, double> val = ValLosses(r.out);
  ASSERT_EQ(val.size(), 2u);  // steps 25 and 50
  std::cout << "qwen3-moe from Hugging Face (dp 4, ep 2, 4 workers): loss " << losses.front()
            << " -> " << losses.back() << ", validation " << val.begin()->second << " -> "
            << val.rbegin()->second << std::endl;
  EXPECT_LT(losses.back(), losses.front() - 1.0);
  EXPECT_LT(val.rbegin()->second, val.begin()->second);

  const std::string out = dir.path() + "/export";
  CommandResult e = RunCommand({SHARDTRAIN_CLI_BIN, "export", ckpt, "--out", out});
  ASSERT_EQ(e.exit_code, 0) << e.err;
  std::cout << e.out;
  EXPECT_NE(e.out.find("4 experts of 16, top 2"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("(Hugging Face Qwen3MoeForCausalLM layout)"), std::string::npos) << e.out;
  std::ifstream config_file(out + "/config.json");
  const std::string config((std::istreambuf_iterator<char>(config_file)),
                           std::istreambuf_iterator<char>());
  EXPECT_NE(config.find("Qwen3MoeForCausalLM"), std::string::npos) << config;
  // The export on one rank, not moved (lr 1e-30): its first validation is
  // the source's last.
  const std::string again = dir.path() + "/again.yaml";
  std::ofstream(again) << "name: qwen3-moe-again\nmodel: {init: " << out << "}\n"
                       << "data: {train: " << kData << ", val: " << SourceDir()
                       << "/data/fortunes-val.txt}\n"
                          "batch: {global: 16, micro: 16, seq_len: 32}\n"
                          "optimizer: {lr: 1e-30}\neval: {every: 1, batches: 2}\nsteps: 1\n";
  CommandResult a = RunCommand({SHARDTRAIN_CLI_BIN, "local", again, "--workers", "1", "--output",
                                "json", "--set", "checkpoint.dir=" + dir.path() + "/again"},
                               seconds(300));
  ASSERT_EQ(a.exit_code, 0) << a.out << a.err;
  const std::map<int, double> back = ValLosses(a.out);
  ASSERT_EQ(back.count(1), 1u) << a.out;
  std::cout << "the export read back on one rank: validation " << back.at(1)
            << ", the fine-tune's last " << val.rbegin()->second << std::endl;
  EXPECT_NEAR(back.at(1), val.rbegin()->second, 1e-5 * val.rbegin()->second);
}

}  // namespace
}  // namespace shardtrain::testing
