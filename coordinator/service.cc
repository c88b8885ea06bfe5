#include "coordinator/service.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <iostream>
#include <memory>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/text_bounds.h"

namespace shardtrain::coordinator {
namespace {

// The longest a long-polling call may hold a request (WaitCheckpointShards).
constexpr int64_t kMaxWaitMs = 60'000;

absl::Status RequireId(const std::string& value, const char* field) {
  if (value.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": must not be empty"));
  return absl::OkStatus();
}

absl::Status RequireKvKey(const std::string& job_id, const std::string& key) {
  if (auto s = RequireId(job_id, "job_id"); !s.ok()) return s;
  return RequireId(key, "key");
}

// Stores *result into *out when ok, and returns the status either way.
template <typename T>
absl::Status Fill(absl::StatusOr<T> result, T* out) {
  if (!result.ok()) return result.status();
  *out = *std::move(result);
  return absl::OkStatus();
}

}  // namespace

CoordinatorService::CoordinatorService(Coordinator* core, MetricsRegistry* registry,
                                       const Authenticator* auth,
                                       std::function<std::string()> leader)
    : core_(core),
      leader_(std::move(leader)),
      auth_(auth ? auth : &no_auth_),
      rpcs_(registry->AddCounter("shardtrain_coordinator_rpc_total",
                                 "RPCs handled, by method and status code.", {"method", "code"})),
      latency_(registry->AddHistogram("shardtrain_coordinator_rpc_latency_seconds",
                                      "Time to handle an RPC (server side), by method.", {"method"},
                                      ExponentialBuckets(0.00005, 2, 18))) {}

template <typename Fn>
grpc::Status CoordinatorService::Handle(grpc::ServerContext* ctx, const char* method, Fn&& fn) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status s;
  try {
    s = [&]() -> absl::Status {
      // Who is calling, and may that role call this at all: before anything
      // else, so an unauthenticated caller learns nothing (not even NOT_FOUND).
      absl::string_view authorization;
      const auto& md = ctx->client_metadata();
      if (auto it = md.find("authorization"); it != md.end()) {
        authorization = absl::string_view(it->second.data(), it->second.size());
      }
      absl::StatusOr<Principal> who = auth_->Authenticate(authorization);
      if (!who.ok()) return who.status();
      if (auto a = Authorize(*who, method); !a.ok()) return a;
      if (core() == nullptr) {
        const std::string leader = leader_ ? leader_() : "";
        return absl::UnavailableError(absl::StrCat(
            kCoordinatorStandby, leader.empty() ? "no leader is known yet (one is being elected)"
                                                : absl::StrCat("the leader is at ", leader)));
      }
      return fn(*who);
    }();
  } catch (const std::exception& e) {
    // No exception leaves a gRPC thread: the call fails, the server stays.
    std::cerr << "shardtrain-coordinator: " << method << " threw: " << e.what() << std::endl;
    s = absl::InternalError(absl::StrCat(method, " failed: ", e.what()));
  } catch (...) {
    std::cerr << "shardtrain-coordinator: " << method << " threw" << std::endl;
    s = absl::InternalError(absl::StrCat(method, " failed"));
  }
  // Errors may quote input (a key, a spec value): never echo more than a
  // few hundred bytes of it.
  if (!s.ok() && s.message().size() > 2 * kMaxEchoBytes) {
    s = absl::Status(s.code(), Truncate(std::string(s.message()), 2 * kMaxEchoBytes));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  rpcs_.WithLabels({method, std::string(absl::StatusCodeToString(s.code()))}).Increment();
  latency_.WithLabels({method}).Observe(seconds);
  return ToGrpcStatus(s);
}

absl::Status CoordinatorService::CheckJobAccess(const Principal& who,
                                                const std::string& job_id) const {
  if (who.role != Role::kUser) return absl::OkStatus();
  absl::StatusOr<v1::Job> job = core()->GetJob(job_id);
  if (!job.ok()) return job.status();
  return MayAccessJob(who, job_id, job->owner());
}

grpc::Status CoordinatorService::RegisterWorker(grpc::ServerContext* ctx,
                                                const v1::RegisterWorkerRequest* req,
                                                v1::RegisterWorkerResponse* resp) {
  return Handle(ctx, "RegisterWorker", [&](const Principal& who) -> absl::Status {
    return Fill(core()->RegisterWorker(*req), resp);
  });
}

grpc::Status CoordinatorService::Heartbeat(grpc::ServerContext* ctx,
                                           const v1::HeartbeatRequest* req,
                                           v1::HeartbeatResponse* resp) {
  return Handle(ctx, "Heartbeat", [&](const Principal& who) -> absl::Status {
    if (auto s = RequireId(req->worker_id(), "worker_id"); !s.ok()) return s;
    return Fill(core()->Heartbeat(*req), resp);
  });
}

grpc::Status CoordinatorService::ListWorkers(grpc::ServerContext* ctx,
                                             const v1::ListWorkersRequest*,
                                             v1::ListWorkersResponse* resp) {
  return Handle(ctx, "ListWorkers", [&](const Principal& who) -> absl::Status {
    *resp = core()->ListWorkers();
    return absl::OkStatus();
  });
}

grpc::Status CoordinatorService::SubmitJob(grpc::ServerContext* ctx,
                                           const v1::SubmitJobRequest* req,
                                           v1::SubmitJobResponse* resp) {
  return Handle(ctx, "SubmitJob", [&](const Principal& who) -> absl::Status {
    if (req->spec_yaml().empty()) return absl::InvalidArgumentError("spec: the spec is empty");
    absl::StatusOr<v1::Job> job = core()->SubmitJob(*req, who.name);
    if (!job.ok()) return job.status();
    *resp->mutable_job() = *std::move(job);
    return absl::OkStatus();
  });
}

grpc::Status CoordinatorService::GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req,
                                        v1::Job* resp) {
  return Handle(ctx, "GetJob", [&](const Principal& who) -> absl::Status {
    if (auto s = RequireId(req->job_id(), "job_id"); !s.ok()) return s;
    if (auto s = CheckJobAccess(who, req->job_id()); !s.ok()) return s;
    return Fill(core()->GetJob(req->job_id()), resp);
  });
}

grpc::Status CoordinatorService::ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest* req,
                                          v1::ListJobsResponse* resp) {
  return Handle(ctx, "ListJobs", [&](const Principal& who) -> absl::Status {
    v1::ListJobsRequest mine = *req;
    if (who.role == Role::kUser) mine.set_owner(who.name);  // a user lists its own jobs only
    return Fill(core()->ListJobs(mine), resp);
  });
}

grpc::Status CoordinatorService::CancelJob(grpc::ServerContext* ctx,
                                           const v1::CancelJobRequest* req, v1::Job* resp) {
  return Handle(ctx, "CancelJob", [&](const Principal& who) -> absl::Status {
    if (auto s = RequireId(req->job_id(), "job_id"); !s.ok()) return s;
    if (auto s = CheckJobAccess(who, req->job_id()); !s.ok()) return s;
    return Fill(core()->CancelJob(req->job_id(), req->reason()), resp);
  });
}

grpc::Status CoordinatorService::WatchJob(grpc::ServerContext* ctx, const v1::WatchJobRequest* req,
                                          grpc::ServerWriter<v1::JobEvent>* writer) {
  return Handle(ctx, "WatchJob", [&](const Principal& who) -> absl::Status {
    if (auto s = RequireId(req->job_id(), "job_id"); !s.ok()) return s;
    if (auto s = CheckJobAccess(who, req->job_id()); !s.ok()) return s;
    int64_t after = req->after_seq();
    while (!ctx->IsCancelled()) {
      bool ended = false;
      auto events = core()->WaitEvents(req->job_id(), after, /*wait_ms=*/500, &ended);
      if (!events.ok()) return events.status();
      for (const v1::JobEvent& ev : *events) {
        if (!writer->Write(ev)) return absl::CancelledError("watcher went away");
        after = ev.seq();
      }
      if (ended) return absl::OkStatus();
    }
    return absl::CancelledError("watcher went away");
  });
}

grpc::Status CoordinatorService::GetHistory(grpc::ServerContext* ctx,
                                            const v1::GetHistoryRequest* req,
                                            v1::GetHistoryResponse* resp) {
  return Handle(ctx, "GetHistory", [&](const Principal& who) -> absl::Status {
    if (auto s = RequireId(req->job_id(), "job_id"); !s.ok()) return s;
    if (auto s = CheckJobAccess(who, req->job_id()); !s.ok()) return s;
    return Fill(core()->GetHistory(req->job_id()), resp);
  });
}

grpc::Status CoordinatorService::GetPlan(grpc::ServerContext* ctx, const v1::GetPlanRequest* req,
                                         v1::Plan* resp) {
  return Handle(ctx, "GetPlan", [&](const Principal& who) -> absl::Status {
    if (auto s = RequireId(req->job_id(), "job_id"); !s.ok()) return s;
    if (auto s = CheckJobAccess(who, req->job_id()); !s.ok()) return s;
    return Fill(core()->GetPlan(req->job_id()), resp);
  });
}

grpc::Status CoordinatorService::ListCheckpoints(grpc::ServerContext* ctx,
                                                 const v1::ListCheckpointsRequest* req,
                                                 v1::ListCheckpointsResponse* resp) {
  return Handle(ctx, "ListCheckpoints", [&](const Principal& who) -> absl::Status {
    if (auto s = RequireId(req->job_id(), "job_id"); !s.ok()) return s;
    if (auto s = CheckJobAccess(who, req->job_id()); !s.ok()) return s;
    return Fill(core()->ListCheckpoints(req->job_id()), resp);
  });
}

grpc::Status CoordinatorService::ReportStep(grpc::ServerContext* ctx,
                                            const v1::ReportStepRequest* req,
                                            v1::ReportStepResponse* resp) {
  return Handle(ctx, "ReportStep", [&](const Principal& who) -> absl::Status {
    if (auto s = RequireId(req->report().job_id(), "report.job_id"); !s.ok()) return s;
    return Fill(core()->ReportStep(*req), resp);
  });
}

grpc::Status CoordinatorService::ReportCheckpoint(grpc::ServerContext* ctx,
                                                  const v1::ReportCheckpointRequest* req,
                                                  v1::ReportCheckpointResponse* resp) {
  return Handle(ctx, "ReportCheckpoint", [&](const Principal& who) -> absl::Status {
    if (auto s = RequireId(req->shard().job_id(), "shard.job_id"); !s.ok()) return s;
    absl::StatusOr<bool> complete = core()->ReportCheckpoint(*req);
    if (!complete.ok()) return complete.status();
    resp->set_complete(*complete);
    resp->set_coordinator_instance(core()->instance());
    return absl::OkStatus();
  });
}

grpc::Status CoordinatorService::WaitCheckpointShards(grpc::ServerContext* ctx,
                                                      const v1::WaitCheckpointShardsRequest* req,
                                                      v1::WaitCheckpointShardsResponse* resp) {
  return Handle(ctx, "WaitCheckpointShards", [&](const Principal& who) -> absl::Status {
    if (auto s = RequireId(req->job_id(), "job_id"); !s.ok()) return s;
    if (req->wait_ms() < 0 || req->wait_ms() > kMaxWaitMs) {
      return absl::InvalidArgumentError(
          absl::StrCat("wait_ms: ", req->wait_ms(), " is outside 0..", kMaxWaitMs));
    }
    return Fill(core()->WaitCheckpointShards(*req), resp);
  });
}

grpc::Status CoordinatorService::CommitCheckpoint(grpc::ServerContext* ctx,
                                                  const v1::CommitCheckpointRequest* req,
                                                  v1::CommitCheckpointResponse* resp) {
  return Handle(ctx, "CommitCheckpoint", [&](const Principal& who) -> absl::Status {
    if (auto s = RequireId(req->job_id(), "job_id"); !s.ok()) return s;
    return Fill(core()->CommitCheckpoint(*req), resp);
  });
}

grpc::Status CoordinatorService::ReportCheckpointFailure(
    grpc::ServerContext* ctx, const v1::ReportCheckpointFailureRequest* req,
    v1::ReportCheckpointFailureResponse* resp) {
  return Handle(ctx, "ReportCheckpointFailure", [&](const Principal& who) -> absl::Status {
    if (auto s = RequireId(req->job_id(), "job_id"); !s.ok()) return s;
    return Fill(core()->ReportCheckpointFailure(*req), resp);
  });
}

grpc::Status CoordinatorService::ReportDone(grpc::ServerContext* ctx,
                                            const v1::ReportDoneRequest* req,
                                            v1::ReportDoneResponse*) {
  return Handle(ctx, "ReportDone", [&](const Principal& who) -> absl::Status {
    if (auto s = RequireId(req->job_id(), "job_id"); !s.ok()) return s;
    return core()->ReportDone(*req);
  });
}

grpc::Status CoordinatorService::ReportFailure(grpc::ServerContext* ctx,
                                               const v1::ReportFailureRequest* req,
                                               v1::ReportFailureResponse*) {
  return Handle(ctx, "ReportFailure", [&](const Principal& who) -> absl::Status {
    if (auto s = RequireId(req->job_id(), "job_id"); !s.ok()) return s;
    return core()->ReportFailure(*req);
  });
}

grpc::Status CoordinatorService::ReportEvent(grpc::ServerContext* ctx,
                                             const v1::ReportEventRequest* req,
                                             v1::ReportEventResponse*) {
  return Handle(ctx, "ReportEvent", [&](const Principal& who) -> absl::Status {
    if (auto s = RequireId(req->job_id(), "job_id"); !s.ok()) return s;
    return core()->ReportEvent(*req);
  });
}

grpc::Status CoordinatorService::KvSet(grpc::ServerContext* ctx, const v1::KvSetRequest* req,
                                       v1::KvSetResponse*) {
  return Handle(ctx, "KvSet", [&](const Principal& who) -> absl::Status {
    if (auto s = RequireKvKey(req->job_id(), req->key()); !s.ok()) return s;
    if (auto s = core()->CheckLease(req->job_id(), req->generation(), req->lease_token());
        !s.ok()) {
      return s;
    }
    return core()->kv().Set(req->job_id(), req->generation(), req->key(), req->value());
  });
}

grpc::Status CoordinatorService::KvGet(grpc::ServerContext* ctx, const v1::KvGetRequest* req,
                                       v1::KvGetResponse* resp) {
  return Handle(ctx, "KvGet", [&](const Principal& who) -> absl::Status {
    if (auto s = RequireKvKey(req->job_id(), req->key()); !s.ok()) return s;
    if (auto s = core()->CheckKvAccess(req->job_id(), req->generation()); !s.ok()) return s;
    auto v = core()->kv().Get(req->job_id(), req->generation(), req->key(), req->wait_ms());
    if (!v.ok()) return v.status();
    resp->set_value(*std::move(v));
    return absl::OkStatus();
  });
}

grpc::Status CoordinatorService::KvAdd(grpc::ServerContext* ctx, const v1::KvAddRequest* req,
                                       v1::KvAddResponse* resp) {
  return Handle(ctx, "KvAdd", [&](const Principal& who) -> absl::Status {
    if (auto s = RequireKvKey(req->job_id(), req->key()); !s.ok()) return s;
    if (auto s = core()->CheckLease(req->job_id(), req->generation(), req->lease_token());
        !s.ok()) {
      return s;
    }
    auto v = core()->kv().Add(req->job_id(), req->generation(), req->key(), req->delta());
    if (!v.ok()) return v.status();
    resp->set_value(*v);
    return absl::OkStatus();
  });
}

grpc::Status CoordinatorService::GetJobDiagnostics(grpc::ServerContext* ctx,
                                                   const v1::GetJobDiagnosticsRequest* req,
                                                   v1::JobDiagnostics* resp) {
  return Handle(ctx, "GetJobDiagnostics", [&](const Principal& who) -> absl::Status {
    if (auto s = RequireId(req->job_id(), "job_id"); !s.ok()) return s;
    if (auto s = CheckJobAccess(who, req->job_id()); !s.ok()) return s;
    return Fill(core()->GetJobDiagnostics(req->job_id()), resp);
  });
}

void RegisterCoordinatorMetrics(Coordinator* core, MetricsRegistry* registry) {
  Family<Gauge>* workers = &registry->AddGauge("shardtrain_coordinator_workers",
                                               "Attached workers, by liveness state.", {"state"});
  Family<Gauge>* jobs =
      &registry->AddGauge("shardtrain_coordinator_jobs", "Jobs, by state.", {"state"});
  Family<Gauge>* step =
      &registry->AddGauge("shardtrain_coordinator_job_step",
                          "Last step every rank of an active job reported.", {"job_id"});
  Family<Gauge>* total = &registry->AddGauge("shardtrain_coordinator_job_total_steps",
                                             "Steps an active job trains for.", {"job_id"});
  Family<Gauge>* loss = &registry->AddGauge("shardtrain_coordinator_job_loss",
                                            "Loss of an active job's last step.", {"job_id"});
  Family<Counter>* skipped = &registry->AddCounter(
      "shardtrain_coordinator_skipped_steps_total",
      "Optimizer steps of an active job skipped because fp16 gradients overflowed (parameters "
      "unchanged, loss scale halved), as every rank reported them; re-runs after a recovery "
      "count again.",
      {"job_id"});
  Family<Gauge>* committed = &registry->AddGauge(
      "shardtrain_coordinator_job_committed_step",
      "Newest committed checkpoint step of an active job (0: none); the job's step minus this "
      "is what a crash would cost now.",
      {"job_id"});
  Family<Counter>* ckpt_failures = &registry->AddCounter(
      "shardtrain_checkpoint_failures_total",
      "Checkpoints not committed (a rank could not write its shard, or the commit did not "
      "complete), by reason: no_space, read_only, permission_denied, not_a_directory, io_error, "
      "incomplete, other. Kept for an hour after the job ends.",
      {"job_id", "reason"});
  auto exported_failures = std::make_shared<std::set<std::pair<std::string, std::string>>>();
  registry->AddCollector([core, workers, jobs, step, total, loss, skipped, committed, ckpt_failures,
                          exported_failures] {
    // The core's counts only grow: each counter catches up with its count;
    // a series the core no longer reports (its job ended long ago) goes.
    std::set<std::pair<std::string, std::string>> now;
    for (const auto& [job_id, by_reason] : core->CheckpointFailuresByJob()) {
      for (const auto& [reason, n] : by_reason) {
        Counter& c = ckpt_failures->WithLabels({job_id, reason});
        c.Increment(static_cast<double>(n) - c.Value());
        now.insert({job_id, reason});
      }
    }
    for (const auto& [job_id, reason] : *exported_failures) {
      if (!now.count({job_id, reason})) ckpt_failures->Remove({job_id, reason});
    }
    *exported_failures = std::move(now);
    for (const auto& [state, n] : core->WorkerCountsByState()) workers->WithLabels({state}).Set(n);
    for (const auto& [state, n] : core->JobCountsByState()) jobs->WithLabels({state}).Set(n);
    std::vector<v1::Job> all;
    v1::ListJobsRequest page;
    page.set_page_size(1000);
    do {
      absl::StatusOr<v1::ListJobsResponse> r = core->ListJobs(page);
      if (!r.ok()) break;
      all.insert(all.end(), r->jobs().begin(), r->jobs().end());
      page.set_page_token(r->next_page_token());
    } while (!page.page_token().empty());
    const std::map<std::string, int64_t> skipped_steps = core->SkippedStepsOfActiveJobs();
    for (const v1::Job& j : all) {
      // Only active jobs are exported, so the label set stays small.
      if (IsTerminal(j.state())) {
        step->Remove({j.job_id()});
        total->Remove({j.job_id()});
        loss->Remove({j.job_id()});
        skipped->Remove({j.job_id()});
        committed->Remove({j.job_id()});
        continue;
      }
      // The core's count only grows: the counter catches up with it.
      if (auto it = skipped_steps.find(j.job_id()); it != skipped_steps.end()) {
        Counter& c = skipped->WithLabels({j.job_id()});
        c.Increment(static_cast<double>(it->second) - c.Value());
      }
      step->WithLabels({j.job_id()}).Set(j.progress().step());
      committed->WithLabels({j.job_id()}).Set(j.progress().last_committed_checkpoint_step());
      total->WithLabels({j.job_id()}).Set(j.progress().total_steps());
      // A loss that is not finite (a diverged run, or a forged report) is
      // not a sample: the series is dropped rather than exported as NaN.
      if (std::isfinite(j.progress().loss())) {
        loss->WithLabels({j.job_id()}).Set(j.progress().loss());
      } else {
        loss->Remove({j.job_id()});
      }
    }
  });
}

}  // namespace shardtrain::coordinator
