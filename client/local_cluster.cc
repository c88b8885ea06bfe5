#include "client/local_cluster.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/errors.h"
#include "client/eta.h"
#include "client/local_gpus.h"
#include "client/output.h"
#include "client/pictures.h"
#include "common/grpc_status.h"
#include "common/job_spec.h"
#include "common/process.h"
#include "worker/coordinator_client.h"

namespace shardtrain::client {
namespace {

namespace fs = std::filesystem;

struct Child {
  std::string name;
  pid_t pid = -1;
  std::string log;
  int status = 0;  // waitpid's, once it exited
};

// "exited with code 1", "killed by signal 6 (Aborted)".
std::string ExitDescription(int status) {
  if (WIFSIGNALED(status)) {
    return absl::StrFormat("killed by signal %d (%s)", WTERMSIG(status),
                           strsignal(WTERMSIG(status)));
  }
  return absl::StrCat("exited with code ", WEXITSTATUS(status));
}

// The directory of this executable: the daemons are installed next to it.
std::string SelfDir() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "." : p.parent_path().string();
}

absl::StatusOr<Child> Spawn(const std::string& name, const std::vector<std::string>& argv,
                            const std::string& log) {
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork for ", name, " failed"));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);  // parent already gone
    setpgid(0, 0);                      // Ctrl-C reaches only the CLI, which tears down in order
    sigset_t none;
    sigemptyset(&none);
    pthread_sigmask(SIG_SETMASK, &none, nullptr);
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::perror(("exec " + argv[0]).c_str());
    _exit(127);
  }
  return Child{name, pid, log};
}

// Runs argv to its end (at most `timeout`; then SIGKILL), its stdout and
// stderr into the files given; its exit code (128 + signal when killed).
absl::StatusOr<int> RunToEnd(const std::vector<std::string>& argv, const std::string& out,
                             const std::string& err, std::chrono::seconds timeout) {
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork for ", argv[0], " failed"));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    sigset_t none;
    sigemptyset(&none);
    pthread_sigmask(SIG_SETMASK, &none, nullptr);
    int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (o < 0 || e < 0) _exit(127);
    dup2(o, 1);
    dup2(e, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::perror(("exec " + argv[0]).c_str());
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) != pid) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return absl::DeadlineExceededError(
          absl::StrCat(argv[0], " did not finish within ", timeout.count(), " s"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

bool Exited(Child& c) {
  if (c.pid < 0) return true;
  int status = 0;
  if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
    c.pid = -1;
    c.status = status;
    return true;
  }
  return false;
}

std::string Tail(const std::string& path, int lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  for (std::string l; std::getline(in, l);) all.push_back(l);
  std::string out;
  for (size_t i = all.size() > size_t(lines) ? all.size() - lines : 0; i < all.size(); ++i) {
    out += "    " + all[i] + "\n";
  }
  return out;
}

// SIGTERM everyone, wait up to 5 s, then SIGKILL whoever is left.
void TearDown(std::vector<Child>& children) {
  for (auto& c : children) {
    if (c.pid > 0) kill(c.pid, SIGTERM);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (auto& c : children) {
    while (!Exited(c) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (c.pid > 0) {
      kill(c.pid, SIGKILL);
      waitpid(c.pid, nullptr, 0);
      c.pid = -1;
    }
  }
}

class LocalRun {
 public:
  LocalRun(const GlobalFlags& g, const LocalOptions& o) : g_(g), o_(o), sets_(o.sets) {}
  ~LocalRun() {
    TearDown(children_);
    std::error_code ec;
    if (!dir_.empty() && !o_.keep && !keep_logs_) fs::remove_all(dir_, ec);
  }

  int Run() {
    std::string text;
    if (auto s = ReadSpec(o_.spec_path, &text); !s.ok()) return ReportError(g_, s);
    if (auto s = AddModelFromInit(g_, text, &sets_); !s.ok()) return ReportError(g_, s);
    absl::StatusOr<JobSpec> spec = ParseJobSpec(text, sets_);
    if (!spec.ok()) return ReportError(g_, spec.status());
    if (std::string w = CheckpointDirWarning(*spec); !w.empty()) Warn(g_, w);
    if (std::string w = ValidationWarning(*spec); !w.empty()) Warn(g_, w);
    if (std::string w = FinetuneWarning(*spec); !w.empty()) Warn(g_, w);
    // The local workers run here, in this directory: their checkpoint.dir
    // is the spec's as this process sees it.
    if (std::string w = CheckpointSpaceWarning(*spec, spec->checkpoint.dir); !w.empty()) {
      Warn(g_, w);
    }
    const int workers = o_.workers > 0 ? o_.workers : spec->World();
    if (workers < spec->World()) {
      return ReportError(g_, absl::InvalidArgumentError(absl::StrFormat(
                                 "--workers: %d workers can never run a job of world %d "
                                 "(dp·cp·tp·pp = %d·%d·%d·%d)",
                                 workers, spec->World(), spec->parallel.dp, spec->parallel.cp,
                                 spec->parallel.tp, spec->parallel.pp)));
    }
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const int threads = o_.threads > 0 ? o_.threads : std::max(1, cores / workers);

    char tmpl[] = "/tmp/shardtrain-local-XXXXXX";
    if (!mkdtemp(tmpl)) return ReportError(g_, absl::InternalError("cannot create a temp dir"));
    dir_ = tmpl;
    const std::string bin = SelfDir();
    // A GPU job: one worker per GPU (round-robin when there are more
    // workers), or nothing started at all on a machine without one.
    std::vector<std::string> gpus;
    if (spec->resources.device == DeviceKind::kCuda) {
      absl::StatusOr<std::vector<std::string>> found = FindGpus(bin, *spec);
      if (!found.ok()) return ReportError(g_, found.status());
      gpus = *std::move(found);
      // NCCL refuses two ranks on one GPU: say so before anything starts.
      if (absl::Status fit = CheckWorkersFitGpus(*spec, workers, static_cast<int>(gpus.size()));
          !fit.ok()) {
        return ReportError(g_, fit);
      }
    }
    const std::string port_file = dir_ + "/coordinator.port";
    auto coord =
        Spawn("coordinator",
              {bin + "/shardtrain-coordinator", "--listen", "127.0.0.1:0", "--state-dir",
               dir_ + "/state", "--port-file", port_file, "--lease-ms", absl::StrCat(o_.lease_ms)},
              dir_ + "/coordinator.log");
    if (!coord.ok()) return ReportError(g_, coord.status());
    children_.push_back(*coord);
    auto address = WaitForPort(port_file);
    if (!address.ok()) return Failed(address.status());
    GlobalFlags g = g_;
    g.coordinator = *address;
    for (int i = 0; i < workers; ++i) {
      std::vector<std::string> argv = {
          bin + "/shardtrain-worker", "--coordinator",  *address, "--threads",
          absl::StrCat(threads),      "--heartbeat-ms", "200"};
      if (!gpus.empty()) argv.insert(argv.end(), {"--device", WorkerGpu(i, gpus)});
      auto w = Spawn(absl::StrCat("worker ", i), argv, absl::StrCat(dir_, "/worker-", i, ".log"));
      if (!w.ok()) return Failed(w.status());
      children_.push_back(*w);
    }
    if (g.output != "json") {
      const std::vector<std::string> used(
          gpus.begin(), gpus.begin() + std::min<size_t>(gpus.size(), size_t(workers)));
      const std::string per_worker = gpus.empty() ? absl::StrFormat(" × %d threads", threads)
                                                  : absl::StrCat(" on ", absl::StrJoin(used, ", "));
      std::cout << absl::StrFormat("local cluster: coordinator %s, %d workers%s (logs in %s)",
                                   *address, workers, per_worker, dir_)
                << std::endl;
      if (workers > static_cast<int>(gpus.size()) && !gpus.empty()) {
        Warn(g_, absl::StrFormat("%d workers share %d GPUs (worker i drives GPU i mod %d)", workers,
                                 gpus.size(), gpus.size()));
      }
    }
    return SubmitAndWatch(g, text, spec->World());
  }

 private:
  absl::StatusOr<std::string> WaitForPort(const std::string& port_file) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      std::string content;
      int port = 0;
      if (ReadFile(port_file, &content).ok() &&
          absl::SimpleAtoi(content.substr(0, content.find('\n')), &port) && port > 0) {
        return absl::StrCat("127.0.0.1:", port);
      }
      if (Exited(children_[0])) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return absl::UnavailableError("the local coordinator did not start");
  }

  // The GPUs `shardtrain-worker --probe-devices` finds that can train
  // (client/local_gpus.h). FAILED_PRECONDITION naming resources.device and
  // the worker's reason when there is none: the job cannot run here.
  absl::StatusOr<std::vector<std::string>> FindGpus(const std::string& bin, const JobSpec& spec) {
    const std::string out = dir_ + "/probe-devices.out", err = dir_ + "/probe-devices.err";
    absl::StatusOr<int> code = RunToEnd({bin + "/shardtrain-worker", "--probe-devices"}, out, err,
                                        std::chrono::seconds(60));
    std::string stdout_text, stderr_text;
    ReadFile(out, &stdout_text).IgnoreError();
    ReadFile(err, &stderr_text).IgnoreError();
    std::vector<std::string> gpus = UsableGpus(stdout_text);
    if (code.ok() && *code == 0 && !gpus.empty()) return gpus;
    // The worker's own words: "shardtrain-worker: no CUDA device: <why>".
    std::string why = code.ok() ? stderr_text : std::string(code.status().message());
    while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
    for (absl::string_view prefix : {"shardtrain-worker: ", "no CUDA device: "}) {
      if (absl::StartsWith(why, prefix)) why.erase(0, prefix.size());
    }
    if (why.empty()) why = absl::StrCat("shardtrain-worker --probe-devices exited ", *code);
    return absl::FailedPreconditionError(absl::StrCat(
        "resources.device: cuda, but this machine has no CUDA device shardtrain can train on (",
        why, "); to train on the CPU: --set resources.device=cpu",
        spec.precision == Precision::kFp32 ? "" : " --set precision=fp32"));
  }

  // Reports `s` with the tail of every child's log (in JSON: as the detail).
  int Failed(const absl::Status& s) {
    std::string logs;
    for (const auto& c : children_) {
      absl::StrAppend(&logs, "  ", c.name, " log (", c.log, "):\n", Tail(c.log, 8));
    }
    if (g_.output == "json") {
      std::cerr << ErrorJson({s.code(), std::string(s.message()), logs}) << std::endl;
    } else {
      std::cerr << "shardtrain: " << s.message() << "\n" << logs << std::flush;
    }
    return ExitCodeFor(s.code());
  }

  int SubmitAndWatch(const GlobalFlags& g, const std::string& text, int world) {
    worker::CoordinatorClient client(g.coordinator, g.timeout_ms);
    v1::SubmitJobRequest req;
    req.set_spec_yaml(text);
    for (const auto& kv : sets_) req.add_overrides(kv);
    req.set_resume_from(o_.resume_from);
    v1::SubmitJobResponse resp;
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      ctx.set_wait_for_ready(true);
      if (auto s = FromGrpcStatus(client.stub().SubmitJob(&ctx, req, &resp), "SubmitJob");
          !s.ok()) {
        return Failed(s);
      }
    }
    const v1::Job& job = resp.job();
    if (g.output != "json") {
      std::cout << "submitted " << job.job_id() << std::endl;
      if (!LayoutLine(job).empty()) std::cout << LayoutLine(job) << std::endl;
    }

    // Ctrl-C / SIGTERM: cancel the job and stop watching; teardown follows.
    std::atomic<bool> interrupted{false};
    grpc::ClientContext watch_ctx;
    std::thread signals([&] {
      WaitForTerminationSignal();
      interrupted = true;
      watch_ctx.TryCancel();
    });
    signals.detach();

    // A worker process that dies (a crash, an abort, the OOM killer) never
    // comes back in a local cluster: say so at once, with the end of its
    // log, and once fewer workers are left than the job's world, stop
    // watching a job that can only wait.
    std::atomic<bool> watching{true}, workers_lost{false};
    std::string lost;  // which workers exited, how
    std::mutex lost_mu;
    std::thread monitor([&] {
      std::vector<bool> reported(children_.size(), false);
      while (watching) {
        int alive = 0;
        for (size_t i = 1; i < children_.size(); ++i) {  // [0]: the coordinator
          if (!Exited(children_[i])) {
            ++alive;
            continue;
          }
          if (reported[i]) continue;
          reported[i] = true;
          const Child& c = children_[i];
          const std::string what = absl::StrCat(c.name, " ", ExitDescription(c.status));
          {
            std::lock_guard<std::mutex> lock(lost_mu);
            absl::StrAppend(&lost, lost.empty() ? "" : "; ", what);
          }
          if (g.output != "json") {
            std::cerr << "shardtrain: " << what << "; the end of its log (" << c.log << "):\n"
                      << Tail(c.log, 8) << std::flush;
          }
        }
        if (alive < world) {
          workers_lost = true;
          watch_ctx.TryCancel();
          return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });

    v1::WatchJobRequest wreq;
    wreq.set_job_id(job.job_id());
    auto reader = client.stub().WatchJob(&watch_ctx, wreq);
    v1::JobEvent ev;
    EtaEstimator eta;
    while (reader->Read(&ev)) {
      if (g.output != "json") {
        std::cout << EventLine(ev, job.progress().total_steps(), &eta) << std::endl;
      }
    }
    grpc::Status ws = reader->Finish();
    watching = false;
    monitor.join();
    if (interrupted || workers_lost) {
      v1::CancelJobRequest c;
      c.set_job_id(job.job_id());
      c.set_reason(interrupted ? "interrupted (shardtrain local)"
                               : "its workers exited (shardtrain local)");
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      v1::Job ignored;
      client.stub().CancelJob(&ctx, c, &ignored);
      if (interrupted) {
        return ReportError(g, absl::CancelledError(absl::StrCat("interrupted; job ", job.job_id(),
                                                                " cancelled, cluster stopped")));
      }
      keep_logs_ = true;  // what the dead workers wrote is the user's lead
      std::lock_guard<std::mutex> lock(lost_mu);
      return ReportError(
          g, absl::AbortedError(absl::StrFormat(
                 "%s: fewer workers are left than the job's world (%d); job %s cancelled, cluster "
                 "stopped (logs in %s)",
                 lost, world, job.job_id(), dir_)));
    }
    if (!ws.ok()) return Failed(FromGrpcStatus(ws, "WatchJob"));

    v1::Job final_job;
    v1::GetHistoryResponse history;
    {
      grpc::ClientContext ctx;
      v1::GetJobRequest r;
      r.set_job_id(job.job_id());
      if (auto s = FromGrpcStatus(client.stub().GetJob(&ctx, r, &final_job)); !s.ok()) {
        return Failed(s);
      }
    }
    {
      grpc::ClientContext ctx;
      v1::GetHistoryRequest r;
      r.set_job_id(job.job_id());
      client.stub().GetHistory(&ctx, r, &history);
    }
    const bool ok = final_job.state() == v1::JOB_STATE_SUCCEEDED;
    if (g.output == "json") {
      std::string steps = StepsJson(history);  // {"steps": [...]}
      std::cout << "{\"job\": " << JobJson(final_job) << ", " << steps.substr(1, steps.size() - 2)
                << "}" << std::endl;
    } else {
      std::cout << "job " << final_job.job_id() << " " << StateName(final_job.state());
      if (final_job.progress().step() > 0) {
        std::cout << absl::StrFormat(" after %d steps, final loss %.4f",
                                     final_job.progress().step(), final_job.progress().loss());
      }
      if (!final_job.failure_reason().empty()) std::cout << ": " << final_job.failure_reason();
      // The SUCCEEDED event said where the weights are, when they were saved.
      if (ok && final_job.output().empty()) std::cout << "; weights not saved (no checkpoint.dir)";
      // A job that succeeded with warnings (checkpoints not committed) says
      // so in its last line too: the user may have scrolled past them.
      if (history.warnings_size() > 0) {
        std::cout << "; " << history.warnings_size()
                  << (history.warnings_size() == 1 ? " warning" : " warnings")
                  << " ([WARNING] above)";
      }
      std::cout << std::endl;
      if (o_.plot) {
        std::vector<Curve> curves;
        AppendLossCurves(history, "", &curves);
        std::cout << "\nloss of " << final_job.job_id() << ":\n" << TerminalChart(curves);
      }
    }
    if (!ok && g.output != "json") {
      for (const auto& c : children_) {
        std::cerr << "  " << c.name << " log:\n" << Tail(c.log, 5);
      }
    }
    return ok ? kExitOk : kExitFailed;
  }

  const GlobalFlags g_;
  bool keep_logs_ = false;  // kept after the run even without --keep
  const LocalOptions o_;
  // o_.sets and the model fields read from model.init's config.json
  // (AddModelFromInit): what the job is submitted with.
  std::vector<std::string> sets_;
  std::string dir_;
  std::vector<Child> children_;
};

}  // namespace

int Local(const GlobalFlags& g, const LocalOptions& o) {
  LocalRun run(g, o);
  return run.Run();
}

}  // namespace shardtrain::client
