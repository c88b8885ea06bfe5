// Ordering ops with device work on the Gloo backend: OpArgs::after (the op
// reads its input only once an engine::Event completed) and
// Work::BlockStream (a stream waits for the op; a host wait here). Real Gloo
// over 127.0.0.1, world sizes 1..4; the events are fakes the test completes
// by hand.
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/comm/test_util.h"
#include "worker/comm/communicator.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/engine/device.h"

namespace shardtrain::comm {
namespace {

using testing::RunRanks;
using testing::TestValue;

// An event the test completes by hand: Query() is false and Synchronize()
// blocks until Release(status); afterwards Query() is true and Synchronize()
// returns `status`. Thread-safe.
class ManualEvent final : public engine::Event {
 public:
  absl::Status Record(engine::Stream&) override { return absl::OkStatus(); }
  absl::Status Synchronize() const override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&released_));
    return status_;
  }
  bool Query() const override {
    absl::MutexLock lock(&mu_);
    return released_;
  }
  void* native() const override { return nullptr; }

  void Release(absl::Status status = absl::OkStatus()) {
    absl::MutexLock lock(&mu_);
    status_ = std::move(status);
    released_ = true;
  }

 private:
  mutable absl::Mutex mu_;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// A host stream (as engine::cpu::CpuDevice's): work runs when issued.
class HostStream final : public engine::Stream {
 public:
  absl::Status Synchronize() override { return absl::OkStatus(); }
  absl::Status WaitEvent(const engine::Event& event) override { return event.Synchronize(); }
  void* native() const override { return nullptr; }
};

// The value rank r writes at element i before submitting (X) and after (Y).
float X(int r, size_t i) { return TestValue(r, i); }
float Y(int r, size_t i) { return TestValue(r, i) + 100.0f; }

// Long enough that an op which ignored its event would have finished.
constexpr absl::Duration kHold = absl::Milliseconds(200);

class GlooOrderingTest : public ::testing::TestWithParam<int> {};

std::string WorldName(const ::testing::TestParamInfo<int>& info) {
  return absl::StrCat("world", info.param);
}

// Each rank writes X, submits with `after` = an unreleased event, writes Y,
// then releases: the result must be built from Y only, and the op must not
// finish before its own event is released.
TEST_P(GlooOrderingTest, OpReadsItsInputOnlyAfterTheEvent) {
  const int world = GetParam();
  RunRanks(world, [&](Communicator& comm) {
    const int rank = comm.rank();
    const size_t n = 1000;
    std::vector<float> data(n), in(n), out(n * world, -1.0f);
    for (size_t i = 0; i < n; ++i) data[i] = in[i] = X(rank, i);
    ManualEvent reduce_ready, gather_ready;
    auto reduce =
        comm.AllReduceAsync(data.data(), n, DataType::kFloat32, ReduceOp::kSum, &reduce_ready);
    auto gather = comm.AllGatherAsync(in.data(), out.data(), n, DataType::kFloat32, &gather_ready);
    absl::SleepFor(kHold);
    EXPECT_FALSE(reduce->Done()) << "rank " << rank << ": the op ran before its event";
    EXPECT_FALSE(gather->Done()) << "rank " << rank;
    for (size_t i = 0; i < n; ++i) data[i] = in[i] = Y(rank, i);
    reduce_ready.Release();
    ASSERT_TRUE(reduce->Wait(absl::Seconds(30)).ok());
    // The all-gather still waits for its own event.
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_FALSE(gather->Done()) << "rank " << rank;
    gather_ready.Release();
    ASSERT_TRUE(gather->Wait(absl::Seconds(30)).ok());

    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
      float want = 0;
      for (int r = 0; r < world; ++r) want += Y(r, i);
      if (data[i] != want && bad++ == 0) {
        ADD_FAILURE() << "rank " << rank << " all-reduce element " << i << ": got " << data[i]
                      << ", want " << want;
      }
    }
    for (size_t j = 0; j < n * world; ++j) {
      const float want = Y(static_cast<int>(j / n), j % n);
      if (out[j] != want && bad++ == 0) {
        ADD_FAILURE() << "rank " << rank << " all-gather element " << j << ": got " << out[j]
                      << ", want " << want;
      }
    }
    EXPECT_EQ(bad, 0u) << "wrong elements on rank " << rank;
  });
}

// Rank 0's event fails: its op fails (ABORTED, naming the event's error),
// the op queued behind it fails with ABORTED, and later submissions fail at
// once with FAILED_PRECONDITION. The other ranks' ops fail too (rank 0
// closes its connections) and they are poisoned as well.
TEST_P(GlooOrderingTest, FailingEventFailsTheOpAndPoisons) {
  const int world = GetParam();
  GlooOptions options;
  options.timeout = absl::Seconds(10);
  options.dump_on_failure = false;
  RunRanks(
      world,
      [&](Communicator& comm) {
        const bool failing = comm.rank() == 0;
        std::vector<float> a(100, 1.0f), b(100, 1.0f);
        ASSERT_TRUE(comm.Barrier().ok());  // seq 1: every rank is connected and here
        ManualEvent ready;
        auto first = comm.AllReduceAsync(a.data(), a.size(), DataType::kFloat32, ReduceOp::kSum,
                                         failing ? &ready : nullptr);
        auto second = comm.AllReduceAsync(b.data(), b.size(), DataType::kFloat32, ReduceOp::kSum);
        if (failing) {
          absl::SleepFor(absl::Milliseconds(100));
          ready.Release(absl::InternalError("injected device fault"));
        }
        const absl::Status s1 = first->Wait(absl::Seconds(20));
        EXPECT_FALSE(s1.ok()) << "rank " << comm.rank();
        const absl::Status s2 = second->Wait(absl::Seconds(20));
        if (failing) {
          EXPECT_EQ(s1.code(), absl::StatusCode::kAborted) << s1;
          EXPECT_NE(s1.message().find("AllReduce seq=2"), std::string::npos) << s1;
          EXPECT_NE(s1.message().find("injected device fault"), std::string::npos) << s1;
          // Submitted before the failure: queued, then aborted.
          EXPECT_EQ(s2.code(), absl::StatusCode::kAborted) << s2;
        } else {
          // Peers may see the failure before or after submitting `second`.
          EXPECT_TRUE(s2.code() == absl::StatusCode::kAborted ||
                      s2.code() == absl::StatusCode::kFailedPrecondition)
              << s2;
        }
        EXPECT_FALSE(comm.health().ok()) << "rank " << comm.rank();
        const absl::Status later = comm.Barrier();
        EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition) << later;
      },
      options);
}

// Work::BlockStream on a host stream is a host wait: it returns only once the
// op finished (held back here by its event), with the op's result in place.
TEST_P(GlooOrderingTest, BlockStreamOnAHostStreamReturnsWhenTheOpIsDone) {
  const int world = GetParam();
  RunRanks(world, [&](Communicator& comm) {
    const size_t n = 1000;
    std::vector<float> data(n);
    for (size_t i = 0; i < n; ++i) data[i] = X(comm.rank(), i);
    ManualEvent ready;
    HostStream stream;
    auto work = comm.AllReduceAsync(data.data(), n, DataType::kFloat32, ReduceOp::kSum, &ready);
    std::thread releaser([&] {
      absl::SleepFor(kHold);
      ready.Release();
    });
    const absl::Status s = work->BlockStream(stream);
    const bool done = work->Done();
    releaser.join();
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(done) << "BlockStream returned before the op finished";
    for (size_t i = 0; i < n; ++i) {
      float want = 0;
      for (int r = 0; r < world; ++r) want += X(r, i);
      ASSERT_EQ(data[i], want) << "rank " << comm.rank() << " element " << i;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Gloo, GlooOrderingTest, ::testing::Values(1, 2, 3, 4), WorldName);

// An event that never completes fails the op at its timeout (the wait
// counts towards it) instead of hanging the op thread.
TEST(GlooOrderingTimeoutTest, EventThatNeverCompletesTimesOut) {
  for (int world : {1, 2}) {
    GlooOptions options;
    options.timeout = absl::Milliseconds(500);
    options.dump_on_failure = false;
    options.prefix = absl::StrCat("never_completes/world", world);
    RunRanks(
        world,
        [&](Communicator& comm) {
          ManualEvent never;
          float x = 1.0f;
          const absl::Time t0 = absl::Now();
          auto work = comm.AllReduceAsync(&x, 1, DataType::kFloat32, ReduceOp::kSum,
                                          comm.rank() == 0 ? &never : nullptr);
          const absl::Status s = work->Wait(absl::Seconds(10));
          const absl::Duration took = absl::Now() - t0;
          EXPECT_FALSE(s.ok());
          EXPECT_LT(took, absl::Milliseconds(500) + absl::Seconds(2)) << s;
          if (comm.rank() == 0) {
            // Its own timeout, or (world 2) rank 1's: rank 1 times out in the
            // all-reduce at the same 500 ms, and its failure may reach rank 0
            // first; either way while rank 0 still waited for its event.
            EXPECT_GE(took, absl::Milliseconds(world == 1 ? 500 : 400)) << s;
            const bool peer_first = world > 1 && s.code() == absl::StatusCode::kAborted &&
                                    s.message().find("another rank") != std::string::npos;
            EXPECT_TRUE(s.code() == absl::StatusCode::kDeadlineExceeded || peer_first) << s;
            EXPECT_NE(s.message().find("OpArgs::after"), std::string::npos) << s;
          }
          EXPECT_FALSE(comm.health().ok());
        },
        options);
  }
}

TEST(WorkBlockStreamTest, CompletedWorkReportsItsStatus) {
  HostStream stream;
  EXPECT_TRUE(CompletedWork(1, absl::OkStatus())->BlockStream(stream).ok());
  const absl::Status s = CompletedWork(2, absl::InternalError("boom"))->BlockStream(stream);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_EQ(s.message(), "boom");
}

TEST(WorkBlockStreamTest, PendingWorkWaitsForCompletion) {
  HostStream stream;
  PendingWork work(3);
  std::thread completer([&] {
    absl::SleepFor(absl::Milliseconds(100));
    work.Complete(absl::AbortedError("peer died"));
  });
  const absl::Status s = work.BlockStream(stream);
  const bool done = work.Done();
  completer.join();
  EXPECT_TRUE(done);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
}

}  // namespace
}  // namespace shardtrain::comm
