// libFuzzer target: the coordinator's request handlers, driven on the core
// object (no network server) over an in-memory state store and a fake clock.
//
// Input: a sequence of calls, each {uint8 op, uint16 length (little-endian),
// length bytes}. `op` (mod kNumOps) picks the handler; the bytes are the
// request message in protobuf wire format (what a client would send). Ids
// the fuzzer cannot guess are filled in, at any depth of the request: a
// job_id "$" names the job submitted last; an empty worker_id the worker
// registered last, and a one-character worker_id "0".."9" the n-th one
// registered. Waits (wait_ms) are zeroed so a call never blocks. Secrets
// left empty are filled in as the real worker would present them (its
// registration secret, its assignment's lease token, derived from the one
// key the fuzzed coordinator uses), so fenced calls reach their handlers;
// non-empty ones stay, for the refusal paths.
// tests/fuzz/make_seeds.py writes the seed corpus from text-format requests.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/clock.h"
#include "coordinator/coordinator.h"
#include "coordinator/fencing.h"
#include "coordinator/spec_validator.h"
#include "coordinator/state_store.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/stubs/logging.h"
#include "shardtrain/v1/coordinator.pb.h"

namespace shardtrain::coordinator {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

enum Op : uint8_t {
  kRegister,
  kHeartbeat,
  kListWorkers,
  kTick,
  kSubmit,
  kGetJob,
  kListJobs,
  kCancel,
  kWaitEvents,
  kGetHistory,
  kGetPlan,
  kReportStep,
  kReportDone,
  kReportCheckpoint,
  kWaitShards,
  kCommit,
  kListCheckpoints,
  kReportFailure,
  kReportEvent,
  kKvSet,
  kKvGet,
  kKvAdd,
  kAdvanceClock,
  kJobDiagnostics,
  kNumOps
};

struct Ids {
  std::string last_job;
  std::vector<std::string> workers;
};

const FencingKey& Key() {
  static const FencingKey key = FencingKey::Random();
  return key;
}

std::string StringField(const Message& m, const char* name) {
  const FieldDescriptor* f = m.GetDescriptor()->FindFieldByName(name);
  if (!f || f->is_repeated() || f->cpp_type() != FieldDescriptor::CPPTYPE_STRING) return "";
  return m.GetReflection()->GetString(m, f);
}

int64_t Int64Field(const Message& m, const char* name) {
  const FieldDescriptor* f = m.GetDescriptor()->FindFieldByName(name);
  if (!f || f->is_repeated() || f->cpp_type() != FieldDescriptor::CPPTYPE_INT64) return 0;
  return m.GetReflection()->GetInt64(m, f);
}

// An empty worker_secret or lease_token of `m` (a request, after FillIn)
// becomes the right one. The job and generation of a lease token are the
// request's own, or those of its report/shard.
void FillInSecrets(Message* m) {
  const Reflection* r = m->GetReflection();
  const auto* d = m->GetDescriptor();
  if (const FieldDescriptor* f = d->FindFieldByName("worker_secret");
      f && r->GetString(*m, f).empty()) {
    std::string id = StringField(*m, "worker_id");
    if (id.empty()) id = StringField(*m, "previous_worker_id");
    r->SetString(m, f, Key().WorkerSecret(id));
  }
  if (const FieldDescriptor* f = d->FindFieldByName("lease_token");
      f && r->GetString(*m, f).empty()) {
    const Message* holder = m;
    for (const char* inner : {"report", "shard"}) {
      const FieldDescriptor* g = d->FindFieldByName(inner);
      if (g && g->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) holder = &r->GetMessage(*m, g);
    }
    r->SetString(
        m, f, Key().LeaseToken(StringField(*holder, "job_id"), Int64Field(*holder, "generation")));
  }
}

// Fills in the ids and zeroes the waits of `m` and every message inside it.
void FillIn(Message* m, const Ids& ids) {
  const Reflection* r = m->GetReflection();
  std::vector<const FieldDescriptor*> fields;
  const auto* d = m->GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) {
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        for (int k = 0; k < r->FieldSize(*m, f); ++k)
          FillIn(r->MutableRepeatedMessage(m, f, k), ids);
      }
      continue;
    }
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (r->HasField(*m, f)) FillIn(r->MutableMessage(m, f), ids);
    } else if (f->name() == "wait_ms" && f->cpp_type() == FieldDescriptor::CPPTYPE_INT64) {
      r->SetInt64(m, f, 0);
    } else if (f->name() == "job_id" && f->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
      if (r->GetString(*m, f) == "$") r->SetString(m, f, ids.last_job);
    } else if ((f->name() == "worker_id" || f->name() == "previous_worker_id") &&
               f->cpp_type() == FieldDescriptor::CPPTYPE_STRING && !ids.workers.empty()) {
      const std::string v = r->GetString(*m, f);
      if (v.empty() && f->name() == "worker_id") {
        r->SetString(m, f, ids.workers.back());
      } else if (v.size() == 1 && v[0] >= '0' && v[0] <= '9') {
        r->SetString(m, f, ids.workers[size_t(v[0] - '0') % ids.workers.size()]);
      }
    }
  }
}

template <typename Req>
bool Decode(const uint8_t* p, size_t n, const Ids& ids, Req* req) {
  if (!req->ParseFromArray(p, int(n))) return false;
  FillIn(req, ids);
  FillInSecrets(req);
  return true;
}

void RunCall(Coordinator& c, FakeClock& clock, Ids& ids, uint8_t op, const uint8_t* p, size_t n) {
  switch (op % kNumOps) {
    case kRegister: {
      v1::RegisterWorkerRequest req;
      if (!Decode(p, n, ids, &req)) return;
      auto r = c.RegisterWorker(req);
      if (r.ok() && ids.workers.size() < 64) ids.workers.push_back(r->worker_id());
      return;
    }
    case kHeartbeat: {
      v1::HeartbeatRequest req;
      if (Decode(p, n, ids, &req)) c.Heartbeat(req).IgnoreError();
      return;
    }
    case kListWorkers:
      c.ListWorkers();
      return;
    case kTick:
      c.Tick();
      return;
    case kSubmit: {
      v1::SubmitJobRequest req;
      if (!Decode(p, n, ids, &req)) return;
      auto r = c.SubmitJob(req);
      if (r.ok()) ids.last_job = r->job_id();
      return;
    }
    case kGetJob: {
      v1::GetJobRequest req;
      if (Decode(p, n, ids, &req)) c.GetJob(req.job_id()).IgnoreError();
      return;
    }
    case kListJobs: {
      v1::ListJobsRequest req;
      if (Decode(p, n, ids, &req)) c.ListJobs(req).status().IgnoreError();
      return;
    }
    case kCancel: {
      v1::CancelJobRequest req;
      if (Decode(p, n, ids, &req)) c.CancelJob(req.job_id(), req.reason()).IgnoreError();
      return;
    }
    case kWaitEvents: {
      v1::WatchJobRequest req;
      bool ended = false;
      if (Decode(p, n, ids, &req))
        c.WaitEvents(req.job_id(), req.after_seq(), 0, &ended).IgnoreError();
      return;
    }
    case kGetHistory: {
      v1::GetHistoryRequest req;
      if (Decode(p, n, ids, &req)) c.GetHistory(req.job_id()).IgnoreError();
      return;
    }
    case kGetPlan: {
      v1::GetPlanRequest req;
      if (Decode(p, n, ids, &req)) c.GetPlan(req.job_id()).IgnoreError();
      return;
    }
    case kReportStep: {
      v1::ReportStepRequest req;
      if (Decode(p, n, ids, &req)) c.ReportStep(req).IgnoreError();
      return;
    }
    case kReportDone: {
      v1::ReportDoneRequest req;
      if (Decode(p, n, ids, &req)) c.ReportDone(req).IgnoreError();
      return;
    }
    case kReportCheckpoint: {
      v1::ReportCheckpointRequest req;
      if (Decode(p, n, ids, &req)) c.ReportCheckpoint(req).IgnoreError();
      return;
    }
    case kWaitShards: {
      v1::WaitCheckpointShardsRequest req;
      if (Decode(p, n, ids, &req)) c.WaitCheckpointShards(req).IgnoreError();
      return;
    }
    case kCommit: {
      v1::CommitCheckpointRequest req;
      if (Decode(p, n, ids, &req)) c.CommitCheckpoint(req).IgnoreError();
      return;
    }
    case kListCheckpoints: {
      v1::ListCheckpointsRequest req;
      if (Decode(p, n, ids, &req)) c.ListCheckpoints(req.job_id()).IgnoreError();
      return;
    }
    case kReportFailure: {
      v1::ReportFailureRequest req;
      if (Decode(p, n, ids, &req)) c.ReportFailure(req).IgnoreError();
      return;
    }
    case kReportEvent: {
      v1::ReportEventRequest req;
      if (Decode(p, n, ids, &req)) c.ReportEvent(req).IgnoreError();
      return;
    }
    case kKvSet: {
      v1::KvSetRequest req;
      if (Decode(p, n, ids, &req))
        c.kv().Set(req.job_id(), req.generation(), req.key(), req.value()).IgnoreError();
      return;
    }
    case kKvGet: {
      v1::KvGetRequest req;
      if (Decode(p, n, ids, &req))
        c.kv().Get(req.job_id(), req.generation(), req.key(), 0).IgnoreError();
      return;
    }
    case kKvAdd: {
      v1::KvAddRequest req;
      if (Decode(p, n, ids, &req)) {
        c.kv().Add(req.job_id(), req.generation(), req.key(), req.delta()).IgnoreError();
      }
      return;
    }
    case kAdvanceClock:  // up to ~65 s: enough to run out any lease
      clock.AdvanceMs(n == 0 ? 1000 : int64_t(p[0]) * 256 + (n > 1 ? p[1] : 0));
      return;
    case kJobDiagnostics: {
      v1::GetJobDiagnosticsRequest req;
      if (Decode(p, n, ids, &req)) c.GetJobDiagnostics(req.job_id()).IgnoreError();
      return;
    }
  }
}

}  // namespace
}  // namespace shardtrain::coordinator

// Protobuf logs every string field with invalid UTF-8 it parses: silenced,
// so the fuzzer spends its time running calls, not writing logs.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardtrain::coordinator;
  FakeClock clock;
  CoordinatorOptions options;
  options.fencing_key = Key();
  auto c = Coordinator::Create(options, NewMemoryStateStore(), ValidateSpec, &clock);
  if (!c.ok()) __builtin_trap();
  Ids ids;
  size_t at = 0;
  while (at + 3 <= size) {
    const uint8_t op = data[at];
    const size_t n =
        std::min<size_t>(size_t(data[at + 1]) | size_t(data[at + 2]) << 8, size - at - 3);
    RunCall(**c, clock, ids, op, data + at + 3, n);
    at += 3 + n;
  }
  (*c)->Shutdown();
  return 0;
}
