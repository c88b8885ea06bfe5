// Storage faults through the real processes (issue 40): checkpoint.dir on a
// tmpfs this test mounts (and unmounts) in its own temp dir, too small for
// the job's checkpoints, or read-only. A checkpoint that cannot be written is
// a [WARNING] the user sees (`submit --wait`/`watch`, `status`, `history`,
// `local`) and a count in shardtrain_checkpoint_failures_total; `warn` keeps
// training and `fail` stops at once naming the path; no step directory is
// left behind; the newest committed checkpoint stays whole and resumable;
// final weights that cannot be written fail the job once, after the back-off,
// without retraining. Mounting needs root (CAP_SYS_ADMIN): elsewhere every
// test skips, saying why.
//
// A tiny model (1 layer, C = 32: 22k parameters, a checkpoint 258 KiB over
// two ranks of 129 KiB, final weights 86 KiB: `shardtrain plan` with
// TinyJob's overrides) and few steps keep each test to seconds.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "tests/integration/harness.h"
#include "tests/integration/training_util.h"
#include "worker/checkpoint/directory.h"
#include "worker/checkpoint/storage.h"

namespace shardtrain::testing {
namespace {

namespace fs = std::filesystem;

// The tiny job on 2 ranks (dp 2), no evaluation, checkpoints in `ck`.
std::vector<std::string> TinyJob(const std::string& ck, int steps, int every) {
  return {"data.train=" + kData,
          "eval.every=0",
          "model.layers=1",
          "model.heads=2",
          "model.dim=32",
          "model.context=32",
          "batch.seq_len=32",
          "batch.micro=2",
          "batch.global=4",
          "parallel.dp=2",
          "optimizer.warmup_steps=0",
          "steps=" + std::to_string(steps),
          "checkpoint.every=" + std::to_string(every),
          "checkpoint.dir=" + ck};
}

std::vector<std::string> WithSets(std::vector<std::string> args,
                                  const std::vector<std::string>& sets) {
  for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
  return args;
}

// Names in `dir`, sorted; empty when it does not exist.
std::set<std::string> Listing(const std::string& dir) {
  std::set<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    out.insert(it->path().filename().string());
  }
  return out;
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A tmpfs of `size` on a fresh directory under `parent`; unmounted (lazily,
// should a process still hold it) and removed by the destructor.
class ScopedTmpfs {
 public:
  ScopedTmpfs(const std::string& parent, const std::string& size) : dir_(parent + "/volume") {
    fs::create_directories(dir_);
    const std::string options = "size=" + size;
    if (::mount("tmpfs", dir_.c_str(), "tmpfs", 0, options.c_str()) == 0) {
      mounted_ = true;
    } else {
      why_ = std::string("cannot mount a tmpfs (") + std::strerror(errno) +
             "): the storage fault tests need root or CAP_SYS_ADMIN";
    }
  }
  ~ScopedTmpfs() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  bool ok() const { return mounted_; }
  const std::string& why() const { return why_; }
  const std::string& dir() const { return dir_; }
  bool RemountReadOnly() {
    return ::mount(nullptr, dir_.c_str(), nullptr, MS_REMOUNT | MS_RDONLY, nullptr) == 0;
  }

 private:
  std::string dir_, why_;
  bool mounted_ = false;
};

class StorageFaultsTest : public ClusterTest {
 protected:
  std::string Metrics() {
    const CommandResult r =
        RunCommand({"/usr/bin/curl", "-sf",
                    "http://127.0.0.1:" + std::to_string(c_.metrics_port) + "/metrics"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.out;
  }
};

// 420 KiB: room for one checkpoint, a shard and the final weights, not for
// a second checkpoint: step 2 commits, steps 4 and 6 cannot be written. Under `warn`
// the job trains on and SUCCEEDS, and the user is told each time, the
// coordinator counts them, nothing is left of steps 4 and 6, and step 2 is
// whole: a new job resumes from it.
TEST_F(StorageFaultsTest, FullVolumeWarnsCountsTrainsOnAndKeepsTheCommittedCheckpoint) {
  ScopedTmpfs volume(dir_.path(), "420k");
  if (!volume.ok()) GTEST_SKIP() << volume.why();
  Start(2);
  // submit warns only with a worker of this machine attached: wait for them.
  ASSERT_TRUE(WaitFor(
      [&] {
        const std::string w = Cli({"workers", "-o", "json"}, c_.address()).out;
        size_t alive = 0;
        for (size_t at = w.find("\"ALIVE\""); at != std::string::npos;
             at = w.find("\"ALIVE\"", at + 1)) {
          ++alive;
        }
        return alive == 2;
      },
      std::chrono::seconds(20)));
  const std::string ck = volume.dir() + "/ck";
  const auto start = std::chrono::steady_clock::now();
  CommandResult run =
      Cli(WithSets({"submit", kDdpSpec, "--wait"}, TinyJob(ck, 8, 2)), c_.address());
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  const std::string job = run.out.substr(0, run.out.find('\n'));
  std::cout << "[storage-faults] full volume: SUCCEEDED in " << took << " s\n" << run.out;

  // submit warned at the start: the volume holds less than two checkpoints.
  EXPECT_NE(run.err.find("checkpoint.dir " + ck + " has "), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("less than two checkpoints of this job (2 × 258.0 KiB)"),
            std::string::npos)
      << run.err;

  // watch (submit --wait): one warning per step that was not committed.
  EXPECT_NE(run.out.find("checkpoint step 2 committed"), std::string::npos) << run.out;
  for (int step : {4, 6}) {
    const std::regex warning("\\[WARNING\\] checkpoint step " + std::to_string(step) +
                             " not committed: rank [01]: (No space left on device|needs [0-9.]+ "
                             "KiB, [0-9.]+ KiB free) \\(" +
                             ck + "/step-" + std::to_string(step) + "\\)");
    EXPECT_TRUE(std::regex_search(run.out, warning)) << step << "\n" << run.out;
  }
  EXPECT_EQ(Count(run.out, "[WARNING]"), 2) << run.out;
  EXPECT_NE(run.out.find("[SUCCEEDED]"), std::string::npos) << run.out;

  // status and history show them too; the counter has them by reason.
  const std::string status = Cli({"status", job}, c_.address()).out;
  EXPECT_NE(status.find("checkpoint: step 2 committed, 2 not committed since"), std::string::npos)
      << status;
  EXPECT_EQ(Count(status, "[WARNING] checkpoint step"), 2) << status;
  const std::string history = Cli({"history", job}, c_.address()).out;
  EXPECT_EQ(Count(history, "[WARNING] checkpoint step"), 2) << history;
  const std::string metrics = Metrics();
  EXPECT_NE(metrics.find("shardtrain_checkpoint_failures_total{job_id=\"" + job +
                         "\",reason=\"no_space\"} 2"),
            std::string::npos)
      << metrics;

  // Nothing left of the failed steps; the committed one verifies.
  EXPECT_EQ(Listing(ck), (std::set<std::string>{"final.weights", "step-2"}));
  EXPECT_EQ(Listing(ck + "/step-2"),
            (std::set<std::string>{"manifest.txt", "rank-0.shard", "rank-1.shard"}));
  checkpoint::FileCheckpointStorage storage;
  absl::StatusOr<checkpoint::LatestValidResult> latest = checkpoint::LatestValid(storage, ck);
  ASSERT_TRUE(latest.ok()) << latest.status();
  ASSERT_TRUE(latest->checkpoint.has_value());
  EXPECT_EQ(latest->checkpoint->step, 2);
  const std::string listed = Cli({"checkpoints", job}, c_.address()).out;
  EXPECT_NE(listed.find(ck + "/step-2"), std::string::npos) << listed;

  // Resumable: a job on another volume goes on from step 2.
  CommandResult resumed = Cli(WithSets({"submit", kDdpSpec, "--wait", "--resume-from", ck},
                                       TinyJob(dir_.path() + "/ck2", 4, 0)),
                              c_.address());
  EXPECT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  EXPECT_NE(resumed.out.find("resumed from " + ck + "/step-2 (step 2)"), std::string::npos)
      << resumed.out;
  EXPECT_EQ(resumed.out.find("step 1/4"), std::string::npos) << "retrained from 0: " << resumed.out;
}

// A read-only checkpoint.dir under `on_failure: fail`: the first checkpoint
// fails the job at once, naming the path and the cause, without a restart;
// nothing is written.
TEST_F(StorageFaultsTest, ReadOnlyVolumeUnderFailStopsTheJobNamingThePath) {
  ScopedTmpfs volume(dir_.path(), "1m");
  if (!volume.ok()) GTEST_SKIP() << volume.why();
  ASSERT_TRUE(volume.RemountReadOnly()) << std::strerror(errno);
  const std::string ck = volume.dir() + "/ck";
  std::vector<std::string> sets = TinyJob(ck, 6, 2);
  sets.push_back("checkpoint.on_failure=fail");
  const auto start = std::chrono::steady_clock::now();
  CommandResult run = RunLocal(sets, ck, {"--workers", "2"}, /*json=*/false);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "[storage-faults] read-only volume, on_failure fail: exit " << run.exit_code
            << " in " << took << " s\n"
            << run.out;
  EXPECT_EQ(run.exit_code, 1) << run.out << run.err;
  const std::string warning = "checkpoint step 2 not committed: rank ";
  EXPECT_NE(run.out.find("[WARNING] " + warning), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("Read-only file system (" + ck + "/step-2)"), std::string::npos)
      << run.out;
  EXPECT_NE(run.out.find("(checkpoint.on_failure: fail); no checkpoint committed"),
            std::string::npos)
      << run.out;
  EXPECT_EQ(run.out.find("RECOVERING"), std::string::npos) << run.out;
  EXPECT_EQ(run.out.find("step 3/6"), std::string::npos) << "trained on: " << run.out;
  EXPECT_TRUE(Listing(volume.dir()).empty());
}

// Final weights that do not fit (no checkpoints: every 0): retried for
// checkpoint.final_retry_s with one warning, then FAILED once, naming the
// file; never RECOVERING, never retrained from step 0.
TEST_F(StorageFaultsTest, FinalWeightsThatDoNotFitFailOnceAfterTheBackOff) {
  ScopedTmpfs volume(dir_.path(), "64k");
  if (!volume.ok()) GTEST_SKIP() << volume.why();
  const std::string ck = volume.dir() + "/ck";
  std::vector<std::string> sets = TinyJob(ck, 4, 0);
  sets.push_back("checkpoint.final_retry_s=2");
  const auto start = std::chrono::steady_clock::now();
  CommandResult run = RunLocal(sets, ck, {"--workers", "2"}, /*json=*/false);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "[storage-faults] final weights on a full volume: exit " << run.exit_code << " in "
            << took << " s\n"
            << run.out;
  EXPECT_EQ(run.exit_code, 1) << run.out << run.err;
  EXPECT_NE(run.out.find("[WARNING] rank 0: final weights not saved: needs "), std::string::npos)
      << run.out;
  EXPECT_NE(run.out.find(ck + "/final.weights); the trained weights stay in memory"),
            std::string::npos)
      << run.out;
  EXPECT_NE(run.out.find("final weights not saved: needs"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("retried for 2s (checkpoint.final_retry_s) (permanent"), std::string::npos)
      << run.out;
  EXPECT_EQ(run.out.find("RECOVERING"), std::string::npos) << run.out;
  EXPECT_EQ(Count(run.out, "step 1/4"), 1) << "trained once: " << run.out;
  EXPECT_LT(took, 60);
  EXPECT_FALSE(fs::exists(ck + "/final.weights"));
}

}  // namespace
}  // namespace shardtrain::testing
