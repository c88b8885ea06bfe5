#include "coordinator/rendezvous_kv.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace shardtrain::coordinator {
namespace {

TEST(RendezvousKvTest, SetGetIsNamespacedByJobAndGeneration) {
  RendezvousKv kv;
  ASSERT_TRUE(kv.Set("j1", 1, "rank_0", "addr-a").ok());
  EXPECT_EQ(*kv.Get("j1", 1, "rank_0", 0), "addr-a");
  EXPECT_TRUE(absl::IsNotFound(kv.Get("j1", 2, "rank_0", 0).status()));
  EXPECT_TRUE(absl::IsNotFound(kv.Get("j2", 1, "rank_0", 0).status()));
}

TEST(RendezvousKvTest, BlockingGetWakesWhenKeyIsSet) {
  RendezvousKv kv;
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(kv.Set("j", 0, "k", "v").ok());
  });
  auto start = std::chrono::steady_clock::now();
  auto v = kv.Get("j", 0, "k", 5000);
  setter.join();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "v");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

TEST(RendezvousKvTest, TimeoutIsDeadlineExceededNamingTheKey) {
  RendezvousKv kv;
  auto start = std::chrono::steady_clock::now();
  auto v = kv.Get("j7", 3, "rank_5", 100);
  auto took = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(absl::IsDeadlineExceeded(v.status())) << v.status();
  EXPECT_NE(v.status().message().find("rank_5"), absl::string_view::npos) << v.status();
  EXPECT_NE(v.status().message().find("j7"), absl::string_view::npos) << v.status();
  EXPECT_GE(took, std::chrono::milliseconds(95));
}

// Found by coordinator_fuzz: an Add past INT64_MAX (or below INT64_MIN) was
// signed overflow; it is refused and the stored value stays as it was.
TEST(RendezvousKvTest, AddThatWouldOverflowIsRefusedAndChangesNothing) {
  RendezvousKv kv;
  ASSERT_EQ(*kv.Add("j", 1, "n", 1), 1);
  absl::StatusOr<int64_t> over = kv.Add("j", 1, "n", INT64_MAX);
  EXPECT_TRUE(absl::IsOutOfRange(over.status())) << over.status();
  EXPECT_EQ(*kv.Add("j", 1, "n", 0), 1);
  ASSERT_EQ(*kv.Add("j", 1, "m", -1), -1);
  EXPECT_TRUE(absl::IsOutOfRange(kv.Add("j", 1, "m", INT64_MIN).status()));
  EXPECT_EQ(*kv.Add("j", 1, "m", INT64_MAX), INT64_MAX - 1);
}

TEST(RendezvousKvTest, AddIsAtomicAcrossThreads) {
  RendezvousKv kv;
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&] {
      for (int i = 0; i < 250; ++i) ASSERT_TRUE(kv.Add("j", 0, "n", 1).ok());
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(*kv.Add("j", 0, "n", 0), 1000);
  EXPECT_EQ(*kv.Get("j", 0, "n", 0), "1000");
  ASSERT_TRUE(kv.Set("j", 0, "s", "abc").ok());
  EXPECT_TRUE(absl::IsInvalidArgument(kv.Add("j", 0, "s", 1).status()));
}

TEST(RendezvousKvTest, DropJobForgetsEveryGeneration) {
  RendezvousKv kv;
  ASSERT_TRUE(kv.Set("j1", 0, "a", "1").ok());
  ASSERT_TRUE(kv.Set("j1", 1, "a", "1").ok());
  ASSERT_TRUE(kv.Set("j2", 0, "a", "1").ok());
  kv.DropJob("j1");
  EXPECT_EQ(kv.Size(), 1u);
  EXPECT_TRUE(kv.Get("j2", 0, "a", 0).ok());
}

TEST(RendezvousKvTest, ShutdownWakesWaiters) {
  RendezvousKv kv;
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    kv.Shutdown();
  });
  auto v = kv.Get("j", 0, "never", 60'000);
  t.join();
  EXPECT_TRUE(absl::IsUnavailable(v.status())) << v.status();
}

TEST(RendezvousKvTest, AddRefusesOverflowAndKeepsTheValue) {
  RendezvousKv kv;
  ASSERT_EQ(*kv.Add("j", 0, "n", INT64_MAX - 1), INT64_MAX - 1);
  auto over = kv.Add("j", 0, "n", 2);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kOutOfRange) << over.status();
  EXPECT_EQ(*kv.Get("j", 0, "n", 0), std::to_string(INT64_MAX - 1));
  ASSERT_EQ(*kv.Add("j", 0, "m", INT64_MIN + 1), INT64_MIN + 1);
  EXPECT_EQ(kv.Add("j", 0, "m", -2).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(RendezvousKvTest, ValueSizeKeysAndBytesPerJobAreBoundedUntilTheJobIsDropped) {
  KvLimits limits;
  limits.max_value_bytes = 10;
  limits.max_keys_per_job = 3;
  limits.max_bytes_per_job = 24;
  RendezvousKv kv(limits);
  EXPECT_TRUE(absl::IsInvalidArgument(kv.Set("j", 0, "k", std::string(11, 'v'))));
  ASSERT_TRUE(kv.Set("j", 0, "a", "1234567").ok());                          // 8 bytes with the key
  ASSERT_TRUE(kv.Set("j", 1, "b", "1234567").ok());                          // 16
  EXPECT_TRUE(absl::IsResourceExhausted(kv.Set("j", 1, "c", "123456789")));  // 26 > 24
  ASSERT_TRUE(kv.Set("j", 1, "b", "1").ok());                        // overwriting shrinks: 10
  ASSERT_TRUE(kv.Set("j", 1, "c", "1").ok());                        // 12, 3 keys
  EXPECT_TRUE(absl::IsResourceExhausted(kv.Set("j", 1, "d", "1")));  // a 4th key
  ASSERT_TRUE(kv.Set("other", 0, "d", "1").ok());                    // per job
  kv.DropJob("j");
  ASSERT_TRUE(kv.Set("j", 2, "d", "1234567").ok());
  EXPECT_EQ(kv.Size(), 2u);
}

}  // namespace
}  // namespace shardtrain::coordinator
