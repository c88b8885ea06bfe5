// Real processes (fork) rendezvous through a FileStore and all-reduce in a
// loop; the test SIGKILLs one of them mid-collective. Every survivor must get
// an error within timeout + 2 s of the kill, and its flight-recorder dump must
// name the op and the dead rank.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/rendezvous_store.h"

namespace shardtrain::comm {
namespace {

constexpr int kWorld = 4;
constexpr int kVictim = 2;
constexpr absl::Duration kTimeout = absl::Seconds(5);

// Child body: all-reduce 1 MiB until failure; report through the store.
[[noreturn]] void RunRank(const std::string& dir, int rank) {
  auto store = std::make_shared<FileStore>(dir);
  GlooOptions options;
  options.prefix = "killjob/gen0";
  options.timeout = kTimeout;
  auto comm = CreateGlooCommunicator(store, rank, kWorld, options);
  if (!comm.ok()) {
    store->Set(absl::StrCat("result/", rank), comm.status().ToString()).IgnoreError();
    _exit(2);
  }
  std::vector<float> x(1 << 18, 1.0f);
  for (int iter = 0; iter < 1000000; ++iter) {
    absl::Status s = (*comm)->AllReduce(x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum);
    if (!s.ok()) {
      const int64_t failed_at_us = absl::ToUnixMicros(absl::Now());
      store
          ->Set(absl::StrCat("result/", rank), absl::StrCat(failed_at_us, "\n", s.ToString(), "\n",
                                                            (*comm)->flight_recorder().DumpText()))
          .IgnoreError();
      _exit(0);
    }
    for (float& v : x) v = 1.0f;
    if (iter == 3) store->Set(absl::StrCat("running/", rank), "1").IgnoreError();
  }
  _exit(3);
}

TEST(GlooKillTest, SurvivorsFailWithinTimeoutPlusTwoSeconds) {
  char tmpl[] = "/tmp/shardtrain_kill_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  std::vector<pid_t> pids;
  for (int r = 0; r < kWorld; ++r) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) RunRank(dir, r);
    pids.push_back(pid);
  }
  FileStore store(dir);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(store.Get(absl::StrCat("running/", r), absl::Seconds(60)).ok())
        << "rank " << r << " never got going";
  }
  const int64_t killed_at_us = absl::ToUnixMicros(absl::Now());
  ASSERT_EQ(kill(pids[kVictim], SIGKILL), 0);

  for (int r = 0; r < kWorld; ++r) {
    int status = 0;
    ASSERT_EQ(waitpid(pids[r], &status, 0), pids[r]);
    if (r == kVictim) {
      EXPECT_TRUE(WIFSIGNALED(status));
      continue;
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "rank " << r << ": "
        << (WIFSIGNALED(status) ? absl::StrCat("killed by signal ", WTERMSIG(status))
                                : absl::StrCat("exit code ", WEXITSTATUS(status)));
    auto result = store.Get(absl::StrCat("result/", r), absl::Seconds(1));
    ASSERT_TRUE(result.ok()) << "rank " << r << ": " << result.status();
    std::vector<std::string> lines = absl::StrSplit(*result, absl::MaxSplits('\n', 2));
    ASSERT_EQ(lines.size(), 3u) << *result;
    int64_t failed_at_us = 0;
    ASSERT_TRUE(absl::SimpleAtoi(lines[0], &failed_at_us));
    const double after_kill_ms = (failed_at_us - killed_at_us) / 1000.0;
    std::cerr << "rank " << r << " failed " << after_kill_ms
              << " ms after the SIGKILL: " << lines[1] << "\n";
    EXPECT_LT(after_kill_ms, absl::ToDoubleMilliseconds(kTimeout + absl::Seconds(2)));
    // The status and the flight recorder's failed record name the op and
    // the dead rank.
    const std::string& dump = lines[2];
    EXPECT_NE(lines[1].find("AllReduce seq="), std::string::npos) << lines[1];
    const size_t failed = dump.find("state=failed");
    ASSERT_NE(failed, std::string::npos) << dump;
    const std::string failed_line = dump.substr(dump.rfind('\n', failed) + 1);
    EXPECT_NE(failed_line.find("AllReduce"), std::string::npos) << failed_line;
    const std::string marker = "ranks not arrived (dead, hung or behind): [";
    const size_t list = failed_line.find(marker);
    ASSERT_NE(list, std::string::npos) << failed_line;
    const size_t begin = list + marker.size();
    const std::string missing = failed_line.substr(begin, failed_line.find(']', begin) - begin);
    const std::vector<std::string> ranks = absl::StrSplit(missing, ',');
    EXPECT_NE(std::find(ranks.begin(), ranks.end(), std::to_string(kVictim)), ranks.end())
        << failed_line;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace shardtrain::comm
