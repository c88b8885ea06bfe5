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
//   control_plane_bench [--workers 100,1000] [--seconds 5] [--jobs 200]
//                       [--client-threads 8] [--modes paced,flood]
//                       [--serial-calls 2000] [--lease-ms 30000] [--json]
#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_util.h"
#include "common/metrics.h"
#include "coordinator/clock.h"
#include "coordinator/coordinator.h"
#include "coordinator/service.h"
#include "coordinator/spec_validator.h"
#include "coordinator/state_store.h"
#include "shardtrain/v1/coordinator.grpc.pb.h"

namespace shardtrain::coordinator {
namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr char kSpec[] =
    "name: bench\n"
    "model: {layers: 1, heads: 1, dim: 8, context: 8, vocab: 256}\n"
    "data: {train: x.txt}\n"
    "batch: {global: 2, micro: 1, seq_len: 8}\n"
    "parallel: {dp: 2}\n"
    "steps: 1\n";
constexpr auto kRpcDeadline = std::chrono::seconds(10);
constexpr auto kHeartbeatPeriod = std::chrono::seconds(1);  // worker daemon default

struct Config {
  std::vector<int> workers = {100, 1000};
  double seconds = 5;
  int jobs = 200;
  int client_threads = 8;
  std::vector<std::string> modes = {"paced", "flood"};
  int serial_calls = 2000;
  int64_t lease_ms = 30'000;
  bool json = false;
};

// Per-call latencies (µs) of one phase, plus its failures and wall time.
struct Samples {
  std::vector<double> us;
  int64_t errors = 0;
  double seconds = 0;
  void Merge(const Samples& o) {
    us.insert(us.end(), o.us.begin(), o.us.end());
    errors += o.errors;
  }
};

struct Row {
  std::string metric;
  int workers = 0;
  size_t calls = 0;
  int64_t errors = 0;
  double p50 = 0, p99 = 0, max = 0;
  double rate = 0;  // completed calls per second of the phase
};

double Micros(SteadyClock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

Row MakeRow(const std::string& metric, int workers, Samples s) {
  std::sort(s.us.begin(), s.us.end());
  Row r;
  r.metric = metric;
  r.workers = workers;
  r.calls = s.us.size();
  r.errors = s.errors;
  r.p50 = bench::Percentile(s.us, 0.50);
  r.p99 = bench::Percentile(s.us, 0.99);
  r.max = s.us.empty() ? 0 : s.us.back();
  r.rate = s.seconds > 0 ? static_cast<double>(s.us.size()) / s.seconds : 0;
  return r;
}

// A channel with its own TCP connection (gRPC otherwise shares one connection
// among channels to the same target).
std::shared_ptr<grpc::Channel> NewChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  channel->WaitForConnected(std::chrono::system_clock::now() + kRpcDeadline);
  return channel;
}

// Times one unary call made like worker/coordinator_client.cc makes it.
template <typename Call>
bool TimedCall(Call&& call, Samples* out) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
  const auto t0 = SteadyClock::now();
  grpc::Status s = call(&ctx);
  out->us.push_back(Micros(SteadyClock::now() - t0));
  if (!s.ok()) ++out->errors;
  return s.ok();
}

std::unique_ptr<grpc::Server> StartServer(grpc::Service* service, int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || *port == 0) return nullptr;
  return server;
}

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

// One stub per client thread, each on its own connection.
std::vector<std::unique_ptr<v1::Coordinator::Stub>> NewStubs(const std::string& address, int n) {
  std::vector<std::unique_ptr<v1::Coordinator::Stub>> stubs;
  for (int i = 0; i < n; ++i) stubs.push_back(v1::Coordinator::NewStub(NewChannel(address)));
  return stubs;
}

// Runs body(t) on `threads` threads and merges their samples; wall time of
// the whole run goes into `seconds`.
Samples RunThreads(int threads, const std::function<void(int, Samples*)>& body) {
  std::vector<Samples> per(threads);
  std::vector<std::thread> pool;
  const auto t0 = SteadyClock::now();
  for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { body(t, &per[t]); });
  for (auto& th : pool) th.join();
  Samples all;
  all.seconds = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  for (const Samples& s : per) all.Merge(s);
  return all;
}

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
    TimedCall([&](grpc::ClientContext* ctx) { return stub.SubmitJob(ctx, req, &resp); }, &s);
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

// Measures one worker count on a fresh coordinator; appends rows.
absl::Status RunSize(int workers, const Config& cfg, std::vector<Row>* rows,
                     std::vector<std::string>* notes) {
  auto coord = CoordinatorUnderTest::Start(cfg.lease_ms);
  if (!coord.ok()) return coord.status();
  const std::string address = (*coord)->address();

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

  for (const std::string& mode : cfg.modes) {
    const bool paced = mode == "paced";
    LoadResult r = RunLoad(address, ids, secrets, cfg, paced);
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
    if (auto s = RunSize(workers, cfg, &rows, &notes); !s.ok()) {
      std::cerr << "control_plane_bench: workers=" << workers << ": " << s << "\n";
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
  CLI11_PARSE(app, argc, argv);
  return shardtrain::coordinator::Run(cfg);
}
