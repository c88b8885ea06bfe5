// The outbox that keeps a rank's reports in order through a coordinator
// outage (worker/report_outbox.h), with items that stand for reports: each
// delivers its name to a list unless the "coordinator" is down.
#include "worker/report_outbox.h"

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::worker {
namespace {

using ::testing::ElementsAre;
using Kind = ReportOutbox::Kind;

class ReportOutboxTest : public ::testing::Test {
 protected:
  // An item that, while the coordinator is up, records `name` as delivered
  // (and on which thread); while it is down, answers UNAVAILABLE.
  ReportOutbox::Item Report(Kind kind, int64_t step, const std::string& name) {
    return {kind, step, name, [this, name] {
              std::lock_guard<std::mutex> lock(mu_);
              ++attempts_;
              if (down_) return absl::UnavailableError("down");
              delivered_.push_back(name);
              threads_.push_back(std::this_thread::get_id());
              return absl::OkStatus();
            }};
  }
  ReportOutbox::Item Step(int64_t step) {
    return Report(Kind::kStep, step, "step " + std::to_string(step));
  }
  void SetDown(bool down) {
    std::lock_guard<std::mutex> lock(mu_);
    down_ = down;
  }
  std::vector<std::string> Delivered() {
    std::lock_guard<std::mutex> lock(mu_);
    return delivered_;
  }
  int Attempts() {
    std::lock_guard<std::mutex> lock(mu_);
    return attempts_;
  }

  std::atomic<bool> stop_{false};
  std::mutex mu_;
  bool down_ = false;
  int attempts_ = 0;
  std::vector<std::string> delivered_;
  std::vector<std::thread::id> threads_;
};

TEST_F(ReportOutboxTest, SendsAtOnceOnTheCallersThreadWhenNothingWaits) {
  ReportOutbox outbox([](const std::string&) {}, &stop_);
  bool queued = true;
  ASSERT_TRUE(outbox.Send(Step(1), &queued).ok());
  EXPECT_FALSE(queued);
  EXPECT_THAT(Delivered(), ElementsAre("step 1"));
  EXPECT_EQ(threads_[0], std::this_thread::get_id());
  // A refusal that is not UNAVAILABLE is the caller's answer, not held.
  absl::Status refused = outbox.Send(
      {Kind::kOther, 0, "done", [] { return absl::AbortedError("stale generation"); }}, &queued);
  EXPECT_TRUE(absl::IsAborted(refused)) << refused;
  EXPECT_FALSE(queued);
  EXPECT_FALSE(outbox.backlogged());
}

TEST_F(ReportOutboxTest, AnOutageHoldsEveryReportAndDeliversThemInOrderOnceItAnswers) {
  std::vector<std::string> log;
  std::mutex log_mu;
  ReportOutbox outbox(
      [&](const std::string& m) {
        std::lock_guard<std::mutex> lock(log_mu);
        log.push_back(m);
      },
      &stop_);
  ASSERT_TRUE(outbox.Send(Step(1)).ok());
  SetDown(true);
  for (int s = 2; s <= 5; ++s) {
    bool queued = false;
    ASSERT_TRUE(outbox.Send(Step(s), &queued).ok());
    EXPECT_TRUE(queued) << s;
  }
  ASSERT_TRUE(outbox.Send(Report(Kind::kShard, 4, "checkpoint step 4")).ok());
  ASSERT_TRUE(outbox.Send(Report(Kind::kOther, 0, "done")).ok());
  // Held, not lost: only the oldest is retried while the coordinator is down.
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  EXPECT_THAT(Delivered(), ElementsAre("step 1"));
  EXPECT_TRUE(outbox.backlogged());
  const int attempts_while_down = Attempts();
  EXPECT_GE(attempts_while_down, 2);  // step 2 at once, then again after the backoff
  SetDown(false);
  ASSERT_TRUE(outbox.Drain());
  EXPECT_THAT(Delivered(), ElementsAre("step 1", "step 2", "step 3", "step 4", "step 5",
                                       "checkpoint step 4", "done"));
  // After the outage, a report goes out at once again.
  bool queued = true;
  ASSERT_TRUE(outbox.Send(Step(6), &queued).ok());
  EXPECT_FALSE(queued);
  std::lock_guard<std::mutex> lock(log_mu);
  ASSERT_EQ(log.size(), 2u);
  EXPECT_THAT(log[0], ::testing::HasSubstr("coordinator unreachable (down): holding step 2"));
  EXPECT_THAT(log[1], ::testing::HasSubstr("6 held reports delivered"));
}

TEST_F(ReportOutboxTest, AFullQueueDropsTheOldestStepReportsAndNothingElse) {
  ReportOutbox outbox([](const std::string&) {}, &stop_, /*max_queued_steps=*/3);
  SetDown(true);
  ASSERT_TRUE(outbox.Send(Step(1)).ok());
  ASSERT_TRUE(outbox.Send(Report(Kind::kShard, 1, "checkpoint step 1")).ok());
  for (int s = 2; s <= 6; ++s) ASSERT_TRUE(outbox.Send(Step(s)).ok());
  EXPECT_EQ(outbox.dropped(), 3);
  SetDown(false);
  ASSERT_TRUE(outbox.Drain());
  // The three oldest step reports still queued went (step 1 may have been
  // in flight, being retried, when the queue filled); the checkpoint's
  // report stays, in its place.
  const std::vector<std::string> got = Delivered();
  ASSERT_EQ(got.size(), 4u);
  EXPECT_THAT(got, ::testing::Contains("checkpoint step 1"));
  EXPECT_EQ(got[2], "step 5");
  EXPECT_EQ(got[3], "step 6");
}

TEST_F(ReportOutboxTest, KeptReportsAreSentAgainFirstWhenTheCoordinatorsInstanceChanges) {
  ReportOutbox outbox([](const std::string&) {}, &stop_);
  outbox.SawInstance("a");
  outbox.Keep(Report(Kind::kShard, 10, "checkpoint step 10"));
  outbox.Keep(Step(12));
  outbox.Keep(Step(11));
  outbox.Keep(Step(9));
  outbox.Keep(Step(12));               // replaces the one of step 12
  outbox.ForgetKept(Kind::kStep, 10);  // step 9 is whole at the coordinator
  outbox.SawInstance("a");
  outbox.SawInstance("");
  EXPECT_FALSE(outbox.backlogged());  // the same coordinator: nothing to re-send
  outbox.SawInstance("b");            // a restart: kept reports go first
  ASSERT_TRUE(outbox.Send(Step(13)).ok());
  ASSERT_TRUE(outbox.Drain());
  EXPECT_THAT(Delivered(), ElementsAre("step 11", "step 12", "checkpoint step 10", "step 13"));
  outbox.SawInstance("c");  // re-sent once: nothing is kept now
  EXPECT_FALSE(outbox.backlogged());
}

TEST_F(ReportOutboxTest, DrainGivesUpWhenTheRunIsStopped) {
  ReportOutbox outbox([](const std::string&) {}, &stop_);
  SetDown(true);
  ASSERT_TRUE(outbox.Send(Step(1)).ok());
  std::thread stopper([this] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    stop_ = true;
  });
  EXPECT_FALSE(outbox.Drain());
  stopper.join();
  EXPECT_TRUE(Delivered().empty());
}

}  // namespace
}  // namespace shardtrain::worker
