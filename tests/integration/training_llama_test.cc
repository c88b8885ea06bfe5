// The Llama family through the real path (training_test's other half, the
// same executable): Llama 3 tokens prepared, trained and sampled; a small
// Llama on 4 workers (dp 2 × tp 2) that learns, exported in Hugging Face's
// layout and trained again from a spec that names only model.init.
#include <gtest/gtest.h>

#include <cmath>
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

using std::chrono::seconds;

// Llama 3 tokens end to end: `shardtrain prepare --tokenizer llama3` writes
// uint32 shards led by <|begin_of_text|>, examples/llama3-tokens-fortunes.yaml
// (llama-tiny with Llama 3's 128,256-id vocabulary) trains a few steps on
// them, and `shardtrain sample` encodes the prompt and decodes the
// continuation with Llama 3's tokenizer.
TEST_F(TrainingTest, PreparedLlama3ShardsTrainAndSample) {
  TempDir dir;
  const std::string out = dir.path() + "/fortunes-llama3";
  CommandResult p = RunCommand({SHARDTRAIN_CLI_BIN, "prepare", kData, "--tokenizer", "llama3",
                                "--val-fraction", "0.05", "--threads", "2", "--out", out});
  ASSERT_EQ(p.exit_code, 0) << p.out << p.err;
  std::cout << p.out;
  EXPECT_NE(p.out.find("vocabulary 128256 ids, uint32 token files, id 128000 leads each document"),
            std::string::npos)
      << p.out;
  EXPECT_NE(p.out.find("format: llmc, tokenizer: llama3} (model.vocab >= 128256)"),
            std::string::npos)
      << p.out;
  CommandResult r = RunCommand({SHARDTRAIN_CLI_BIN,
                                "local",
                                SourceDir() + "/examples/llama3-tokens-fortunes.yaml",
                                "--workers",
                                "1",
                                "--output",
                                "json",
                                "--set",
                                "data.train=" + out + "/train",
                                "--set",
                                "data.val=" + out + "/val",
                                "--set",
                                "steps=4",
                                "--set",
                                "eval.every=4",
                                "--set",
                                "batch.global=4",
                                "--set",
                                "batch.micro=4",
                                "--set",
                                "batch.seq_len=32",
                                "--set",
                                "checkpoint.dir=" + dir.path()},
                               seconds(300));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::vector<double> losses = Losses(r.out);
  ASSERT_EQ(losses.size(), 4u);
  std::cout << "llama3 tokens: loss " << losses.front() << " -> " << losses.back() << std::endl;
  EXPECT_NEAR(losses.front(), std::log(128256.0), 0.5);  // uniform over Llama 3's vocabulary
  EXPECT_LT(losses.back(), losses.front());
  CommandResult s = RunCommand({SHARDTRAIN_CLI_BIN, "sample", dir.path(), "--prompt",
                                "Q: What is the meaning of life?", "--tokens", "12", "-o", "json"});
  ASSERT_EQ(s.exit_code, 0) << s.err;
  std::cout << "sample: " << s.out << std::endl;
  EXPECT_NE(s.out.find("\"text\": \"Q: What is the meaning of life?"), std::string::npos) << s.out;
  EXPECT_EQ(s.out.find("<|begin_of_text|>Q:"), std::string::npos) << s.out;  // not printed back
}

// examples/llama-fortunes.yaml as a user runs it (half its steps, for CI's
// time): the Llama family (RMSNorm, rotary positions, SwiGLU, grouped-query
// attention, untied head) on 4 worker processes, dp 2 × tp 2 with ZeRO-1,
// learns the fortunes text, and `shardtrain sample` writes text from its
// weights.
TEST_F(TrainingTest, LlamaFortunesOnFourWorkersLearnsAndSamples) {
  TempDir dir;
  CommandResult r = RunCommand(
      {SHARDTRAIN_CLI_BIN, "local", SourceDir() + "/examples/llama-fortunes.yaml", "--workers", "4",
       "--threads", "1", "--output", "json", "--set", "data.train=" + kData, "--set",
       "data.val=" + SourceDir() + "/data/fortunes-val.txt", "--set", "steps=150", "--set",
       "checkpoint.dir=" + dir.path()},
      seconds(600));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::vector<double> losses = Losses(r.out);
  ASSERT_EQ(losses.size(), 150u);
  double tail = 0;
  for (size_t i = losses.size() - 10; i < losses.size(); ++i) tail += losses[i] / 10;
  const std::map<int, double> val = ValLosses(r.out);
  std::cout << "llama-fortunes (dp2 x tp2, 4 workers): loss " << losses.front() << " -> "
            << losses.back() << " (mean of the last 10 steps " << tail << "), validation "
            << val.begin()->second << " -> " << val.rbegin()->second << std::endl;
  EXPECT_GT(losses.front(), 5.0);
  EXPECT_LT(tail, 2.7);
  ASSERT_EQ(val.size(), 3u);  // steps 50, 100, 150
  EXPECT_LT(val.rbegin()->second, val.begin()->second);
  EXPECT_LT(val.rbegin()->second, 2.6);
  CommandResult s = RunCommand({SHARDTRAIN_CLI_BIN, "sample", dir.path(), "--prompt", "The ",
                                "--tokens", "120", "--temperature", "0.7"});
  ASSERT_EQ(s.exit_code, 0) << s.err;
  std::cout << "sample: " << s.out << std::endl;
  EXPECT_GT(s.out.size(), 100u);

  // Exported in Hugging Face's layout, the model comes back from a spec
  // whose model names only init: the CLI reads config.json (plan prints the
  // shape; local trains it), and with a learning rate that moves no fp32
  // weight the first validation equals the source's last.
  const std::string hf = dir.path() + "/hf";
  CommandResult e = RunCommand({SHARDTRAIN_CLI_BIN, "export", dir.path(), "--out", hf});
  ASSERT_EQ(e.exit_code, 0) << e.err;
  const std::string spec = dir.path() + "/from-init.yaml";
  std::ofstream(spec) << "name: from-init\nmodel: {init: " << hf << "}\n"
                      << "data: {train: " << kData << ", val: " << SourceDir()
                      << "/data/fortunes-val.txt}\n"
                         "batch: {global: 16, micro: 16, seq_len: 64}\n"
                         "optimizer: {lr: 1e-30}\neval: {every: 1, batches: 2}\nsteps: 1\n";
  CommandResult plan = RunCommand({SHARDTRAIN_CLI_BIN, "plan", spec});
  ASSERT_EQ(plan.exit_code, 0) << plan.out << plan.err;
  EXPECT_NE(plan.err.find("model from " + hf +
                          "/config.json: arch llama, layers 4, heads 4, dim "
                          "128, context 128, vocab 256, ffn_dim 384, kv_heads 2"),
            std::string::npos)
      << plan.err;
  EXPECT_NE(plan.out.find("model: llama L=4 NH=4 KVH=2 C=128 F=384 context=128 V=256"),
            std::string::npos)
      << plan.out;
  CommandResult ft = RunCommand({SHARDTRAIN_CLI_BIN, "local", spec, "--workers", "1", "--output",
                                 "json", "--set", "checkpoint.dir=" + dir.path() + "/init"},
                                seconds(300));
  ASSERT_EQ(ft.exit_code, 0) << ft.out << ft.err;
  const std::map<int, double> init_val = ValLosses(ft.out);
  ASSERT_EQ(init_val.count(1), 1u) << ft.out;
  std::cout << "model.init alone, from the export's config.json: val " << init_val.at(1)
            << ", the source's last " << val.rbegin()->second << std::endl;
  EXPECT_NEAR(init_val.at(1), val.rbegin()->second, 1e-5 * val.rbegin()->second);

  // LoRA on that Hugging Face model (constant rate: the first steps do not
  // depend on the run's length), checkpointed at step 2 of 4: `export
  // step-2 --merged BASE` writes the model a 2-step run's final weights
  // are, byte for byte, and `--adapter` PEFT's files.
  const std::string lora = dir.path() + "/lora", lora2 = dir.path() + "/lora2";
  for (const auto& [steps, ckpt] : {std::pair<int, std::string>{4, lora}, {2, lora2}}) {
    CommandResult lr =
        RunCommand({SHARDTRAIN_CLI_BIN, "local", spec, "--workers", "1", "--set",
                    "steps=" + std::to_string(steps), "--set", "optimizer.lr=1e-2", "--set",
                    "optimizer.schedule=constant", "--set", "optimizer.warmup_steps=0", "--set",
                    "checkpoint.every=2", "--set", "checkpoint.dir=" + ckpt, "--set",
                    "finetune.lora={rank: 4, alpha: 8, targets: [q, v, down]}"},
                   seconds(300));
    ASSERT_EQ(lr.exit_code, 0) << lr.out << lr.err;
  }
  const std::string from_step = lora + "/step-2", merged = dir.path() + "/merged",
                    final_hf = dir.path() + "/final-hf", peft = dir.path() + "/peft";
  CommandResult m =
      RunCommand({SHARDTRAIN_CLI_BIN, "export", from_step, "--merged", hf, "--out", merged});
  ASSERT_EQ(m.exit_code, 0) << m.out << m.err;
  CommandResult f =
      RunCommand({SHARDTRAIN_CLI_BIN, "export", lora2 + "/final.weights", "--out", final_hf});
  ASSERT_EQ(f.exit_code, 0) << f.out << f.err;
  auto bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string a = bytes(merged + "/model.safetensors"),
                    b = bytes(final_hf + "/model.safetensors");
  std::cout << "LoRA step-2 merged into the base: " << a.size() << " bytes, "
            << (a == b ? "equal to" : "NOT equal to") << " the job's final weights exported"
            << std::endl;
  EXPECT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "export --merged differs from the job's final weights";
  EXPECT_EQ(bytes(hf + "/model.safetensors") == a, false) << "the adapters changed nothing";
  CommandResult p =
      RunCommand({SHARDTRAIN_CLI_BIN, "export", from_step, "--adapter", "--out", peft});
  ASSERT_EQ(p.exit_code, 0) << p.out << p.err;
  EXPECT_TRUE(std::filesystem::exists(peft + "/adapter_model.safetensors"));
  // The final weights are a whole model: nothing to merge.
  CommandResult whole = RunCommand({SHARDTRAIN_CLI_BIN, "export", lora2 + "/final.weights",
                                    "--merged", hf, "--out", dir.path() + "/nope"});
  EXPECT_EQ(whole.exit_code, 2) << whole.out << whole.err;
}

}  // namespace
}  // namespace shardtrain::testing
