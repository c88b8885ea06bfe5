// KvRendezvousStore over the in-memory coordinator: keys live in the
// namespace of one (job, generation), and the store keeps the
// comm::RendezvousStore promises (DEADLINE_EXCEEDED on a wait that runs out).
#include "worker/kv_rendezvous_store.h"

#include <thread>

#include "gtest/gtest.h"
#include "tests/unit/worker/fake_coordinator.h"

namespace shardtrain::worker {
namespace {

TEST(KvRendezvousStoreTest, SetGetAddWithinOneGeneration) {
  FakeCoordinator coordinator;
  KvRendezvousStore store(&coordinator, "job-1", 3);
  ASSERT_TRUE(store.Set("rank0", std::string("a\0b", 3)).ok());
  absl::StatusOr<std::string> v = store.Get("rank0", absl::ZeroDuration());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, std::string("a\0b", 3));
  EXPECT_EQ(*store.Add("count", 2), 2);
  EXPECT_EQ(*store.Add("count", 5), 7);
  EXPECT_EQ(*store.Get("count", absl::ZeroDuration()), "7");
}

TEST(KvRendezvousStoreTest, GenerationsAndJobsDoNotShareKeys) {
  FakeCoordinator coordinator;
  KvRendezvousStore gen3(&coordinator, "job-1", 3);
  KvRendezvousStore gen4(&coordinator, "job-1", 4);
  KvRendezvousStore other(&coordinator, "job-2", 3);
  ASSERT_TRUE(gen3.Set("k", "three").ok());
  EXPECT_EQ(gen4.Get("k", absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(other.Get("k", absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(*gen3.Get("k", absl::ZeroDuration()), "three");
}

TEST(KvRendezvousStoreTest, GetWaitsForAPeerThenTimesOut) {
  FakeCoordinator coordinator;
  KvRendezvousStore a(&coordinator, "job-1", 1), b(&coordinator, "job-1", 1);
  std::thread peer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_TRUE(b.Set("addr", "127.0.0.1:4000").ok());
  });
  absl::StatusOr<std::string> v = a.Get("addr", absl::Seconds(3));
  peer.join();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "127.0.0.1:4000");
  absl::StatusOr<std::string> late = a.Get("never", absl::Milliseconds(30));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded) << late.status();
}

TEST(KvRendezvousStoreTest, PassesCoordinatorErrorsOn) {
  FakeCoordinator coordinator;
  KvRendezvousStore store(&coordinator, "job-1", 1);
  coordinator.SetOutage(true);
  EXPECT_EQ(store.Set("k", "v").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(store.Add("k", 1).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(store.Get("k", absl::Seconds(1)).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace shardtrain::worker
