// GPU workers around the engine, with real processes: the worker's
// --device cuda:N and --probe-devices, `shardtrain local` with a cuda job,
// and a cuda job on a cluster that has no GPU worker (it waits, and `why`
// says for what). On a machine without a GPU (the build machines) the
// refusals are what runs; with one they skip.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <set>
#include <string>

#include "tests/integration/harness.h"

namespace shardtrain::testing {
namespace {

using std::chrono::seconds;

const std::string kTinySpec = SourceDir() + "/tests/data/specs/good/tiny.yaml";
const std::string kData = "data.train=" + SourceDir() + "/data/fortunes.txt";

bool MachineHasAGpu() {
  return RunCommand({SHARDTRAIN_WORKER_BIN, "--probe-devices"}).exit_code == 0;
}

std::string JsonField(const std::string& json, const std::string& field) {
  std::smatch m;
  const std::regex re("\"" + field + "\": \"([^\"]*)\"");
  return std::regex_search(json, m, re) ? m[1].str() : "?";
}

// The temp dirs of `shardtrain local` runs that probed for GPUs.
std::set<std::string> ProbedLocalDirs() {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/tmp", ec)) {
    if (e.path().filename().string().rfind("shardtrain-local-", 0) == 0 &&
        std::filesystem::exists(e.path() / "probe-devices.out", ec)) {
      out.insert(e.path().string());
    }
  }
  return out;
}

TEST(GpuWorkersTest, WorkerWithoutAGpuExitsNamingTheReason) {
  if (MachineHasAGpu()) GTEST_SKIP() << "this machine has a GPU";
  CommandResult probe = RunCommand({SHARDTRAIN_WORKER_BIN, "--probe-devices"});
  EXPECT_EQ(probe.exit_code, 1);
  EXPECT_EQ(probe.out, "");
  EXPECT_EQ(probe.err.rfind("shardtrain-worker: no CUDA device: ", 0), 0u) << probe.err;

  // No coordinator needed to find out: the device is checked before it is dialled.
  CommandResult w = RunCommand(
      {SHARDTRAIN_WORKER_BIN, "--coordinator", "127.0.0.1:1", "--device", "cuda:0"}, seconds(30));
  EXPECT_EQ(w.exit_code, 1) << w.err;
  EXPECT_EQ(w.err.rfind("shardtrain-worker: --device cuda:0: no CUDA device: ", 0), 0u) << w.err;
  EXPECT_EQ(w.err.find("not available in this build yet"), std::string::npos) << w.err;

  CommandResult bad = RunCommand(
      {SHARDTRAIN_WORKER_BIN, "--coordinator", "127.0.0.1:1", "--device", "cuda:one"}, seconds(30));
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_EQ(bad.err, "shardtrain-worker: --device: 'cuda:one' is not cpu or cuda:N\n");
}

TEST(GpuWorkersTest, LocalRefusesACudaJobBeforeStartingAnything) {
  if (MachineHasAGpu()) GTEST_SKIP() << "this machine has a GPU";
  const std::set<std::string> before = ProbedLocalDirs();
  CommandResult r = Cli({"local", kTinySpec, "--set", kData, "--set", "resources.device=cuda",
                         "--set", "precision=bf16"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;  // an unrunnable job, not a bad spec
  EXPECT_EQ(r.out, "");                         // no cluster line: nothing started
  // (After the spec's warnings, e.g. that no checkpoint.dir keeps the weights.)
  EXPECT_NE(r.err.find("shardtrain: resources.device: cuda, but this machine has no CUDA device "
                       "shardtrain can train on ("),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("); to train on the CPU: --set resources.device=cpu --set precision=fp32\n"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("no CUDA device: no CUDA device"), std::string::npos) << r.err;

  CommandResult json =
      Cli({"local", kTinySpec, "--set", kData, "--set", "resources.device=cuda", "-o", "json"});
  EXPECT_EQ(json.exit_code, 1);
  EXPECT_EQ(json.out, "");
  EXPECT_NE(json.err.find("{\"error\": {\"code\": \"FAILED_PRECONDITION\", \"message\": "
                          "\"resources.device: cuda, but this machine has no CUDA device"),
            std::string::npos)
      << json.err;
  // fp32 needs no precision change.
  EXPECT_NE(json.err.find("--set resources.device=cpu\"}}"), std::string::npos) << json.err;
  // Its temporary directory went with it.
  EXPECT_EQ(ProbedLocalDirs(), before);
}

// A cuda job submitted before any GPU worker attached waits, and says why
// (status and `why`); `plan` shows it. Once only cpu workers registered,
// a new cuda job is refused at submit, naming the field (exit 1).
TEST(GpuWorkersTest, ACudaJobWithoutCudaWorkersWaitsAndSaysWhy) {
  TempDir dir;
  Coordinator c = StartCoordinator(dir.path(), 10'000);
  ASSERT_GT(c.port, 0) << c.process.Log();
  const std::vector<std::string> cuda = {"--set", kData,           "--set", "resources.device=cuda",
                                         "--set", "precision=fp16"};

  std::vector<std::string> plan = {"plan", kTinySpec};
  plan.insert(plan.end(), cuda.begin(), cuda.end());
  CommandResult p = Cli(plan);
  EXPECT_EQ(p.exit_code, 0) << p.err;
  EXPECT_NE(p.out.find("precision fp16"), std::string::npos) << p.out;

  std::vector<std::string> submit = {"submit", kTinySpec};
  submit.insert(submit.end(), cuda.begin(), cuda.end());
  CommandResult s = Cli(submit, c.address());
  ASSERT_EQ(s.exit_code, 0) << s.err;
  const std::string job = s.out.substr(0, s.out.find('\n'));
  const std::string want =
      "waiting for 4 cuda (fp16) workers, 0 free; no alive worker can run cuda (fp16)";
  const std::string status = Cli({"status", job, "-o", "json"}, c.address()).out;
  EXPECT_EQ(JsonField(status, "state"), "PENDING") << status;
  EXPECT_EQ(JsonField(status, "pending_reason"), want) << status;
  EXPECT_EQ(JsonField(status, "device"), "cuda") << status;

  Process w = StartWorker(dir.path(), c.address(), 0);
  ASSERT_TRUE(WaitFor(
      [&] {
        return Cli({"workers", "-o", "json"}, c.address()).out.find("\"kind\": \"cpu\"") !=
               std::string::npos;
      },
      seconds(20)))
      << w.Log();
  CommandResult why = Cli({"why", job}, c.address());
  EXPECT_EQ(why.exit_code, 0) << why.err;
  EXPECT_EQ(why.out, "job " + job + " is PENDING, not RUNNING: " + want + "\n");
  EXPECT_EQ(JsonField(Cli({"status", job, "-o", "json"}, c.address()).out, "state"), "PENDING");

  CommandResult refused = Cli(submit, c.address());
  EXPECT_EQ(refused.exit_code, 1) << refused.out << refused.err;
  EXPECT_NE(refused.err.find("resources.device: cuda is supported by none of the 1 workers that "
                             "registered (they offer: cpu fp32)"),
            std::string::npos)
      << refused.err;
  // The workers table names each worker's device model.
  CommandResult workers = Cli({"workers"}, c.address());
  EXPECT_NE(workers.out.find("MODEL"), std::string::npos) << workers.out;
  EXPECT_NE(workers.out.find("cpu, 1 threads"), std::string::npos) << workers.out;
}

}  // namespace
}  // namespace shardtrain::testing
