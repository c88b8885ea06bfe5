#include "worker/daemon.h"

#include <algorithm>
#include <chrono>
#include <iostream>
#include <utility>

#include "common/process.h"

namespace shardtrain::worker {
namespace {

void Log(const std::string& id, const std::string& msg) {
  std::cerr << "shardtrain-worker[" << (id.empty() ? "?" : id) << "]: " << msg << std::endl;
}

void SleepFor(int64_t ms, const std::atomic<bool>& shutdown) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (!shutdown && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min<int64_t>(ms, 20)));
  }
}

}  // namespace

WorkerDaemon::WorkerDaemon(WorkerOptions options, CoordinatorApi* coordinator, JobRunner runner,
                           MetricsRegistry* registry)
    : options_(std::move(options)),
      runner_(std::move(runner)),
      client_(coordinator),
      heartbeats_(registry
                      ->AddCounter("shardtrain_worker_heartbeats_total",
                                   "Heartbeats the coordinator answered.")
                      .WithLabels({})),
      assignments_(
          registry->AddCounter("shardtrain_worker_assignments_total", "Job assignments received.")
              .WithLabels({})) {}

WorkerDaemon::~WorkerDaemon() {
  StopJob("worker shutting down");
  JoinRetired(/*all=*/true);
}

std::string WorkerDaemon::worker_id() const {
  std::lock_guard<std::mutex> lock(mu_);
  return worker_id_;
}

absl::Status WorkerDaemon::Register() {
  v1::RegisterWorkerRequest req;
  req.set_host(HostName());
  req.set_collective_address(options_.collective_address);
  *req.add_devices() = options_.device;
  req.set_host_memory_bytes(TotalMemoryBytes());
  req.set_threads(options_.threads);
  req.set_metrics_address(options_.metrics_address);
  req.set_checkpoint_root(options_.checkpoint_root);
  req.set_data_root(options_.data_root);
  {
    std::lock_guard<std::mutex> lock(mu_);
    req.set_previous_worker_id(worker_id_);
    req.set_worker_secret(worker_secret_);  // keeps the id; nobody else can
  }
  auto resp = client_->RegisterWorker(req);
  if (!resp.ok()) return resp.status();
  std::lock_guard<std::mutex> lock(mu_);
  if (worker_id_ != resp->worker_id()) {
    Log(resp->worker_id(),
        "registered with coordinator " + options_.coordinator + " as " + resp->worker_id() +
            " (device " + options_.device.name() +
            (options_.device.model().empty() ? std::string() : " = " + options_.device.model()) +
            ", checkpoint root " + options_.checkpoint_root + ", data root " + options_.data_root +
            ")");
  }
  worker_id_ = resp->worker_id();
  worker_secret_ = resp->worker_secret();
  lease_ms_ = resp->lease_ms();
  return absl::OkStatus();
}

void WorkerDaemon::Run(const std::atomic<bool>& shutdown) {
  bool registered = false, outage_logged = false;
  while (!shutdown) {
    JoinRetired(/*all=*/false);
    absl::Status status;
    if (!registered) {
      status = Register();
      registered = status.ok();
    }
    if (registered) {
      v1::HeartbeatRequest hb;
      std::shared_ptr<RecentCollectives> collectives;
      {
        std::lock_guard<std::mutex> lock(mu_);
        hb.set_worker_id(worker_id_);
        hb.set_worker_secret(worker_secret_);
        // A finished runner no longer counts as running its job.
        if (!current_.job_id().empty() && !(job_finished_ && *job_finished_)) {
          hb.set_job_id(current_.job_id());
          hb.set_generation(current_.generation());
          collectives = job_collectives_;
        }
      }
      if (collectives) {  // outside mu_; never waits on a collective (recent_collectives.h)
        for (v1::CollectiveRecord& r : collectives->Snapshot()) {
          *hb.add_recent_collectives() = std::move(r);
        }
      }
      auto resp = client_->Heartbeat(hb);
      status = resp.status();
      if (resp.ok()) {
        heartbeats_.Increment();
        Apply(*resp);
      } else if (absl::IsNotFound(resp.status())) {
        Log(worker_id(), "coordinator does not know this worker; registering again");
        registered = false;
        continue;
      }
    }
    if (!status.ok() && !outage_logged) {
      Log(worker_id(), "coordinator unreachable (" + std::string(status.message()) +
                           "); retrying. Is shardtrain-coordinator running at " +
                           options_.coordinator + "?");
      outage_logged = true;
    } else if (status.ok() && outage_logged) {
      Log(worker_id(), "coordinator reachable again");
      outage_logged = false;
    }
    int64_t lease;
    {
      std::lock_guard<std::mutex> lock(mu_);
      lease = lease_ms_;
    }
    SleepFor(std::max<int64_t>(10, std::min(options_.heartbeat_ms, lease / 3)), shutdown);
  }
  StopJob("worker shutting down");
  JoinRetired(/*all=*/true);
}

void WorkerDaemon::Apply(const v1::HeartbeatResponse& resp) {
  for (const v1::Command& c : resp.commands()) {
    if (c.has_abort()) {
      std::string running;
      {
        std::lock_guard<std::mutex> lock(mu_);
        running = current_.job_id();
      }
      if (running == c.abort().job_id()) {
        StopJob("abort " + c.abort().job_id() + ": " + c.abort().reason());
      }
    } else if (c.has_run()) {
      StopJob("new assignment");
      StartJob(c.run());
    } else if (c.has_drain()) {
      Log(worker_id(), "drain requested: " + c.drain().reason());
    }
  }
}

void WorkerDaemon::StartJob(const v1::RunAssignment& a) {
  assignments_.Increment();
  std::string id = worker_id();
  Log(id, "assignment: job " + a.job_id() + " rank " + std::to_string(a.rank()) + "/" +
              std::to_string(a.world()) + " generation " + std::to_string(a.generation()));
  std::lock_guard<std::mutex> lock(mu_);
  current_ = a;
  job_stop_ = std::make_unique<std::atomic<bool>>(false);
  job_finished_ = std::make_unique<std::atomic<bool>>(false);
  std::atomic<bool>* stop = job_stop_.get();
  std::atomic<bool>* finished = job_finished_.get();
  job_collectives_ = std::make_shared<RecentCollectives>();
  job_thread_ = std::thread([this, a, id, stop, finished, collectives = job_collectives_] {
    RunContext ctx{&a, id, client_, &options_, stop, collectives.get()};
    runner_(ctx);
    *finished = true;
  });
}

void WorkerDaemon::StopJob(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!job_thread_.joinable()) return;
  if (!*job_finished_) Log(worker_id_, "stopping job " + current_.job_id() + ": " + reason);
  *job_stop_ = true;
  retired_.push_back({std::move(job_thread_), std::move(job_stop_), std::move(job_finished_)});
  job_collectives_.reset();
  current_.Clear();
}

void WorkerDaemon::JoinRetired(bool all) {
  std::vector<Retired> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = retired_.begin(); it != retired_.end();) {
      if (all || *it->finished) {
        done.push_back(std::move(*it));
        it = retired_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (Retired& r : done) r.thread.join();  // outside mu_: the runner may need it
}

}  // namespace shardtrain::worker
