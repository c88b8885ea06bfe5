// Checkpoints and recovery through the real path: a killed rank resumes from
// the last commit, checkpoints reshard across world sizes and ZeRO stages,
// corrupt or partial commits are skipped, the coordinator survives kill -9,
// and elastic jobs shrink.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <thread>

#include "tests/integration/harness.h"
#include "tests/integration/training_util.h"
#include "worker/checkpoint/loader.h"
#include "worker/checkpoint/manifest.h"
#include "worker/checkpoint/storage.h"
#include "worker/checkpoint/weights_file.h"

namespace shardtrain::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Saved on 4 ranks under ZeRO-3 (each rank holds only its parameter shard),
// resumed on 2 ranks under ZeRO-1 and on 1 rank (DDP), with no conversion
// step: steps 21..40 continue the 4-rank run.
TEST_F(TrainingTest, CheckpointFrom4RanksResumesOn2And1) {
  TempDir dir;
  auto run = [&](int dp, int zero, const std::string& ckpt, const std::string& resume) {
    const std::vector<std::string> sets = {"parallel.dp=" + std::to_string(dp),
                                           "batch.micro=" + std::to_string(32 / dp),
                                           "parallel.zero=" + std::to_string(zero),
                                           "steps=40",
                                           "optimizer.lr=1e-3",
                                           "checkpoint.every=20"};
    CommandResult r = RunLocal(sets, ckpt,
                               resume.empty() ? std::vector<std::string>{}
                                              : std::vector<std::string>{"--resume-from", resume});
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return Losses(r.out);
  };
  const std::vector<double> full = run(4, 3, dir.path() + "/four", "");
  ASSERT_EQ(full.size(), 40u);
  ASSERT_TRUE(std::filesystem::exists(dir.path() + "/four/step-20/manifest.txt"));
  // One process reads the 4-rank sharded checkpoint for sampling as well.
  CommandResult sample = RunCommand({SHARDTRAIN_CLI_BIN, "sample", dir.path() + "/four/step-20",
                                     "--prompt", "The ", "--tokens", "20", "--temperature", "0"});
  EXPECT_EQ(sample.exit_code, 0) << sample.err;
  EXPECT_EQ(sample.out.rfind("The ", 0), 0u) << sample.out;
  EXPECT_GE(sample.out.size(), 24u) << sample.out;
  std::cout << "step  4 ranks ZeRO-3  2 ranks ZeRO-1 (resumed)  2 ranks ZeRO-3 (resumed)  1 rank "
               "ZeRO-0 (resumed)\n";
  const std::vector<std::pair<int, int>> targets = {{2, 1}, {2, 3}, {1, 0}};  // (dp, zero)
  std::vector<std::vector<double>> resumed;
  for (auto [dp, zero] : targets) {
    resumed.push_back(
        run(dp, zero, dir.path() + "/from4-dp" + std::to_string(dp) + "-z" + std::to_string(zero),
            dir.path() + "/four/step-20"));
    ASSERT_EQ(resumed.back().size(), 20u) << "resumed run should report steps 21..40 only";
  }
  double worst = 0;
  for (int i = 0; i < 20; ++i) {
    const double want = full[20 + i];
    for (size_t k = 0; k < targets.size(); ++k) {
      const double rel = std::abs(resumed[k][i] - want) / std::abs(want);
      worst = std::max(worst, rel);
      EXPECT_LE(rel, 1e-5) << "dp " << targets[k].first << " zero " << targets[k].second << " step "
                           << 21 + i;
    }
    std::printf("%4d  %12.7f  %17.7f  %17.7f  %16.7f\n", 21 + i, want, resumed[0][i], resumed[1][i],
                resumed[2][i]);
  }
  std::cout << "max relative loss difference after resharding 4 ranks ZeRO-3 -> 2 ranks ZeRO-1, "
               "2 ranks ZeRO-3, 1 rank: "
            << worst << std::endl;
}

// A flipped byte in the newest commit, and a step directory a SIGKILL left
// without manifest: resuming from the checkpoint root skips both and uses
// the previous commit.
TEST_F(TrainingTest, CorruptOrPartialCheckpointFallsBackToThePreviousCommit) {
  TempDir dir;
  const std::string ckpt = dir.path() + "/ckpt";
  const std::vector<std::string> sets = {"parallel.dp=2", "batch.micro=16", "checkpoint.every=10",
                                         "steps=30", "optimizer.lr=1e-3"};
  CommandResult straight = RunLocal(sets, ckpt);
  ASSERT_EQ(straight.exit_code, 0) << straight.err;
  const std::vector<double> expected = Losses(straight.out);
  ASSERT_EQ(expected.size(), 30u);
  ASSERT_TRUE(std::filesystem::exists(ckpt + "/step-20/manifest.txt"));
  {  // flip one byte in the middle of rank 1's shard of step 20
    std::fstream f(ckpt + "/step-20/rank-1.shard", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(0, std::ios::end);
    const std::streamoff mid = f.tellg() / 2;
    f.seekg(mid);
    char c = 0;
    f.read(&c, 1);
    f.seekp(mid);
    c ^= 0x40;
    f.write(&c, 1);
  }
  std::filesystem::create_directories(ckpt + "/step-25");  // a save cut short: shards, no manifest
  std::filesystem::copy_file(ckpt + "/step-10/rank-0.shard", ckpt + "/step-25/rank-0.shard");
  // The resumed runs commit to a directory of their own, so both see the damage.
  std::vector<std::string> resumed = sets;
  resumed.push_back("checkpoint.dir=" + dir.path() + "/resumed");
  CommandResult r = RunLocal(resumed, ckpt, {"--resume-from", ckpt});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::vector<double> losses = Losses(r.out);
  // Resumed from step 10 (20 was corrupt, 25 never committed): steps 11..30,
  // each equal to the first run's.
  ASSERT_EQ(losses.size(), 20u);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(losses[i], expected[10 + i]) << "step " << 11 + i;
  // The skips are job events: the human output of the same resume shows them.
  CommandResult shown = RunLocal(resumed, ckpt, {"--resume-from", ckpt}, /*json=*/false);
  ASSERT_EQ(shown.exit_code, 0) << shown.err;
  EXPECT_NE(shown.out.find("rank 0: skipping checkpoint " + ckpt + "/step-20: DATA_LOSS"),
            std::string::npos)
      << shown.out;
  EXPECT_NE(shown.out.find("rank 0: resumed from " + ckpt + "/step-10"), std::string::npos)
      << shown.out;
}

TEST_F(ClusterTest, KilledRankRecoversFromTheLastCommitAndMatchesAnUninterruptedRun) {
  const int steps = 40;
  const std::vector<std::string> sets = {"steps=40", "checkpoint.every=10", "optimizer.lr=1e-3"};
  // The uninterrupted run, on a local cluster of its own.
  CommandResult straight = RunLocal(sets, dir_.path() + "/straight");
  ASSERT_EQ(straight.exit_code, 0) << straight.out << straight.err;
  const std::vector<double> expected = Losses(straight.out);
  ASSERT_EQ(expected.size(), size_t(steps));

  // 5 workers for a job of 4: after rank 2's worker dies, 4 are left.
  Start(5, /*lease_ms=*/2000);
  const std::string job = Submit(sets);
  ASSERT_TRUE(WaitFor([&] { return Step(job) >= 22; }, seconds(120))) << Status(job);
  const std::string victim = KillRank(job, 2);
  ASSERT_FALSE(victim.empty()) << Status(job);
  const int killed_at = Step(job);
  ASSERT_TRUE(WaitFor([&] { return State(job) == "SUCCEEDED"; }, seconds(180))) << Status(job);
  const std::string done = Status(job);
  EXPECT_EQ(Field(done, "state"), "SUCCEEDED");
  EXPECT_NE(done.find("\"restarts\": 1"), std::string::npos) << done;
  CommandResult ckpts = Cli({"checkpoints", job}, c_.address());
  EXPECT_EQ(ckpts.exit_code, 0) << ckpts.err;
  EXPECT_NE(ckpts.out.find("step-30"), std::string::npos) << ckpts.out;  // keep 3: 10, 20, 30
  std::cout << ckpts.out;
  CommandResult watch = Cli({"watch", job}, c_.address());
  EXPECT_NE(watch.out.find("[RECOVERING]"), std::string::npos) << watch.out;
  EXPECT_NE(watch.out.find("resuming from committed step 20"), std::string::npos) << watch.out;
  const std::vector<double> got = Losses(Cli({"history", job, "-o", "json"}, c_.address()).out);
  ASSERT_EQ(got.size(), size_t(steps));
  std::cout << "rank 2 killed at step " << killed_at << "; resumed from step 20\n"
            << "step  uninterrupted  recovered\n";
  double worst = 0;
  for (int s = 0; s < steps; ++s) {
    const double rel = std::abs(got[s] - expected[s]) / std::abs(expected[s]);
    worst = std::max(worst, rel);
    if (s >= 18) std::printf("%4d  %13.9f  %9.9f\n", s + 1, expected[s], got[s]);
    EXPECT_LE(rel, 1e-6) << "step " << s + 1;
  }
  std::cout << "max relative loss difference after recovery: " << worst << std::endl;
}

// Issue #17: the coordinator and the workers share no filesystem. The
// coordinator runs in a directory of its own; workers 0-2 run in the shared
// volume's directory (their default checkpoint root), workers 3-4 elsewhere
// with --checkpoint-root pointing at it. Every rank resolves the relative
// checkpoint.dir on the volume: a SIGKILLed rank recovers from the last
// commit and the losses match an uninterrupted run, keep: 2 leaves exactly
// two step directories, and the coordinator's directory holds nothing.
TEST_F(ClusterTest, CheckpointsLiveOnTheWorkersVolumeAloneAndRecoveryFindsThem) {
  namespace fs = std::filesystem;
  const std::vector<std::string> sets = {"steps=40", "checkpoint.every=10", "checkpoint.keep=2",
                                         "optimizer.lr=1e-3"};
  CommandResult straight = RunLocal(sets, dir_.path() + "/straight");
  ASSERT_EQ(straight.exit_code, 0) << straight.out << straight.err;
  const std::vector<double> expected = Losses(straight.out);
  ASSERT_EQ(expected.size(), 40u);

  const std::string coordinator_cwd = dir_.path() + "/coordinator-cwd";
  const std::string volume = dir_.path() + "/volume";
  const std::string elsewhere = dir_.path() + "/elsewhere";
  for (const std::string& d : {coordinator_cwd, volume, elsewhere}) fs::create_directories(d);
  c_ = StartCoordinator(dir_.path(), /*lease_ms=*/2000, "127.0.0.1:0", coordinator_cwd);
  ASSERT_GT(c_.port, 0) << c_.process.Log();
  for (int i = 0; i < 5; ++i) {  // 5 workers for a job of 4: one spare
    workers_.push_back(i < 3 ? StartWorker(dir_.path(), c_.address(), i, {}, volume)
                             : StartWorker(dir_.path(), c_.address(), i,
                                           {"--checkpoint-root", volume}, elsewhere));
  }
  std::vector<std::string> args = {
      "submit", kDdpSpec,      "--set", "data.train=" + kData, "--set", "checkpoint.dir=ckpt/split",
      "--set",  "eval.every=0"};
  for (const std::string& set : sets) args.insert(args.end(), {"--set", set});
  ASSERT_TRUE(WaitFor(
      [&] {
        const std::string w = Cli({"workers", "-o", "json"}, c_.address()).out;
        return std::count(w.begin(), w.end(), '{') >= 6;  // the list and 5 workers
      },
      seconds(20)));
  CommandResult sub = Cli(args, c_.address());
  ASSERT_EQ(sub.exit_code, 0) << sub.err;
  EXPECT_EQ(sub.err.find("warning"), std::string::npos) << sub.err;  // one root: nothing to say
  std::string job = sub.out;
  while (!job.empty() && job.back() == '\n') job.pop_back();

  ASSERT_TRUE(WaitFor([&] { return Step(job) >= 22; }, seconds(120))) << Status(job);
  ASSERT_FALSE(KillRank(job, 2).empty()) << Status(job);
  ASSERT_TRUE(WaitFor([&] { return State(job) == "SUCCEEDED"; }, seconds(180))) << Status(job);
  const std::string done = Status(job);
  EXPECT_NE(done.find("\"restarts\": 1"), std::string::npos) << done;
  EXPECT_EQ(Field(done, "output"), volume + "/ckpt/split/final.weights") << done;
  CommandResult watch = Cli({"watch", job}, c_.address());
  EXPECT_NE(watch.out.find("resuming from committed step 20"), std::string::npos) << watch.out;

  const std::vector<double> got = Losses(Cli({"history", job, "-o", "json"}, c_.address()).out);
  ASSERT_EQ(got.size(), 40u);
  double worst = 0;
  for (int s = 0; s < 40; ++s) {
    const double rel = std::abs(got[s] - expected[s]) / std::abs(expected[s]);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, 1e-6) << "step " << s + 1;
  }
  std::cout << "separate coordinator and worker directories: max relative loss difference "
               "after recovery "
            << worst << std::endl;

  // The record: the two newest commits, named as the spec names them.
  CommandResult ckpts = Cli({"checkpoints", job, "-o", "json"}, c_.address());
  std::cout << ckpts.out;
  EXPECT_NE(ckpts.out.find("\"step\": 30, \"dir\": \"ckpt/split/step-30\""), std::string::npos)
      << ckpts.out;
  EXPECT_NE(ckpts.out.find("\"step\": 20, \"dir\": \"ckpt/split/step-20\""), std::string::npos)
      << ckpts.out;
  EXPECT_EQ(ckpts.out.find("step-10"), std::string::npos) << ckpts.out;
  // The volume: exactly keep = 2 step directories and the final weights; the
  // newest commit verifies.
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(volume + "/ckpt/split")) {
    left.push_back(e.path().filename());
  }
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"final.weights", "step-20", "step-30"}));
  checkpoint::FileCheckpointStorage storage;
  auto manifest = checkpoint::ReadManifest(storage, volume + "/ckpt/split/step-30/manifest.txt");
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->world, 4);
  EXPECT_TRUE(checkpoint::VerifyShards(storage, volume + "/ckpt/split/step-30", *manifest).ok());
  // No checkpoint file anywhere else: not where the coordinator runs, not in
  // the other workers' working directory.
  std::vector<std::string> stray;
  for (const std::string& d : {coordinator_cwd, elsewhere}) {
    for (const auto& e : fs::recursive_directory_iterator(d)) stray.push_back(e.path());
  }
  EXPECT_TRUE(stray.empty()) << stray.front();
}

// kill -9 of the coordinator at random points, 5 times, while one job trains
// (with checkpoints) and two wait: every acknowledged job is still there
// after each restart, and all three finish.
TEST_F(ClusterTest, CoordinatorKill9FiveTimesLosesNoJobAndAllFinish) {
  Start(2, /*lease_ms=*/10'000);  // workers ride out the outages on their lease
  std::vector<std::string> jobs;
  for (int i = 0; i < 3; ++i) {
    jobs.push_back(Submit({"parallel.dp=2", "batch.micro=16", "steps=25", "max_restarts=10",
                           "checkpoint.every=5",
                           "checkpoint.dir=" + dir_.path() + "/ckpt" + std::to_string(i)}));
    ASSERT_FALSE(jobs.back().empty());
  }
  const int port = c_.port;
  std::mt19937 rng(20261122);
  for (int k = 0; k < 5; ++k) {
    const int pause_ms = 300 + int(rng() % 2500);
    std::this_thread::sleep_for(milliseconds(pause_ms));
    c_.process.Signal(SIGKILL);
    ASSERT_TRUE(c_.process.Wait(seconds(5)));
    c_ = StartCoordinator(dir_.path(), 10'000, "127.0.0.1:" + std::to_string(port));
    ASSERT_EQ(c_.port, port) << c_.process.Log();
    std::cout << "kill -9 #" << k + 1 << " after " << pause_ms << " ms:";
    for (const std::string& j : jobs) {
      const std::string state = State(j);
      std::cout << " " << j << "=" << state;
      EXPECT_FALSE(state.empty()) << j << " lost after restart " << k + 1;
    }
    std::cout << std::endl;
  }
  for (const std::string& j : jobs) {
    EXPECT_TRUE(WaitFor([&] { return State(j) == "SUCCEEDED"; }, seconds(240))) << Status(j);
  }
}

// Issue 50, acceptance 0: the coordinator SIGKILLed mid-job and kept down
// for longer than two checkpoint intervals, then restarted on its state.
// The workers train on and hold what they report; once it answers, the
// history has every step with an uninterrupted run's losses, the
// checkpoints written meanwhile are committed, and a worker killed after
// the outage recovers from the newest commit.
TEST_F(ClusterTest, CoordinatorOutageLosesNoReportAndItsCheckpointsAreCommitted) {
  namespace fs = std::filesystem;
  const int steps = 100;
  const std::vector<std::string> sets = {
      "steps=100",       "checkpoint.every=10", "optimizer.lr=1e-3", "parallel.dp=2",
      "batch.global=32", "batch.micro=16",      "batch.seq_len=128", "max_restarts=2"};
  CommandResult straight = RunLocal(sets, dir_.path() + "/straight");
  ASSERT_EQ(straight.exit_code, 0) << straight.out << straight.err;
  const std::vector<double> expected = Losses(straight.out);
  ASSERT_EQ(expected.size(), size_t(steps));

  Start(3, /*lease_ms=*/10'000);  // 3 workers for a job of 2: one spare
  const std::string job = Submit(sets);
  ASSERT_TRUE(WaitFor([&] { return Step(job) >= 12; }, seconds(120))) << Status(job);
  const int port = c_.port;
  c_.process.Signal(SIGKILL);
  ASSERT_TRUE(c_.process.Wait(seconds(5)));
  const auto down = std::chrono::steady_clock::now();
  // Down until both ranks wrote their shards of step 30 (20 and 30 meanwhile).
  const std::string ckpt = dir_.path() + "/ckpt";
  ASSERT_TRUE(WaitFor(
      [&] {
        return fs::exists(ckpt + "/step-30/rank-0.shard") &&
               fs::exists(ckpt + "/step-30/rank-1.shard");
      },
      seconds(120)));
  EXPECT_FALSE(fs::exists(ckpt + "/step-20/manifest.txt"));  // not committed while it was down
  c_ = StartCoordinator(dir_.path(), 10'000, "127.0.0.1:" + std::to_string(port));
  ASSERT_EQ(c_.port, port) << c_.process.Log();
  const double outage_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - down).count();
  // The held reports land: steps 20 and 30 get committed.
  auto committed = [&](int step) {
    return Cli({"checkpoints", job, "-o", "json"}, c_.address())
               .out.find("\"step\": " + std::to_string(step) + ",") != std::string::npos;
  };
  ASSERT_TRUE(WaitFor([&] { return committed(30); }, seconds(60))) << Status(job);
  const int at_kill = Step(job);
  ASSERT_LT(at_kill, steps) << "the job ended before a rank could be killed";
  ASSERT_FALSE(KillRank(job, 1).empty()) << Status(job);
  ASSERT_TRUE(WaitFor([&] { return State(job) == "SUCCEEDED"; }, seconds(180))) << Status(job);

  const std::string done = Status(job);
  EXPECT_NE(done.find("\"restarts\": 1"), std::string::npos) << done;
  EXPECT_EQ(Step(job), steps) << done;
  const std::string watch = Cli({"watch", job}, c_.address()).out;
  for (int step : {20, 30}) {
    EXPECT_NE(watch.find("checkpoint step " + std::to_string(step) + " committed"),
              std::string::npos)
        << watch;
  }
  std::smatch m;
  ASSERT_TRUE(std::regex_search(watch, m, std::regex("resuming from committed step (\\d+)")))
      << watch;
  const int resumed = std::stoi(m[1]);
  EXPECT_GE(resumed, 30);
  const std::vector<double> got = Losses(Cli({"history", job, "-o", "json"}, c_.address()).out);
  ASSERT_EQ(got.size(), size_t(steps));
  double worst = 0;
  for (int s = 0; s < steps; ++s) {
    const double rel = std::abs(got[s] - expected[s]) / std::abs(expected[s]);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, 1e-6) << "step " << s + 1;
  }
  std::string delivered;
  for (Process& w : workers_) {
    std::smatch d;
    const std::string log = w.Log();
    if (std::regex_search(log, d, std::regex("coordinator answers again: [^\n]*"))) {
      delivered += "\n  " + d.str();
    }
  }
  std::printf(
      "coordinator down %.1f s from step 12; rank 1 killed at step %d after the outage, resumed "
      "from committed step %d; history %zu of %d steps, max relative loss difference %.3g%s\n",
      outage_s, at_kill, resumed, got.size(), steps, worst, delivered.c_str());
}

// min 2, max 4 workers; rank 2's worker dies with no spare: the job goes on
// on 2 workers (not 3: the global batch of 4 micro-batches must split evenly),
// from the last commit, and its losses continue the uninterrupted 4-rank run.
TEST_F(ClusterTest, ElasticShrinksTo2WorkersAndContinuesTheLossCurve) {
  const std::vector<std::string> sets = {"steps=40", "checkpoint.every=10", "optimizer.lr=1e-3",
                                         "resources.min_workers=2", "resources.max_workers=4"};
  CommandResult straight = RunLocal(sets, dir_.path() + "/straight");
  ASSERT_EQ(straight.exit_code, 0) << straight.err;
  const std::vector<double> expected = Losses(straight.out);
  ASSERT_EQ(expected.size(), 40u);

  Start(4, /*lease_ms=*/2000);
  const std::string job = Submit(sets);
  ASSERT_TRUE(WaitFor([&] { return Step(job) >= 22; }, seconds(120))) << Status(job);
  const std::string victim = KillRank(job, 2);
  ASSERT_FALSE(victim.empty()) << Status(job);
  ASSERT_TRUE(WaitFor([&] { return State(job) == "SUCCEEDED"; }, seconds(180))) << Status(job);
  EXPECT_NE(Status(job).find("\"world\": 2"), std::string::npos) << Status(job);
  CommandResult watch = Cli({"watch", job}, c_.address());
  EXPECT_NE(watch.out.find("elastic: world 4 -> 2"), std::string::npos) << watch.out;
  const std::vector<double> got = Losses(Cli({"history", job, "-o", "json"}, c_.address()).out);
  ASSERT_EQ(got.size(), 40u);
  double worst = 0;
  for (int s = 0; s < 40; ++s) {
    const double rel = std::abs(got[s] - expected[s]) / std::abs(expected[s]);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, 1e-5) << "step " << s + 1;
  }
  std::cout << "elastic 4 -> 2 workers: max relative loss difference " << worst << std::endl;
}

// A dp2 × tp2 × pp2 mesh (1F1B) on 8 workers loses a rank: every other rank
// is aborted (most share no group with it), and the job resumes from the
// last commit on dp1 × tp2 × pp2 — 4 workers, one replica with 8
// micro-batches instead of two with 4 — continuing the uninterrupted run's
// loss curve.
TEST_F(ClusterTest, ElasticMeshDropsAReplicaAndContinuesTheLossCurve) {
  const std::vector<std::string> sets = {
      "steps=30",      "checkpoint.every=10",     "optimizer.lr=1e-3",
      "parallel.dp=2", "parallel.tp=2",           "parallel.pp=2",
      "batch.micro=4", "resources.min_workers=4", "resources.max_workers=8"};
  CommandResult straight = RunLocal(sets, dir_.path() + "/straight");
  ASSERT_EQ(straight.exit_code, 0) << straight.err;
  const std::vector<double> expected = Losses(straight.out);
  ASSERT_EQ(expected.size(), 30u);

  Start(8, /*lease_ms=*/2000);
  const std::string job = Submit(sets);
  ASSERT_TRUE(WaitFor([&] { return Step(job) >= 13; }, seconds(120))) << Status(job);
  const std::string victim = KillRank(job, 5);
  ASSERT_FALSE(victim.empty()) << Status(job);
  ASSERT_TRUE(WaitFor([&] { return State(job) == "SUCCEEDED"; }, seconds(180))) << Status(job);
  EXPECT_NE(Status(job).find("\"world\": 4"), std::string::npos) << Status(job);
  CommandResult watch = Cli({"watch", job}, c_.address());
  EXPECT_NE(watch.out.find("elastic: world 8 -> 4"), std::string::npos) << watch.out;
  const std::vector<double> got = Losses(Cli({"history", job, "-o", "json"}, c_.address()).out);
  ASSERT_EQ(got.size(), 30u);
  double worst = 0;
  for (int s = 0; s < 30; ++s) {
    const double rel = std::abs(got[s] - expected[s]) / std::abs(expected[s]);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, 1e-5) << "step " << s + 1;
  }
  std::cout << "elastic mesh dp2xtp2xpp2 -> dp1xtp2xpp2: max relative loss difference " << worst
            << std::endl;
}

// SIGKILL of a rank while checkpoint step 20 is being written (as soon as its
// directory appears): the commit of step 10 stays intact, and the job
// recovers from the newest commit and matches the uninterrupted run.
TEST_F(ClusterTest, KillDuringCheckpointWriteKeepsThePreviousCommit) {
  const std::vector<std::string> sets = {"steps=30", "checkpoint.every=10", "optimizer.lr=1e-3",
                                         "parallel.dp=2", "batch.micro=16"};
  CommandResult straight = RunLocal(sets, dir_.path() + "/straight");
  ASSERT_EQ(straight.exit_code, 0) << straight.err;
  const std::vector<double> expected = Losses(straight.out);

  Start(3, /*lease_ms=*/2000);  // one spare
  const std::string job = Submit(sets);
  const std::string ckpt = dir_.path() + "/ckpt";
  ASSERT_TRUE(WaitFor([&] { return std::filesystem::exists(ckpt + "/step-20"); }, seconds(120)));
  const std::string victim = KillRank(job, 1);
  ASSERT_FALSE(victim.empty()) << Status(job);
  const bool step20_committed = std::filesystem::exists(ckpt + "/step-20/manifest.txt");
  ASSERT_TRUE(WaitFor([&] { return State(job) == "SUCCEEDED"; }, seconds(180))) << Status(job);
  // Step 10's commit is whole: its manifest and every shard verify.
  checkpoint::FileCheckpointStorage storage;
  auto manifest = checkpoint::ReadManifest(storage, ckpt + "/step-10/manifest.txt");
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_TRUE(checkpoint::VerifyShards(storage, ckpt + "/step-10", *manifest).ok());
  const std::vector<double> got = Losses(Cli({"history", job, "-o", "json"}, c_.address()).out);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t s = 0; s < got.size(); ++s) EXPECT_EQ(got[s], expected[s]) << "step " << s + 1;
  std::cout << "killed while step 20 was being written (manifest "
            << (step20_committed ? "already" : "not yet") << " written); "
            << Cli({"checkpoints", job}, c_.address()).out;
}

}  // namespace
}  // namespace shardtrain::testing
