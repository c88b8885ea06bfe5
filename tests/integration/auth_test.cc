// Issue 15, acceptance 2, against a real coordinator serving TLS with a token
// file (certificates made by openssl at run time, nothing checked in):
// without a token every RPC of the service answers UNAUTHENTICATED; a user
// cannot see or cancel another user's job (PERMISSION_DENIED); reports forged
// with a wrong lease token are refused while a real worker (TLS + worker
// token) trains the job to the end; plaintext on a non-loopback address
// needs --insecure.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>

#include "google/protobuf/descriptor.h"
#include "shardtrain/v1/coordinator.grpc.pb.h"
#include "tests/integration/harness.h"
#include "worker/coordinator_client.h"

namespace shardtrain::testing {
namespace {

using std::chrono::seconds;
using worker::ConnectOptions;
using worker::CoordinatorClient;

const std::string kTinySpec = SourceDir() + "/tests/data/specs/good/tiny.yaml";
const std::string kData = "data.train=" + SourceDir() + "/data/fortunes.txt";
const std::string kWorkerToken = "worker-token-0123456789";
const std::string kAliceToken = "alice-token-0123456789";
const std::string kBobToken = "bob-token-0123456789abc";
const std::string kAdminToken = "admin-token-0123456789";

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void Sh(const std::string& cmd) {
  CommandResult r = RunCommand({"/bin/sh", "-c", cmd}, seconds(30));
  ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.err;
}

class AuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string d = dir_.path();
    // A CA, and a server certificate it signs for 127.0.0.1 (P-256: fast).
    Sh("cd " + d +
       " && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1"
       " -subj /CN=test-ca -keyout ca.key -out ca.pem 2>/dev/null"
       " && openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=localhost"
       " -keyout server.key -out server.csr 2>/dev/null"
       " && printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > san.ext"
       " && openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1"
       " -extfile san.ext -out server.pem 2>/dev/null");
    std::ofstream(d + "/tokens") << "# token role name\n"
                                 << kWorkerToken << " worker workers\n"
                                 << kAliceToken << " user alice\n"
                                 << kBobToken << " user bob\n"
                                 << kAdminToken << " admin root\n";
    coord_ = StartCoordinator(d, 3000, "127.0.0.1:0", "",
                              {"--tls-cert", d + "/server.pem", "--tls-key", d + "/server.key",
                               "--tokens", d + "/tokens"});
    ASSERT_GT(coord_.port, 0) << coord_.process.Log();
  }

  // A client over TLS with `token` (none when empty).
  std::unique_ptr<CoordinatorClient> Client(const std::string& token) {
    ConnectOptions c;
    c.token = token;
    c.tls_ca = ReadAll(dir_.path() + "/ca.pem");
    return std::make_unique<CoordinatorClient>(coord_.address(), 10'000, c);
  }
  std::unique_ptr<grpc::ClientContext> Ctx(const CoordinatorClient& c) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + seconds(10));
    c.Authorize(ctx.get());
    return ctx;
  }
  std::vector<std::string> TlsFlags(const std::string& token) {
    return {"--tls-ca", dir_.path() + "/ca.pem", "--token", token};
  }

  TempDir dir_;
  Coordinator coord_;
};

// One call of every RPC with an empty request, by method name.
using AnyCall = std::function<grpc::Status(v1::Coordinator::Stub&, grpc::ClientContext*)>;
std::map<std::string, AnyCall> EveryRpc() {
#define SHARDTRAIN_CALL(Method, Req, Resp)                            \
  {                                                                   \
#Method, [](v1::Coordinator::Stub& s, grpc::ClientContext* ctx) {   \
      v1::Resp resp;                                                    \
      return s.Method(ctx, v1::Req(), &resp);                           \
    } \
  }
  std::map<std::string, AnyCall> calls = {
      SHARDTRAIN_CALL(RegisterWorker, RegisterWorkerRequest, RegisterWorkerResponse),
      SHARDTRAIN_CALL(Heartbeat, HeartbeatRequest, HeartbeatResponse),
      SHARDTRAIN_CALL(ListWorkers, ListWorkersRequest, ListWorkersResponse),
      SHARDTRAIN_CALL(SubmitJob, SubmitJobRequest, SubmitJobResponse),
      SHARDTRAIN_CALL(GetJob, GetJobRequest, Job),
      SHARDTRAIN_CALL(ListJobs, ListJobsRequest, ListJobsResponse),
      SHARDTRAIN_CALL(CancelJob, CancelJobRequest, Job),
      SHARDTRAIN_CALL(GetHistory, GetHistoryRequest, GetHistoryResponse),
      SHARDTRAIN_CALL(GetPlan, GetPlanRequest, Plan),
      SHARDTRAIN_CALL(ListCheckpoints, ListCheckpointsRequest, ListCheckpointsResponse),
      SHARDTRAIN_CALL(ReportStep, ReportStepRequest, ReportStepResponse),
      SHARDTRAIN_CALL(ReportCheckpoint, ReportCheckpointRequest, ReportCheckpointResponse),
      SHARDTRAIN_CALL(WaitCheckpointShards, WaitCheckpointShardsRequest,
                      WaitCheckpointShardsResponse),
      SHARDTRAIN_CALL(CommitCheckpoint, CommitCheckpointRequest, CommitCheckpointResponse),
      SHARDTRAIN_CALL(ReportCheckpointFailure, ReportCheckpointFailureRequest,
                      ReportCheckpointFailureResponse),
      SHARDTRAIN_CALL(ReportDone, ReportDoneRequest, ReportDoneResponse),
      SHARDTRAIN_CALL(ReportFailure, ReportFailureRequest, ReportFailureResponse),
      SHARDTRAIN_CALL(ReportEvent, ReportEventRequest, ReportEventResponse),
      SHARDTRAIN_CALL(KvSet, KvSetRequest, KvSetResponse),
      SHARDTRAIN_CALL(KvGet, KvGetRequest, KvGetResponse),
      SHARDTRAIN_CALL(KvAdd, KvAddRequest, KvAddResponse),
      SHARDTRAIN_CALL(GetJobDiagnostics, GetJobDiagnosticsRequest, JobDiagnostics),
  };
#undef SHARDTRAIN_CALL
  calls["WatchJob"] = [](v1::Coordinator::Stub& s, grpc::ClientContext* ctx) {
    auto reader = s.WatchJob(ctx, v1::WatchJobRequest());
    v1::JobEvent ev;
    while (reader->Read(&ev)) {
    }
    return reader->Finish();
  };
  return calls;
}

TEST_F(AuthTest, EveryRpcWithoutATokenIsUnauthenticated) {
  std::map<std::string, AnyCall> calls = EveryRpc();
  // The list above must cover the whole service: a new RPC fails here until
  // it is added (and so checked).
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          v1::Coordinator::service_full_name());
  ASSERT_NE(service, nullptr);
  std::set<std::string> methods;
  for (int i = 0; i < service->method_count(); ++i) methods.insert(service->method(i)->name());
  std::set<std::string> covered;
  for (const auto& [name, call] : calls) covered.insert(name);
  ASSERT_EQ(methods, covered);

  for (const std::string& token : {std::string(), std::string("not-a-known-token-at-all")}) {
    auto client = Client(token);
    for (const auto& [name, call] : calls) {
      auto ctx = Ctx(*client);
      grpc::Status s = call(client->stub(), ctx.get());
      EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << name << " with token \"" << token << "\": " << s.error_message();
    }
  }
  // The same calls with the admin's token get past authentication (their
  // empty requests then fail validation, or succeed).
  auto admin = Client(kAdminToken);
  for (const auto& [name, call] : calls) {
    auto ctx = Ctx(*admin);
    grpc::Status s = call(admin->stub(), ctx.get());
    EXPECT_NE(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << name;
    EXPECT_NE(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << name;
  }
  // Plaintext to a TLS port gets nowhere.
  CoordinatorClient plain(coord_.address(), 2'000, ConnectOptions{kAdminToken, "", "", ""});
  auto ctx = Ctx(plain);
  v1::ListJobsResponse list;
  EXPECT_EQ(plain.stub().ListJobs(ctx.get(), v1::ListJobsRequest(), &list).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(AuthTest, UserCannotSeeOrCancelAnotherUsersJob) {
  CommandResult submitted = Cli({"submit", kTinySpec, "--set", kData, "-o", "json", "--tls-ca",
                                 dir_.path() + "/ca.pem", "--token", kAliceToken},
                                coord_.address());
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err;
  const size_t at = submitted.out.find("\"job_id\": \"");
  ASSERT_NE(at, std::string::npos) << submitted.out;
  const std::string job = submitted.out.substr(at + 11, 8);

  auto bob = Client(kBobToken);
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job);
  v1::Job out;
  auto ctx = Ctx(*bob);
  grpc::Status s = bob->stub().CancelJob(ctx.get(), cancel, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  v1::GetJobRequest get;
  get.set_job_id(job);
  ctx = Ctx(*bob);
  EXPECT_EQ(bob->stub().GetJob(ctx.get(), get, &out).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // Nor its diagnostics (`shardtrain why`), which Alice may read.
  v1::GetJobDiagnosticsRequest why;
  why.set_job_id(job);
  v1::JobDiagnostics diag;
  ctx = Ctx(*bob);
  EXPECT_EQ(bob->stub().GetJobDiagnostics(ctx.get(), why, &diag).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  {
    auto alice = Client(kAliceToken);
    auto actx = Ctx(*alice);
    grpc::Status mine = alice->stub().GetJobDiagnostics(actx.get(), why, &diag);
    EXPECT_TRUE(mine.ok()) << mine.error_message();
    EXPECT_EQ(diag.job_id(), job);
  }
  v1::ListJobsResponse list;
  ctx = Ctx(*bob);
  ASSERT_TRUE(bob->stub().ListJobs(ctx.get(), v1::ListJobsRequest(), &list).ok());
  EXPECT_EQ(list.jobs_size(), 0);
  // The CLI says so and fails; the job is untouched.
  CommandResult by_bob = Cli(
      {"cancel", job, "--tls-ca", dir_.path() + "/ca.pem", "--token", kBobToken}, coord_.address());
  EXPECT_NE(by_bob.exit_code, 0);
  EXPECT_NE(by_bob.err.find("another user"), std::string::npos) << by_bob.err;
  // A worker token cannot submit or cancel at all.
  auto w = Client(kWorkerToken);
  ctx = Ctx(*w);
  EXPECT_EQ(w->stub().CancelJob(ctx.get(), cancel, &out).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // Alice lists and cancels her own job; the admin sees it.
  auto alice = Client(kAliceToken);
  ctx = Ctx(*alice);
  ASSERT_TRUE(alice->stub().ListJobs(ctx.get(), v1::ListJobsRequest(), &list).ok());
  ASSERT_EQ(list.jobs_size(), 1);
  EXPECT_EQ(list.jobs(0).owner(), "alice");
  ctx = Ctx(*alice);
  s = alice->stub().CancelJob(ctx.get(), cancel, &out);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(out.state(), v1::JOB_STATE_CANCELLED);
}

TEST_F(AuthTest, ForgedReportsAreRefusedWhileTheRealWorkerFinishesTheJob) {
  Process worker = StartWorker(dir_.path(), coord_.address(), 0, TlsFlags(kWorkerToken));
  CommandResult submitted = Cli(
      {"submit", kTinySpec, "--set", kData, "--set", "parallel.dp=1", "--set", "steps=40", "--set",
       "batch.global=2", "-o", "json", "--tls-ca", dir_.path() + "/ca.pem", "--token", kAliceToken},
      coord_.address());
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err;
  const size_t at = submitted.out.find("\"job_id\": \"");
  ASSERT_NE(at, std::string::npos) << submitted.out;
  const std::string job = submitted.out.substr(at + 11, 8);
  auto admin = Client(kAdminToken);
  v1::GetJobRequest get;
  get.set_job_id(job);
  v1::Job j;
  ASSERT_TRUE(WaitFor(
      [&] {
        auto ctx = Ctx(*admin);
        return admin->stub().GetJob(ctx.get(), get, &j).ok() && j.ranks_size() == 1;
      },
      seconds(30)))
      << worker.Log();

  // A holder of a worker token, knowing the ids GetJob shows, forges reports.
  auto forger = Client(kWorkerToken);
  v1::ReportStepRequest step;
  step.set_worker_id(j.ranks(0).worker_id());
  step.set_lease_token(std::string(32, 'f'));
  step.mutable_report()->set_job_id(job);
  step.mutable_report()->set_generation(j.generation());
  step.mutable_report()->set_step(1);
  step.mutable_report()->set_loss(std::numeric_limits<double>::quiet_NaN());
  v1::ReportStepResponse step_resp;
  auto ctx = Ctx(*forger);
  grpc::Status s = forger->stub().ReportStep(ctx.get(), step, &step_resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  v1::ReportDoneRequest done;
  done.set_job_id(job);
  done.set_generation(j.generation());
  done.set_worker_id(j.ranks(0).worker_id());
  done.set_steps(40);
  v1::ReportDoneResponse done_resp;
  ctx = Ctx(*forger);
  s = forger->stub().ReportDone(ctx.get(), done, &done_resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  v1::HeartbeatRequest hb;
  hb.set_worker_id(j.ranks(0).worker_id());
  v1::HeartbeatResponse hb_resp;
  ctx = Ctx(*forger);
  s = forger->stub().Heartbeat(ctx.get(), hb, &hb_resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_EQ(hb_resp.commands_size(), 0);

  // The real worker, over TLS with its token and lease token, finishes; no
  // forged step is in the history.
  ASSERT_TRUE(WaitFor(
      [&] {
        auto c = Ctx(*admin);
        return admin->stub().GetJob(c.get(), get, &j).ok() &&
               (j.state() == v1::JOB_STATE_SUCCEEDED || j.state() == v1::JOB_STATE_FAILED);
      },
      seconds(60)))
      << worker.Log();
  ASSERT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.failure_reason() << "\n" << worker.Log();
  v1::GetHistoryRequest hreq;
  hreq.set_job_id(job);
  v1::GetHistoryResponse history;
  ctx = Ctx(*admin);
  ASSERT_TRUE(admin->stub().GetHistory(ctx.get(), hreq, &history).ok());
  ASSERT_EQ(history.steps_size(), 40);
  for (const v1::StepReport& r : history.steps()) EXPECT_TRUE(std::isfinite(r.loss())) << r.step();
}

TEST(AuthFlagsTest, PlaintextOnANonLoopbackAddressNeedsInsecure) {
  TempDir dir;
  CommandResult r = RunCommand(
      {SHARDTRAIN_COORDINATOR_BIN, "--listen", "0.0.0.0:0", "--state-dir", dir.path() + "/state"},
      seconds(20));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--insecure"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--tls-cert"), std::string::npos) << r.err;
  r = RunCommand({SHARDTRAIN_COORDINATOR_BIN, "--listen", "127.0.0.1:0", "--state-dir",
                  dir.path() + "/state", "--tls-cert", dir.path() + "/x.pem"},
                 seconds(20));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--tls-key"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace shardtrain::testing
