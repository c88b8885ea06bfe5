// The coordinator's state in etcd (issue 50, item 1): the store against a
// real etcd cluster on loopback (Debian's etcd-server), and coordinators on
// it: a job one acknowledged is there for another coordinator started on
// another machine's state directory; a member down of three changes nothing;
// without a majority a write is UNAVAILABLE, said plainly.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "coordinator/etcd_state_store.h"
#include "tests/integration/etcd_harness.h"
#include "tests/integration/harness.h"
#include "tests/integration/training_util.h"

namespace shardtrain::testing {
namespace {

using coordinator::EtcdOptions;
using coordinator::OpenEtcdStateStore;
using coordinator::StoredState;
using std::chrono::seconds;

EtcdOptions Options(const std::string& url) {
  absl::StatusOr<EtcdOptions> o = coordinator::ParseEtcdUrl(url);
  EXPECT_TRUE(o.ok()) << o.status();
  return o.ok() ? *o : EtcdOptions();
}

class EtcdStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveEtcd()) GTEST_SKIP() << "no /usr/bin/etcd (scripts/setup installs etcd-server)";
  }
  TempDir dir_;
};

TEST(EtcdUrlTest, ParsesMembersAndPrefixAndRefusesWhatIsNotOne) {
  absl::StatusOr<EtcdOptions> o = coordinator::ParseEtcdUrl("etcd://a:2379,10.0.0.2:2380/team/x");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->endpoints, (std::vector<std::string>{"a:2379", "10.0.0.2:2380"}));
  EXPECT_EQ(o->prefix, "/team/x/");
  EXPECT_EQ(coordinator::ParseEtcdUrl("etcd://h:1")->prefix, "/shardtrain/");
  for (const char* bad : {"http://h:1", "etcd://", "etcd://h", "etcd://h:0", "etcd://h:1,:2"}) {
    absl::StatusOr<EtcdOptions> r = coordinator::ParseEtcdUrl(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << bad << ": " << r.status();
  }
}

TEST_F(EtcdStateTest, EverythingWrittenReadsBackAndABigRecordIsSplitAndJoined) {
  EtcdCluster etcd(dir_.path(), 1);
  ASSERT_TRUE(etcd.ok()) << etcd.Log(0);
  const EtcdOptions o = Options(etcd.url());
  {
    auto store = OpenEtcdStateStore(o);
    ASSERT_TRUE(store.ok()) << store.status();
    v1::WorkerInfo w;
    w.set_worker_id("w-0001");
    ASSERT_TRUE((*store)->PutWorker(w).ok());
    for (int i : {2, 1, 10}) {  // submission order is submitted_ms's, not the ids'
      v1::Job j;
      j.set_job_id("j-00000" + std::to_string(i));
      j.set_submitted_ms(100 * i);
      // Job 10 carries a 3.5 MiB spec: beyond etcd's 1.5 MiB request limit.
      if (i == 10) j.set_spec_yaml(std::string(3'500'000, 'y'));
      v1::JobEvent e;
      e.set_job_id(j.job_id());
      e.set_seq(i);
      e.set_message("event " + std::to_string(i));
      ASSERT_TRUE((*store)->PutJobWithEvent(j, e).ok()) << j.job_id();
    }
    for (int step : {10, 2, 1}) {
      v1::StepReport s;
      s.set_job_id("j-000001");
      s.set_step(step);
      s.set_loss(step);
      ASSERT_TRUE((*store)->PutStep(s).ok());
    }
    v1::Plan p;
    p.set_job_id("j-000001");
    p.set_dp(2);
    ASSERT_TRUE((*store)->PutPlan(p).ok());
  }
  auto store = OpenEtcdStateStore(o);  // another process's view: only what etcd holds
  ASSERT_TRUE(store.ok()) << store.status();
  absl::StatusOr<StoredState> s = (*store)->Load();
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->workers.size(), 1u);
  ASSERT_EQ(s->jobs.size(), 3u);
  EXPECT_EQ(s->jobs[0].job_id(), "j-000001");
  EXPECT_EQ(s->jobs[1].job_id(), "j-000002");
  EXPECT_EQ(s->jobs[2].job_id(), "j-0000010");
  EXPECT_EQ(s->jobs[2].spec_yaml().size(), 3'500'000u);
  ASSERT_EQ(s->events.size(), 3u);
  ASSERT_EQ(s->steps.size(), 3u);
  EXPECT_EQ(s->steps[0].step(), 1);  // numeric order (keys are zero-padded)
  EXPECT_EQ(s->steps[2].step(), 10);
  ASSERT_EQ(s->plans.size(), 1u);
  EXPECT_EQ(s->plans[0].dp(), 2);

  // One fencing key for every coordinator on this etcd.
  auto k1 = coordinator::EtcdFencingKey(o);
  auto k2 = coordinator::EtcdFencingKey(o);
  ASSERT_TRUE(k1.ok() && k2.ok());
  EXPECT_EQ(k1->LeaseToken("j-1", 1), k2->LeaseToken("j-1", 1));
}

TEST_F(EtcdStateTest, UnreachableEtcdIsUnavailableNamingTheMembers) {
  EtcdOptions o = Options("etcd://127.0.0.1:1,127.0.0.1:2");
  o.timeout_ms = 300;
  const auto start = std::chrono::steady_clock::now();
  auto store = OpenEtcdStateStore(o);
  EXPECT_TRUE(absl::IsUnavailable(store.status())) << store.status();
  EXPECT_NE(store.status().message().find("127.0.0.1:1,127.0.0.1:2"), std::string::npos)
      << store.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(5));
}

// A coordinator on a 3-member etcd acknowledges jobs and trains one; killed,
// it is replaced by one started with another (empty) state directory, which
// leads once the first one's lease ran out and has every job, the history
// and the checkpoints; with one member down the
// cluster goes on, with two down a submit is refused UNAVAILABLE, and once
// they are back it is accepted again.
TEST_F(EtcdStateTest, ASecondCoordinatorOnTheSameEtcdHasEverythingTheFirstAcknowledged) {
  EtcdCluster etcd(dir_.path(), 3);
  ASSERT_TRUE(etcd.ok()) << etcd.Log(0) << etcd.Log(1) << etcd.Log(2);
  // A leader lease (10 s) longer than a write's wait for etcd (5 s): the
  // refused submit below is answered by the leader, not by a leader that
  // meanwhile stepped down because it could not renew its lease.
  const std::vector<std::string> state = {"--state", etcd.url(), "--leader-ttl-s", "10"};
  const std::string a_dir = dir_.path() + "/a", b_dir = dir_.path() + "/b";
  for (const std::string& d : {a_dir, b_dir}) std::filesystem::create_directories(d);
  Coordinator a = StartCoordinator(a_dir, 10'000, "127.0.0.1:0", "", state);
  ASSERT_GT(a.port, 0) << a.process.Log();
  EXPECT_NE(a.process.Log().find("state " + etcd.url()), std::string::npos) << a.process.Log();
  std::vector<Process> workers;
  for (int i = 0; i < 2; ++i) workers.push_back(StartWorker(dir_.path(), a.address(), i));
  const std::vector<std::string> submit = {"submit", kDdpSpec,
                                           "--set",  "data.train=" + kData,
                                           "--set",  "parallel.dp=2",
                                           "--set",  "steps=20",
                                           "--set",  "eval.every=0",
                                           "--set",  "checkpoint.every=5",
                                           "--set",  "checkpoint.dir=" + dir_.path() + "/ckpt"};
  CommandResult sub = Cli(submit, a.address());
  ASSERT_EQ(sub.exit_code, 0) << sub.err;
  const std::string job = sub.out.substr(0, sub.out.find('\n'));
  ASSERT_TRUE(WaitFor(
      [&] {
        return Field(Cli({"status", job, "-o", "json"}, a.address()).out, "state") == "SUCCEEDED";
      },
      seconds(120)))
      << Cli({"status", job}, a.address()).out;
  const std::string history_a = Cli({"history", job, "-o", "json"}, a.address()).out;
  ASSERT_EQ(Losses(history_a).size(), 20u) << history_a;
  a.process.Signal(SIGKILL);
  ASSERT_TRUE(a.process.Wait(seconds(5)));

  etcd.Kill(2);  // one of three: nothing changes
  Coordinator b = StartCoordinator(b_dir, 10'000, "127.0.0.1:0", "", state);
  ASSERT_GT(b.port, 0) << b.process.Log();
  // b leads once a's lease has run out.
  ASSERT_TRUE(
      WaitFor([&] { return b.process.Log().find("leading") != std::string::npos; }, seconds(30)))
      << b.process.Log();
  EXPECT_EQ(Field(Cli({"status", job, "-o", "json"}, b.address()).out, "state"), "SUCCEEDED");
  EXPECT_EQ(Losses(Cli({"history", job, "-o", "json"}, b.address()).out), Losses(history_a));
  const std::string ckpts = Cli({"checkpoints", job}, b.address()).out;
  EXPECT_NE(ckpts.find("step-15"), std::string::npos) << ckpts;
  CommandResult second = Cli({"submit", kDdpSpec, "--set", "data.train=" + kData}, b.address());
  EXPECT_EQ(second.exit_code, 0) << second.err;

  etcd.Kill(1);  // two of three: no majority, no write
  CommandResult refused = Cli({"submit", kDdpSpec, "--set", "data.train=" + kData}, b.address());
  EXPECT_EQ(refused.exit_code, 4) << refused.out;  // as for an unreachable coordinator: retry
  std::cout << "with 2 of 3 etcd members down, submit says: " << refused.err;
  EXPECT_NE(refused.err.find("answered, but cannot store its state, so nothing was changed"),
            std::string::npos)
      << refused.err;
  EXPECT_NE(refused.err.find("are a majority of the members up?"), std::string::npos)
      << refused.err;
  EXPECT_EQ(::kill(b.process.pid(), 0), 0) << "the coordinator must not crash";

  ASSERT_TRUE(etcd.Start(1)) << etcd.Log(1);
  ASSERT_TRUE(etcd.Start(2)) << etcd.Log(2);
  CommandResult again;
  ASSERT_TRUE(WaitFor(
      [&] {
        again = Cli({"submit", kDdpSpec, "--set", "data.train=" + kData}, b.address());
        return again.exit_code == 0;
      },
      seconds(30)))
      << again.err;
  // The refused submit left nothing behind: the trained job, the one before
  // the outage and the one after.
  const std::string jobs = Cli({"list", "-o", "json"}, b.address()).out;
  EXPECT_EQ(std::count(jobs.begin(), jobs.end(), '{') - 1, 3) << jobs;
}

}  // namespace
}  // namespace shardtrain::testing
