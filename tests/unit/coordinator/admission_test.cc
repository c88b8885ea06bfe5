// Issue #15 bugs 2, 3, 5 and 6 at the coordinator core: admission limits,
// plans the coordinator cannot hold, the queue policy (backfill without
// starvation), pending reasons, device/precision refusal, KV access, paged
// job summaries, idempotent submits, bounded event text.
#include "coordinator/admission.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>
#include <utility>

#include "common/text_bounds.h"
#include "coordinator/coordinator.h"
#include "coordinator/spec_validator.h"

namespace shardtrain::coordinator {
namespace {

std::string Spec(int dp, const std::string& extra = "") {
  return "name: t\nmodel: {layers: 2, heads: 2, dim: 16, context: 16, vocab: 256}\n"
         "data: {train: data/x.txt}\nbatch: {global: " +
         std::to_string(2 * dp) + ", micro: 2, seq_len: 8}\nparallel: {dp: " + std::to_string(dp) +
         "}\nsteps: 3\nmax_restarts: 0\n" + extra;
}

// The poison job: one million layers of width 1.
const std::vector<std::string> kMillionLayers = {"model.layers=1000000", "model.heads=1",
                                                 "model.dim=1"};

class AdmissionTest : public ::testing::Test {
 protected:
  void SetUp() override { Open(CoordinatorOptions()); }

  void Open(CoordinatorOptions o, std::unique_ptr<StateStore> store = NewMemoryStateStore()) {
    o.lease_ms = 1000;
    auto c = Coordinator::Create(o, std::move(store), ValidateSpec, &clock_);
    ASSERT_TRUE(c.ok()) << c.status();
    core_ = *std::move(c);
  }

  std::string Register(const std::string& kind = "cpu") {
    v1::RegisterWorkerRequest r;
    r.set_host("h");
    r.set_collective_address("127.0.0.1");
    r.add_devices()->set_kind(kind);
    auto resp = core_->RegisterWorker(r);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? resp->worker_id() : "";
  }

  absl::StatusOr<v1::Job> Submit(const std::string& yaml,
                                 const std::vector<std::string>& overrides = {},
                                 const std::string& key = "") {
    v1::SubmitJobRequest r;
    r.set_spec_yaml(yaml);
    for (const std::string& o : overrides) r.add_overrides(o);
    r.set_idempotency_key(key);
    return core_->SubmitJob(r);
  }

  v1::Job Job(const std::string& id) { return *core_->GetJob(id); }

  FakeClock clock_;
  std::unique_ptr<Coordinator> core_;
};

TEST_F(AdmissionTest, MillionLayerJobIsRefusedNamingThePlanLimitAndTheCoordinatorGoesOn) {
  Register();
  auto job = Submit(Spec(1), kMillionLayers);
  ASSERT_TRUE(absl::IsInvalidArgument(job.status())) << job.status();
  EXPECT_NE(job.status().message().find("plan: model.layers 1000000"), std::string::npos)
      << job.status();
  EXPECT_NE(job.status().message().find("--max-plan-bytes"), std::string::npos);
  EXPECT_EQ(core_->ListJobs({})->jobs_size(), 0);
  // The coordinator still schedules the next job on the free worker.
  auto ok = Submit(Spec(1));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(Job(ok->job_id()).state(), v1::JOB_STATE_SCHEDULED);
}

TEST_F(AdmissionTest, EachLimitNamesItsFieldAndFlag) {
  auto world = Submit(Spec(1), {"parallel.dp=2000", "batch.global=4000"});
  ASSERT_TRUE(absl::IsInvalidArgument(world.status())) << world.status();
  EXPECT_NE(world.status().message().find("parallel: world 2000"), std::string::npos);
  EXPECT_NE(world.status().message().find("--max-world"), std::string::npos);

  auto params = Submit(Spec(1), {"model.dim=65536", "model.heads=1"});
  ASSERT_TRUE(absl::IsInvalidArgument(params.status())) << params.status();
  EXPECT_NE(params.status().message().find("model: "), std::string::npos);
  EXPECT_NE(params.status().message().find("--max-params"), std::string::npos);

  // Expert parallelism over NCCL exchanges in device memory: admitted.
  auto ep = Submit(Spec(2), {"model.moe={experts: 4, top_k: 2}", "parallel.ep=2",
                             "resources.device=cuda", "parallel.comm=nccl"});
  EXPECT_TRUE(ep.ok()) << ep.status();

  // 8-bit AdamW state runs on GPU ranks too (on the device or, offloaded,
  // on the host): admitted.
  auto int8 = Submit(Spec(1), {"optimizer.state=int8", "resources.device=cuda"});
  EXPECT_TRUE(int8.ok()) << int8.status();

  auto bytes = Submit(Spec(1) + "# " + std::string(70 * 1024, 'x') + "\n");
  ASSERT_TRUE(absl::IsInvalidArgument(bytes.status())) << bytes.status();
  EXPECT_NE(bytes.status().message().find("--max-spec-bytes"), std::string::npos);
  EXPECT_LT(bytes.status().message().size(), 300u);
}

TEST_F(AdmissionTest, LongPathsAndRegistrationFieldsAreRefusedByName) {
  v1::SubmitJobRequest submit;
  submit.set_spec_yaml(Spec(1));
  submit.set_resume_from(std::string(2'500'000, 'p'));  // the 2.5 MB path
  auto job = core_->SubmitJob(submit);
  ASSERT_TRUE(absl::IsInvalidArgument(job.status())) << job.status();
  EXPECT_EQ(job.status().message(), "resume_from: 2500000 bytes, at most 4096");

  v1::RegisterWorkerRequest reg;
  reg.set_host(std::string(5000, 'h'));
  reg.set_collective_address("127.0.0.1");
  reg.add_devices()->set_kind("cpu");
  auto w = core_->RegisterWorker(reg);
  ASSERT_TRUE(absl::IsInvalidArgument(w.status())) << w.status();
  EXPECT_EQ(w.status().message(), "host: 5000 bytes, at most 4096");
  EXPECT_EQ(core_->ListWorkers().workers_size(), 0);
}

TEST_F(AdmissionTest, ParamsAndPlanEstimateMatchTheModel) {
  JobSpec spec = *ValidateSpec(
      Spec(1), {"model.preset=gpt2-124m", "model.layers=12", "model.heads=12", "model.dim=768",
                "model.context=1024", "model.vocab=50257", "batch.seq_len=1024"});
  // 124,475,904 with the padded vocabulary 50304 (llm.c's count).
  EXPECT_EQ(ModelParams(spec.model), 124475904.0);
  EXPECT_LT(EstimatePlanBytes(spec, 1), 64 * 1024.0);
}

TEST(AdmissionRestartTest, StoredJobTooLargeToPlanFailsAtLoadAndTheCoordinatorStartsAgain) {
  const std::string dir = ::testing::TempDir() + "/admission-restart";
  std::filesystem::remove_all(dir);
  FakeClock clock;
  std::string job_id;
  {
    // A coordinator of an earlier version (no plan limit) stored the job.
    CoordinatorOptions loose;
    loose.limits.max_plan_bytes = int64_t{1} << 40;
    auto core = *Coordinator::Create(loose, *OpenSqliteStateStore(dir), ValidateSpec, &clock);
    v1::SubmitJobRequest r;
    r.set_spec_yaml(Spec(1));
    for (const std::string& o : kMillionLayers) r.add_overrides(o);
    auto job = core->SubmitJob(r);
    ASSERT_TRUE(job.ok()) << job.status();
    job_id = job->job_id();
  }
  for (int start = 0; start < 2; ++start) {  // and again: the failure is durable
    auto core =
        Coordinator::Create(CoordinatorOptions(), *OpenSqliteStateStore(dir), ValidateSpec, &clock);
    ASSERT_TRUE(core.ok()) << core.status();
    v1::Job job = *(*core)->GetJob(job_id);
    EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
    EXPECT_NE(job.failure_reason().find("--max-plan-bytes"), std::string::npos)
        << job.failure_reason();
  }
}

TEST(AdmissionThrowTest, AValidatorThatThrowsRefusesTheSpecInsteadOfCrashing) {
  FakeClock clock;
  auto throwing = [](const std::string&,
                     const std::vector<std::string>&) -> absl::StatusOr<JobSpec> {
    throw std::bad_alloc();
  };
  auto core = Coordinator::Create(CoordinatorOptions(), NewMemoryStateStore(), throwing, &clock);
  ASSERT_TRUE(core.ok()) << core.status();
  v1::SubmitJobRequest r;
  r.set_spec_yaml(Spec(1));
  auto job = (*core)->SubmitJob(r);
  ASSERT_TRUE(absl::IsInvalidArgument(job.status())) << job.status();
  EXPECT_EQ(job.status().message().rfind("spec: validation failed: ", 0), 0u) << job.status();
}

TEST_F(AdmissionTest, SmallJobBackfillsPastAnUnsatisfiableHeadWhichStillRunsFirstLater) {
  CoordinatorOptions o;
  o.reserve_after = 1;
  Open(o);
  const std::string w1 = Register();
  v1::Job head = *Submit(Spec(2));
  EXPECT_EQ(Job(head.job_id()).pending_reason(),
            "waiting for 2 cpu workers, 1 free; only 1 alive can run it");
  v1::Job small = *Submit(Spec(1));
  EXPECT_EQ(Job(small.job_id()).state(), v1::JOB_STATE_SCHEDULED);  // backfilled
  EXPECT_EQ(Job(small.job_id()).pending_reason(), "");

  // A second worker attaches: the head could now fit, and was passed over
  // once, so it reserves the free worker; a later small job waits.
  Register();
  v1::Job later = *Submit(Spec(1));
  EXPECT_EQ(Job(later.job_id()).state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(Job(later.job_id()).pending_reason(), "queued behind " + head.job_id() +
                                                      ", which reserves the free cpu workers "
                                                      "until it starts");
  EXPECT_EQ(Job(head.job_id()).pending_reason(),
            "waiting for 2 cpu workers, 1 free; reserving the free cpu workers (passed over 1 "
            "times)");
  // The small job ends: the head gets both workers before the later job.
  ASSERT_TRUE(core_->CancelJob(small.job_id(), "").ok());
  EXPECT_EQ(Job(head.job_id()).state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(Job(later.job_id()).state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(Job(later.job_id()).pending_reason(), "waiting for 1 cpu workers, 0 free");
  ASSERT_TRUE(core_->CancelJob(later.job_id(), "").ok());
  EXPECT_EQ(Job(later.job_id()).pending_reason(), "");  // ended: waits no more
}

// A registration must describe a device this coordinator can schedule:
// unknown kinds and negative counts are refused naming the field, and
// nothing is registered.
TEST_F(AdmissionTest, RegistrationWithImpossibleFieldsIsRefusedNamingTheField) {
  auto attempt = [&](const std::function<void(v1::RegisterWorkerRequest&)>& edit) {
    v1::RegisterWorkerRequest r;
    r.set_host("h");
    r.set_collective_address("127.0.0.1");
    r.add_devices()->set_kind("cpu");
    edit(r);
    return core_->RegisterWorker(r).status();
  };
  const std::pair<std::function<void(v1::RegisterWorkerRequest&)>, std::string> cases[] = {
      {[](auto& r) { r.mutable_devices(0)->set_kind("tpu"); },
       "devices.kind: \"tpu\", must be cpu or cuda"},
      {[](auto& r) { r.mutable_devices(0)->set_kind(""); },
       "devices.kind: \"\", must be cpu or cuda"},
      {[](auto& r) { r.set_threads(-5); }, "threads: -5, must be >= 0"},
      {[](auto& r) { r.set_host_memory_bytes(-1); }, "host_memory_bytes: -1, must be >= 0"},
      {[](auto& r) { r.mutable_devices(0)->set_memory_bytes(-1); },
       "devices.memory_bytes: -1, must be >= 0"},
  };
  for (const auto& [edit, message] : cases) {
    const absl::Status s = attempt(edit);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_EQ(s.message(), message);
  }
  const v1::ListWorkersResponse workers = core_->ListWorkers();
  EXPECT_EQ(workers.workers_size(), 0);
  EXPECT_TRUE(attempt([](auto& r) { r.mutable_devices(0)->set_kind("cuda"); }).ok());
}

TEST_F(AdmissionTest, PrecisionOrDeviceNoRegisteredWorkerSupportsIsRefused) {
  // No worker yet: the cluster may still be starting, the job waits.
  auto early = Submit(Spec(1, "precision: bf16\n"));
  ASSERT_TRUE(early.ok()) << early.status();
  EXPECT_EQ(Job(early->job_id()).pending_reason(),
            "waiting for 1 cpu (bf16) workers, 0 free; no alive worker can run cpu (bf16)");
  Register();  // a cpu worker: fp32 only
  EXPECT_EQ(Job(early->job_id()).state(), v1::JOB_STATE_PENDING);
  auto bf16 = Submit(Spec(1, "precision: bf16\n"));
  ASSERT_TRUE(absl::IsFailedPrecondition(bf16.status())) << bf16.status();
  EXPECT_EQ(bf16.status().message(),
            "precision: bf16 on cpu is supported by none of the 1 workers that registered (they "
            "offer: cpu fp32)");
  auto cuda = Submit(Spec(1, "resources: {device: cuda}\n"));
  ASSERT_TRUE(absl::IsFailedPrecondition(cuda.status())) << cuda.status();
  EXPECT_EQ(cuda.status().message().rfind("resources.device: cuda is supported by none", 0), 0u)
      << cuda.status();
  EXPECT_TRUE(Submit(Spec(1)).ok());
}

TEST_F(AdmissionTest, KvIsOnlyForTheCurrentGenerationOfAScheduledOrRunningJob) {
  EXPECT_TRUE(absl::IsNotFound(core_->CheckKvAccess("j-999999", 1)));
  v1::Job pending = *Submit(Spec(1));
  EXPECT_TRUE(absl::IsFailedPrecondition(core_->CheckKvAccess(pending.job_id(), 0)));
  Register();
  EXPECT_TRUE(core_->CheckKvAccess(pending.job_id(), 1).ok());
  EXPECT_TRUE(absl::IsAborted(core_->CheckKvAccess(pending.job_id(), 2)));
  ASSERT_TRUE(core_->kv().Set(pending.job_id(), 1, "k", "v").ok());
  ASSERT_TRUE(core_->CancelJob(pending.job_id(), "").ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(core_->CheckKvAccess(pending.job_id(), 1)));
  EXPECT_EQ(core_->kv().Size(), 0u);  // freed when the job ended
}

TEST_F(AdmissionTest, ListJobsPagesSummaries) {
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(Submit(Spec(1))->job_id());
  v1::ListJobsRequest req;
  req.set_page_size(2);
  std::vector<std::string> seen;
  int pages = 0;
  do {
    auto page = core_->ListJobs(req);
    ASSERT_TRUE(page.ok()) << page.status();
    ++pages;
    for (const v1::Job& j : page->jobs()) {
      seen.push_back(j.job_id());
      EXPECT_EQ(j.spec_yaml(), "");
    }
    req.set_page_token(page->next_page_token());
  } while (!req.page_token().empty());
  EXPECT_EQ(seen, ids);
  EXPECT_EQ(pages, 3);
  req.set_page_token("nonsense");
  EXPECT_TRUE(absl::IsInvalidArgument(core_->ListJobs(req).status()));
}

TEST_F(AdmissionTest, SameIdempotencyKeyReturnsTheSameJob) {
  auto a = Submit(Spec(1), {}, "key-1");
  auto b = Submit(Spec(1), {}, "key-1");
  auto c = Submit(Spec(1), {}, "key-2");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->job_id(), b->job_id());
  EXPECT_NE(a->job_id(), c->job_id());
  EXPECT_EQ(core_->ListJobs({})->jobs_size(), 2);
  EXPECT_TRUE(absl::IsInvalidArgument(Submit(Spec(1), {}, std::string(129, 'k')).status()));
}

TEST_F(AdmissionTest, EventTextIsOneBoundedLine) {
  v1::Job job = *Submit(Spec(1));
  ASSERT_TRUE(core_->CancelJob(job.job_id(), "a\nb\x1b[2J" + std::string(100'000, 'x')).ok());
  bool ended = false;
  auto events = core_->WaitEvents(job.job_id(), 0, 0, &ended);
  ASSERT_TRUE(events.ok());
  const std::string& last = events->back().message();
  EXPECT_LE(last.size(), kMaxEventBytes + 3);
  EXPECT_EQ(last.rfind("cancelled: a b [2J", 0), 0u) << last.substr(0, 40);
  EXPECT_EQ(last.substr(last.size() - 3), "...");
}

}  // namespace
}  // namespace shardtrain::coordinator
