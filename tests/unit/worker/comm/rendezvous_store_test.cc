#include "worker/comm/rendezvous_store.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gloo/common/error.h"
#include "gtest/gtest.h"
#include "worker/comm/gloo_store_adapter.h"

namespace shardtrain::comm {
namespace {

// Temp dirs of this test binary, removed at exit.
class TempDirs : public ::testing::Environment {
 public:
  static std::string Make() {
    char tmpl[] = "/tmp/shardtrain_store_XXXXXX";
    char* dir = mkdtemp(tmpl);
    EXPECT_NE(dir, nullptr);
    dirs().push_back(dir ? dir : "");
    return dirs().back();
  }
  void TearDown() override {
    for (const std::string& d : dirs()) {
      if (!d.empty()) std::filesystem::remove_all(d);
    }
  }

 private:
  static std::vector<std::string>& dirs() {
    static std::vector<std::string> d;
    return d;
  }
};
const auto* const kTempDirs = ::testing::AddGlobalTestEnvironment(new TempDirs);

std::string MakeTempDir() { return TempDirs::Make(); }

std::vector<std::shared_ptr<RendezvousStore>> Stores() {
  return {std::make_shared<InMemoryStore>(), std::make_shared<FileStore>(MakeTempDir())};
}

TEST(RendezvousStoreTest, SetGetOverwrite) {
  for (auto& store : Stores()) {
    ASSERT_TRUE(store->Set("job1/gen0/a", std::string("x\0y", 3)).ok());
    auto v = store->Get("job1/gen0/a", absl::ZeroDuration());
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(*v, std::string("x\0y", 3));
    ASSERT_TRUE(store->Set("job1/gen0/a", "second").ok());
    EXPECT_EQ(*store->Get("job1/gen0/a", absl::ZeroDuration()), "second");
  }
}

TEST(RendezvousStoreTest, GetTimesOutNamingKey) {
  for (auto& store : Stores()) {
    const absl::Time t0 = absl::Now();
    auto v = store->Get("job1/missing%key", absl::Milliseconds(100));
    const absl::Duration took = absl::Now() - t0;
    ASSERT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_NE(v.status().message().find("job1/missing%key"), std::string::npos) << v.status();
    EXPECT_GE(took, absl::Milliseconds(95));
    EXPECT_LT(took, absl::Seconds(1));
  }
}

TEST(RendezvousStoreTest, GetBlocksUntilSet) {
  for (auto& store : Stores()) {
    std::thread setter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      ASSERT_TRUE(store->Set("late", "value").ok());
    });
    auto v = store->Get("late", absl::Seconds(5));
    setter.join();
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(*v, "value");
  }
}

TEST(RendezvousStoreTest, AddIsAtomicAcrossThreads) {
  for (auto& store : Stores()) {
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < 50; ++i) ASSERT_TRUE(store->Add("ctr", 1).ok());
      });
    }
    for (auto& t : threads) t.join();
    auto v = store->Add("ctr", 0);
    ASSERT_TRUE(v.ok());
    EXPECT_EQ(*v, 200);
    EXPECT_EQ(*store->Get("ctr", absl::ZeroDuration()), "200");
    ASSERT_TRUE(store->Set("text", "abc").ok());
    EXPECT_EQ(store->Add("text", 1).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(RendezvousStoreTest, FileStoreAddIsAtomicAcrossProcesses) {
  const std::string dir = MakeTempDir();
  std::vector<pid_t> pids;
  for (int p = 0; p < 3; ++p) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      FileStore store(dir);
      for (int i = 0; i < 40; ++i) {
        if (!store.Add("ctr", 1).ok()) _exit(1);
      }
      _exit(0);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  FileStore store(dir);
  EXPECT_EQ(*store.Add("ctr", 0), 120);
}

TEST(GlooStoreAdapterTest, PrefixesKeysAndBlocksInGet) {
  auto store = std::make_shared<InMemoryStore>();
  GlooStoreAdapter a(store.get(), "job7/gen2/world", absl::Seconds(5));
  GlooStoreAdapter b(store.get(), "job7/gen3/world", absl::Milliseconds(50));
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    a.set("rank_0", {'h', 'i'});
  });
  EXPECT_EQ(a.get("rank_0"), (std::vector<char>{'h', 'i'}));
  setter.join();
  EXPECT_EQ(*store->Get("job7/gen2/world/rank_0", absl::ZeroDuration()), "hi");
  // Another generation does not see it, and get() throws after its timeout.
  EXPECT_THROW(b.get("rank_0"), gloo::IoException);
  EXPECT_THROW(b.wait({"rank_0"}, std::chrono::milliseconds(20)), gloo::IoException);
}

}  // namespace
}  // namespace shardtrain::comm
