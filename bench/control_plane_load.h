// What control_plane_bench (control_plane_bench.cc) puts on the coordinator:
// its options, the simulated workers (registration requests, heartbeats
// paced or flooded, background heartbeats that keep leases), the jobs it
// submits and the listings it counts with. Header-only, for the bench alone.
#ifndef SHARDTRAIN_BENCH_CONTROL_PLANE_LOAD_H_
#define SHARDTRAIN_BENCH_CONTROL_PLANE_LOAD_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/control_plane_rpc.h"
#include "shardtrain/v1/coordinator.grpc.pb.h"

namespace shardtrain::coordinator {

inline constexpr char kSpec[] =
    "name: bench\n"
    "model: {layers: 1, heads: 1, dim: 8, context: 8, vocab: 256}\n"
    "data: {train: x.txt}\n"
    "batch: {global: 2, micro: 1, seq_len: 8}\n"
    "parallel: {dp: 2}\n"
    "steps: 1\n";

struct Config {
  std::vector<int> workers = {100, 1000};
  double seconds = 5;
  int jobs = 200;
  int client_threads = 8;
  std::vector<std::string> modes = {"paced", "flood"};
  int serial_calls = 2000;
  int64_t lease_ms = 30'000;
  bool json = false;
  bool process = false, tls = false, tokens = false;
  int list_jobs = 0;
  std::string coordinator_bin;
  // --process: sqlite (the coordinator's --state-dir), or etcd (a private
  // etcd for the run; each worker count under its own key prefix).
  std::string state = "sqlite";
  std::string etcd_url;  // filled in when state is etcd
  int failovers = 0;     // etcd: leader kills timed with a standby beside it
  int leader_ttl_s = 2;
};

inline Samples SerialGetJob(v1::Coordinator::Stub& stub, int calls) {
  Samples s;
  const auto t0 = SteadyClock::now();
  for (int i = 0; i < calls; ++i) {
    v1::GetJobRequest req;
    v1::Job resp;
    TimedCall([&](grpc::ClientContext* ctx) { return stub.GetJob(ctx, req, &resp); }, &s);
  }
  s.seconds = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  return s;
}

inline v1::RegisterWorkerRequest SimulatedWorker(int k) {
  v1::RegisterWorkerRequest req;
  req.set_host(absl::StrFormat("bench-host-%d", k / 8));
  req.set_collective_address(absl::StrFormat("127.0.0.1:%d", 20000 + k));
  v1::Device* d = req.add_devices();
  d->set_name(absl::StrCat("cuda:", k % 8));
  d->set_kind("cuda");  // bench jobs are CPU jobs (one CPU worker is registered apart)
  d->set_memory_bytes(int64_t{80} << 30);
  d->set_model("simulated by control_plane_bench");
  req.set_host_memory_bytes(int64_t{512} << 30);
  req.set_threads(8);
  return req;
}

// Submits `jobs` jobs from `stub`, one every `interval` (back to back when 0).
inline Samples SubmitJobs(v1::Coordinator::Stub& stub, int jobs, SteadyClock::duration interval) {
  Samples s;
  v1::SubmitJobRequest req;
  req.set_spec_yaml(kSpec);
  const auto t0 = SteadyClock::now();
  for (int i = 0; i < jobs; ++i) {
    std::this_thread::sleep_until(t0 + interval * (i + 1));
    v1::SubmitJobResponse resp;
    TimedCall([&](grpc::ClientContext* ctx) { return stub.SubmitJob(ctx, req, &resp); }, &s,
              TheAuth().user);
  }
  s.seconds = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  return s;
}

struct LoadResult {
  Samples heartbeats;
  Samples submits;
};

// Heartbeats every worker in `ids` for cfg.seconds (paced or flood) while a
// separate connection submits cfg.jobs jobs spread evenly over the window.
inline LoadResult RunLoad(const std::string& address, const std::vector<std::string>& ids,
                          const std::vector<std::string>& secrets, const Config& cfg, bool paced) {
  const int threads = cfg.client_threads;
  auto stubs = NewStubs(address, threads);
  auto submit_stub = v1::Coordinator::NewStub(NewChannel(address));
  const auto window =
      std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(cfg.seconds));
  const auto start = SteadyClock::now() + std::chrono::milliseconds(50);
  const auto end = start + window;
  const size_t n = ids.size();

  LoadResult out;
  std::thread submitter([&] {
    std::this_thread::sleep_until(start);
    out.submits = SubmitJobs(*submit_stub, cfg.jobs, window / (cfg.jobs + 1));
  });
  out.heartbeats = RunThreads(threads, [&](int t, Samples* s) {
    v1::Coordinator::Stub& stub = *stubs[t];
    std::vector<size_t> mine;
    for (size_t k = t; k < n; k += threads) mine.push_back(k);
    if (mine.empty()) return;
    v1::HeartbeatRequest req;
    v1::HeartbeatResponse resp;
    std::this_thread::sleep_until(start);
    for (int64_t round = 0;; ++round) {
      for (size_t k : mine) {
        if (paced) {
          // Worker k beats at start + k/n s + round periods.
          const auto due = start + kHeartbeatPeriod * round +
                           std::chrono::nanoseconds(kHeartbeatPeriod) * static_cast<int64_t>(k) /
                               static_cast<int64_t>(n);
          if (due >= end) return;
          std::this_thread::sleep_until(due);
        } else if (SteadyClock::now() >= end) {
          return;
        }
        req.set_worker_id(ids[k]);
        req.set_worker_secret(secrets[k]);
        TimedCall([&](grpc::ClientContext* ctx) { return stub.Heartbeat(ctx, req, &resp); }, s);
      }
    }
  });
  out.heartbeats.seconds = std::chrono::duration<double>(window).count();
  submitter.join();
  return out;
}

// Every worker of `ids` heartbeats once per second (client_threads
// connections) until `stop`: keeps their leases while another phase runs.
class BackgroundHeartbeats {
 public:
  BackgroundHeartbeats(const std::string& address, const std::vector<std::string>& ids,
                       const std::vector<std::string>& secrets, int threads) {
    const auto start = SteadyClock::now();
    for (int t = 0; t < threads; ++t) {
      pool_.emplace_back([this, address, &ids, &secrets, threads, t, start] {
        auto stub = v1::Coordinator::NewStub(NewChannel(address));
        v1::HeartbeatRequest req;
        v1::HeartbeatResponse resp;
        Samples ignored;
        for (int64_t round = 0; !stop_; ++round) {
          for (size_t k = t; k < ids.size() && !stop_; k += threads) {
            std::this_thread::sleep_until(start + kHeartbeatPeriod * round +
                                          std::chrono::nanoseconds(kHeartbeatPeriod) *
                                              static_cast<int64_t>(k) /
                                              static_cast<int64_t>(ids.size()));
            req.set_worker_id(ids[k]);
            req.set_worker_secret(secrets[k]);
            TimedCall([&](grpc::ClientContext* ctx) { return stub->Heartbeat(ctx, req, &resp); },
                      &ignored);
          }
        }
      });
    }
  }
  ~BackgroundHeartbeats() {
    stop_ = true;
    for (auto& th : pool_) th.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> pool_;
};

// Workers the coordinator lists ALIVE, or -1 on an error.
inline int CountAlive(v1::Coordinator::Stub& stub) {
  v1::ListWorkersResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
  if (!TheAuth().admin.empty()) ctx.AddMetadata("authorization", "Bearer " + TheAuth().admin);
  if (!stub.ListWorkers(&ctx, v1::ListWorkersRequest(), &resp).ok()) return -1;
  int alive = 0;
  for (const v1::WorkerInfo& w : resp.workers()) {
    alive += w.state() == v1::WORKER_STATE_ALIVE ? 1 : 0;
  }
  return alive;
}

// Every job the coordinator lists (all pages of 1,000), or -1 on an error.
inline int64_t CountJobs(v1::Coordinator::Stub& stub, Samples* timing = nullptr) {
  int64_t n = 0;
  v1::ListJobsRequest req;
  req.set_page_size(1000);
  const auto t0 = SteadyClock::now();
  for (;;) {
    v1::ListJobsResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
    if (!TheAuth().admin.empty()) ctx.AddMetadata("authorization", "Bearer " + TheAuth().admin);
    if (!stub.ListJobs(&ctx, req, &resp).ok()) {
      if (timing) ++timing->errors;
      return -1;
    }
    n += resp.jobs_size();
    if (resp.next_page_token().empty()) break;
    req.set_page_token(resp.next_page_token());
  }
  if (timing) timing->us.push_back(Micros(SteadyClock::now() - t0));
  return n;
}

}  // namespace shardtrain::coordinator

#endif  // SHARDTRAIN_BENCH_CONTROL_PLANE_LOAD_H_
