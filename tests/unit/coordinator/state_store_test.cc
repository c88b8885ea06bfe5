#include "coordinator/state_store.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>

namespace shardtrain::coordinator {
namespace {

class SqliteStateStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/st-store-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(SqliteStateStoreTest, EverythingWrittenReadsBackAfterReopen) {
  {
    auto store = OpenSqliteStateStore(dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    v1::WorkerInfo w;
    w.set_worker_id("w-0001");
    w.set_host("h");
    ASSERT_TRUE((*store)->PutWorker(w).ok());
    for (int i = 1; i <= 3; ++i) {
      v1::Job job;
      job.set_job_id("j-00000" + std::to_string(i));
      job.set_submitted_ms(1000 - i);  // later ids submitted earlier: order is by time
      job.set_state(v1::JOB_STATE_PENDING);
      v1::JobEvent ev;
      ev.set_job_id(job.job_id());
      ev.set_seq(1);
      ev.set_message("submitted");
      ASSERT_TRUE((*store)->PutJobWithEvent(job, ev).ok());
    }
    v1::Job changed;
    changed.set_job_id("j-000001");
    changed.set_submitted_ms(999);
    changed.set_state(v1::JOB_STATE_CANCELLED);
    ASSERT_TRUE((*store)->PutJob(changed).ok());
    v1::StepReport s;
    s.set_job_id("j-000001");
    s.set_step(1);
    s.set_loss(5.5);
    ASSERT_TRUE((*store)->PutStep(s).ok());
    s.set_loss(4.5);  // re-run step: latest value replaces it
    s.set_skipped(true);
    s.set_loss_scale(32768);
    ASSERT_TRUE((*store)->PutStep(s).ok());
  }
  auto store = OpenSqliteStateStore(dir_);
  ASSERT_TRUE(store.ok());
  auto state = (*store)->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(state->workers.size(), 1u);
  EXPECT_EQ(state->workers[0].host(), "h");
  ASSERT_EQ(state->jobs.size(), 3u);
  EXPECT_EQ(state->jobs[0].job_id(), "j-000003");
  EXPECT_EQ(state->jobs[2].job_id(), "j-000001");
  EXPECT_EQ(state->jobs[2].state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(state->events.size(), 3u);
  ASSERT_EQ(state->steps.size(), 1u);
  EXPECT_DOUBLE_EQ(state->steps[0].loss(), 4.5);
  EXPECT_TRUE(state->steps[0].skipped());
  EXPECT_DOUBLE_EQ(state->steps[0].loss_scale(), 32768);
}

TEST_F(SqliteStateStoreTest, UnusableDirectoryIsUnavailable) {
  auto store = OpenSqliteStateStore("/proc/no-such-dir/x");
  EXPECT_TRUE(absl::IsUnavailable(store.status())) << store.status();
}

TEST_F(SqliteStateStoreTest, NotADatabaseIsRefused) {
  FILE* f = fopen((dir_ + "/state.db").c_str(), "w");
  fputs("this is not sqlite, just text long enough to fill a header page.......", f);
  fclose(f);
  auto store = OpenSqliteStateStore(dir_);
  EXPECT_FALSE(store.ok());
}

}  // namespace
}  // namespace shardtrain::coordinator
