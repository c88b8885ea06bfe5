// Issue #15, recovery part: a killed rank with a spare attached recovers
// under the default lease and timeouts; failures a retry cannot fix fail the
// job at once; spec paths stay inside the workers' roots.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>

#include "tests/integration/harness.h"
#include "tests/integration/training_util.h"

namespace shardtrain::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class HardeningTest : public ClusterTest {
 protected:
  // A coordinator and `n` workers with every flag at its default (lease,
  // heartbeat period, timeouts), except 1 compute thread per worker.
  void StartWithDefaults(int n, const std::vector<std::string>& worker_flags = {}) {
    c_ = StartCoordinator(dir_.path(), /*lease_ms=*/0);
    ASSERT_GT(c_.port, 0) << c_.process.Log();
    for (int i = 0; i < n; ++i) {
      std::vector<std::string> argv = {SHARDTRAIN_WORKER_BIN, "--coordinator", c_.address(),
                                       "--threads", "1"};
      argv.insert(argv.end(), worker_flags.begin(), worker_flags.end());
      workers_.emplace_back(argv, dir_.path() + "/worker-" + std::to_string(i) + ".log");
    }
  }
  std::string Reason(const std::string& job) { return Field(Status(job), "failure_reason"); }
  std::string Logs() {
    std::string all;
    for (const Process& w : workers_) all += w.Log();
    return all;
  }
};

// Bug 1: default coordinator and worker flags, 5 workers for a job of 4,
// rank 3 SIGKILLed at step >= 25. Generation 2 must not be ganged onto the
// killed worker (its lease has not run out), the four live workers must
// keep their leases while their ranks abort, and the job finishes on them
// with the losses of an uninterrupted run.
TEST_F(HardeningTest, KilledRankUnderDefaultLeaseFinishesOnTheFourLiveWorkers) {
  const int steps = 40;
  const std::vector<std::string> sets = {"parallel.dp=4", "steps=40", "checkpoint.every=10"};
  CommandResult straight = RunLocal(sets, dir_.path() + "/straight");
  ASSERT_EQ(straight.exit_code, 0) << straight.out << straight.err;
  const std::vector<double> expected = Losses(straight.out);
  ASSERT_EQ(expected.size(), size_t(steps));

  StartWithDefaults(5);
  const std::string job = Submit(sets);
  ASSERT_TRUE(WaitFor([&] { return Step(job) >= 25; }, seconds(90))) << Status(job);
  const std::string victim = KillRank(job, 3);
  ASSERT_FALSE(victim.empty()) << Status(job);
  const int killed_at = Step(job);
  const auto killed = std::chrono::steady_clock::now();
  ASSERT_TRUE(WaitFor([&] { return State(job) == "SUCCEEDED"; }, seconds(60)))
      << Status(job) << Cli({"watch", job}, c_.address()).out << Logs();
  const double recovery_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  const std::string done = Status(job);
  EXPECT_NE(done.find("\"restarts\": 1"), std::string::npos) << done;
  EXPECT_NE(done.find("\"generation\": 2"), std::string::npos) << done;
  EXPECT_EQ(done.find("\"worker_id\": \"" + victim + "\""), std::string::npos)
      << "generation 2 was ganged onto the killed worker " << victim << ": " << done;
  // No live worker lost its lease while its rank was being stopped.
  EXPECT_EQ(Logs().find("registering again"), std::string::npos) << Logs();
  const std::string watch = Cli({"watch", job}, c_.address()).out;
  EXPECT_NE(watch.find("resuming from committed step 20"), std::string::npos) << watch;

  const std::vector<double> got = Losses(Cli({"history", job, "-o", "json"}, c_.address()).out);
  ASSERT_EQ(got.size(), size_t(steps));
  std::printf("rank 3 (%s) killed at step %d; SUCCEEDED %.1f s later on the four live workers\n",
              victim.c_str(), killed_at, recovery_s);
  std::printf("step  uninterrupted  recovered\n");
  double worst = 0;
  for (int s = 0; s < steps; ++s) {
    const double rel = std::abs(got[s] - expected[s]) / std::abs(expected[s]);
    worst = std::max(worst, rel);
    if (s >= 19) std::printf("%4d  %13.9f  %9.9f\n", s + 1, expected[s], got[s]);
    EXPECT_LE(rel, 1e-6) << "step " << s + 1;
  }
  std::printf("max relative loss difference after recovery: %g\n", worst);

  // The curve, drawn: in the terminal (the first and last loss on the value
  // axis' ends, within rounding) and as an SVG file with one polyline.
  const CommandResult plot = Cli({"history", job, "--plot"}, c_.address());
  ASSERT_EQ(plot.exit_code, 0) << plot.err;
  std::printf("%s", plot.out.c_str());
  EXPECT_NE(plot.out.find("* loss"), std::string::npos) << plot.out;
  char top[32];  // the value axis' top label: the largest loss
  std::snprintf(top, sizeof top, "%.4g |", *std::max_element(got.begin(), got.end()));
  EXPECT_NE(plot.out.find(top), std::string::npos) << plot.out;
  const std::string svg_path = dir_.path() + "/loss.svg";
  const CommandResult svg = Cli({"history", job, job, "--plot", svg_path}, c_.address());
  ASSERT_EQ(svg.exit_code, 0) << svg.err;
  std::ifstream in(svg_path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.rfind("<svg", 0), 0u) << text.substr(0, 100);
  EXPECT_NE(text.find(job + " loss"), std::string::npos);
  // Several jobs without --plot: a usage error.
  EXPECT_EQ(Cli({"history", job, job}, c_.address()).exit_code, 2);
}

// Bug 6, second half: a missing data file is permanent. The job FAILS after
// one attempt, without using max_restarts, and the reason names the path.
TEST_F(HardeningTest, MissingDataFileFailsAtOnceWithoutRestarts) {
  StartWithDefaults(1);
  const std::string missing = dir_.path() + "/no-such-corpus.txt";
  const std::string job = Submit({"parallel.dp=1", "steps=5", "data.train=" + missing});
  ASSERT_TRUE(WaitFor([&] { return State(job) == "FAILED"; }, seconds(30))) << Status(job);
  const std::string st = Status(job);
  EXPECT_NE(st.find("\"restarts\": 0"), std::string::npos) << st;
  EXPECT_NE(Reason(job).find(missing), std::string::npos) << st;
  EXPECT_NE(Reason(job).find("permanent"), std::string::npos) << st;
  std::printf("failure reason: %s\n", Reason(job).c_str());
}

// Paths: the coordinator refuses relative spec paths that climb out with
// ".." at submit; a worker with --data-root refuses a data path outside it
// (a permanent failure naming the field) and resolves relative ones under
// it; it reports its data root when it registers.
TEST_F(HardeningTest, SpecPathsStayInsideTheWorkersRoots) {
  const std::string data_root = SourceDir() + "/data";
  StartWithDefaults(1, {"--data-root", data_root});
  ASSERT_TRUE(WaitFor(
      [&] {
        return Cli({"workers", "-o", "json"}, c_.address())
                   .out.find("\"data_root\": \"" + data_root + "\"") != std::string::npos;
      },
      seconds(20)))
      << Cli({"workers", "-o", "json"}, c_.address()).out;

  for (const std::string set : {"data.train=../../etc/passwd", "checkpoint.dir=a/../../ckpt"}) {
    CommandResult r = Cli({"submit", kDdpSpec, "--set", set}, c_.address());
    EXPECT_NE(r.exit_code, 0) << set << ": " << r.out;
    const std::string field = set.substr(0, set.find('='));
    EXPECT_NE(r.err.find(field + ": "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("escapes its root"), std::string::npos) << r.err;
    std::printf("submit --set %s -> exit %d: %s", set.c_str(), r.exit_code, r.err.c_str());
  }
  EXPECT_EQ(Cli({"list"}, c_.address()).out.find("j-"), std::string::npos) << "nothing stored";

  const std::string outside = Submit({"parallel.dp=1", "steps=2", "data.train=/etc/hostname"});
  ASSERT_TRUE(WaitFor([&] { return State(outside) == "FAILED"; }, seconds(30))) << Status(outside);
  EXPECT_NE(Status(outside).find("\"restarts\": 0"), std::string::npos) << Status(outside);
  EXPECT_NE(Reason(outside).find("data.train: '/etc/hostname' is outside this worker's root"),
            std::string::npos)
      << Status(outside);
  std::printf("failure reason: %s\n", Reason(outside).c_str());

  const std::string inside = Submit({"parallel.dp=1", "steps=2", "data.train=fortunes.txt"});
  ASSERT_TRUE(WaitFor([&] { return State(inside) == "SUCCEEDED"; }, seconds(60)))
      << Status(inside) << Logs();
}

}  // namespace
}  // namespace shardtrain::testing
