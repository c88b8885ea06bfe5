// WorkerDaemon against the in-memory coordinator, with a runner that records
// what it was asked to run and runs until it is told to stop.
#include "worker/daemon.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/metrics.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/fake_coordinator.h"

namespace shardtrain::worker {
namespace {

using Calls = FakeCoordinator::Calls;
using Rpc = FakeCoordinator::Rpc;
using std::chrono::milliseconds;

// A JobRunner that records every run and runs until *ctx.stop, or, when
// finish_at_once is set, reports done at once and returns.
class FakeRunner {
 public:
  struct Run {
    v1::RunAssignment assignment;
    std::string worker_id;
    CoordinatorApi* client = nullptr;
    bool returned = false;
    bool stopped = false;  // *ctx.stop was set when it returned
  };

  JobRunner AsJobRunner() {
    return [this](const RunContext& ctx) {
      size_t i;
      {
        std::lock_guard<std::mutex> lock(mu_);
        runs_.push_back({*ctx.assignment, ctx.worker_id, ctx.client});
        i = runs_.size() - 1;
        changed_.notify_all();
      }
      // Heartbeats carry the recorder's records while the run lasts.
      ScopedRecorderAttach attach(ctx.collectives, recorder);
      // `hold` keeps a stopped run from returning, as a rank stuck in a
      // rendezvous or a collective until its timeout would.
      while ((!*ctx.stop || hold) && !finish_at_once) std::this_thread::sleep_for(milliseconds(1));
      if (finish_at_once) {
        v1::ReportDoneRequest done;
        done.set_job_id(ctx.assignment->job_id());
        done.set_generation(ctx.assignment->generation());
        done.set_rank(ctx.assignment->rank());
        done.set_worker_id(ctx.worker_id);
        EXPECT_TRUE(ctx.client->ReportDone(done).ok());
      }
      std::lock_guard<std::mutex> lock(mu_);
      runs_[i].returned = true;
      runs_[i].stopped = *ctx.stop;
      changed_.notify_all();
    };
  }

  std::vector<Run> runs() const {
    std::lock_guard<std::mutex> lock(mu_);
    return runs_;
  }

  bool WaitFor(const std::function<bool(const std::vector<Run>&)>& pred) const {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, std::chrono::seconds(3), [&] { return pred(runs_); });
  }

  std::atomic<bool> finish_at_once{false};
  std::atomic<bool> hold{false};
  const comm::FlightRecorder* recorder = nullptr;  // set before the daemon starts

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable changed_;
  std::vector<Run> runs_;  // GUARDED_BY(mu_)
};

v1::RunAssignment Assignment(int64_t generation = 1) {
  v1::RunAssignment a;
  a.set_job_id("job-1");
  a.set_generation(generation);
  a.set_rank(0);
  a.set_world(1);
  a.set_spec_yaml("name: t\n");
  return a;
}

v1::HeartbeatResponse With(const v1::Command& c) {
  v1::HeartbeatResponse r;
  r.set_lease_ms(3000);
  *r.add_commands() = c;
  return r;
}

// Heartbeats from index `from` on.
int CountFrom(const Calls& c, size_t from) { return int(c.heartbeats.size()) - int(from); }

// True when some heartbeat from index `from` on reported `job` (generation `gen`).
bool Reported(const Calls& c, size_t from, const std::string& job, int64_t gen = 1) {
  for (size_t i = from; i < c.heartbeats.size(); ++i) {
    if (c.heartbeats[i].job_id() == job && c.heartbeats[i].generation() == gen) return true;
  }
  return false;
}

// Index of the first heartbeat whose answer held a command of `kind`, or -1.
int AnsweredWith(const Calls& c, v1::Command::CommandCase kind) {
  for (size_t i = 0; i < c.heartbeat_answers.size(); ++i) {
    if (!c.heartbeat_answers[i].ok()) continue;
    for (const v1::Command& cmd : c.heartbeat_answers[i]->commands()) {
      if (cmd.command_case() == kind) return int(i);
    }
  }
  return -1;
}

class DaemonTest : public ::testing::Test {
 protected:
  void Start(int64_t heartbeat_ms = 10) {
    WorkerOptions o;
    o.coordinator = "fake:1";
    o.device.set_name("cpu");
    o.device.set_kind("cpu");
    o.threads = 3;
    o.collective_address = "10.0.0.7";
    o.metrics_address = "10.0.0.7:9100";
    o.heartbeat_ms = heartbeat_ms;
    daemon_ = std::make_unique<WorkerDaemon>(o, &coordinator_, runner_.AsJobRunner(), &registry_);
    thread_ = std::thread([this] { daemon_->Run(shutdown_); });
  }

  void Stop() {
    shutdown_ = true;
    if (thread_.joinable()) thread_.join();
  }

  void TearDown() override { Stop(); }

  // Waits for the first run to start and a heartbeat to report it.
  void WaitRunning() {
    ASSERT_TRUE(runner_.WaitFor([](const auto& runs) { return runs.size() == 1; }));
    ASSERT_TRUE(coordinator_.WaitFor([](const Calls& c) { return Reported(c, 0, "job-1"); }));
  }

  // Answers a heartbeat with `command`, waits for two more heartbeats, and
  // checks that job-1 still runs: reported, started once, not returned.
  void ExpectStillRunningAfter(const v1::Command& command) {
    coordinator_.QueueHeartbeat(With(command));
    const v1::Command::CommandCase kind = command.command_case();
    ASSERT_TRUE(coordinator_.WaitFor([kind](const Calls& c) {
      const int i = AnsweredWith(c, kind);
      return i >= 0 && c.heartbeats.size() > size_t(i) + 2;
    }));
    const Calls c = coordinator_.calls();
    EXPECT_EQ(c.heartbeats.back().job_id(), "job-1");
    const std::vector<FakeRunner::Run> runs = runner_.runs();
    ASSERT_EQ(runs.size(), 1u);
    EXPECT_FALSE(runs[0].returned);
  }

  double HeartbeatsCounted() {
    return registry_
        .AddCounter("shardtrain_worker_heartbeats_total", "Heartbeats the coordinator answered.")
        .WithLabels({})
        .Value();
  }

  FakeCoordinator coordinator_;
  FakeRunner runner_;
  MetricsRegistry registry_;
  std::atomic<bool> shutdown_{false};
  std::unique_ptr<WorkerDaemon> daemon_;
  std::thread thread_;
};

TEST_F(DaemonTest, RegistersOnceThenHeartbeatsEveryHeartbeatMs) {
  Start(/*heartbeat_ms=*/30);
  ASSERT_TRUE(coordinator_.WaitFor([](const Calls& c) { return c.heartbeats.size() >= 5; }));
  Stop();
  const Calls c = coordinator_.calls();
  ASSERT_EQ(c.registers.size(), 1u);
  const v1::RegisterWorkerRequest& r = c.registers[0];
  EXPECT_FALSE(r.host().empty());
  EXPECT_EQ(r.collective_address(), "10.0.0.7");
  EXPECT_EQ(r.metrics_address(), "10.0.0.7:9100");
  EXPECT_EQ(r.threads(), 3);
  ASSERT_EQ(r.devices_size(), 1);
  EXPECT_EQ(r.devices(0).name(), "cpu");
  EXPECT_EQ(r.previous_worker_id(), "");
  EXPECT_EQ(daemon_->worker_id(), "w-1");
  for (const v1::HeartbeatRequest& hb : c.heartbeats) {
    EXPECT_EQ(hb.worker_id(), "w-1");
    EXPECT_EQ(hb.worker_secret(), "secret-of-w-1");  // what registration answered
    EXPECT_EQ(hb.job_id(), "");                      // idle
  }
  for (size_t i = 1; i < c.heartbeat_times.size(); ++i) {
    EXPECT_GE(c.heartbeat_times[i] - c.heartbeat_times[i - 1], milliseconds(30)) << "gap " << i;
  }
  EXPECT_EQ(HeartbeatsCounted(), double(c.heartbeats.size()));
}

TEST_F(DaemonTest, HeartbeatsAtLeastThreeTimesPerLease) {
  coordinator_.set_lease_ms(90);  // lease / 3 = 30 ms, far below heartbeat_ms
  Start(/*heartbeat_ms=*/60'000);
  // At heartbeat_ms, the second heartbeat would come after a minute.
  ASSERT_TRUE(coordinator_.WaitFor([](const Calls& c) { return c.heartbeats.size() >= 4; }));
  const Calls c = coordinator_.calls();
  for (size_t i = 1; i < c.heartbeat_times.size(); ++i) {
    EXPECT_GE(c.heartbeat_times[i] - c.heartbeat_times[i - 1], milliseconds(30)) << "gap " << i;
  }
}

TEST_F(DaemonTest, RunCommandStartsTheRunnerOnceWithTheAssignment) {
  coordinator_.Assign(Assignment());  // answers `run` while the worker does not report it
  Start();
  WaitRunning();
  const size_t seen = coordinator_.calls().heartbeats.size();
  ASSERT_TRUE(coordinator_.WaitFor([&](const Calls& c) { return CountFrom(c, seen) >= 3; }));
  const std::vector<FakeRunner::Run> runs = runner_.runs();
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].assignment.SerializeAsString(), Assignment().SerializeAsString());
  EXPECT_EQ(runs[0].worker_id, "w-1");
  EXPECT_EQ(runs[0].client, &coordinator_);
  EXPECT_FALSE(runs[0].returned);
  const Calls c = coordinator_.calls();
  EXPECT_EQ(AnsweredWith(c, v1::Command::kRun), 0);  // the first heartbeat got it
  for (size_t i = 1; i < c.heartbeats.size(); ++i) {
    EXPECT_EQ(c.heartbeats[i].job_id(), "job-1") << "heartbeat " << i;
    EXPECT_EQ(c.heartbeats[i].generation(), 1) << "heartbeat " << i;
  }
}

TEST_F(DaemonTest, AbortStopsAndJoinsTheJobAndTheNextHeartbeatIsIdle) {
  coordinator_.Assign(Assignment());
  Start();
  WaitRunning();
  coordinator_.Assign(std::nullopt, "job is CANCELLED");  // the reported job gets an abort
  ASSERT_TRUE(coordinator_.WaitFor([](const Calls& c) {
    const int i = AnsweredWith(c, v1::Command::kAbort);
    return i >= 0 && c.heartbeats.size() > size_t(i) + 1;
  }));
  const Calls c = coordinator_.calls();
  const int i = AnsweredWith(c, v1::Command::kAbort);
  EXPECT_EQ(c.heartbeats[i].job_id(), "job-1");
  EXPECT_EQ(c.heartbeats[i + 1].job_id(), "");
  EXPECT_EQ(c.heartbeats[i + 1].generation(), 0);
  // The daemon does not wait for the run (see HeartbeatsGoOnWhileAStopped...),
  // but the run ends promptly once told to stop.
  ASSERT_TRUE(runner_.WaitFor([](const auto& runs) { return runs[0].returned; }));
  const std::vector<FakeRunner::Run> runs = runner_.runs();
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_TRUE(runs[0].stopped);
}

// Issue #15: a stopped run that does not return yet (stuck in a rendezvous
// or collective) must not hold up heartbeats, nor the next generation.
TEST_F(DaemonTest, HeartbeatsGoOnWhileAStoppedRunIsStillWindingDown) {
  coordinator_.Assign(Assignment(/*generation=*/1));
  Start();
  WaitRunning();
  runner_.hold = true;
  coordinator_.Assign(std::nullopt, "stale assignment");  // abort generation 1
  ASSERT_TRUE(coordinator_.WaitFor([](const Calls& c) {
    const int i = AnsweredWith(c, v1::Command::kAbort);
    return i >= 0 && c.heartbeats.size() > size_t(i) + 5;
  }));
  const Calls c = coordinator_.calls();
  const int i = AnsweredWith(c, v1::Command::kAbort);
  for (size_t k = i + 1; k < c.heartbeats.size(); ++k) {
    EXPECT_EQ(c.heartbeats[k].job_id(), "") << "heartbeat " << k;  // stopped: not reported
  }
  EXPECT_FALSE(runner_.runs()[0].returned) << "the held run cannot have returned";
  coordinator_.Assign(Assignment(/*generation=*/2));
  ASSERT_TRUE(runner_.WaitFor([](const auto& runs) { return runs.size() == 2; }));
  ASSERT_TRUE(coordinator_.WaitFor([](const Calls& c) { return Reported(c, 0, "job-1", 2); }));
  EXPECT_FALSE(runner_.runs()[0].returned);
  runner_.hold = false;
  ASSERT_TRUE(runner_.WaitFor([](const auto& runs) { return runs[0].returned; }));
  EXPECT_TRUE(runner_.runs()[0].stopped);
  EXPECT_FALSE(runner_.runs()[1].returned);
}

TEST_F(DaemonTest, AbortOfAnotherJobIsIgnored) {
  coordinator_.Assign(Assignment());
  Start();
  WaitRunning();
  v1::Command abort;
  abort.mutable_abort()->set_job_id("job-2");
  abort.mutable_abort()->set_generation(1);
  ExpectStillRunningAfter(abort);
}

TEST_F(DaemonTest, NewGenerationStopsTheOldRunThenStartsTheNew) {
  coordinator_.Assign(Assignment(/*generation=*/1));
  Start();
  WaitRunning();
  coordinator_.Assign(Assignment(/*generation=*/2));  // abort gen 1 + run gen 2
  ASSERT_TRUE(runner_.WaitFor([](const auto& runs) { return runs.size() == 2; }));
  ASSERT_TRUE(coordinator_.WaitFor([](const Calls& c) { return Reported(c, 0, "job-1", 2); }));
  ASSERT_TRUE(runner_.WaitFor([](const auto& runs) { return runs[0].returned; }));
  const std::vector<FakeRunner::Run> runs = runner_.runs();
  EXPECT_EQ(runs[0].assignment.generation(), 1);
  EXPECT_TRUE(runs[0].stopped);
  EXPECT_EQ(runs[1].assignment.generation(), 2);
  EXPECT_FALSE(runs[1].returned);
}

TEST_F(DaemonTest, JobThatEndsByItselfIsNoLongerReported) {
  runner_.finish_at_once = true;  // reports done, then returns
  coordinator_.Assign(Assignment());
  Start();
  ASSERT_TRUE(runner_.WaitFor([](const auto& runs) { return runs.size() == 1; }));
  // Once the runner has returned, every heartbeat says the worker is idle
  // (the fake neither re-runs nor aborts a rank that reported done).
  size_t idle = 0;
  ASSERT_TRUE(coordinator_.WaitFor([&](const Calls& c) {
    for (idle = 1; idle < c.heartbeats.size(); ++idle) {
      if (c.heartbeats[idle].job_id().empty()) return true;
    }
    return false;
  }));
  ASSERT_TRUE(coordinator_.WaitFor([&](const Calls& c) { return CountFrom(c, idle) >= 3; }));
  const Calls c = coordinator_.calls();
  for (size_t i = idle; i < c.heartbeats.size(); ++i) {
    EXPECT_EQ(c.heartbeats[i].job_id(), "") << "heartbeat " << i;
  }
  EXPECT_EQ(AnsweredWith(c, v1::Command::kAbort), -1);
  const std::vector<FakeRunner::Run> runs = runner_.runs();
  ASSERT_EQ(runs.size(), 1u);  // not started again
  EXPECT_TRUE(runs[0].returned);
  EXPECT_FALSE(runs[0].stopped);
}

TEST_F(DaemonTest, HeartbeatNotFoundRegistersAgainWithThePreviousId) {
  coordinator_.Assign(Assignment());
  Start();
  WaitRunning();
  coordinator_.FailNext(Rpc::kHeartbeat, absl::NotFoundError("worker w-1 is not registered"));
  ASSERT_TRUE(coordinator_.WaitFor([](const Calls& c) { return c.registers.size() == 2; }));
  const size_t after = coordinator_.calls().heartbeats.size();
  ASSERT_TRUE(coordinator_.WaitFor([&](const Calls& c) { return CountFrom(c, after) >= 2; }));
  const Calls c = coordinator_.calls();
  EXPECT_EQ(c.registers[1].previous_worker_id(), "w-1");
  EXPECT_EQ(c.registers[1].worker_secret(), "secret-of-w-1");  // keeps its id: proves it is w-1
  for (size_t i = after; i < c.heartbeats.size(); ++i) {
    EXPECT_EQ(c.heartbeats[i].worker_id(), "w-1");
    EXPECT_EQ(c.heartbeats[i].job_id(), "job-1");  // the job ran on through it
  }
  const std::vector<FakeRunner::Run> runs = runner_.runs();
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_FALSE(runs[0].returned);
}

TEST_F(DaemonTest, UnreachableCoordinatorAtStartIsRetriedUntilItAnswers) {
  coordinator_.SetOutage(true);
  Start();
  ASSERT_TRUE(coordinator_.WaitFor([](const Calls& c) { return c.registers.size() >= 3; }));
  EXPECT_TRUE(coordinator_.calls().heartbeats.empty());  // never heartbeats unregistered
  coordinator_.SetOutage(false);
  ASSERT_TRUE(coordinator_.WaitFor([](const Calls& c) { return c.heartbeats.size() >= 2; }));
  EXPECT_EQ(coordinator_.calls().heartbeats[0].worker_id(), "w-1");
  EXPECT_EQ(daemon_->worker_id(), "w-1");
}

TEST_F(DaemonTest, HeartbeatOutageKeepsTheJobAndTheId) {
  coordinator_.Assign(Assignment());
  Start();
  WaitRunning();
  coordinator_.SetOutage(true);
  const size_t before = coordinator_.calls().heartbeats.size();
  ASSERT_TRUE(coordinator_.WaitFor([&](const Calls& c) { return CountFrom(c, before) >= 3; }));
  coordinator_.SetOutage(false);
  const size_t after = coordinator_.calls().heartbeats.size();
  ASSERT_TRUE(coordinator_.WaitFor([&](const Calls& c) { return CountFrom(c, after) >= 2; }));
  const std::vector<FakeRunner::Run> runs = runner_.runs();
  Stop();  // so that every answered heartbeat is counted
  const Calls c = coordinator_.calls();
  EXPECT_EQ(c.registers.size(), 1u);  // UNAVAILABLE is not NOT_FOUND: no re-registration
  int failed = 0;
  for (size_t i = 0; i < c.heartbeats.size(); ++i) {
    failed += !c.heartbeat_answers[i].ok();
    EXPECT_EQ(c.heartbeats[i].worker_id(), "w-1");
    if (i > 0) {
      EXPECT_EQ(c.heartbeats[i].job_id(), "job-1") << "heartbeat " << i;
    }
  }
  EXPECT_GE(failed, 3);
  EXPECT_EQ(HeartbeatsCounted(), double(int(c.heartbeats.size()) - failed));
  ASSERT_EQ(runs.size(), 1u);  // and it ran on until shutdown
  EXPECT_FALSE(runs[0].returned);
}

// Today a drain command is only logged: the coordinator stops handing the
// worker work, and the daemon neither stops its job nor its heartbeats.
TEST_F(DaemonTest, DrainLeavesTheRunningJobAlone) {
  coordinator_.Assign(Assignment());
  Start();
  WaitRunning();
  v1::Command drain;
  drain.mutable_drain()->set_reason("worker is draining");
  ExpectStillRunningAfter(drain);
}

TEST_F(DaemonTest, ShutdownStopsAndJoinsTheRunningJob) {
  coordinator_.Assign(Assignment());
  Start();
  WaitRunning();
  Stop();  // Run returns only after the job's thread is joined
  const std::vector<FakeRunner::Run> runs = runner_.runs();
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_TRUE(runs[0].returned);
  EXPECT_TRUE(runs[0].stopped);
}

TEST_F(DaemonTest, HeartbeatsCarryTheRunningRanksNewestCollectives) {
  comm::FlightRecorder recorder(64);
  for (uint64_t seq = 1; seq <= 20; ++seq) {
    comm::FlightRecord r;
    r.seq = seq;
    r.op = comm::OpType::kAllReduce;
    r.group = "world";
    r.bytes = 4000;
    recorder.Queued(r);
    recorder.Running(seq);
    if (seq < 20) recorder.Done(seq);  // #20 is still running, as in a hang
  }
  runner_.recorder = &recorder;
  coordinator_.Assign(Assignment());
  Start();
  WaitRunning();
  ASSERT_TRUE(coordinator_.WaitFor([](const Calls& c) {
    return !c.heartbeats.empty() && c.heartbeats.back().recent_collectives_size() > 0;
  }));
  const v1::HeartbeatRequest hb = coordinator_.calls().heartbeats.back();
  ASSERT_EQ(hb.recent_collectives_size(), 16);  // the newest 16, oldest first
  EXPECT_EQ(hb.recent_collectives(0).seq(), 5);
  EXPECT_EQ(hb.recent_collectives(0).state(), "done");
  EXPECT_GT(hb.recent_collectives(0).end_ms(), 0);
  EXPECT_EQ(hb.recent_collectives(15).seq(), 20);
  EXPECT_EQ(hb.recent_collectives(15).state(), "running");
  EXPECT_EQ(hb.recent_collectives(15).end_ms(), 0);
  EXPECT_EQ(hb.recent_collectives(15).group(), "world");
  EXPECT_EQ(hb.recent_collectives(15).bytes(), 4000);
  Stop();  // the run detaches before `recorder` goes
}

}  // namespace
}  // namespace shardtrain::worker
