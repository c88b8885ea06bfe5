#include "client/commands.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/errors.h"
#include "client/eta.h"
#include "client/output.h"
#include "client/pictures.h"
#include "client/why.h"
#include "common/auto_layout.h"
#include "common/device_peaks.h"
#include "common/grpc_status.h"
#include "common/job_spec.h"
#include "common/planner.h"
#include "common/process.h"
#include "common/storage_fault.h"
#include "worker/checkpoint/hf_config.h"
#include "worker/coordinator_client.h"

namespace shardtrain::client {
namespace {

using worker::CoordinatorClient;

// Submit attempts while the coordinator answers UNAVAILABLE (0.5 s, then
// 1 s between them).
constexpr int kSubmitAttempts = 3;

// 128 random bits as hex: a SubmitJob idempotency key.
std::string RandomIdempotencyKey() {
  std::random_device rd;
  std::string key;
  for (int i = 0; i < 4; ++i) absl::StrAppend(&key, absl::Hex(rd(), absl::kZeroPad8));
  return key;
}

std::unique_ptr<grpc::ClientContext> Ctx(const GlobalFlags& g) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(g.timeout_ms));
  return ctx;
}

// One unary call with the --timeout-ms deadline. `what`, when set, prefixes
// the error message (the spec file a refusal is about).
template <typename Req, typename Resp, typename Method>
absl::Status Call(const GlobalFlags& g, Method method, const Req& req, Resp* resp,
                  const std::string& what = "") {
  CoordinatorClient client(g.coordinator, g.timeout_ms, g.connect);
  return FromGrpcStatus(client.Invoke([&](v1::Coordinator::Stub& stub, grpc::ClientContext* ctx) {
    return (stub.*method)(ctx, req, resp);
  }),
                        what);
}

// Warns (Warn: stderr, JSON with -o json) when `job`'s checkpoint.dir is relative while the alive
// workers resolve relative dirs against different checkpoint roots: its
// ranks would then write to different places and recovery would not find
// their checkpoints. Best effort: silent when the workers cannot be listed.
void WarnOnSplitCheckpointRoots(const GlobalFlags& g, const v1::Job& job) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(job.spec_yaml());
  if (!spec.ok() || spec->checkpoint.dir.empty() || spec->checkpoint.dir.front() == '/') return;
  v1::ListWorkersResponse resp;
  if (!Call(g, &v1::Coordinator::Stub::ListWorkers, v1::ListWorkersRequest(), &resp, "ListWorkers")
           .ok()) {
    return;
  }
  std::map<std::string, std::vector<std::string>> by_root;  // root -> worker ids
  for (const v1::WorkerInfo& w : resp.workers()) {
    if (w.state() == v1::WORKER_STATE_ALIVE && !w.checkpoint_root().empty()) {
      by_root[w.checkpoint_root()].push_back(w.worker_id());
    }
  }
  if (by_root.size() < 2) return;
  std::vector<std::string> groups;
  for (const auto& [root, ids] : by_root) {
    groups.push_back(absl::StrCat(absl::StrJoin(ids, ", "), ": ", root));
  }
  Warn(g, absl::StrCat("checkpoint.dir ", spec->checkpoint.dir,
                       " is relative, and the alive workers resolve it against different "
                       "checkpoint roots (",
                       absl::StrJoin(groups, "; "),
                       "). All ranks of a job must see one checkpoint.dir, or recovery cannot "
                       "find their checkpoints: start the workers with one --checkpoint-root on "
                       "a shared volume, or give an absolute checkpoint.dir that every worker "
                       "mounts."));
}

// CheckpointSpaceWarning for a submitted job, when an alive worker runs on
// this machine (then its checkpoint.dir here is the workers'): a relative
// dir resolved against that worker's checkpoint root. Best effort: silent
// when the workers cannot be listed or none is local.
void WarnOnCheckpointSpace(const GlobalFlags& g, const v1::Job& job) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(job.spec_yaml());
  if (!spec.ok() || spec->checkpoint.dir.empty()) return;
  v1::ListWorkersResponse resp;
  if (!Call(g, &v1::Coordinator::Stub::ListWorkers, v1::ListWorkersRequest(), &resp, "ListWorkers")
           .ok()) {
    return;
  }
  const std::string here = HostName();
  for (const v1::WorkerInfo& w : resp.workers()) {
    if (w.state() != v1::WORKER_STATE_ALIVE || w.host() != here) continue;
    const std::string& dir = spec->checkpoint.dir;
    const std::string local = dir.front() == '/' || w.checkpoint_root().empty()
                                  ? dir
                                  : absl::StrCat(w.checkpoint_root(), "/", dir);
    if (std::string warning = CheckpointSpaceWarning(*spec, local); !warning.empty()) {
      Warn(g, warning);
    }
    return;
  }
}

absl::StatusOr<v1::Job> GetJob(const GlobalFlags& g, const std::string& id) {
  v1::GetJobRequest req;
  req.set_job_id(id);
  v1::Job job;
  if (auto s = Call(g, &v1::Coordinator::Stub::GetJob, req, &job); !s.ok()) return s;
  return job;
}

}  // namespace

int ReportError(const GlobalFlags& g, const absl::Status& s) {
  const CliError e = Describe(s, g.coordinator, g.timeout_ms);
  if (g.output == "json") {
    std::cerr << ErrorJson(e) << std::endl;
  } else {
    std::cerr << ErrorText(e, g.verbose) << std::flush;
  }
  return ExitCodeFor(s.code());
}

void Warn(const GlobalFlags& g, const std::string& message) {
  if (g.output == "json") {
    std::cerr << WarningJson(message) << std::endl;
  } else {
    std::cerr << "shardtrain: warning: " << message << std::endl;
  }
}

std::string CheckpointDirWarning(const JobSpec& spec) {
  if (!spec.checkpoint.dir.empty()) return "";
  return "no checkpoint.dir: the trained weights will not be saved; set checkpoint.dir (or "
         "--set checkpoint.dir=DIR) to keep them";
}

std::string CheckpointSpaceWarning(const JobSpec& spec, const std::string& dir) {
  if (spec.checkpoint.dir.empty()) return "";
  absl::StatusOr<v1::Plan> plan = MakePlan(spec, spec.World());
  absl::StatusOr<int64_t> free = FreeBytesAt(dir);
  if (!plan.ok() || !free.ok()) return "";
  const bool checkpoints = spec.checkpoint.every > 0;
  const int64_t needed = checkpoints ? 2 * plan->checkpoint_bytes() : FinalWeightsBytes(spec);
  if (*free >= needed) return "";
  return absl::StrCat(
      "checkpoint.dir ", dir, " has ", FormatStorageBytes(*free), " free, less than ",
      checkpoints ? absl::StrCat("two checkpoints of this job (2 × ",
                                 FormatStorageBytes(plan->checkpoint_bytes()), ")")
                  : absl::StrCat("the final weights (", FormatStorageBytes(needed), ")"),
      ": ",
      checkpoints ? "checkpoints will not be committed once it is full (checkpoint.on_failure)"
                  : "they will not be saved",
      ". Free space, or set checkpoint.dir to a larger volume; `shardtrain plan` shows the sizes");
}

std::string ValidationWarning(const JobSpec& spec) {
  if (spec.data.val.empty() || spec.eval.every != spec.steps || spec.steps == 1) return "";
  return "data.val: validation runs after the last step only (eval.every = steps); set "
         "eval.every (or --set eval.every=N) to evaluate every N steps";
}

std::string FinetuneWarning(const JobSpec& spec) {
  if (!spec.finetune.lora.on() || !spec.model.init.empty()) return "";
  return "finetune.lora without model.init: the adapters train on a randomly initialised model; "
         "set model.init to the checkpoint to fine-tune";
}

absl::Status ReadSpec(const std::string& path, std::string* text) {
  absl::Status s = ReadFile(path, text);
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("spec file: ", s.message()));
  return absl::OkStatus();
}

absl::Status AddModelFromInit(const GlobalFlags& g, const std::string& spec_text,
                              std::vector<std::string>* sets) {
  absl::StatusOr<ModelFromInit> from = ModelShapeFromInit(spec_text, *sets);
  if (!from.ok() || from->init.empty()) return absl::OkStatus();  // ParseJobSpec says what is wrong
  const std::string path = checkpoint::HfConfigPathOf(from->init);
  std::string json;
  if (absl::Status s = ReadFile(path, &json); !s.ok()) {
    // A spec that describes its model may init from our own checkpoint.
    if (!from->shape_from_init) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "model.init: the spec names no model shape, and its config.json cannot be read here (",
        s.message(), "): set model.preset or the model's fields, or run from where ", from->init,
        " is"));
  }
  std::vector<std::string> added;
  if (from->shape_from_init) {
    auto fields = checkpoint::ModelFieldsFromHfConfig(json);
    if (!fields.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.init: ", path, ": ", fields.status().message()));
    }
    for (const auto& [key, value] : *fields) {
      if (absl::c_linear_search(from->keys_set, key)) continue;
      sets->push_back(absl::StrCat("model.", key, "=", value));
      added.push_back(absl::StrCat(key, " ", value));
    }
  }
  // A checkpoint that is not one of ours or fails to parse: its reader says why.
  absl::StatusOr<std::optional<std::string>> aux = checkpoint::HfRouterAuxLossCoef(json);
  if (!from->aux_loss_coef_set && aux.ok() && aux->has_value()) {
    const std::string& coef = **aux;
    sets->push_back(absl::StrCat("router.aux_loss_coef=", coef));
    added.push_back(absl::StrCat("router.aux_loss_coef ", coef,
                                 " (router_aux_loss_coef × top_k / MoE layers)"));
  }
  if (g.output != "json" && !added.empty()) {
    std::cerr << "shardtrain: model from " << path << ": " << absl::StrJoin(added, ", ")
              << std::endl;
  }
  return absl::OkStatus();
}

int Submit(const GlobalFlags& g, const std::string& spec_path, std::vector<std::string> sets,
           const std::string& resume_from, bool wait) {
  v1::SubmitJobRequest req;
  if (auto s = ReadSpec(spec_path, req.mutable_spec_yaml()); !s.ok()) return ReportError(g, s);
  if (auto s = AddModelFromInit(g, req.spec_yaml(), &sets); !s.ok()) return ReportError(g, s);
  for (const auto& kv : sets) req.add_overrides(kv);
  req.set_resume_from(resume_from);
  // One key per invocation: a retry after UNAVAILABLE (the answer may have
  // been lost after the coordinator stored the job) returns the same job.
  req.set_idempotency_key(RandomIdempotencyKey());
  v1::SubmitJobResponse resp;
  absl::Status s;
  for (int attempt = 0; attempt < kSubmitAttempts; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(500 << (attempt - 1)));
    s = Call(g, &v1::Coordinator::Stub::SubmitJob, req, &resp, spec_path);
    if (!absl::IsUnavailable(s)) break;
  }
  if (!s.ok()) return ReportError(g, s);
  if (g.output == "json") {
    std::cout << JobJson(resp.job()) << std::endl;
  } else {
    std::cout << resp.job().job_id() << std::endl;
  }
  // The coordinator accepted the spec, so it parses here too.
  if (auto spec = ParseJobSpec(req.spec_yaml(), sets); spec.ok()) {
    if (std::string w = CheckpointDirWarning(*spec); !w.empty()) Warn(g, w);
    if (std::string w = ValidationWarning(*spec); !w.empty()) Warn(g, w);
    if (std::string w = FinetuneWarning(*spec); !w.empty()) Warn(g, w);
  }
  WarnOnSplitCheckpointRoots(g, resp.job());
  WarnOnCheckpointSpace(g, resp.job());
  return wait ? Watch(g, resp.job().job_id()) : 0;
}

int List(const GlobalFlags& g) {
  // Every page, in submission order.
  v1::ListJobsResponse resp;
  v1::ListJobsRequest req;
  req.set_page_size(500);
  do {
    v1::ListJobsResponse page;
    if (auto s = Call(g, &v1::Coordinator::Stub::ListJobs, req, &page); !s.ok()) {
      return ReportError(g, s);
    }
    for (v1::Job& j : *page.mutable_jobs()) *resp.add_jobs() = std::move(j);
    req.set_page_token(page.next_page_token());
  } while (!req.page_token().empty());
  if (g.output == "json") {
    std::string out = "{\"jobs\": [";
    for (int i = 0; i < resp.jobs_size(); ++i) {
      absl::StrAppend(&out, i ? ", " : "", JobJson(resp.jobs(i)));
    }
    std::cout << out << "]}" << std::endl;
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& j : resp.jobs()) {
    rows.push_back({j.job_id(), j.name(), StateName(j.state()), absl::StrCat(j.world()),
                    absl::StrCat(j.progress().step(), "/", j.progress().total_steps()),
                    j.progress().step() > 0 ? absl::StrFormat("%.4f", j.progress().loss()) : "-",
                    j.pending_reason().empty() ? "-" : j.pending_reason()});
  }
  std::cout << FormatTable({"JOB", "NAME", "STATE", "WORLD", "STEP", "LOSS", "WAITING"}, rows);
  return 0;
}

int Status(const GlobalFlags& g, const std::string& job_id) {
  auto job = GetJob(g, job_id);
  if (!job.ok()) return ReportError(g, job.status());
  std::cout << (g.output == "json" ? JobJson(*job) + "\n" : JobText(*job)) << std::flush;
  return 0;
}

int Why(const GlobalFlags& g, const std::string& job_id) {
  v1::GetJobDiagnosticsRequest req;
  req.set_job_id(job_id);
  v1::JobDiagnostics d;
  if (absl::Status s = Call(g, &v1::Coordinator::Stub::GetJobDiagnostics, req, &d); !s.ok()) {
    return ReportError(g, s);
  }
  const WhyVerdict v = AnalyzeWhy(d);
  std::cout << (g.output == "json" ? WhyJson(d, v) + "\n" : WhyText(d, v)) << std::flush;
  return kExitOk;
}

int Watch(const GlobalFlags& g, const std::string& job_id) {
  auto job = GetJob(g, job_id);
  if (!job.ok()) return ReportError(g, job.status());
  const int64_t total = job->progress().total_steps();
  if (g.output != "json" && !LayoutLine(*job).empty()) std::cout << LayoutLine(*job) << std::endl;
  CoordinatorClient client(g.coordinator, g.timeout_ms, g.connect);
  EtaEstimator eta;
  int64_t after = 0;
  bool said = false;  // the move to another coordinator, since the last event
  // The stream ends when the job does; a broken stream is resumed from the
  // last event seen, so a coordinator restart costs a pause, not the watch.
  for (int attempt = 0; attempt < 30; ++attempt) {
    grpc::ClientContext ctx;
    client.Authorize(&ctx);
    v1::WatchJobRequest req;
    req.set_job_id(job_id);
    req.set_after_seq(after);
    auto reader = client.stub().WatchJob(&ctx, req);
    v1::JobEvent ev;
    while (reader->Read(&ev)) {
      after = ev.seq();
      attempt = 0;
      said = false;
      if (g.output == "json") {
        std::cout << "{\"seq\": " << ev.seq()
                  << ", \"state\": " << JsonString(StateName(ev.state()))
                  << ", \"message\": " << JsonString(ev.message())
                  << (ev.has_step() ? ", \"step\": " + StepJson(ev.step()) : "") << "}"
                  << std::endl;
      } else {
        std::cout << EventLine(ev, total, &eta) << std::endl;
      }
    }
    grpc::Status s = reader->Finish();
    if (s.ok()) break;
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE) return ReportError(g, FromGrpcStatus(s));
    // Several coordinators (--coordinator A,B): follow the leader, saying so
    // once per outage (while a standby is being elected the addresses are
    // tried in turn).
    const std::string was = client.current_address();
    if (client.FollowLeader(s) && g.output != "json" && !said) {
      std::cerr << "(the coordinator at " << was << " stopped answering; following the leader)"
                << std::endl;
      said = true;
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  job = GetJob(g, job_id);
  if (!job.ok()) return ReportError(g, job.status());
  return job->state() == v1::JOB_STATE_SUCCEEDED ? kExitOk : kExitFailed;
}

int Cancel(const GlobalFlags& g, const std::string& job_id) {
  v1::CancelJobRequest req;
  req.set_job_id(job_id);
  req.set_reason("shardtrain cancel");
  v1::Job job;
  if (auto s = Call(g, &v1::Coordinator::Stub::CancelJob, req, &job); !s.ok()) {
    return ReportError(g, s);
  }
  std::cout << (g.output == "json" ? JobJson(job) : job.job_id() + " " + StateName(job.state()))
            << std::endl;
  return 0;
}

int Workers(const GlobalFlags& g) {
  v1::ListWorkersResponse resp;
  if (auto s = Call(g, &v1::Coordinator::Stub::ListWorkers, v1::ListWorkersRequest(), &resp);
      !s.ok()) {
    return ReportError(g, s);
  }
  if (g.output == "json") {
    std::string out = "{\"workers\": [";
    for (int i = 0; i < resp.workers_size(); ++i) {
      absl::StrAppend(&out, i ? ", " : "", WorkerJson(resp.workers(i)));
    }
    std::cout << out << "]}" << std::endl;
    return 0;
  }
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  std::vector<std::vector<std::string>> rows;
  for (const auto& w : resp.workers()) {
    rows.push_back({w.worker_id(), w.host(), w.device().name(),
                    w.device().model().empty() ? "-" : w.device().model(),
                    WorkerStateName(w.state()), w.job_id().empty() ? "-" : w.job_id(),
                    w.job_id().empty() ? "-" : absl::StrCat(w.rank()),
                    absl::StrFormat("%.1fs ago", (now - w.last_heartbeat_ms()) / 1000.0)});
  }
  std::cout << FormatTable(
      {"WORKER", "HOST", "DEVICE", "MODEL", "STATE", "JOB", "RANK", "HEARTBEAT"}, rows);
  return 0;
}

int History(const GlobalFlags& g, const std::vector<std::string>& job_ids,
            const HistoryPlot& plot) {
  if (job_ids.size() > 1 && !plot.wanted) {
    return ReportError(g, absl::InvalidArgumentError(
                              "several jobs: only with --plot (their curves side by side)"));
  }
  std::vector<v1::GetHistoryResponse> histories;
  for (const std::string& id : job_ids) {
    v1::GetHistoryRequest req;
    req.set_job_id(id);
    v1::GetHistoryResponse resp;
    if (auto s = Call(g, &v1::Coordinator::Stub::GetHistory, req, &resp); !s.ok()) {
      return ReportError(g, s);
    }
    histories.push_back(std::move(resp));
  }
  if (plot.wanted) {
    // loss (and val_loss where evaluated) per job; one job's curves say
    // only which they are.
    std::vector<Curve> curves;
    for (size_t k = 0; k < job_ids.size(); ++k) {
      AppendLossCurves(histories[k], job_ids.size() > 1 ? job_ids[k] + " " : "", &curves);
    }
    const std::string title = absl::StrCat("loss: ", absl::StrJoin(job_ids, ", "));
    if (plot.file.empty()) {
      std::cout << title << "\n" << TerminalChart(curves);
      return 0;
    }
    if (absl::Status s = WriteFileAtomically(plot.file, SvgChart(curves, title)); !s.ok()) {
      return ReportError(g, s);
    }
    std::cout << "wrote " << plot.file << std::endl;
    return 0;
  }
  const v1::GetHistoryResponse& resp = histories.front();
  if (g.output == "json") {
    std::cout << StepsJson(resp) << std::endl;
    return 0;
  }
  const bool csv = g.output == "csv";
  std::cout << HistoryText(resp, csv);
  // The job's warnings after its steps; beside CSV, on stderr.
  if (const std::string warnings = WarningLines(resp); !warnings.empty()) {
    (csv ? std::cerr : std::cout) << (csv ? "" : "\n") << warnings << std::flush;
  }
  return 0;
}

int Checkpoints(const GlobalFlags& g, const std::string& job_id) {
  v1::ListCheckpointsRequest req;
  req.set_job_id(job_id);
  v1::ListCheckpointsResponse resp;
  if (auto s = Call(g, &v1::Coordinator::Stub::ListCheckpoints, req, &resp); !s.ok()) {
    return ReportError(g, s);
  }
  if (g.output == "json") {
    std::vector<std::string> rows;
    for (const auto& c : resp.checkpoints()) {
      rows.push_back(absl::StrCat("{\"step\": ", c.step(), ", \"dir\": ", JsonString(c.dir()),
                                  ", \"bytes\": ", c.bytes(), ", \"world\": ", c.world(),
                                  ", \"committed_ms\": ", c.committed_ms(), "}"));
    }
    std::cout << "{\"checkpoints\": [" << absl::StrJoin(rows, ", ") << "]}" << std::endl;
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& c : resp.checkpoints()) {
    rows.push_back({absl::StrCat(c.step()), c.dir(), absl::StrFormat("%.1f MB", c.bytes() / 1e6),
                    absl::StrCat(c.world())});
  }
  std::cout << FormatTable({"STEP", "DIR", "SIZE", "SHARDS"}, rows);
  return 0;
}

int Plan(const GlobalFlags& g, const std::string& spec_path, std::vector<std::string> sets,
         int world) {
  std::string text;
  if (auto s = ReadSpec(spec_path, &text); !s.ok()) return ReportError(g, s);
  if (auto s = AddModelFromInit(g, text, &sets); !s.ok()) return ReportError(g, s);
  absl::StatusOr<JobSpec> spec = ParseJobSpec(text, sets);
  if (!spec.ok()) return ReportError(g, spec.status());
  absl::StatusOr<v1::Plan> plan = MakePlan(*spec, world > 0 ? world : spec->World());
  if (!plan.ok()) return ReportError(g, plan.status());
  std::cout << (g.output == "json" ? PlanJson(*plan) + "\n"
                                   : PlanText(*spec, *plan) + PlanPictures(*spec, *plan))
            << std::flush;
  return 0;
}

int PlanAuto(const GlobalFlags& g, const std::string& spec_path, std::vector<std::string> sets,
             const PlanAutoFlags& flags) {
  std::string text;
  if (auto s = ReadSpec(spec_path, &text); !s.ok()) return ReportError(g, s);
  if (auto s = AddModelFromInit(g, text, &sets); !s.ok()) return ReportError(g, s);
  absl::StatusOr<JobSpec> spec = ParseJobSpec(text, sets);
  if (!spec.ok()) return ReportError(g, spec.status());
  absl::StatusOr<int64_t> memory = ParseByteSize(flags.memory, "--memory-per-rank");
  if (!memory.ok()) return ReportError(g, memory.status());
  AutoLayoutOptions options;
  options.ranks = flags.ranks > 0 ? flags.ranks : spec->World();
  options.memory_per_rank = *memory;
  if (flags.tflops > 0) {
    options.cost.flops_per_rank = flags.tflops * 1e12;
  } else if (spec->resources.device == DeviceKind::kCuda) {
    // The same table the workers measure their MFU against.
    const std::optional<double> peak = DensePeakFlops(flags.gpu, spec->Compute());
    if (!peak) {
      return ReportError(g, absl::InvalidArgumentError(absl::StrCat(
                                "--gpu ", flags.gpu, ": ", WhyNoPeak(flags.gpu, spec->Compute()),
                                "; give --tflops-per-rank instead")));
    }
    options.cost.flops_per_rank = *peak * flags.mfu;
  } else {
    options.cost.flops_per_rank = 100e12;
  }
  options.cost.tp_bandwidth = flags.tp_gbps * 1e9;
  options.cost.link_bandwidth = flags.link_gbps * 1e9;
  options.cost.ranks_per_node = flags.ranks_per_node;
  absl::StatusOr<AutoLayoutResult> result = AutoLayout(*spec, options);
  if (!result.ok()) return ReportError(g, result.status());
  if (g.output == "json") {
    std::vector<std::string> rows;
    for (const LayoutCandidate& c : result->fitting) {
      rows.push_back(
          absl::StrFormat("{\"dp\": %d, \"tp\": %d, \"pp\": %d, \"zero\": %d, \"micro\": %d, "
                          "\"peak_memory_bytes\": %d, \"bubble\": %.6f, \"step_s\": %.9g}",
                          c.dp, c.tp, c.pp, c.zero, c.micro, c.peak_memory, c.bubble, c.step_s()));
    }
    if (!rows.empty()) std::cout << "{\"layouts\": [" << absl::StrJoin(rows, ", ") << "]}\n";
  } else {
    std::cout << AutoLayoutText(*spec, options, *result) << std::flush;
  }
  if (result->fitting.empty()) {
    const LayoutCandidate& least = result->too_big.front();
    return ReportError(g, absl::InvalidArgumentError(absl::StrCat(
                              "no layout of ", options.ranks, " ranks fits in --memory-per-rank ",
                              FormatPlanBytes(options.memory_per_rank), ": the smallest (dp ",
                              least.dp, " · tp ", least.tp, " · pp ", least.pp, ", ZeRO-",
                              least.zero, ") needs ", FormatPlanBytes(least.peak_memory),
                              " per rank; use more ranks or a smaller batch.micro")));
  }
  return 0;
}

}  // namespace shardtrain::client
