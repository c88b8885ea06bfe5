// Training through the real path: coordinator -> plan -> workers -> Gloo DDP
// -> step reports. Equivalence: the same spec (global batch fixed) on 1, 2 and
// 4 workers gives the same loss at every step and the same final weights;
// cancel and a killed worker end the job; two small jobs share 4 workers.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "tests/integration/harness.h"
#include "tests/integration/training_util.h"
#include "worker/checkpoint/weights_file.h"

namespace shardtrain::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// fp32 sums in another order differ in the last bits, and Adam amplifies
// that for elements whose gradient is near zero; at the example's lr 3e-3 the
// 30-step drift reaches ~1.3e-5, at 1e-3 it stays below 1e-6. 1 MiB buckets
// make the 0.84M-param model's gradient 4 buckets, so overlap is exercised.
// The validation loss (every 10 steps, 1 global batch of the first 64 KiB of
// the corpus) matches too: the same windows whatever dp and batch.micro.
TEST_F(TrainingTest, DdpOn1And2And4WorkersMatchesStepByStep) {
  TempDir dir;
  const int steps = 30;
  const std::string val = dir.path() + "/val.txt";
  {
    std::ifstream in(kData);
    std::string head(64 << 10, '\0');
    in.read(head.data(), std::streamsize(head.size()));
    std::ofstream(val) << head;
  }
  std::map<int, std::vector<double>> losses;
  std::map<int, std::map<int, double>> val_losses;
  std::map<int, std::vector<float>> weights;
  for (int dp : {1, 2, 4}) {
    const std::string ckpt = dir.path() + "/dp" + std::to_string(dp);
    CommandResult r =
        RunLocal({"parallel.dp=" + std::to_string(dp), "batch.micro=" + std::to_string(32 / dp),
                  "steps=" + std::to_string(steps), "optimizer.lr=1e-3", "parallel.bucket_mb=1",
                  "data.val=" + val, "eval.every=10", "eval.batches=1"},
                 ckpt);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_EQ(Field(r.out, "state"), "SUCCEEDED");
    losses[dp] = Losses(r.out);
    ASSERT_EQ(losses[dp].size(), size_t(steps)) << r.out;
    val_losses[dp] = ValLosses(r.out);
    ASSERT_EQ(val_losses[dp].size(), 3u) << r.out;  // steps 10, 20, 30 only
    for (int s : {10, 20, 30})
      EXPECT_EQ(val_losses[dp].count(s), 1u) << "dp " << dp << " step " << s;
    auto w = checkpoint::LoadWeights(ckpt + "/final.weights");
    ASSERT_TRUE(w.ok()) << w.status();
    weights[dp] = w->params;
  }
  std::cout << "step  loss(1 rank)  loss(2 ranks)  loss(4 ranks)\n";
  for (int s = 0; s < steps; ++s) {
    std::printf("%4d  %12.7f  %13.7f  %13.7f\n", s + 1, losses[1][s], losses[2][s], losses[4][s]);
  }
  double worst_loss = 0, worst_param = 0;
  for (int dp : {2, 4}) {
    for (int s = 0; s < steps; ++s) {
      const double rel = std::abs(losses[dp][s] - losses[1][s]) / std::abs(losses[1][s]);
      worst_loss = std::max(worst_loss, rel);
      EXPECT_LE(rel, 1e-5) << "dp " << dp << " step " << s + 1 << ": " << losses[dp][s] << " vs "
                           << losses[1][s];
    }
    for (const auto& [s, v] : val_losses[1]) {
      const double rel = std::abs(val_losses[dp][s] - v) / v;
      worst_loss = std::max(worst_loss, rel);
      EXPECT_LE(rel, 1e-5) << "val_loss, dp " << dp << " step " << s;
    }
    ASSERT_EQ(weights[dp].size(), weights[1].size());
    for (size_t i = 0; i < weights[1].size(); ++i) {
      const double diff = std::abs(double(weights[dp][i]) - weights[1][i]);
      worst_param = std::max(worst_param, diff);
    }
  }
  std::cout << "DDP equivalence over " << steps
            << " steps: max relative (training or validation) loss difference " << worst_loss
            << ", max absolute final-parameter difference " << worst_param << "; loss "
            << losses[1].front() << " -> " << losses[1].back() << std::endl;
  EXPECT_LE(worst_param, 1e-5);
  EXPECT_LT(losses[1].back(), losses[1].front() - 0.5);  // it learned
  EXPECT_LT(val_losses[1][30], val_losses[1][10]);       // and generalised a little
  std::cout << "val_loss (1 rank): step 10 " << val_losses[1][10] << ", 20 " << val_losses[1][20]
            << ", 30 " << val_losses[1][30] << std::endl;
}

// Every ZeRO stage (0 = DDP, 1, 2, 3, 3 without resharding after forward,
// 3 with optimizer offload) on 1, 2, 3 and 4 ranks gives the losses of one
// DDP rank for 12 steps within 1e-5 (the two ZeRO-3 options on 2 and 3
// ranks: an even and an uneven split). Global batch 24 so that 3 ranks
// divide it; 3 layers make the model 644,224 params, whose units (embeddings
// 49,152, blocks 198,272, final 256) 3 ranks cannot split evenly.
TEST_F(TrainingTest, ZeroStagesOn1To4RanksMatchOneRank) {
  TempDir dir;
  const int steps = 12;
  struct Variant {
    const char* name;
    std::vector<std::string> sets;
    std::vector<int> ranks = {1, 2, 3, 4};
  };
  const std::vector<Variant> variants = {
      {"zero0", {"parallel.zero=0"}},
      {"zero1", {"parallel.zero=1"}},
      {"zero2", {"parallel.zero=2"}},
      {"zero3", {"parallel.zero=3"}},
      {"zero3 keep", {"parallel.zero=3", "parallel.reshard_after_forward=false"}, {2, 3}},
      {"zero3 offload", {"parallel.zero=3", "parallel.offload=optimizer"}, {2, 3}},
  };
  struct Result {
    std::vector<double> losses;
    std::vector<float> weights;  // final.weights, written by rank 0
  };
  auto run = [&](int dp, const Variant& v) {
    std::vector<std::string> sets = {"parallel.dp=" + std::to_string(dp),
                                     "batch.global=24",
                                     "batch.micro=" + std::to_string(24 / dp),
                                     "steps=" + std::to_string(steps),
                                     "optimizer.lr=1e-3",
                                     "model.layers=3"};
    sets.insert(sets.end(), v.sets.begin(), v.sets.end());
    std::string name = v.name;
    std::replace(name.begin(), name.end(), ' ', '-');
    const std::string ckpt = dir.path() + "/" + name + "-dp" + std::to_string(dp);
    CommandResult r = RunLocal(sets, ckpt);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    Result out{Losses(r.out), {}};
    auto w = checkpoint::LoadWeights(ckpt + "/final.weights");
    EXPECT_TRUE(w.ok()) << w.status();
    if (w.ok()) out.weights = w->params;
    return out;
  };
  const Result reference = run(1, variants[0]);
  ASSERT_EQ(reference.losses.size(), size_t(steps));
  // Losses are reported as fp32, whose unit in the last place is ~6e-8 of
  // them; the final weights show the stages' own (smaller) differences.
  std::printf(
      "max relative loss difference / max absolute final-weight difference vs 1 rank "
      "ZeRO-0 over %d steps\n",
      steps);
  std::printf("%-14s %19s %19s %19s %19s\n", "variant", "1 rank", "2 ranks", "3 ranks", "4 ranks");
  for (const Variant& v : variants) {
    std::printf("%-14s", v.name);
    for (int dp : {1, 2, 3, 4}) {
      if (dp == 1 && &v == &variants[0]) {
        std::printf(" %19s", "(reference)");
        continue;
      }
      if (std::find(v.ranks.begin(), v.ranks.end(), dp) == v.ranks.end()) {
        std::printf(" %19s", "-");
        continue;
      }
      const Result got = run(dp, v);
      ASSERT_EQ(got.losses.size(), size_t(steps)) << v.name << " dp " << dp;
      ASSERT_EQ(got.weights.size(), reference.weights.size()) << v.name << " dp " << dp;
      double worst = 0, worst_w = 0;
      for (int s = 0; s < steps; ++s) {
        worst = std::max(
            worst, std::abs(got.losses[s] - reference.losses[s]) / std::abs(reference.losses[s]));
      }
      for (size_t i = 0; i < got.weights.size(); ++i) {
        worst_w = std::max(worst_w, double(std::abs(got.weights[i] - reference.weights[i])));
      }
      std::printf(" %9.3g/%9.3g", worst, worst_w);
      std::fflush(stdout);
      EXPECT_LE(worst, 1e-5) << v.name << " dp " << dp;
      EXPECT_LE(worst_w, 1e-5) << v.name << " dp " << dp;
    }
    std::printf("\n");
  }
}

TEST_F(ClusterTest, CancelStopsEveryRankWithin5sAndFreesTheWorkers) {
  Start(2);
  const std::string job = Submit({"parallel.dp=2", "batch.micro=16", "steps=100000"});
  ASSERT_TRUE(WaitFor([&] { return Step(job) >= 3; }, seconds(60))) << Status(job);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(Cli({"cancel", job}, c_.address()).exit_code, 0);
  ASSERT_TRUE(WaitFor(
      [&] {
        int stopped = 0;
        for (auto& w : workers_)
          stopped += w.Log().find("stopping job " + job) != std::string::npos ||
                     w.Log().find("ended the job") != std::string::npos;
        return stopped == 2;
      },
      seconds(5)))
      << workers_[0].Log() << workers_[1].Log();
  std::cout << "both ranks stopped "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
            << " s after cancel" << std::endl;
  EXPECT_EQ(State(job), "CANCELLED");
  CommandResult w = Cli({"workers", "-o", "json"}, c_.address());
  EXPECT_EQ(w.out.find(job), std::string::npos) << w.out;  // no worker holds it any more
}

TEST_F(ClusterTest, KilledWorkerFailsTheJobWithTheReason) {
  const int64_t lease_ms = 2000;
  Start(2, lease_ms);
  const std::string job = Submit({"parallel.dp=2", "batch.micro=16", "steps=100000",
                                  "timeouts.collective_s=3", "max_restarts=0"});
  ASSERT_TRUE(WaitFor([&] { return Step(job) >= 2; }, seconds(60))) << Status(job);
  const auto t0 = std::chrono::steady_clock::now();
  workers_[1].Signal(SIGKILL);
  ASSERT_TRUE(WaitFor([&] { return State(job) == "FAILED"; }, milliseconds(lease_ms + 3000 + 2000)))
      << Status(job);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string reason = Field(Status(job), "failure_reason");
  std::cout << "job FAILED " << took << " s after SIGKILL: " << reason << std::endl;
  EXPECT_FALSE(reason.empty());
  EXPECT_NE(reason.find("rank"), std::string::npos) << reason;
}

TEST_F(ClusterTest, TwoJobsShareFourWorkersAndAThirdWaits) {
  Start(4);
  const std::vector<std::string> small = {"parallel.dp=2", "batch.micro=16", "steps=15"};
  const std::string a = Submit(small), b = Submit(small), c = Submit(small);
  ASSERT_TRUE(WaitFor([&] { return State(a) == "RUNNING" && State(b) == "RUNNING"; }, seconds(30)))
      << Status(a) << Status(b);
  EXPECT_EQ(State(c), "PENDING");
  ASSERT_TRUE(WaitFor([&] { return State(c) == "SUCCEEDED"; }, seconds(120))) << Status(c);
  EXPECT_EQ(State(a), "SUCCEEDED");
  EXPECT_EQ(State(b), "SUCCEEDED");
}

TEST_F(ClusterTest, WorkerMetricsDuringARunPassPromtool) {
  c_ = StartCoordinator(dir_.path(), 10'000);
  ASSERT_GT(c_.port, 0);
  workers_.push_back(
      StartWorker(dir_.path(), c_.address(), 0, {"--metrics-listen", "127.0.0.1:0"}));
  const std::string job = Submit({"parallel.dp=1", "batch.micro=32", "steps=100000"});
  ASSERT_TRUE(WaitFor([&] { return Step(job) >= 2; }, seconds(60))) << Status(job);
  std::smatch m;
  const std::string log = workers_[0].Log();
  ASSERT_TRUE(std::regex_search(log, m, std::regex("metrics on (http://[0-9.:]+/metrics)"))) << log;
  const std::string file = dir_.path() + "/worker-metrics.txt";
  ASSERT_EQ(RunCommand({"/usr/bin/curl", "-sf", "-o", file, m[1].str()}).exit_code, 0);
  std::ifstream in(file);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const std::string& want :
       {"shardtrain_worker_steps_total{job_id=\"" + job + "\",rank=\"0\"}",
        "shardtrain_worker_step_seconds_bucket{job_id=\"" + job + "\",rank=\"0\",le=\"+Inf\"}",
        "shardtrain_worker_tokens_total{job_id=\"" + job + "\"",
        std::string("shardtrain_worker_peak_rss_bytes ")}) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
  if (std::filesystem::exists("/usr/bin/promtool")) {
    CommandResult check = RunCommand({"/bin/sh", "-c", "promtool check metrics < " + file});
    EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
  }
  // Once the job ended on the worker, none of its series is exported.
  Cli({"cancel", job}, c_.address());
  CommandResult after;
  EXPECT_TRUE(WaitFor(
      [&] {
        after = RunCommand({"/usr/bin/curl", "-sf", m[1].str()});
        return after.exit_code == 0 && after.out.find(job) == std::string::npos;
      },
      seconds(30)))
      << after.out;
  EXPECT_NE(after.out.find("shardtrain_worker_peak_rss_bytes "), std::string::npos) << after.out;
}

TEST_F(ClusterTest, MissingDataFailsTheJobNamingTheFile) {
  Start(1);
  const std::string job = Submit({"parallel.dp=1", "data.train=/nonexistent/corpus.txt"});
  ASSERT_TRUE(WaitFor([&] { return State(job) == "FAILED"; }, seconds(20))) << Status(job);
  EXPECT_NE(Field(Status(job), "failure_reason").find("/nonexistent/corpus.txt"), std::string::npos)
      << Status(job);
}

TEST_F(TrainingTest, FortunesTinyTrainsBelow2_5AndSamples) {
  TempDir dir;
  CommandResult r = RunCommand(
      {SHARDTRAIN_CLI_BIN, "local", SourceDir() + "/examples/fortunes-tiny.yaml", "--workers", "1",
       "--output", "json", "--set", "data.train=" + kData, "--set", "checkpoint.dir=" + dir.path()},
      seconds(600));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::vector<double> losses = Losses(r.out);
  ASSERT_EQ(losses.size(), 300u);
  // One step's loss is one batch's: judge the end of the run by the mean of
  // its last 10 steps.
  double tail = 0;
  for (size_t i = losses.size() - 10; i < losses.size(); ++i) tail += losses[i] / 10;
  std::cout << "fortunes-tiny: loss " << losses.front() << " -> " << losses.back()
            << " (mean of the last 10 steps " << tail << ")" << std::endl;
  EXPECT_GT(losses.front(), 5.0);
  EXPECT_LT(tail, 2.5);
  CommandResult s = RunCommand({SHARDTRAIN_CLI_BIN, "sample", dir.path(), "--prompt", "The ",
                                "--tokens", "120", "--temperature", "0.7"});
  ASSERT_EQ(s.exit_code, 0) << s.err;
  std::cout << "sample: " << s.out << std::endl;
  EXPECT_GT(s.out.size(), 100u);
  // A byte model has no GPT-2 tokenizer: refused, naming the vocabulary.
  CommandResult bpe = RunCommand({SHARDTRAIN_CLI_BIN, "sample", dir.path(), "--tokenizer", "gpt2"});
  EXPECT_EQ(bpe.exit_code, 2) << bpe.err;
  EXPECT_NE(bpe.err.find("vocab 256"), std::string::npos) << bpe.err;
}

// GPT-2 tokens end to end: `shardtrain prepare` makes BPE shards (progress
// on stderr, the summary and the spec line on stdout; a second run into the
// same --out is refused and keeps the first), a GPT-2-vocabulary job trains
// on them with validation, and `shardtrain sample` encodes the prompt and
// decodes the continuation with GPT-2's tokenizer.
TEST_F(TrainingTest, PreparedGpt2ShardsTrainAndSample) {
  TempDir dir;
  const std::string out = dir.path() + "/fortunes-gpt2";
  CommandResult p = RunCommand({SHARDTRAIN_CLI_BIN, "prepare", kData, "--val-fraction", "0.05",
                                "--threads", "2", "--out", out});
  ASSERT_EQ(p.exit_code, 0) << p.out << p.err;
  std::cout << p.out;
  EXPECT_NE(p.err.find("prepare: "), std::string::npos) << p.err;  // progress
  EXPECT_NE(p.out.find("prepared 2 documents"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("format: llmc, tokenizer: gpt2"), std::string::npos) << p.out;
  CommandResult again = RunCommand({SHARDTRAIN_CLI_BIN, "prepare", kData, "--out", out});
  EXPECT_EQ(again.exit_code, 1) << again.err;
  EXPECT_NE(again.err.find("exists"), std::string::npos) << again.err;

  // The tiny example on GPT-2's vocabulary and the prepared shards, one
  // worker, with `sets` on top.
  auto train = [&](const std::vector<std::string>& sets) {
    std::vector<std::string> argv = {
        SHARDTRAIN_CLI_BIN, "local", SourceDir() + "/examples/fortunes-tiny.yaml", "--workers", "1",
        "--output",         "json"};
    for (const std::string& set :
         {std::string("model.vocab=50257"), std::string("model.dim=64"),
          std::string("model.layers=2"), "data.train=" + out + "/train", "data.val=" + out + "/val",
          std::string("data.format=llmc"), std::string("data.tokenizer=gpt2")}) {
      argv.insert(argv.end(), {"--set", set});
    }
    for (const std::string& set : sets) argv.insert(argv.end(), {"--set", set});
    return RunCommand(argv, seconds(300));
  };
  CommandResult r = train({"eval.every=10", "steps=20", "checkpoint.dir=" + dir.path()});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::vector<double> losses = Losses(r.out);
  ASSERT_EQ(losses.size(), 20u);
  std::cout << "gpt2 tokens: loss " << losses.front() << " -> " << losses.back() << std::endl;
  EXPECT_NEAR(losses.front(), std::log(50257.0), 0.5);  // uniform over GPT-2's vocabulary
  EXPECT_LT(losses.back(), losses.front() - 1.0);
  CommandResult s = RunCommand({SHARDTRAIN_CLI_BIN, "sample", dir.path(), "--prompt",
                                "Q: What is the meaning of life?", "--tokens", "20", "-o", "json"});
  ASSERT_EQ(s.exit_code, 0) << s.err;
  std::cout << "sample: " << s.out << std::endl;
  EXPECT_NE(s.out.find("\"text\": \"Q: What is the meaning of life?"), std::string::npos) << s.out;
  // The same weights read as a byte model (GPT-2-sized, trained on bytes):
  // the prompt's bytes go in, 20 bytes come out, no vocabulary needed.
  CommandResult bytes =
      RunCommand({SHARDTRAIN_CLI_BIN, "sample", dir.path(), "--tokenizer", "byte", "--vocab",
                  "/nonexistent", "--prompt", "Q: ", "--tokens", "20", "--temperature", "0"});
  ASSERT_EQ(bytes.exit_code, 0) << bytes.err;
  EXPECT_EQ(bytes.out.size(), 3u + 20u + 1u) << bytes.out;  // prompt, bytes, newline

  // Out in Hugging Face's layout, and back in as a new job's model.init: with
  // a learning rate too small to move an fp32 weight (1e-30), its weights
  // stay the source's bit for bit and its first validation equals the
  // source's last.
  const std::string hf = dir.path() + "/hf";
  CommandResult e = RunCommand({SHARDTRAIN_CLI_BIN, "export", dir.path(), "--out", hf});
  ASSERT_EQ(e.exit_code, 0) << e.err;
  std::cout << e.out;
  for (const char* f : {"model.safetensors", "config.json", "vocab.json", "merges.txt"}) {
    EXPECT_TRUE(std::filesystem::exists(hf + "/" + f)) << f;
  }
  CommandResult again_export = RunCommand({SHARDTRAIN_CLI_BIN, "export", dir.path(), "--out", hf});
  EXPECT_EQ(again_export.exit_code, 1) << again_export.err;  // not over an export
  const std::map<int, double> source_val = ValLosses(r.out);
  ASSERT_EQ(source_val.count(20), 1u) << r.out;
  CommandResult ft = train({"model.init=" + hf, "eval.every=1", "steps=1", "optimizer.lr=1e-30",
                            "checkpoint.dir=" + dir.path() + "/init"});
  ASSERT_EQ(ft.exit_code, 0) << ft.out << ft.err;
  const std::map<int, double> init_val = ValLosses(ft.out);
  ASSERT_EQ(init_val.count(1), 1u) << ft.out;
  std::cout << "model.init from the export: val " << init_val.at(1) << ", the source's last "
            << source_val.at(20) << std::endl;
  EXPECT_NEAR(init_val.at(1), source_val.at(20), 1e-6 * source_val.at(20));
  auto a = checkpoint::LoadWeights(dir.path() + "/final.weights");
  auto b = checkpoint::LoadWeights(dir.path() + "/init/final.weights");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->params, b->params);
}

// examples/fortunes-3d.yaml (dp2 × tp2 × pp2, 1F1B, ZeRO-1) through the
// whole system — coordinator, plan, 8 worker processes, the mesh over Gloo —
// trains like the same spec on one rank (same global batch) within 1e-5 per
// step for 20 steps, its final weights (assembled from the 8 slices) equal
// the one rank's to 1e-5, and `shardtrain sample` reads its checkpoint.
TEST_F(TrainingTest, ThreeDMeshOnEightWorkersMatchesOneRankAndSamples) {
  TempDir dir;
  const std::string spec = SourceDir() + "/examples/fortunes-3d.yaml";
  auto run = [&](const std::string& name, const std::vector<std::string>& sets, int workers) {
    std::vector<std::string> args = {SHARDTRAIN_CLI_BIN,
                                     "local",
                                     spec,
                                     "--workers",
                                     std::to_string(workers),
                                     "--threads",
                                     "1",
                                     "--output",
                                     "json",
                                     "--set",
                                     "data.train=" + kData,
                                     "--set",
                                     "checkpoint.dir=" + dir.path() + "/" + name,
                                     "--set",
                                     "steps=20",
                                     "--set",
                                     "checkpoint.every=10",
                                     "--set",
                                     "eval.every=0"};
    for (const auto& s : sets) args.insert(args.end(), {"--set", s});
    return RunCommand(args, seconds(600));
  };
  CommandResult mesh = run("mesh", {}, 8);
  ASSERT_EQ(mesh.exit_code, 0) << mesh.out << mesh.err;
  CommandResult one = run(
      "one",
      {"parallel.dp=1", "parallel.tp=1", "parallel.pp=1", "parallel.zero=0", "batch.micro=8"}, 1);
  ASSERT_EQ(one.exit_code, 0) << one.out << one.err;
  const std::vector<double> a = Losses(mesh.out), b = Losses(one.out);
  ASSERT_EQ(a.size(), 20u) << mesh.out;
  ASSERT_EQ(b.size(), 20u) << one.out;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / b[i]);
  auto wa = checkpoint::LoadWeights(dir.path() + "/mesh/final.weights");
  auto wb = checkpoint::LoadWeights(dir.path() + "/one/final.weights");
  ASSERT_TRUE(wa.ok() && wb.ok()) << wa.status() << " " << wb.status();
  ASSERT_EQ(wa->params.size(), wb->params.size());
  double worst_param = 0;
  for (size_t i = 0; i < wa->params.size(); ++i) {
    worst_param = std::max(worst_param, std::abs(double(wa->params[i]) - wb->params[i]));
  }
  std::cout << "fortunes-3d (dp2 x tp2 x pp2) vs 1 rank over 20 steps: loss " << a.front() << " -> "
            << a.back() << ", max relative loss difference " << worst
            << ", max absolute final-parameter difference " << worst_param << std::endl;
  EXPECT_LE(worst, 1e-5);
  EXPECT_LE(worst_param, 1e-5);
  CommandResult s = RunCommand({SHARDTRAIN_CLI_BIN, "sample", dir.path() + "/mesh", "--prompt",
                                "The ", "--tokens", "40", "--temperature", "0.7"});
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_GT(s.out.size(), 30u);
}

// `shardtrain local` whose worker dies (here SIGKILL; on the H100 it was an
// abort): the CLI says which worker and how at once, with the end of its
// log, and with fewer workers left than the job's world it cancels the job
// and exits 1 instead of waiting for a worker that never comes back; the
// logs stay for the user (removed here by the test).
TEST(LocalClusterTest, AWorkerThatDiesEndsTheRunNamingHowItExited) {
  TempDir dir;
  Process cli({SHARDTRAIN_CLI_BIN, "local", kDdpSpec, "--threads", "1", "--set",
               "data.train=" + kData, "--set", "checkpoint.dir=" + dir.path() + "/ckpt", "--set",
               "eval.every=0", "--set", "steps=100000"},
              dir.path() + "/cli.log");
  ASSERT_TRUE(WaitFor([&] { return cli.Log().find("step ") != std::string::npos; }, seconds(60)))
      << cli.Log();
  // The CLI's children named shardtrain-worker (comm is cut at 15 bytes).
  std::vector<pid_t> workers;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    std::ifstream stat(e.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    const size_t close = line.rfind(')');
    if (close == std::string::npos || line.find("(shardtrain-work)") == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    char state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == cli.pid()) workers.push_back(std::stoi(e.path().filename().string()));
  }
  ASSERT_EQ(workers.size(), 4u) << "kDdpSpec runs dp 4 on four workers";
  const auto killed_at = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(workers[0], SIGKILL), 0);
  int code = -1;
  ASSERT_TRUE(cli.Wait(seconds(20), &code)) << cli.Log();
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  const std::string log = cli.Log();
  std::printf("[local] exit %d %.2f s after the kill\n", code, took);
  EXPECT_EQ(code, 1) << log;
  EXPECT_LT(took, 10.0) << "the 10 s lease: the CLI must not wait for recovery";
  EXPECT_NE(log.find("killed by signal 9"), std::string::npos) << log;
  EXPECT_NE(log.find("the end of its log"), std::string::npos) << log;
  EXPECT_NE(log.find("fewer workers are left than the job's world (4)"), std::string::npos) << log;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, std::regex(R"(logs in (/tmp/shardtrain-local-\w+))")))
      << log;
  EXPECT_TRUE(std::filesystem::exists(m[1].str() + "/worker-0.log")) << "the logs are kept";
  std::filesystem::remove_all(m[1].str());
}

}  // namespace
}  // namespace shardtrain::testing
