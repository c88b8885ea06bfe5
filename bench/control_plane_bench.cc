// control_plane_bench: latency of the coordinator's control-plane RPCs under
// simulated worker load, as ratios to an empty unary RPC measured in the same
// run over the same gRPC stack. A benchmark, never a test.
//
// Everything runs in this one process, on 127.0.0.1 with port 0:
//   - baseline: a second gRPC sync server whose GetJob answers OK with an
//     empty Job at once; timed serially (one call in flight) and flooded
//     (--client-threads calls in flight) from the same client setup.
//   - per --workers N: a fresh coordinator assembled as coordinator/main.cc
//     does (SQLite state store in a temp dir, so every acknowledged write
//     includes its durable commit; the Tick thread at lease/10), then
//       register   N real RegisterWorker RPCs (--client-threads at a time)
//       heartbeat_serial  one Heartbeat in flight, no other load
//       submit_idle       --jobs SubmitJob RPCs one after another, no load
//       heartbeat_<mode>  every simulated worker heartbeats for --seconds:
//                         paced = each worker once per 1 s (the worker
//                         daemon's default period), offsets spread evenly;
//                         flood = each client thread back to back
//       submit_under_<mode>_hb  --jobs SubmitJob RPCs spread evenly over
//                         that window, from their own connection.
//
// Client threads: each of --client-threads threads owns the simulated
// workers k with k % threads == t and its OWN channel (a local subchannel
// pool, hence its own TCP connection); the submitter has one more. Every call
// gets a fresh ClientContext with a 10 s deadline, as
// worker/coordinator_client.cc does. Latency is send-to-response of each call
// (in paced mode not counted from the scheduled send time; the achieved
// heartbeat rate shows whether the clients kept up).
//
// Simulated workers advertise a "cuda" device and the bench jobs are CPU jobs
// of world 2 with one CPU worker registered (so admission accepts them), so
// submitted jobs stay PENDING: every submit is one durable
// commit plus a scheduling pass that places nothing, and every heartbeat is the
// steady-state one (no commands). The pending queue grows by --jobs per phase.
//
// --process: the coordinator is the real shardtrain-coordinator program (next
// to this bench's build directory, or --coordinator-bin) in its own process,
// on 127.0.0.1:0 with its own --state-dir; --tls serves TLS with a
// certificate made for the run (openssl), --tokens authenticates every call
// with bearer tokens (worker, user and admin roles), and the baseline server
// uses the same TLS. Then per worker count also:
//   coordinator resources: RSS after registering the workers less its RSS
//     before (per 1,000 workers), and its CPU time over the paced window
//     (cores busy, per 1,000 workers);
//   list_all_jobs     with --list-jobs J (J jobs submitted first, 8 clients at
//                     once, every worker heartbeating each second meanwhile):
//                     ListJobs of every page (1,000 jobs each) as one sample,
//                     5 samples;
//   restart           the workers heartbeat paced while the coordinator is
//                     killed (SIGKILL) and started again on the same state:
//                     seconds until it listens again, until every worker's
//                     heartbeat is answered again (re-attached), every
//                     worker ALIVE in ListWorkers, and the jobs it lists
//                     before and after (none lost).
//
//   control_plane_bench [--workers 100,1000] [--seconds 5] [--jobs 200]
//                       [--client-threads 8] [--modes paced,flood]
//                       [--serial-calls 2000] [--lease-ms 30000] [--json]
//                       [--process [--tls] [--tokens] [--list-jobs 10000]
//                        [--coordinator-bin PATH]]
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_util.h"
#include "bench/control_plane_rpc.h"
#include "bench/coordinator_process.h"
#include "common/metrics.h"
#include "coordinator/clock.h"
#include "coordinator/coordinator.h"
#include "coordinator/service.h"
#include "coordinator/spec_validator.h"
#include "coordinator/state_store.h"
#include "shardtrain/v1/coordinator.grpc.pb.h"

namespace shardtrain::coordinator {
namespace {

constexpr char kSpec[] =
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
};

// The baseline: GetJob answers OK with an empty Job, nothing else is served.
class EmptyService final : public v1::Coordinator::Service {
 public:
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest*, v1::Job*) override {
    return grpc::Status::OK;
  }
};

// The coordinator as coordinator/main.cc assembles it, on 127.0.0.1:0 with the
// SQLite store in a fresh temp dir (removed on destruction).
class CoordinatorUnderTest {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorUnderTest>> Start(int64_t lease_ms) {
    auto c = std::unique_ptr<CoordinatorUnderTest>(new CoordinatorUnderTest());
    std::string tmpl = (std::filesystem::temp_directory_path() / "cpbench-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) return absl::UnavailableError("mkdtemp failed");
    c->dir_ = tmpl;
    auto store = OpenSqliteStateStore(c->dir_);
    if (!store.ok()) return store.status();
    CoordinatorOptions options;
    options.lease_ms = lease_ms;
    auto core = Coordinator::Create(options, *std::move(store), ValidateSpec, &c->clock_);
    if (!core.ok()) return core.status();
    c->core_ = *std::move(core);
    RegisterCoordinatorMetrics(c->core_.get(), &c->registry_);
    c->service_ = std::make_unique<CoordinatorService>(c->core_.get(), &c->registry_);
    c->server_ = StartServer(c->service_.get(), &c->port_);
    if (!c->server_) return absl::UnavailableError("cannot listen on 127.0.0.1:0");
    const auto period = std::chrono::milliseconds(std::clamp<int64_t>(lease_ms / 10, 20, 500));
    c->ticker_ = std::thread([raw = c.get(), period] {
      std::unique_lock<std::mutex> lock(raw->tick_mu_);
      while (!raw->tick_cv_.wait_for(lock, period, [raw] { return raw->stopping_; })) {
        lock.unlock();
        raw->core_->Tick();
        lock.lock();
      }
    });
    return c;
  }

  ~CoordinatorUnderTest() {
    if (ticker_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(tick_mu_);
        stopping_ = true;
      }
      tick_cv_.notify_all();
      ticker_.join();
    }
    if (core_) core_->Shutdown();
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_.reset();
    service_.reset();
    core_.reset();
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  CoordinatorUnderTest() = default;

  std::string dir_;
  RealClock clock_;
  MetricsRegistry registry_;
  std::unique_ptr<Coordinator> core_;
  std::unique_ptr<CoordinatorService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::mutex tick_mu_;
  std::condition_variable tick_cv_;
  bool stopping_ = false;  // GUARDED_BY(tick_mu_)
  std::thread ticker_;
};

Samples SerialGetJob(v1::Coordinator::Stub& stub, int calls) {
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

v1::RegisterWorkerRequest SimulatedWorker(int k) {
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
Samples SubmitJobs(v1::Coordinator::Stub& stub, int jobs, SteadyClock::duration interval) {
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
LoadResult RunLoad(const std::string& address, const std::vector<std::string>& ids,
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
int CountAlive(v1::Coordinator::Stub& stub) {
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
int64_t CountJobs(v1::Coordinator::Stub& stub, Samples* timing = nullptr) {
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

// Submits jobs until the coordinator holds cfg.list_jobs, client_threads at
// once; then lists all of them, 5 times.
absl::Status ListPhase(const std::string& address, int workers, const Config& cfg,
                       std::vector<Row>* rows, std::vector<std::string>* notes) {
  auto stub = v1::Coordinator::NewStub(NewChannel(address));
  const int64_t have = CountJobs(*stub);
  if (have < 0) return absl::InternalError("ListJobs failed");
  const int64_t need = std::max<int64_t>(0, cfg.list_jobs - have);
  auto stubs = NewStubs(address, cfg.client_threads);
  Samples bulk = RunThreads(cfg.client_threads, [&](int t, Samples* s) {
    const int64_t mine = need / cfg.client_threads + (t < need % cfg.client_threads ? 1 : 0);
    s->Merge(SubmitJobs(*stubs[t], static_cast<int>(mine), SteadyClock::duration::zero()));
  });
  if (bulk.errors > 0) return absl::InternalError(absl::StrCat(bulk.errors, " submits failed"));
  rows->push_back(MakeRow("submit_bulk", workers, std::move(bulk)));
  Samples list;
  int64_t listed = 0;
  const auto t0 = SteadyClock::now();
  for (int i = 0; i < 5; ++i) listed = CountJobs(*stub, &list);
  list.seconds = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  notes->push_back(absl::StrFormat(
      "list_all_jobs      workers=%-5d %d jobs listed in %d pages of 1,000 per sample", workers,
      listed, (listed + 999) / 1000));
  rows->push_back(MakeRow("list_all_jobs", workers, std::move(list)));
  return absl::OkStatus();
}

// Heartbeats every worker paced (1 s) while the coordinator is killed
// (SIGKILL) and started again on the same state and port; measures when it
// listens again and when every worker's heartbeat is answered again.
absl::Status RestartPhase(CoordinatorProcess& proc, std::vector<std::string>& ids,
                          std::vector<std::string>& secrets, const Config& cfg,
                          std::vector<std::string>* notes) {
  const std::string address = proc.address();
  const size_t n = ids.size();
  auto admin = v1::Coordinator::NewStub(NewChannel(address));
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<v1::Coordinator::Stub>> stubs;
  for (int t = 0; t < cfg.client_threads; ++t) {
    channels.push_back(NewChannel(address));
    stubs.push_back(v1::Coordinator::NewStub(channels.back()));
  }
  const int64_t jobs_before = CountJobs(*admin);
  const int alive_before = CountAlive(*admin);
  // Steady clock nanoseconds: of the kill (0 before it), and of each
  // worker's first answered heartbeat after it.
  std::atomic<int64_t> killed_at{0};
  std::vector<std::atomic<int64_t>> back(n);
  for (auto& b : back) b = 0;
  std::atomic<size_t> reattached{0};
  std::atomic<int64_t> not_found{0};
  auto ns = [] { return SteadyClock::now().time_since_epoch().count(); };
  const auto start = SteadyClock::now() + std::chrono::milliseconds(50);
  const auto give_up = start + std::chrono::seconds(150);
  std::vector<std::thread> pool;
  for (int t = 0; t < cfg.client_threads; ++t) {
    pool.emplace_back([&, t] {
      v1::HeartbeatRequest req;
      for (int64_t round = 0; reattached < n && SteadyClock::now() < give_up; ++round) {
        for (size_t k = t; k < n; k += cfg.client_threads) {
          const auto due = start + kHeartbeatPeriod * round +
                           std::chrono::nanoseconds(kHeartbeatPeriod) * static_cast<int64_t>(k) /
                               static_cast<int64_t>(n);
          std::this_thread::sleep_until(due);
          if (back[k] != 0) continue;
          req.set_worker_id(ids[k]);
          req.set_worker_secret(secrets[k]);
          v1::HeartbeatResponse resp;
          // A channel that is not ready is waited for (200 ms at most)
          // before the call: the wait drives its reconnect and TLS
          // handshake, as a worker's one heartbeat per period does. Calls
          // that fail at once on a reconnecting channel leave its handshake
          // unread (no thread of this process polls it), and the many
          // simulated workers sharing a channel would only ever fail at once.
          if (channels[t]->GetState(true) != GRPC_CHANNEL_READY) {
            channels[t]->WaitForConnected(std::chrono::system_clock::now() +
                                          std::chrono::milliseconds(200));
          }
          grpc::ClientContext ctx;
          ctx.set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
          if (!TheAuth().worker.empty()) {
            ctx.AddMetadata("authorization", "Bearer " + TheAuth().worker);
          }
          const int64_t sent = ns();
          grpc::Status st = stubs[t]->Heartbeat(&ctx, req, &resp);
          if (st.error_code() == grpc::StatusCode::NOT_FOUND) ++not_found;
          if (st.ok() && killed_at != 0 && sent > killed_at) {
            back[k] = ns();
            ++reattached;
          }
        }
      }
    });
  }
  std::this_thread::sleep_until(start + std::chrono::seconds(3));  // steady state first
  killed_at = ns();
  proc.Kill9();
  const int64_t down = ns();
  absl::Status restarted = proc.Restart();
  const int64_t listening = ns();
  if (!restarted.ok()) std::cerr << "control_plane_bench: restart: " << restarted << "\n";
  for (auto& th : pool) th.join();
  if (!restarted.ok()) return restarted;
  int64_t last = 0;
  for (auto& b : back) last = std::max<int64_t>(last, b);
  const int alive = CountAlive(*admin);
  const int64_t jobs_after = CountJobs(*admin);
  auto secs = [](int64_t a, int64_t b) { return (b - a) / 1e9; };
  notes->push_back(absl::StrFormat(
      "restart            workers=%-5d kill -9, then listening again after %.2f s (state "
      "load); %zu of %zu workers answered again %.2f s after the kill (ALIVE in ListWorkers: "
      "%d before the kill, %d after; %d NOT_FOUND answers); jobs listed before %d, after %d",
      n, secs(down, listening), reattached.load(), n,
      reattached == n ? secs(killed_at, last) : -1.0, alive_before, alive, not_found.load(),
      jobs_before, jobs_after));
  if (reattached != n) {
    return absl::InternalError(
        absl::StrCat("not every worker re-attached in 150 s: ", notes->back()));
  }
  return absl::OkStatus();
}

// Measures one worker count on a fresh coordinator; appends rows.
absl::Status RunSize(int workers, const Config& cfg, const std::string& run_dir,
                     std::vector<Row>* rows, std::vector<std::string>* notes) {
  std::unique_ptr<CoordinatorUnderTest> in_process;
  std::unique_ptr<CoordinatorProcess> proc;
  if (cfg.process) {
    const std::string dir = absl::StrCat(run_dir, "/coordinator-", workers);
    std::filesystem::create_directories(dir);
    std::vector<std::string> args = {"--lease-ms", absl::StrCat(cfg.lease_ms)};
    if (cfg.tls) {
      for (const char* a : {"--tls-cert", "cert.pem", "--tls-key", "key.pem"}) {
        args.push_back(a[0] == '-' ? a : absl::StrCat(run_dir, "/", a));
      }
    }
    if (cfg.tokens) {
      args.push_back("--tokens");
      args.push_back(run_dir + "/tokens.txt");
    }
    auto p = CoordinatorProcess::Start(cfg.coordinator_bin, dir, args);
    if (!p.ok()) return p.status();
    proc = *std::move(p);
  } else {
    auto coord = CoordinatorUnderTest::Start(cfg.lease_ms);
    if (!coord.ok()) return coord.status();
    in_process = *std::move(coord);
  }
  const std::string address = proc ? proc->address() : in_process->address();
  const int64_t rss_before = proc ? proc->RssBytes() : 0;

  // Register every simulated worker, client_threads registrations in flight.
  std::vector<std::string> ids(workers), secrets(workers);  // Heartbeat needs both
  {
    auto stubs = NewStubs(address, cfg.client_threads);
    Samples s = RunThreads(cfg.client_threads, [&](int t, Samples* out) {
      for (int k = t; k < workers; k += cfg.client_threads) {
        v1::RegisterWorkerRequest req = SimulatedWorker(k);
        v1::RegisterWorkerResponse resp;
        if (TimedCall(
                [&](grpc::ClientContext* ctx) { return stubs[t]->RegisterWorker(ctx, req, &resp); },
                out)) {
          ids[k] = resp.worker_id();
          secrets[k] = resp.worker_secret();
        }
      }
    });
    if (s.errors > 0) return absl::InternalError(absl::StrCat(s.errors, " registrations failed"));
    rows->push_back(MakeRow("register", workers, std::move(s)));
  }
  // One CPU worker (untimed): the bench's CPU jobs of world 2 are then
  // accepted, as a registered worker can run them, and never placed, as one
  // is too few. Without it admission refuses them, and submit rows would
  // time refusals.
  {
    auto stub = v1::Coordinator::NewStub(NewChannel(address));
    v1::RegisterWorkerRequest req = SimulatedWorker(workers);
    req.mutable_devices(0)->set_kind("cpu");
    req.mutable_devices(0)->set_name("cpu");
    v1::RegisterWorkerResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
    if (!TheAuth().worker.empty()) ctx.AddMetadata("authorization", "Bearer " + TheAuth().worker);
    if (grpc::Status g = stub->RegisterWorker(&ctx, req, &resp); !g.ok()) {
      return absl::InternalError("registering the CPU worker: " + g.error_message());
    }
  }

  // One heartbeat in flight, nothing else: the per-call cost of Heartbeat.
  {
    auto stub = v1::Coordinator::NewStub(NewChannel(address));
    Samples s;
    v1::HeartbeatRequest req;
    v1::HeartbeatResponse resp;
    const auto t0 = SteadyClock::now();
    for (int i = 0; i < cfg.serial_calls; ++i) {
      req.set_worker_id(ids[static_cast<size_t>(i) % ids.size()]);
      req.set_worker_secret(secrets[static_cast<size_t>(i) % ids.size()]);
      TimedCall([&](grpc::ClientContext* ctx) { return stub->Heartbeat(ctx, req, &resp); }, &s);
    }
    s.seconds = std::chrono::duration<double>(SteadyClock::now() - t0).count();
    rows->push_back(MakeRow("heartbeat_serial", workers, std::move(s)));

    // Submits with no load, back to back.
    rows->push_back(MakeRow("submit_idle", workers,
                            SubmitJobs(*stub, cfg.jobs, SteadyClock::duration::zero())));
  }

  if (proc) {
    const int64_t rss = proc->RssBytes();
    notes->push_back(absl::StrFormat(
        "coordinator_rss    workers=%-5d %.1f MiB after registering them, %.1f MiB before: "
        "%.2f MiB per 1,000 workers",
        workers, rss / 1048576.0, rss_before / 1048576.0,
        (rss - rss_before) / 1048576.0 / (workers / 1000.0)));
  }
  for (const std::string& mode : cfg.modes) {
    const bool paced = mode == "paced";
    const double cpu0 = proc ? proc->CpuSeconds() : 0;
    LoadResult r = RunLoad(address, ids, secrets, cfg, paced);
    if (proc && paced) {
      const double cores = (proc->CpuSeconds() - cpu0) / cfg.seconds;
      notes->push_back(absl::StrFormat(
          "coordinator_cpu    workers=%-5d %.3f cores busy under paced heartbeats (%.3f per "
          "1,000 workers) with %d submits",
          workers, cores, cores / (workers / 1000.0), cfg.jobs));
    }
    Row hb = MakeRow(absl::StrCat("heartbeat_", mode), workers, std::move(r.heartbeats));
    if (paced) {
      notes->push_back(absl::StrFormat(
          "heartbeat_paced  workers=%-5d %9.0f heartbeats/s achieved of %d/s target "
          "(each worker every 1 s)",
          workers, hb.rate, workers));
    } else {
      notes->push_back(absl::StrFormat(
          "heartbeat_flood  workers=%-5d %9.0f heartbeats/s (%d threads back to back)", workers,
          hb.rate, cfg.client_threads));
    }
    rows->push_back(std::move(hb));
    rows->push_back(
        MakeRow(absl::StrCat("submit_under_", mode, "_hb"), workers, std::move(r.submits)));
  }
  if (proc) {
    if (cfg.list_jobs > 0) {
      // The workers keep heartbeating meanwhile, as they would: their
      // leases must not run out while thousands of jobs are submitted.
      auto admin = v1::Coordinator::NewStub(NewChannel(address));
      const int before = CountAlive(*admin);
      {
        BackgroundHeartbeats keep(address, ids, secrets, cfg.client_threads);
        if (absl::Status st = ListPhase(address, workers, cfg, rows, notes); !st.ok()) return st;
      }
      notes->push_back(absl::StrFormat("list phase         workers=%-5d ALIVE before %d, after %d",
                                       workers, before, CountAlive(*admin)));
    }
    return RestartPhase(*proc, ids, secrets, cfg, notes);
  }
  return absl::OkStatus();
}

std::string LoadAverage() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return absl::StrCat(a, " ", b, " ", c);
}

// Processes named cc1plus / cc1 / ld right now: other engineers' builds.
int CompilersRunning() {
  int n = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    std::ifstream f(entry.path() / "comm");
    std::string comm;
    if (f >> comm && (comm == "cc1plus" || comm == "cc1" || comm == "ld" || comm == "nvcc")) ++n;
  }
  return n;
}

void PrintTable(const std::vector<Row>& rows, const Row& base) {
  std::cout << absl::StrFormat("%-24s %7s %7s %9s %9s %9s %9s %9s %10s\n", "metric", "workers",
                               "calls", "p50 us", "p99 us", "max us", "p50/base", "p99/base",
                               "rate/s");
  for (const Row& r : rows) {
    std::cout << absl::StrFormat("%-24s %7d %7d %9.1f %9.1f %9.1f %9.2f %9.2f %10.0f%s\n", r.metric,
                                 r.workers, r.calls, r.p50, r.p99, r.max, r.p50 / base.p50,
                                 r.p99 / base.p99, r.rate,
                                 r.errors ? absl::StrCat("  (", r.errors, " errors)") : "");
  }
}

void PrintJson(const std::vector<Row>& rows, const Row& base) {
  for (const Row& r : rows) {
    std::cout << absl::StrFormat(
        "{\"metric\": \"%s\", \"workers\": %d, \"p50_us\": %.1f, \"p99_us\": %.1f, "
        "\"max_us\": %.1f, \"baseline_p50_us\": %.1f, \"baseline_p99_us\": %.1f, "
        "\"ratio_p50\": %.3f, \"ratio_p99\": %.3f, \"rate_per_s\": %.1f}\n",
        r.metric, r.workers, r.p50, r.p99, r.max, base.p50, base.p99, r.p50 / base.p50,
        r.p99 / base.p99, r.rate);
  }
}

// --tls: a self-signed certificate for 127.0.0.1 (openssl); --tokens: a
// worker, a user and an admin token. Fills TheAuth() for clients and
// servers.
absl::Status SetUpAuth(const Config& cfg, const std::string& dir) {
  Auth& auth = TheAuth();
  if (cfg.tls) {
    const std::string cmd = absl::StrCat(
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 ",
        "-subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1,DNS:localhost -keyout ", dir,
        "/key.pem -out ", dir, "/cert.pem >/dev/null 2>&1");
    if (std::system(cmd.c_str()) != 0) return absl::InternalError("openssl could not make a cert");
    auto read = [](const std::string& path) {
      std::ifstream f(path);
      return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    };
    const std::string cert = read(dir + "/cert.pem"), key = read(dir + "/key.pem");
    auth.ca_pem = cert;
    grpc::SslServerCredentialsOptions server;
    server.pem_key_cert_pairs.push_back({key, cert});
    auth.server = grpc::SslServerCredentials(server);
  }
  if (cfg.tokens) {
    auth.worker = "bench-worker-token-0123456789";
    auth.user = "bench-user-token-0123456789ab";
    auth.admin = "bench-admin-token-0123456789a";
    std::ofstream f(dir + "/tokens.txt");
    f << auth.worker << " worker workers\n"
      << auth.user << " user bench\n"
      << auth.admin << " admin ops\n";
    if (!f.good()) return absl::InternalError("cannot write the token file");
  }
  return absl::OkStatus();
}

int Run(const Config& cfg) {
  auto spec = ValidateSpec(kSpec, {});
  if (!spec.ok() || spec->World() != 2) {
    std::cerr << "control_plane_bench: bench spec invalid: "
              << (spec.ok() ? "world != 2" : spec.status().ToString()) << "\n";
    return 1;
  }
  std::ostream& info = cfg.json ? std::cerr : std::cout;
  info << "control_plane_bench: " << std::thread::hardware_concurrency() << " cores, load "
       << LoadAverage() << ", " << CompilersRunning() << " compiler processes running\n";

  std::vector<Row> rows;
  std::vector<std::string> notes;
  std::string tmpl = (std::filesystem::temp_directory_path() / "cpbench-run-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    std::cerr << "control_plane_bench: mkdtemp failed\n";
    return 1;
  }
  const std::string run_dir = tmpl;
  struct RemoveDir {
    std::string dir;
    ~RemoveDir() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } remove_run_dir{run_dir};
  if (absl::Status st = SetUpAuth(cfg, run_dir); !st.ok()) {
    std::cerr << "control_plane_bench: " << st << "\n";
    return 1;
  }
  info << "control_plane_bench: coordinator "
       << (cfg.process ? "process " + cfg.coordinator_bin : std::string("in this process"))
       << (cfg.tls ? ", TLS" : ", plaintext")
       << (cfg.tokens ? ", bearer tokens" : ", no authentication") << "\n";

  // Baseline: empty unary RPC, serial, then flooded.
  Row base;
  {
    EmptyService empty;
    int port = 0;
    std::unique_ptr<grpc::Server> server = StartServer(&empty, &port);
    if (!server) {
      std::cerr << "control_plane_bench: cannot listen on 127.0.0.1:0\n";
      return 1;
    }
    const std::string address = absl::StrCat("127.0.0.1:", port);
    auto stub = v1::Coordinator::NewStub(NewChannel(address));
    SerialGetJob(*stub, std::min(cfg.serial_calls, 200));  // warm-up
    base = MakeRow("empty_rpc_serial", 0, SerialGetJob(*stub, cfg.serial_calls));
    rows.push_back(base);

    auto stubs = NewStubs(address, cfg.client_threads);
    const auto end =
        SteadyClock::now() + std::chrono::duration_cast<SteadyClock::duration>(
                                 std::chrono::duration<double>(std::max(1.0, cfg.seconds / 2)));
    Row flood = MakeRow(
        "empty_rpc_flood", 0, RunThreads(cfg.client_threads, [&](int t, Samples* s) {
          v1::GetJobRequest req;
          v1::Job resp;
          while (SteadyClock::now() < end) {
            TimedCall([&](grpc::ClientContext* ctx) { return stubs[t]->GetJob(ctx, req, &resp); },
                      s);
          }
        }));
    notes.push_back(absl::StrFormat(
        "empty_rpc_flood  workers=0     %9.0f calls/s (%d threads back to back): the stack's "
        "ceiling on this machine",
        flood.rate, cfg.client_threads));
    rows.push_back(flood);
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }

  for (int workers : cfg.workers) {
    if (auto s = RunSize(workers, cfg, run_dir, &rows, &notes); !s.ok()) {
      std::cerr << "control_plane_bench: workers=" << workers << ": " << s << "\n";
      PrintTable(rows, base);  // what was measured before the failure
      for (const std::string& n : notes) std::cout << n << "\n";
      return 1;
    }
  }

  if (cfg.json) {
    PrintJson(rows, base);
  } else {
    std::cout << absl::StrFormat(
        "\nbaseline: empty unary GetJob, one call in flight: p50 %.1f us, p99 %.1f us; "
        "ratios below are row / baseline\nclients: %d threads, one TCP connection each "
        "(+1 for submits); SQLite store, lease %d ms\n\n",
        base.p50, base.p99, cfg.client_threads, cfg.lease_ms);
    PrintTable(rows, base);
    std::cout << "\n";
    for (const std::string& n : notes) std::cout << n << "\n";
  }
  info << "control_plane_bench: load at end " << LoadAverage() << ", " << CompilersRunning()
       << " compiler processes running\n";
  return 0;
}

}  // namespace
}  // namespace shardtrain::coordinator

int main(int argc, char** argv) {
  shardtrain::coordinator::Config cfg;
  CLI::App app{
      "control_plane_bench: coordinator RPC latency (register, heartbeat, submit) under N\n"
      "simulated workers, as ratios to an empty unary RPC measured in the same run.\n"
      "A benchmark, not a test."};
  app.add_option("--workers", cfg.workers, "simulated worker counts, one fresh coordinator each")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(1, 100'000));
  app.add_option("--seconds", cfg.seconds, "heartbeat window per worker count and mode")
      ->capture_default_str()
      ->check(CLI::Range(0.5, 600.0));
  app.add_option("--jobs", cfg.jobs, "jobs submitted per submit phase")
      ->capture_default_str()
      ->check(CLI::Range(1, 100'000));
  app.add_option("--client-threads", cfg.client_threads,
                 "client threads, each with its own connection and a slice of the workers")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_option("--modes", cfg.modes,
                 "heartbeat modes: paced (each worker every 1 s), flood (back to back)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::IsMember({"paced", "flood"}));
  app.add_option("--serial-calls", cfg.serial_calls, "calls in each serial (one in flight) phase")
      ->capture_default_str()
      ->check(CLI::Range(10, 10'000'000));
  app.add_option("--lease-ms", cfg.lease_ms, "coordinator lease")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1000}, int64_t{3'600'000}));
  app.add_flag("--json", cfg.json, "one JSON object per row on stdout");
  app.add_flag("--process", cfg.process,
               "run the real shardtrain-coordinator in its own process: adds its RSS and CPU "
               "per 1,000 workers, --list-jobs and a kill -9 + restart with every worker "
               "re-attaching");
  app.add_flag("--tls", cfg.tls, "TLS with a certificate made for the run (openssl)");
  app.add_flag("--tokens", cfg.tokens, "bearer tokens on every call (worker, user, admin roles)");
  app.add_option("--list-jobs", cfg.list_jobs,
                 "--process: submit jobs until the coordinator holds this many, then time "
                 "listing them all (0: skip)")
      ->check(CLI::Range(0, 1'000'000));
  app.add_option("--coordinator-bin", cfg.coordinator_bin,
                 "--process: the coordinator program (default: ../bin/shardtrain-coordinator "
                 "beside this bench)");
  CLI11_PARSE(app, argc, argv);
  if ((cfg.tls || cfg.tokens || cfg.list_jobs > 0) && !cfg.process) {
    std::cerr << "control_plane_bench: --tls, --tokens and --list-jobs need --process\n";
    return 2;
  }
  if (cfg.process && cfg.coordinator_bin.empty()) {
    cfg.coordinator_bin =
        (std::filesystem::canonical("/proc/self/exe").parent_path().parent_path() / "bin" /
         "shardtrain-coordinator")
            .string();
  }
  return shardtrain::coordinator::Run(cfg);
}
