// `shardtrain why` (issue 15): with one rank's worker stopped (SIGSTOP) in a
// running 4-rank job, `why` names that rank as missing from the collective the
// other three wait in. A long lease keeps the job from recovering meanwhile.
#include <signal.h>

#include <iostream>
#include <regex>
#include <string>

#include "tests/integration/training_util.h"

namespace shardtrain::testing {
namespace {

class WhyTest : public ClusterTest {};

TEST_F(WhyTest, NamesTheStoppedRankAsMissingFromTheCollectiveTheOthersWaitIn) {
  Start(4, /*lease_ms=*/60'000);
  // Small and long: steps are quick, the job is still running at the end,
  // and no collective times out while the rank is stopped.
  const std::string job = Submit({"steps=100000", "timeouts.collective_s=600", "model.layers=1",
                                  "model.dim=32", "model.heads=2"});
  ASSERT_FALSE(job.empty());
  ASSERT_TRUE(WaitFor([&] { return State(job) == "RUNNING" && Step(job) >= 3; }, seconds(60)))
      << Status(job) << c_.process.Log();
  CommandResult healthy = Cli({"why", job}, c_.address());
  EXPECT_EQ(healthy.exit_code, 0) << healthy.err;
  std::cout << "$ shardtrain why " << job << "   # all ranks running\n" << healthy.out;

  // The worker holding rank 2, stopped.
  std::smatch m;
  const std::string st = Status(job);
  ASSERT_TRUE(std::regex_search(st, m, std::regex("\"rank\": 2, \"worker_id\": \"(w-\\d+)\"")))
      << st;
  const std::string victim = m[1];
  Process* stopped = nullptr;
  for (Process& w : workers_) {
    if (w.Log().find(" as " + victim + " ") != std::string::npos) stopped = &w;
  }
  ASSERT_NE(stopped, nullptr) << victim;
  stopped->Signal(SIGSTOP);

  CommandResult json;
  const bool named = WaitFor(
      [&] {
        json = Cli({"why", job, "-o", "json"}, c_.address());
        return json.exit_code == 0 && json.out.find("\"missing_ranks\": [2]") != std::string::npos;
      },
      seconds(30));
  CommandResult text = Cli({"why", job}, c_.address());
  stopped->Signal(SIGCONT);  // so that teardown finds it as it left it
  ASSERT_TRUE(named) << json.out << json.err;
  EXPECT_NE(json.out.find("\"verdict\": \"missing\""), std::string::npos) << json.out;
  // Who waits in the stuck collective depends on how far the stopped rank
  // got after its last heartbeat: with a ring, some peers may have finished
  // it and wait in the next one. At least one waits; the stopped rank never.
  const std::string waiting = [&] {
    const size_t at = json.out.find("\"waiting_ranks\": [");
    return at == std::string::npos ? std::string("?")
                                   : json.out.substr(at + 18, json.out.find(']', at) - at - 18);
  }();
  EXPECT_FALSE(waiting.empty()) << json.out;
  EXPECT_EQ(waiting.find('2'), std::string::npos) << json.out;
  EXPECT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("rank 2 (worker " + victim + ", last heartbeat "), std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find(" is missing from collective #"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find(" waited "), std::string::npos) << text.out;
  std::cout << "$ shardtrain why " << job << "   # " << victim << " (rank 2) stopped\n"
            << text.out << "$ shardtrain why " << job << " -o json\n"
            << json.out;
}

}  // namespace
}  // namespace shardtrain::testing
