// Issue #15 bugs 2, 3 and 6 with real processes: a job the plan cannot hold
// is refused and the coordinator stays up, also when such a job is already
// in its state dir; a small job backfills past a head that cannot run yet,
// and the head, once it could, reserves the workers and runs before later
// small jobs; work no registered worker supports is refused at submit.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <regex>
#include <string>

#include "tests/integration/harness.h"

namespace shardtrain::testing {
namespace {

using std::chrono::seconds;

const std::string kTinySpec = SourceDir() + "/tests/data/specs/good/tiny.yaml";
const std::string kData = "data.train=" + SourceDir() + "/data/fortunes.txt";

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string JsonField(const std::string& json, const std::string& field) {
  std::smatch m;
  const std::regex re("\"" + field + "\": \"([^\"]*)\"");
  return std::regex_search(json, m, re) ? m[1].str() : "?";
}

std::string StatusField(const std::string& coord, const std::string& job,
                        const std::string& field) {
  return JsonField(Cli({"status", job, "-o", "json"}, coord).out, field);
}

// `submit` of the tiny spec at world `dp` with more --set overrides.
CommandResult Submit(const std::string& coord, int dp, std::vector<std::string> sets = {}) {
  std::vector<std::string> args = {"submit", kTinySpec,
                                   "--set",  kData,
                                   "--set",  "parallel.dp=" + std::to_string(dp),
                                   "--set",  "batch.global=" + std::to_string(2 * dp)};
  for (const std::string& s : sets) {
    args.push_back("--set");
    args.push_back(s);
  }
  return Cli(args, coord);
}

const std::vector<std::string> kMillionLayers = {"model.layers=1000000", "model.heads=1",
                                                 "model.dim=1"};

bool Alive(Process& p) { return !p.Wait(std::chrono::milliseconds(0)); }

TEST(AdmissionIntegrationTest, PoisonJobsAreRefusedAndTheCoordinatorStaysUp) {
  TempDir dir;
  Coordinator c = StartCoordinator(dir.path(), 10'000);
  ASSERT_GT(c.port, 0) << c.process.Log();
  Process w = StartWorker(dir.path(), c.address(), 0);
  ASSERT_TRUE(
      WaitFor([&] { return Cli({"workers"}, c.address()).out.find("ALIVE") != std::string::npos; },
              seconds(20)));

  CommandResult big = Submit(c.address(), 1, kMillionLayers);
  EXPECT_NE(big.exit_code, 0);
  EXPECT_NE(big.err.find("plan: model.layers 1000000"), std::string::npos) << big.err;
  EXPECT_NE(big.err.find("--max-plan-bytes"), std::string::npos) << big.err;

  // A world the spec allows (at most 2^20 ranks) but this coordinator does not.
  CommandResult wide = Cli({"submit", kTinySpec, "--set", kData, "--set", "parallel.dp=1000000",
                            "--set", "batch.global=2000000"},
                           c.address());
  EXPECT_NE(wide.exit_code, 0);
  EXPECT_NE(wide.err.find("--max-world"), std::string::npos) << wide.err;

  CommandResult bf16 = Submit(c.address(), 1, {"precision=bf16"});
  EXPECT_NE(bf16.exit_code, 0);
  EXPECT_NE(bf16.err.find("precision: bf16 on cpu is supported by none"), std::string::npos)
      << bf16.err;

  // Nothing was stored, and the coordinator still runs what fits.
  EXPECT_TRUE(Alive(c.process)) << c.process.Log();
  CommandResult ok = Submit(c.address(), 1, {"steps=2"});
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  const std::string job = Trim(ok.out);
  EXPECT_TRUE(
      WaitFor([&] { return StatusField(c.address(), job, "state") == "SUCCEEDED"; }, seconds(40)))
      << StatusField(c.address(), job, "state");
  EXPECT_EQ(Cli({"list"}, c.address()).out.find("1000000"), std::string::npos);
}

TEST(AdmissionIntegrationTest, RestartOverAStoredUnplannableJobFailsItAndStaysUp) {
  TempDir dir;
  std::string job;
  {
    // An earlier coordinator without the plan limit stored the job (no
    // worker, so it was never planned).
    Coordinator loose = StartCoordinator(dir.path(), 10'000, "127.0.0.1:0", "",
                                         {"--max-plan-bytes", "1000000000000"});
    ASSERT_GT(loose.port, 0) << loose.process.Log();
    CommandResult sub = Submit(loose.address(), 1, kMillionLayers);
    ASSERT_EQ(sub.exit_code, 0) << sub.err;
    job = Trim(sub.out);
    loose.process.Signal(SIGKILL);
    ASSERT_TRUE(loose.process.Wait(seconds(5)));
  }
  for (int start = 0; start < 2; ++start) {
    Coordinator c = StartCoordinator(dir.path(), 10'000);
    ASSERT_GT(c.port, 0) << c.process.Log();
    Process w = StartWorker(dir.path(), c.address(), start);
    EXPECT_EQ(StatusField(c.address(), job, "state"), "FAILED");
    EXPECT_NE(StatusField(c.address(), job, "failure_reason").find("--max-plan-bytes"),
              std::string::npos);
    // Up, and scheduling: a world-1 job gets the worker.
    CommandResult sub = Submit(c.address(), 1, {"steps=100000"});
    ASSERT_EQ(sub.exit_code, 0) << sub.err;
    const std::string next = Trim(sub.out);
    EXPECT_TRUE(
        WaitFor([&] { return StatusField(c.address(), next, "state") == "RUNNING"; }, seconds(30)))
        << c.process.Log();
    EXPECT_TRUE(Alive(c.process)) << c.process.Log();
  }
}

TEST(AdmissionIntegrationTest, SmallJobBackfillsAndTheHeadStillRunsFirstOnceItCan) {
  TempDir dir;
  Coordinator c = StartCoordinator(dir.path(), 10'000, "127.0.0.1:0", "", {"--reserve-after", "1"});
  ASSERT_GT(c.port, 0) << c.process.Log();
  Process w0 = StartWorker(dir.path(), c.address(), 0);

  CommandResult head_sub = Submit(c.address(), 2, {"steps=100000"});
  ASSERT_EQ(head_sub.exit_code, 0) << head_sub.err;
  const std::string head = Trim(head_sub.out);
  ASSERT_TRUE(WaitFor(
      [&] {
        return StatusField(c.address(), head, "pending_reason") ==
               "waiting for 2 cpu workers, 1 free; only 1 alive can run it";
      },
      seconds(20)))
      << StatusField(c.address(), head, "pending_reason");

  // A world-1 job behind it runs to the end on the one worker.
  CommandResult small = Submit(c.address(), 1, {"steps=2"});
  ASSERT_EQ(small.exit_code, 0) << small.err;
  const std::string small_job = Trim(small.out);
  ASSERT_TRUE(WaitFor([&] { return StatusField(c.address(), small_job, "state") == "SUCCEEDED"; },
                      seconds(40)))
      << StatusField(c.address(), small_job, "state");

  // Another long one takes the worker; then a second worker attaches: the
  // head could now fit and, passed over, reserves the free worker.
  CommandResult busy_sub = Submit(c.address(), 1, {"steps=100000"});
  ASSERT_EQ(busy_sub.exit_code, 0) << busy_sub.err;
  const std::string busy = Trim(busy_sub.out);
  ASSERT_TRUE(
      WaitFor([&] { return StatusField(c.address(), busy, "state") == "RUNNING"; }, seconds(30)));
  Process w1 = StartWorker(dir.path(), c.address(), 1);
  ASSERT_TRUE(WaitFor(
      [&] {
        return StatusField(c.address(), head, "pending_reason").find("reserving") !=
               std::string::npos;
      },
      seconds(20)))
      << StatusField(c.address(), head, "pending_reason");
  CommandResult later_sub = Submit(c.address(), 1, {"steps=100000"});
  ASSERT_EQ(later_sub.exit_code, 0) << later_sub.err;
  const std::string later = Trim(later_sub.out);
  EXPECT_EQ(StatusField(c.address(), later, "pending_reason"),
            "queued behind " + head + ", which reserves the free cpu workers until it starts");
  EXPECT_NE(Cli({"list"}, c.address()).out.find("queued behind " + head), std::string::npos);

  // The busy job ends: the head gets both workers, the later job waits.
  ASSERT_EQ(Cli({"cancel", busy}, c.address()).exit_code, 0);
  EXPECT_TRUE(
      WaitFor([&] { return StatusField(c.address(), head, "state") == "RUNNING"; }, seconds(30)))
      << StatusField(c.address(), head, "state") << c.process.Log();
  EXPECT_EQ(StatusField(c.address(), later, "state"), "PENDING");
}

}  // namespace
}  // namespace shardtrain::testing
