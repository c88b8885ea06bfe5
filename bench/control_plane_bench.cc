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
// --state etcd (with --process): the coordinator keeps its state in a
// one-member etcd started for the run (each worker count under its own key
// prefix), so every acknowledged write is an etcd commit; --failovers N then
// starts a standby coordinator beside it and kills (-9) the serving one N
// times, timing each kill until the other serves (--leader-ttl-s, default
// 2). bench/control_plane_ha.sh runs SQLite and etcd one after the other.
//
//   control_plane_bench [--workers 100,1000] [--seconds 5] [--jobs 200]
//                       [--client-threads 8] [--modes paced,flood]
//                       [--serial-calls 2000] [--lease-ms 30000] [--json]
//                       [--process [--tls] [--tokens] [--list-jobs 10000]
//                        [--coordinator-bin PATH] [--state sqlite|etcd [--failovers N]]]
#include <grpcpp/grpcpp.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_util.h"
#include "bench/control_plane_load.h"
#include "bench/control_plane_phases.h"
#include "bench/control_plane_rpc.h"
#include "bench/coordinator_process.h"
#include "coordinator/spec_validator.h"
#include "shardtrain/v1/coordinator.grpc.pb.h"

namespace shardtrain::coordinator {
namespace {

// The baseline: GetJob answers OK with an empty Job, nothing else is served.
class EmptyService final : public v1::Coordinator::Service {
 public:
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest*, v1::Job*) override {
    return grpc::Status::OK;
  }
};

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
    if (!cfg.etcd_url.empty()) {  // a prefix of its own per worker count
      args.insert(args.end(), {"--state", absl::StrCat(cfg.etcd_url, "/cpbench-", workers),
                               "--leader-ttl-s", absl::StrCat(cfg.leader_ttl_s)});
    }
    auto p = CoordinatorProcess::Start(cfg.coordinator_bin, dir, args);
    if (!p.ok()) return p.status();
    proc = *std::move(p);
    if (!cfg.etcd_url.empty() && !WaitServing(proc->address(), std::chrono::seconds(60))) {
      return absl::DeadlineExceededError("the coordinator on etcd did not lead within 60 s");
    }
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
    if (absl::Status st = RestartPhase(*proc, ids, secrets, cfg, notes); !st.ok()) return st;
    if (!cfg.etcd_url.empty() && cfg.failovers > 0) {
      return FailoverPhase(*proc, run_dir, workers, cfg, notes);
    }
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

int Run(Config cfg) {
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
  std::unique_ptr<EtcdProcess> etcd;
  if (cfg.state == "etcd") {
    auto started = EtcdProcess::Start(run_dir);
    if (!started.ok()) {
      std::cerr << "control_plane_bench: " << started.status() << "\n";
      return 1;
    }
    etcd = *std::move(started);
    cfg.etcd_url = etcd->url();
  }
  info << "control_plane_bench: coordinator "
       << (cfg.process ? "process " + cfg.coordinator_bin : std::string("in this process"))
       << ", state " << (cfg.state == "etcd" ? "etcd (one member, " + cfg.etcd_url + ")" : "SQLite")
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
        "(+1 for submits); %s store, lease %d ms\n\n",
        base.p50, base.p99, cfg.client_threads, cfg.state == "etcd" ? "etcd" : "SQLite",
        cfg.lease_ms);
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
  app.add_option("--state", cfg.state,
                 "--process: the coordinator's state: sqlite (--state-dir) or etcd (a one-member "
                 "etcd started for the run, /usr/bin/etcd)")
      ->capture_default_str()
      ->check(CLI::IsMember({"sqlite", "etcd"}));
  app.add_option("--failovers", cfg.failovers,
                 "--state etcd: then start a standby coordinator and kill -9 the leader this "
                 "many times, timing each kill until the other one serves")
      ->check(CLI::Range(0, 1000));
  app.add_option("--leader-ttl-s", cfg.leader_ttl_s, "--state etcd: the leader lease's TTL")
      ->capture_default_str()
      ->check(CLI::Range(1, 60));
  app.add_option("--coordinator-bin", cfg.coordinator_bin,
                 "--process: the coordinator program (default: ../bin/shardtrain-coordinator "
                 "beside this bench)");
  CLI11_PARSE(app, argc, argv);
  if ((cfg.tls || cfg.tokens || cfg.list_jobs > 0 || cfg.state != "sqlite") && !cfg.process) {
    std::cerr << "control_plane_bench: --tls, --tokens, --list-jobs and --state etcd need "
                 "--process\n";
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
