#include "coordinator/service.h"

#include <chrono>
#include <exception>
#include <iostream>
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

CoordinatorService::CoordinatorService(Coordinator* core, MetricsRegistry* registry)
    : core_(core),
      rpcs_(registry->AddCounter("shardtrain_coordinator_rpc_total",
                                 "RPCs handled, by method and status code.", {"method", "code"})),
      latency_(registry->AddHistogram("shardtrain_coordinator_rpc_latency_seconds",
                                      "Time to handle an RPC (server side), by method.", {"method"},
                                      ExponentialBuckets(0.00005, 2, 18))) {}

template <typename Fn>
grpc::Status CoordinatorService::Handle(const char* method, Fn&& fn) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status s;
  try {
    s = fn();
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

grpc::Status CoordinatorService::RegisterWorker(grpc::ServerContext*,
                                                const v1::RegisterWorkerRequest* req,
                                                v1::RegisterWorkerResponse* resp) {
  return Handle("RegisterWorker", [&] { return Fill(core_->RegisterWorker(*req), resp); });
}

grpc::Status CoordinatorService::Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* req,
                                           v1::HeartbeatResponse* resp) {
  return Handle("Heartbeat", [&]() -> absl::Status {
    if (auto s = RequireId(req->worker_id(), "worker_id"); !s.ok()) return s;
    return Fill(core_->Heartbeat(*req), resp);
  });
}

grpc::Status CoordinatorService::ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*,
                                             v1::ListWorkersResponse* resp) {
  return Handle("ListWorkers", [&] {
    *resp = core_->ListWorkers();
    return absl::OkStatus();
  });
}

grpc::Status CoordinatorService::SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest* req,
                                           v1::SubmitJobResponse* resp) {
  return Handle("SubmitJob", [&]() -> absl::Status {
    if (req->spec_yaml().empty()) return absl::InvalidArgumentError("spec: the spec is empty");
    absl::StatusOr<v1::Job> job = core_->SubmitJob(*req);
    if (!job.ok()) return job.status();
    *resp->mutable_job() = *std::move(job);
    return absl::OkStatus();
  });
}

grpc::Status CoordinatorService::GetJob(grpc::ServerContext*, const v1::GetJobRequest* req,
                                        v1::Job* resp) {
  return Handle("GetJob", [&]() -> absl::Status {
    if (auto s = RequireId(req->job_id(), "job_id"); !s.ok()) return s;
    return Fill(core_->GetJob(req->job_id()), resp);
  });
}

grpc::Status CoordinatorService::ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* req,
                                          v1::ListJobsResponse* resp) {
  return Handle("ListJobs", [&] { return Fill(core_->ListJobs(*req), resp); });
}

grpc::Status CoordinatorService::CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* req,
                                           v1::Job* resp) {
  return Handle("CancelJob", [&]() -> absl::Status {
    if (auto s = RequireId(req->job_id(), "job_id"); !s.ok()) return s;
    return Fill(core_->CancelJob(req->job_id(), req->reason()), resp);
  });
}

grpc::Status CoordinatorService::WatchJob(grpc::ServerContext* ctx, const v1::WatchJobRequest* req,
                                          grpc::ServerWriter<v1::JobEvent>* writer) {
  return Handle("WatchJob", [&]() -> absl::Status {
    if (auto s = RequireId(req->job_id(), "job_id"); !s.ok()) return s;
    int64_t after = req->after_seq();
    while (!ctx->IsCancelled()) {
      bool ended = false;
      auto events = core_->WaitEvents(req->job_id(), after, /*wait_ms=*/500, &ended);
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

grpc::Status CoordinatorService::GetHistory(grpc::ServerContext*, const v1::GetHistoryRequest* req,
                                            v1::GetHistoryResponse* resp) {
  return Handle("GetHistory", [&]() -> absl::Status {
    if (auto s = RequireId(req->job_id(), "job_id"); !s.ok()) return s;
    return Fill(core_->GetHistory(req->job_id()), resp);
  });
}

grpc::Status CoordinatorService::GetPlan(grpc::ServerContext*, const v1::GetPlanRequest* req,
                                         v1::Plan* resp) {
  return Handle("GetPlan", [&]() -> absl::Status {
    if (auto s = RequireId(req->job_id(), "job_id"); !s.ok()) return s;
    return Fill(core_->GetPlan(req->job_id()), resp);
  });
}

grpc::Status CoordinatorService::ListCheckpoints(grpc::ServerContext*,
                                                 const v1::ListCheckpointsRequest* req,
                                                 v1::ListCheckpointsResponse* resp) {
  return Handle("ListCheckpoints", [&]() -> absl::Status {
    if (auto s = RequireId(req->job_id(), "job_id"); !s.ok()) return s;
    return Fill(core_->ListCheckpoints(req->job_id()), resp);
  });
}

grpc::Status CoordinatorService::ReportStep(grpc::ServerContext*, const v1::ReportStepRequest* req,
                                            v1::ReportStepResponse* resp) {
  return Handle("ReportStep", [&]() -> absl::Status {
    if (auto s = RequireId(req->report().job_id(), "report.job_id"); !s.ok()) return s;
    return Fill(core_->ReportStep(*req), resp);
  });
}

grpc::Status CoordinatorService::ReportCheckpoint(grpc::ServerContext*,
                                                  const v1::ReportCheckpointRequest* req,
                                                  v1::ReportCheckpointResponse* resp) {
  return Handle("ReportCheckpoint", [&]() -> absl::Status {
    if (auto s = RequireId(req->shard().job_id(), "shard.job_id"); !s.ok()) return s;
    absl::StatusOr<bool> complete = core_->ReportCheckpoint(*req);
    if (!complete.ok()) return complete.status();
    resp->set_complete(*complete);
    return absl::OkStatus();
  });
}

grpc::Status CoordinatorService::WaitCheckpointShards(grpc::ServerContext*,
                                                      const v1::WaitCheckpointShardsRequest* req,
                                                      v1::WaitCheckpointShardsResponse* resp) {
  return Handle("WaitCheckpointShards", [&]() -> absl::Status {
    if (auto s = RequireId(req->job_id(), "job_id"); !s.ok()) return s;
    if (req->wait_ms() < 0 || req->wait_ms() > kMaxWaitMs) {
      return absl::InvalidArgumentError(
          absl::StrCat("wait_ms: ", req->wait_ms(), " is outside 0..", kMaxWaitMs));
    }
    return Fill(core_->WaitCheckpointShards(*req), resp);
  });
}

grpc::Status CoordinatorService::CommitCheckpoint(grpc::ServerContext*,
                                                  const v1::CommitCheckpointRequest* req,
                                                  v1::CommitCheckpointResponse* resp) {
  return Handle("CommitCheckpoint", [&]() -> absl::Status {
    if (auto s = RequireId(req->job_id(), "job_id"); !s.ok()) return s;
    return Fill(core_->CommitCheckpoint(*req), resp);
  });
}

grpc::Status CoordinatorService::ReportDone(grpc::ServerContext*, const v1::ReportDoneRequest* req,
                                            v1::ReportDoneResponse*) {
  return Handle("ReportDone", [&]() -> absl::Status {
    if (auto s = RequireId(req->job_id(), "job_id"); !s.ok()) return s;
    return core_->ReportDone(*req);
  });
}

grpc::Status CoordinatorService::ReportFailure(grpc::ServerContext*,
                                               const v1::ReportFailureRequest* req,
                                               v1::ReportFailureResponse*) {
  return Handle("ReportFailure", [&]() -> absl::Status {
    if (auto s = RequireId(req->job_id(), "job_id"); !s.ok()) return s;
    return core_->ReportFailure(*req);
  });
}

grpc::Status CoordinatorService::ReportEvent(grpc::ServerContext*,
                                             const v1::ReportEventRequest* req,
                                             v1::ReportEventResponse*) {
  return Handle("ReportEvent", [&]() -> absl::Status {
    if (auto s = RequireId(req->job_id(), "job_id"); !s.ok()) return s;
    return core_->ReportEvent(*req);
  });
}

grpc::Status CoordinatorService::KvSet(grpc::ServerContext*, const v1::KvSetRequest* req,
                                       v1::KvSetResponse*) {
  return Handle("KvSet", [&]() -> absl::Status {
    if (auto s = RequireKvKey(req->job_id(), req->key()); !s.ok()) return s;
    if (auto s = core_->CheckKvAccess(req->job_id(), req->generation()); !s.ok()) return s;
    return core_->kv().Set(req->job_id(), req->generation(), req->key(), req->value());
  });
}

grpc::Status CoordinatorService::KvGet(grpc::ServerContext*, const v1::KvGetRequest* req,
                                       v1::KvGetResponse* resp) {
  return Handle("KvGet", [&]() -> absl::Status {
    if (auto s = RequireKvKey(req->job_id(), req->key()); !s.ok()) return s;
    if (auto s = core_->CheckKvAccess(req->job_id(), req->generation()); !s.ok()) return s;
    auto v = core_->kv().Get(req->job_id(), req->generation(), req->key(), req->wait_ms());
    if (!v.ok()) return v.status();
    resp->set_value(*std::move(v));
    return absl::OkStatus();
  });
}

grpc::Status CoordinatorService::KvAdd(grpc::ServerContext*, const v1::KvAddRequest* req,
                                       v1::KvAddResponse* resp) {
  return Handle("KvAdd", [&]() -> absl::Status {
    if (auto s = RequireKvKey(req->job_id(), req->key()); !s.ok()) return s;
    if (auto s = core_->CheckKvAccess(req->job_id(), req->generation()); !s.ok()) return s;
    auto v = core_->kv().Add(req->job_id(), req->generation(), req->key(), req->delta());
    if (!v.ok()) return v.status();
    resp->set_value(*v);
    return absl::OkStatus();
  });
}

void RegisterCoordinatorMetrics(Coordinator* core, MetricsRegistry* registry) {
  Family<Gauge>* workers = &registry->AddGauge("shardtrain_coordinator_workers",
                                               "Attached workers, by liveness state.", {"state"});
  Family<Gauge>* jobs =
      &registry->AddGauge("shardtrain_coordinator_jobs", "Jobs, by state.", {"state"});
  Family<Gauge>* step =
      &registry->AddGauge("shardtrain_coordinator_job_step",
                          "Last step every rank of an active job reported.", {"job"});
  Family<Gauge>* total = &registry->AddGauge("shardtrain_coordinator_job_total_steps",
                                             "Steps an active job trains for.", {"job"});
  Family<Gauge>* loss = &registry->AddGauge("shardtrain_coordinator_job_loss",
                                            "Loss of an active job's last step.", {"job"});
  registry->AddCollector([core, workers, jobs, step, total, loss] {
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
    for (const v1::Job& j : all) {
      // Only active jobs are exported, so the label set stays small.
      if (IsTerminal(j.state())) {
        step->Remove({j.job_id()});
        total->Remove({j.job_id()});
        loss->Remove({j.job_id()});
        continue;
      }
      step->WithLabels({j.job_id()}).Set(j.progress().step());
      total->WithLabels({j.job_id()}).Set(j.progress().total_steps());
      loss->WithLabels({j.job_id()}).Set(j.progress().loss());
    }
  });
}

}  // namespace shardtrain::coordinator
