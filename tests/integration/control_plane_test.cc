// The control plane with real processes: a coordinator, workers and the CLI
// on 127.0.0.1 (port 0). Issue acceptance: gang scheduling with distinct
// ranks, kill -9 + restart keeps every acknowledged job, PENDING until enough
// workers, DEAD within lease + 2 s, invalid specs refused by field with
// nothing stored, /metrics accepted by promtool, a warning when workers see
// different checkpoint roots.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <thread>

#include "tests/integration/harness.h"

namespace shardtrain::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

const std::string kTinySpec = SourceDir() + "/tests/data/specs/good/tiny.yaml";
// Workers really train what they are given: point them at the real corpus.
const std::string kData = "data.train=" + SourceDir() + "/data/fortunes.txt";

std::string JobState(const std::string& coord, const std::string& job) {
  CommandResult r = Cli({"status", job, "-o", "json"}, coord);
  std::smatch m;
  static const std::regex re("\"state\": \"([A-Z]+)\"");
  return std::regex_search(r.out, m, re) ? m[1].str() : "?(" + r.err + ")";
}

std::map<int, std::string> Ranks(const std::string& status_json) {
  std::map<int, std::string> out;
  static const std::regex re("\"rank\": (\\d+), \"worker_id\": \"(w-\\d+)\"");
  for (auto it = std::sregex_iterator(status_json.begin(), status_json.end(), re);
       it != std::sregex_iterator(); ++it) {
    out[std::stoi((*it)[1])] = (*it)[2];
  }
  return out;
}

std::string WorkerState(const std::string& coord, const std::string& worker) {
  CommandResult r = Cli({"workers", "-o", "json"}, coord);
  std::smatch m;
  std::regex re("\"worker_id\": \"" + worker + "\"[^}]*\"state\": \"([A-Z]+)\"");
  return std::regex_search(r.out, m, re) ? m[1].str() : "?";
}

int CountJobs(const std::string& coord) {
  CommandResult r = Cli({"list", "-o", "json"}, coord);
  int n = 0;
  for (size_t p = r.out.find("\"job_id\""); p != std::string::npos;
       p = r.out.find("\"job_id\"", p + 1)) {
    ++n;
  }
  return n;
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

TEST(ControlPlaneTest, GangScheduledOnDistinctWorkersAndSurvivesKill9) {
  TempDir dir;
  Coordinator c = StartCoordinator(dir.path(), 10'000);
  ASSERT_GT(c.port, 0) << c.process.Log();
  std::vector<Process> workers;
  for (int i = 0; i < 4; ++i) workers.push_back(StartWorker(dir.path(), c.address(), i));

  // steps=100000: the job stays active for the whole test.
  CommandResult sub =
      Cli({"submit", kTinySpec, "--set", kData, "--set", "steps=100000"}, c.address());
  ASSERT_EQ(sub.exit_code, 0) << sub.err;
  const std::string job = Trim(sub.out);
  ASSERT_EQ(job.rfind("j-", 0), 0u) << sub.out;
  CommandResult second =
      Cli({"submit", kTinySpec, "--set", kData, "--set", "name=second"}, c.address());
  ASSERT_EQ(second.exit_code, 0) << second.err;  // waits PENDING behind the first

  std::string status;
  ASSERT_TRUE(WaitFor(
      [&] {
        status = Cli({"status", job, "-o", "json"}, c.address()).out;
        return Ranks(status).size() == 4;
      },
      seconds(10)))
      << status;
  std::map<int, std::string> ranks = Ranks(status);
  std::set<std::string> distinct;
  for (const auto& [rank, worker] : ranks) distinct.insert(worker);
  EXPECT_EQ(distinct.size(), 4u) << status;
  EXPECT_EQ(ranks.begin()->first, 0);
  EXPECT_EQ(ranks.rbegin()->first, 3);
  const std::string before = JobState(c.address(), job);
  EXPECT_TRUE(before == "SCHEDULED" || before == "RUNNING") << before;
  EXPECT_EQ(JobState(c.address(), Trim(second.out)), "PENDING");
  // Past the rendezvous (it runs through the coordinator's KV, which a
  // restart empties, so a generation caught in it re-gangs by design): the
  // first step reported.
  ASSERT_TRUE(WaitFor(
      [&] {
        const std::string out = Cli({"status", job}, c.address()).out;
        return out.find("progress step ") != std::string::npos &&
               out.find("progress step 0/") == std::string::npos;
      },
      seconds(30)))
      << Cli({"status", job}, c.address()).out;

  // kill -9, restart on the same state dir and port.
  const int port = c.port;
  c.process.Signal(SIGKILL);
  ASSERT_TRUE(c.process.Wait(seconds(5)));
  Coordinator again = StartCoordinator(dir.path(), 10'000, "127.0.0.1:" + std::to_string(port));
  ASSERT_EQ(again.port, port) << again.process.Log();
  CommandResult after = Cli({"status", job}, again.address());
  ASSERT_EQ(after.exit_code, 0) << after.err;
  EXPECT_NE(after.out.find(job), std::string::npos);
  EXPECT_EQ(Ranks(Cli({"status", job, "-o", "json"}, again.address()).out), ranks);
  const std::string state_after = JobState(again.address(), job);
  EXPECT_TRUE(state_after == "SCHEDULED" || state_after == "RUNNING")
      << state_after << "\n"
      << Cli({"status", job}, again.address()).out << again.process.Log();
  EXPECT_EQ(CountJobs(again.address()), 2);
  CommandResult list = Cli({"list"}, again.address());
  EXPECT_NE(list.out.find(job), std::string::npos) << list.out;
  EXPECT_NE(list.out.find(Trim(second.out)), std::string::npos) << list.out;
  // The workers re-attach to the restarted coordinator under their old ids.
  EXPECT_TRUE(
      WaitFor([&] { return WorkerState(again.address(), ranks[0]) == "ALIVE"; }, seconds(5)));
  CommandResult cancel = Cli({"cancel", job}, again.address());
  EXPECT_EQ(cancel.exit_code, 0) << cancel.err;
  EXPECT_TRUE(WaitFor([&] { return JobState(again.address(), Trim(second.out)) != "PENDING"; },
                      seconds(10)));
}

TEST(ControlPlaneTest, PendingUntilEnoughWorkersAndDeadWithinLease) {
  TempDir dir;
  const int64_t lease_ms = 2000;
  Coordinator c = StartCoordinator(dir.path(), lease_ms);
  ASSERT_GT(c.port, 0) << c.process.Log();
  std::vector<Process> workers;
  for (int i = 0; i < 4; ++i) workers.push_back(StartWorker(dir.path(), c.address(), i));
  ASSERT_TRUE(
      WaitFor([&] { return Cli({"workers"}, c.address()).out.find("w-0004") != std::string::npos; },
              seconds(10)));
  CommandResult sub = Cli({"submit", kTinySpec, "--set", kData, "--set", "parallel.dp=5", "--set",
                           "batch.global=10", "--set", "steps=100000", "--set", "max_restarts=0"},
                          c.address());
  ASSERT_EQ(sub.exit_code, 0) << sub.err;
  const std::string job = Trim(sub.out);
  std::this_thread::sleep_for(milliseconds(1500));
  EXPECT_EQ(JobState(c.address(), job), "PENDING");

  workers.push_back(StartWorker(dir.path(), c.address(), 4));
  ASSERT_TRUE(WaitFor([&] { return JobState(c.address(), job) != "PENDING"; }, seconds(10)));
  std::map<int, std::string> ranks = Ranks(Cli({"status", job, "-o", "json"}, c.address()).out);
  ASSERT_EQ(ranks.size(), 5u);

  // Once the gang trains (rendezvous done), SIGKILL the worker holding
  // rank 2: DEAD within lease + 2 s.
  ASSERT_TRUE(WaitFor(
      [&] {
        return Cli({"status", job, "-o", "json"}, c.address()).out.find("\"step\": 0,") ==
               std::string::npos;
      },
      seconds(30)));
  const std::string victim = ranks[2];
  Process* holder = nullptr;  // registration order need not be start order: ask the logs
  for (Process& w : workers) {
    if (w.Log().find(" as " + victim + " ") != std::string::npos) holder = &w;
  }
  ASSERT_NE(holder, nullptr) << victim;
  const auto killed_at = std::chrono::steady_clock::now();
  holder->Signal(SIGKILL);
  ASSERT_TRUE(WaitFor([&] { return WorkerState(c.address(), victim) == "DEAD"; },
                      milliseconds(lease_ms + 2000)))
      << WorkerState(c.address(), victim);
  const double took_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - killed_at)
          .count();
  std::cout << "worker " << victim << " marked DEAD " << took_ms << " ms after SIGKILL (lease "
            << lease_ms << " ms)" << std::endl;
  EXPECT_LE(took_ms, lease_ms + 2000);
  // Its job leaves RUNNING, with the reason: either the lease ran out, or a
  // peer's collective failed first and names rank 2 among the missing (under
  // load others may be behind too, e.g. "[1,2,3]").
  ASSERT_TRUE(WaitFor([&] { return JobState(c.address(), job) == "FAILED"; }, seconds(3)));
  CommandResult st = Cli({"status", job}, c.address());
  const bool lease = st.out.find(victim + " (rank 2) missed its lease") != std::string::npos;
  std::smatch missing;
  const bool peer =
      std::regex_search(
          st.out, missing,
          std::regex(R"(ranks not arrived \(dead, hung or behind\): \[([0-9,]*)\])")) &&
      std::regex_search(missing[1].str(), std::regex(R"((^|,)2(,|$))"));
  EXPECT_TRUE(lease || peer) << st.out;
}

// Workers that resolve relative checkpoint dirs against different roots
// cannot share a job's checkpoints: submit says so for a relative
// checkpoint.dir (and still submits), not for an absolute one.
TEST(ControlPlaneTest, SubmitWarnsWhenWorkersHaveDifferentCheckpointRoots) {
  TempDir dir;
  Coordinator c = StartCoordinator(dir.path(), 10'000);
  ASSERT_GT(c.port, 0) << c.process.Log();
  std::vector<Process> workers;
  for (int i = 0; i < 2; ++i) {
    workers.push_back(StartWorker(dir.path(), c.address(), i,
                                  {"--checkpoint-root", dir.path() + "/root" + std::to_string(i)}));
  }
  ASSERT_TRUE(WaitFor(
      [&] {
        const std::string w = Cli({"workers", "-o", "json"}, c.address()).out;
        return w.find(dir.path() + "/root0") != std::string::npos &&
               w.find(dir.path() + "/root1") != std::string::npos;
      },
      seconds(10)))
      << Cli({"workers", "-o", "json"}, c.address()).out;
  // World 4 on 2 workers: the jobs stay PENDING, nothing trains.
  CommandResult relative = Cli({"submit", kTinySpec, "--set", kData, "--set", "checkpoint.every=1",
                                "--set", "checkpoint.dir=ckpt/t"},
                               c.address());
  EXPECT_EQ(relative.exit_code, 0) << relative.err;
  EXPECT_EQ(Trim(relative.out).rfind("j-", 0), 0u) << relative.out;
  EXPECT_NE(relative.err.find("warning: checkpoint.dir ckpt/t is relative"), std::string::npos)
      << relative.err;
  EXPECT_NE(relative.err.find(": " + dir.path() + "/root0"), std::string::npos) << relative.err;
  EXPECT_NE(relative.err.find(": " + dir.path() + "/root1"), std::string::npos) << relative.err;
  CommandResult absolute = Cli({"submit", kTinySpec, "--set", kData, "--set", "checkpoint.every=1",
                                "--set", "checkpoint.dir=" + dir.path() + "/ckpt"},
                               c.address());
  EXPECT_EQ(absolute.exit_code, 0) << absolute.err;
  EXPECT_EQ(absolute.err, "");
  EXPECT_EQ(CountJobs(c.address()), 2);
}

TEST(ControlPlaneTest, InvalidSpecsAreRefusedNamingTheFieldAndNothingIsStored) {
  TempDir dir;
  Coordinator c = StartCoordinator(dir.path(), 10'000);
  ASSERT_GT(c.port, 0) << c.process.Log();
  int checked = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(SourceDir() + "/tests/data/specs/bad")) {
    std::ifstream in(entry.path());
    std::string first;
    std::getline(in, first);
    ASSERT_EQ(first.rfind("# expect: ", 0), 0u) << entry.path();
    const std::string expect = first.substr(10);
    CommandResult r = Cli({"submit", entry.path().string()}, c.address());
    EXPECT_EQ(r.exit_code, 2) << entry.path() << ": " << r.err;
    EXPECT_NE(r.err.find(expect), std::string::npos)
        << entry.path() << "\n  expected: " << expect << "\n  got: " << r.err;
    ++checked;
  }
  // Overrides are validated like the file; unreadable files name the path.
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  const std::vector<Case> more = {
      {{"submit", kTinySpec, "--set", "parallel.tp=3"}, "parallel.tp"},
      {{"submit", kTinySpec, "--set", "optimizer.lr=-1"}, "optimizer.lr"},
      {{"submit", kTinySpec, "--set", "nonsense"}, "override \"nonsense\""},
      {{"submit", "/nonexistent/job.yaml"}, "/nonexistent/job.yaml"},
      {{"submit", dir.path()}, dir.path()},
  };
  for (const Case& k : more) {
    CommandResult r = Cli(k.args, c.address());
    EXPECT_NE(r.exit_code, 0) << k.args.back();
    EXPECT_NE(r.err.find(k.expect), std::string::npos) << k.expect << " in: " << r.err;
    ++checked;
  }
  std::cout << checked << " invalid specs refused" << std::endl;
  EXPECT_GE(checked, 15);
  EXPECT_EQ(CountJobs(c.address()), 0);
  EXPECT_EQ(Cli({"list"}, c.address()).out.find("j-"), std::string::npos);
}

TEST(ControlPlaneTest, UnreachableCoordinatorSaysWhereAndWhatToDo) {
  CommandResult r = Cli({"list", "--timeout-ms", "2000"}, "127.0.0.1:1");
  EXPECT_EQ(r.exit_code, 4);
  EXPECT_NE(r.err.find("127.0.0.1:1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("shardtrain-coordinator"), std::string::npos) << r.err;
  // The hint alone; gRPC's own line only with -v, or as the JSON's detail.
  EXPECT_EQ(r.err.find("failed to connect"), std::string::npos) << r.err;
  CommandResult v = Cli({"list", "--timeout-ms", "2000", "-v"}, "127.0.0.1:1");
  EXPECT_EQ(v.exit_code, 4);
  EXPECT_NE(v.err.find("shardtrain: detail: failed to connect"), std::string::npos) << v.err;
  CommandResult j = Cli({"list", "--timeout-ms", "2000", "-o", "json"}, "127.0.0.1:1");
  EXPECT_EQ(j.exit_code, 4);
  EXPECT_EQ(j.out, "");
  EXPECT_TRUE(std::regex_match(j.err, std::regex(R"(\{"error": \{"code": "UNAVAILABLE", )"
                                                 R"("message": "cannot reach the coordinator at )"
                                                 R"(127\.0\.0\.1:1\. [^\n]*", )"
                                                 R"("detail": "failed to connect[^\n]*"\}\}\n)")))
      << j.err;
}

TEST(ControlPlaneTest, EveryProgramPrintsItsVersion) {
  for (const std::string& bin :
       {std::string(SHARDTRAIN_CLI_BIN), std::string(SHARDTRAIN_COORDINATOR_BIN),
        std::string(SHARDTRAIN_WORKER_BIN)}) {
    CommandResult r = RunCommand({bin, "--version"});
    const std::string name = std::filesystem::path(bin).filename().string();
    EXPECT_EQ(r.exit_code, 0) << name << ": " << r.err;
    EXPECT_TRUE(std::regex_match(
        r.out, std::regex(name + R"( \d+\.\d+\.\d+ \(git ([0-9a-f]{7,}(\+dirty)?|unknown)\)\n)")))
        << r.out;
  }
}

TEST(ControlPlaneTest, BadAddressesAreUsageErrorsNamingTheFlagAndTheValue) {
  struct Case {
    std::vector<std::string> argv;
    std::string expect;
  };
  const std::string kNotAPort = "port \"notaport\" is not a number";
  const std::vector<Case> cases = {
      {{SHARDTRAIN_CLI_BIN, "list", "--coordinator", "127.0.0.1:notaport"},
       "shardtrain: --coordinator \"127.0.0.1:notaport\": " + kNotAPort},
      {{SHARDTRAIN_CLI_BIN, "status", "j-1", "--coordinator", "::1:7070"},
       "--coordinator \"::1:7070\": an IPv6 address needs brackets"},
      {{SHARDTRAIN_WORKER_BIN, "--coordinator", "127.0.0.1:notaport"},
       "shardtrain-worker: --coordinator \"127.0.0.1:notaport\": " + kNotAPort},
      {{SHARDTRAIN_COORDINATOR_BIN, "--listen", "127.0.0.1:notaport", "--state-dir",
        "/nonexistent"},
       "shardtrain-coordinator: --listen \"127.0.0.1:notaport\": " + kNotAPort},
      {{SHARDTRAIN_COORDINATOR_BIN, "--metrics-listen", "127.0.0.1:70000", "--state-dir",
        "/nonexistent"},
       "--metrics-listen \"127.0.0.1:70000\": port 70000 is out of range (0-65535)"},
  };
  for (const Case& c : cases) {
    CommandResult r = RunCommand(c.argv, seconds(10));
    EXPECT_EQ(r.exit_code, 2) << c.argv[0] << ": " << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos)
        << "want: " << c.expect << "\ngot: " << r.err;
  }
  // In JSON mode the same error is one JSON object; stdout stays empty.
  CommandResult j = Cli({"list", "-o", "json", "--coordinator", "127.0.0.1:notaport"});
  EXPECT_EQ(j.exit_code, 2);
  EXPECT_EQ(j.out, "");
  EXPECT_EQ(j.err.rfind(R"({"error": {"code": "INVALID_ARGUMENT", "message": "--coordinator )", 0),
            0u)
      << j.err;
}

TEST(ControlPlaneTest, UnknownJobExitsThreeInTableAndJson) {
  TempDir dir;
  Coordinator c = StartCoordinator(dir.path(), 10'000);
  ASSERT_GT(c.port, 0) << c.process.Log();
  for (const char* command : {"status", "watch", "cancel", "history", "checkpoints", "why"}) {
    CommandResult t = Cli({command, "j-9"}, c.address());
    EXPECT_EQ(t.exit_code, 3) << command << ": " << t.err;
    EXPECT_EQ(t.out, "") << command;
    EXPECT_EQ(t.err, "shardtrain: job j-9 not found\n") << command;
    CommandResult j = Cli({command, "j-9", "-o", "json"}, c.address());
    EXPECT_EQ(j.exit_code, 3) << command << ": " << j.err;
    EXPECT_EQ(j.out, "") << command;
    EXPECT_EQ(j.err, R"({"error": {"code": "NOT_FOUND", "message": "job j-9 not found"}})"
                     "\n")
        << command;
  }
  // A parse error in JSON mode is JSON too, with the usage exit code.
  CommandResult p = Cli({"status", "-o", "json"}, c.address());
  EXPECT_EQ(p.exit_code, 2);
  EXPECT_EQ(p.err, R"({"error": {"code": "INVALID_ARGUMENT", "message": "job is required"}})"
                   "\n");
}

TEST(ControlPlaneTest, SubmitWithoutCheckpointDirSaysTheWeightsAreNotKept) {
  TempDir dir;
  Coordinator c = StartCoordinator(dir.path(), 10'000);
  ASSERT_GT(c.port, 0) << c.process.Log();
  const std::string warning = "no checkpoint.dir: the trained weights will not be saved";
  CommandResult none = Cli({"submit", kTinySpec}, c.address());  // tiny.yaml has no checkpoint
  EXPECT_EQ(none.exit_code, 0) << none.err;
  EXPECT_EQ(none.out.rfind("j-", 0), 0u) << none.out;
  EXPECT_EQ(none.err.rfind("shardtrain: warning: " + warning, 0), 0u) << none.err;
  CommandResult json = Cli({"submit", kTinySpec, "-o", "json"}, c.address());
  EXPECT_EQ(json.exit_code, 0) << json.err;
  EXPECT_EQ(json.out.rfind("{\"job_id\": ", 0), 0u) << json.out;
  EXPECT_EQ(json.err.rfind("{\"warning\": {\"message\": \"" + warning, 0), 0u) << json.err;
  CommandResult kept =
      Cli({"submit", kTinySpec, "--set", "checkpoint.dir=" + dir.path() + "/ckpt"}, c.address());
  EXPECT_EQ(kept.exit_code, 0) << kept.err;
  EXPECT_EQ(kept.err, "");
  // data.val without eval.every: evaluated after the last step only, and
  // said at submit; with eval.every, nothing to say.
  const std::string ckpt = "checkpoint.dir=" + dir.path() + "/ckpt";
  CommandResult end_only =
      Cli({"submit", kTinySpec, "--set", ckpt, "--set", "data.val=val.txt"}, c.address());
  EXPECT_EQ(end_only.exit_code, 0) << end_only.err;
  EXPECT_EQ(end_only.err,
            "shardtrain: warning: data.val: validation runs after the last step only "
            "(eval.every = steps); set eval.every (or --set eval.every=N) to evaluate every N "
            "steps\n");
  CommandResult every = Cli(
      {"submit", kTinySpec, "--set", ckpt, "--set", "data.val=val.txt", "--set", "eval.every=2"},
      c.address());
  EXPECT_EQ(every.exit_code, 0) << every.err;
  EXPECT_EQ(every.err, "");
}

TEST(ControlPlaneTest, MetricsPassPromtool) {
  if (!std::filesystem::exists("/usr/bin/promtool")) GTEST_SKIP() << "promtool not installed";
  TempDir dir;
  Coordinator c = StartCoordinator(dir.path(), 10'000);
  ASSERT_GT(c.metrics_port, 0) << c.process.Log();
  Process w = StartWorker(dir.path(), c.address(), 0, {"--metrics-listen", "127.0.0.1:0"});
  ASSERT_EQ(Cli({"submit", kTinySpec}, c.address()).exit_code, 0);
  Cli({"submit", SourceDir() + "/tests/data/specs/bad/" +
                     std::filesystem::directory_iterator(SourceDir() + "/tests/data/specs/bad")
                         ->path()
                         .filename()
                         .string()},
      c.address());
  ASSERT_TRUE(
      WaitFor([&] { return Cli({"workers"}, c.address()).out.find("ALIVE") != std::string::npos; },
              seconds(10)));
  const std::string file = dir.path() + "/metrics.txt";
  CommandResult curl =
      RunCommand({"/usr/bin/curl", "-sf", "-o", file,
                  "http://127.0.0.1:" + std::to_string(c.metrics_port) + "/metrics"});
  ASSERT_EQ(curl.exit_code, 0) << curl.err;
  std::ifstream in(file);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const char* want :
       {"shardtrain_coordinator_workers{state=\"ALIVE\"} 1",
        "shardtrain_coordinator_jobs{state=\"PENDING\"} 1",
        "shardtrain_coordinator_rpc_total{method=\"SubmitJob\",code=\"INVALID_ARGUMENT\"} 1",
        "shardtrain_coordinator_rpc_latency_seconds_bucket{method=\"Heartbeat\",le=\"+Inf\"}"}) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
  CommandResult check = RunCommand({"/bin/sh", "-c", "promtool check metrics < " + file});
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
  std::cout << "promtool check metrics: exit " << check.exit_code << " " << check.out << check.err
            << std::endl;
}

}  // namespace
}  // namespace shardtrain::testing
