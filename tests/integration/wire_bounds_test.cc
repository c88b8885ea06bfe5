// Issue #15 bug 5 over the wire, as an outside gRPC client generated from
// proto/ would see it: KV calls for jobs that do not exist or are not
// running are refused, KV values are bounded and KvAdd does not wrap,
// errors do not echo megabytes of input, ListJobs pages, and a SubmitJob
// retried with the same idempotency key returns the same job.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <climits>
#include <fstream>
#include <sstream>
#include <string>

#include "coordinator/fencing.h"
#include "shardtrain/v1/coordinator.grpc.pb.h"
#include "tests/integration/harness.h"

namespace shardtrain::testing {
namespace {

using std::chrono::seconds;

std::unique_ptr<grpc::ClientContext> Ctx() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + seconds(10));
  return ctx;
}

std::string TinySpec() {
  std::ifstream in(SourceDir() + "/tests/data/specs/good/tiny.yaml");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class WireBoundsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    c_ = StartCoordinator(dir_.path(), 10'000);
    ASSERT_GT(c_.port, 0) << c_.process.Log();
    stub_ = v1::Coordinator::NewStub(
        grpc::CreateChannel(c_.address(), grpc::InsecureChannelCredentials()));
  }

  grpc::Status Submit(const std::string& key, v1::SubmitJobResponse* resp) {
    v1::SubmitJobRequest req;
    req.set_spec_yaml(TinySpec());
    req.add_overrides("data.train=" + SourceDir() + "/data/fortunes.txt");
    req.set_idempotency_key(key);
    return stub_->SubmitJob(Ctx().get(), req, resp);
  }

  TempDir dir_;
  Coordinator c_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

TEST_F(WireBoundsTest, KvForAJobThatIsNotRunningIsRefusedAndErrorsAreShort) {
  v1::KvSetRequest set;
  set.set_job_id("j-999999");
  set.set_generation(1);
  set.set_key(std::string(512 << 10, 'k'));  // half a megabyte of key
  set.set_value(std::string(3 << 20, 'v'));  // under gRPC's 4 MiB, above the KV's 1 MiB
  v1::KvSetResponse set_resp;
  grpc::Status s = stub_->KvSet(Ctx().get(), set, &set_resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message().substr(0, 200);
  EXPECT_LT(s.error_message().size(), 600u);

  // A PENDING job (no worker): no rendezvous yet.
  v1::SubmitJobResponse job;
  ASSERT_TRUE(Submit("", &job).ok());
  set.set_job_id(job.job().job_id());
  set.set_key("k");
  s = stub_->KvSet(Ctx().get(), set, &set_resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  v1::KvAddRequest add;
  add.set_job_id(job.job().job_id());
  add.set_key("n");
  add.set_delta(INT64_MAX);
  v1::KvAddResponse add_resp;
  s = stub_->KvAdd(Ctx().get(), add, &add_resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
}

TEST_F(WireBoundsTest, KvOfARunningJobBoundsValuesAndRefusesOverflow) {
  Process w = StartWorker(dir_.path(), c_.address(), 0);
  v1::SubmitJobRequest req;
  req.set_spec_yaml(TinySpec());
  for (const char* o : {"parallel.dp=1", "batch.global=2", "steps=100000"}) req.add_overrides(o);
  req.add_overrides("data.train=" + SourceDir() + "/data/fortunes.txt");
  v1::SubmitJobResponse sub;
  ASSERT_TRUE(stub_->SubmitJob(Ctx().get(), req, &sub).ok());
  v1::Job job;
  ASSERT_TRUE(WaitFor(
      [&] {
        v1::GetJobRequest get;
        get.set_job_id(sub.job().job_id());
        return stub_->GetJob(Ctx().get(), get, &job).ok() && job.state() == v1::JOB_STATE_RUNNING;
      },
      seconds(30)))
      << v1::JobState_Name(job.state());

  // The rank's lease token, as the coordinator derives it from the key in
  // its state directory: KV writes need it (fencing).
  absl::StatusOr<coordinator::FencingKey> key =
      coordinator::FencingKey::LoadOrCreate(dir_.path() + "/state/fencing.key");
  ASSERT_TRUE(key.ok()) << key.status();
  const std::string token = key->LeaseToken(job.job_id(), job.generation());
  v1::KvSetRequest set;
  set.set_job_id(job.job_id());
  set.set_generation(job.generation());
  set.set_lease_token(token);
  set.set_key("big");
  set.set_value(std::string(2 << 20, 'v'));
  v1::KvSetResponse set_resp;
  grpc::Status s = stub_->KvSet(Ctx().get(), set, &set_resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  set.set_generation(job.generation() + 1);
  set.set_value("v");
  s = stub_->KvSet(Ctx().get(), set, &set_resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED) << s.error_message();

  v1::KvAddRequest add;
  add.set_job_id(job.job_id());
  add.set_generation(job.generation());
  add.set_lease_token(token);
  add.set_key("counter");
  add.set_delta(INT64_MAX);
  v1::KvAddResponse add_resp;
  ASSERT_TRUE(stub_->KvAdd(Ctx().get(), add, &add_resp).ok());
  EXPECT_EQ(add_resp.value(), INT64_MAX);
  add.set_delta(1);
  s = stub_->KvAdd(Ctx().get(), add, &add_resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE) << s.error_message();
}

TEST_F(WireBoundsTest, SameIdempotencyKeyGivesTheSameJobAndListJobsPages) {
  v1::SubmitJobResponse a, b, c;
  ASSERT_TRUE(Submit("retry-key", &a).ok());
  ASSERT_TRUE(Submit("retry-key", &b).ok());
  ASSERT_TRUE(Submit("other-key", &c).ok());
  EXPECT_EQ(a.job().job_id(), b.job().job_id());
  EXPECT_NE(a.job().job_id(), c.job().job_id());

  v1::ListJobsRequest req;
  req.set_page_size(1);
  std::vector<std::string> ids;
  for (int page = 0; page < 5; ++page) {
    v1::ListJobsResponse resp;
    ASSERT_TRUE(stub_->ListJobs(Ctx().get(), req, &resp).ok());
    for (const v1::Job& j : resp.jobs()) {
      ids.push_back(j.job_id());
      EXPECT_EQ(j.spec_yaml(), "");  // summaries
    }
    if (resp.next_page_token().empty()) break;
    req.set_page_token(resp.next_page_token());
  }
  EXPECT_EQ(ids, (std::vector<std::string>{a.job().job_id(), c.job().job_id()}));
}

}  // namespace
}  // namespace shardtrain::testing
