// auth_overhead_bench: what TLS and bearer tokens cost the coordinator's
// heartbeats (issue 15, acceptance 5). A benchmark, never a test.
//
// Two coordinators run in this process on 127.0.0.1:0, built as
// coordinator/main.cc builds them (core, service, Tick thread):
//   plain   plaintext, no token file (today's default on loopback);
//   secure  TLS (a CA and a server certificate for 127.0.0.1 made with the
//           openssl CLI in a temp dir at start) and a token file; every call
//           carries "authorization: Bearer <worker token>".
// Each gets --workers simulated workers (registered for real; they offer a
// "cuda" device and nothing is submitted, so every heartbeat is the steady
// state one). Then, alternating plain and secure for --rounds rounds so drift
// hits both alike:
//   serial  --serial-calls heartbeats, one in flight, over one connection;
//   paced   every worker beats once per second (the worker daemon's default)
//           for --seconds, from --client-threads threads, each with its own
//           connection (TLS handshakes happen before timing starts).
// Latency is send-to-response of each call; rows print p50/p99 and the
// secure/plain ratio of each.
//
//   auth_overhead_bench [--workers 1000] [--seconds 5] [--rounds 2]
//                       [--client-threads 8] [--serial-calls 2000] [--json]
#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_util.h"
#include "common/metrics.h"
#include "common/process.h"
#include "coordinator/auth.h"
#include "coordinator/clock.h"
#include "coordinator/coordinator.h"
#include "coordinator/service.h"
#include "coordinator/spec_validator.h"
#include "coordinator/state_store.h"
#include "shardtrain/v1/coordinator.grpc.pb.h"

namespace shardtrain::coordinator {
namespace {

using SteadyClock = std::chrono::steady_clock;
constexpr auto kDeadline = std::chrono::seconds(10);
constexpr char kToken[] = "bench-worker-token-0123456789";

struct Config {
  int workers = 1000;
  double seconds = 5;
  int rounds = 2;
  int client_threads = 8;
  int serial_calls = 2000;
  bool json = false;
};

// A PEM file the bench wrote with openssl; exits when it cannot be read.
std::string Pem(const std::string& path) {
  std::string out;
  if (absl::Status s = ReadFile(path, &out); !s.ok()) {
    std::cerr << "auth_overhead_bench: " << s.message() << "\n";
    std::exit(1);
  }
  return out;
}

// One coordinator, plain or secure, with its Tick thread.
class Server {
 public:
  Server(bool secure, const std::string& pki_dir) : secure_(secure) {
    CoordinatorOptions options;
    options.lease_ms = 30'000;
    core_ = *Coordinator::Create(options, NewMemoryStateStore(), ValidateSpec, &clock_);
    if (secure) {
      auth_ = *Authenticator::Parse(absl::StrCat(kToken, " worker bench\n"));
      ca_ = Pem(pki_dir + "/ca.pem");
    }
    service_ = std::make_unique<CoordinatorService>(core_.get(), &registry_, &auth_);
    std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
    if (secure) {
      grpc::SslServerCredentialsOptions o;
      o.pem_key_cert_pairs.push_back({Pem(pki_dir + "/server.key"), Pem(pki_dir + "/server.pem")});
      creds = grpc::SslServerCredentials(o);
    }
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", creds, &port_);
    b.RegisterService(service_.get());
    server_ = b.BuildAndStart();
    ticker_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(mu_);
      while (!cv_.wait_for(lock, std::chrono::milliseconds(500), [this] { return stop_; })) {
        lock.unlock();
        core_->Tick();
        lock.lock();
      }
    });
  }
  ~Server() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    ticker_.join();
    core_->Shutdown();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
  bool ok() const { return server_ && port_ > 0; }

  // A stub on its own connection, connected before it is returned.
  std::unique_ptr<v1::Coordinator::Stub> NewStub() const {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
    if (secure_) {
      grpc::SslCredentialsOptions o;
      o.pem_root_certs = ca_;
      creds = grpc::SslCredentials(o);
    }
    auto ch = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port_), creds, args);
    ch->WaitForConnected(std::chrono::system_clock::now() + kDeadline);
    return v1::Coordinator::NewStub(ch);
  }
  // A context as worker/coordinator_client.cc makes one.
  void Prepare(grpc::ClientContext* ctx) const {
    ctx->set_deadline(std::chrono::system_clock::now() + kDeadline);
    if (secure_) ctx->AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
  }

  std::vector<v1::HeartbeatRequest> beats;  // one per registered simulated worker

 private:
  const bool secure_;
  RealClock clock_;
  MetricsRegistry registry_;
  Authenticator auth_;
  std::string ca_;
  std::unique_ptr<Coordinator> core_;
  std::unique_ptr<CoordinatorService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread ticker_;
};

bool Register(Server& s, int workers) {
  auto stub = s.NewStub();
  for (int k = 0; k < workers; ++k) {
    v1::RegisterWorkerRequest req;
    req.set_host(absl::StrCat("sim-", k));
    req.set_collective_address("127.0.0.1");
    v1::Device* d = req.add_devices();
    d->set_name("cuda:0");
    d->set_kind("cuda");
    v1::RegisterWorkerResponse resp;
    grpc::ClientContext ctx;
    s.Prepare(&ctx);
    if (!stub->RegisterWorker(&ctx, req, &resp).ok()) return false;
    v1::HeartbeatRequest hb;
    hb.set_worker_id(resp.worker_id());
    hb.set_worker_secret(resp.worker_secret());
    s.beats.push_back(std::move(hb));
  }
  return true;
}

struct Samples {
  std::vector<double> us;
  int64_t errors = 0;
};

void Beat(const Server& s, v1::Coordinator::Stub& stub, const v1::HeartbeatRequest& req,
          Samples* out) {
  grpc::ClientContext ctx;
  s.Prepare(&ctx);
  v1::HeartbeatResponse resp;
  const auto t0 = SteadyClock::now();
  grpc::Status st = stub.Heartbeat(&ctx, req, &resp);
  out->us.push_back(std::chrono::duration<double, std::micro>(SteadyClock::now() - t0).count());
  if (!st.ok()) ++out->errors;
}

Samples Serial(const Server& s, int calls) {
  auto stub = s.NewStub();
  Samples out;
  for (int i = 0; i < calls; ++i) Beat(s, *stub, s.beats[i % s.beats.size()], &out);
  return out;
}

Samples Paced(const Server& s, const Config& cfg) {
  std::vector<std::unique_ptr<v1::Coordinator::Stub>> stubs;
  for (int t = 0; t < cfg.client_threads; ++t) stubs.push_back(s.NewStub());
  std::vector<Samples> per(cfg.client_threads);
  const size_t n = s.beats.size();
  const auto start = SteadyClock::now() + std::chrono::milliseconds(50);
  const auto end = start + std::chrono::duration_cast<SteadyClock::duration>(
                               std::chrono::duration<double>(cfg.seconds));
  std::vector<std::thread> pool;
  for (int t = 0; t < cfg.client_threads; ++t) {
    pool.emplace_back([&, t] {
      for (int64_t round = 0;; ++round) {
        for (size_t k = t; k < n; k += cfg.client_threads) {
          // Worker k beats at start + k/n s + `round` seconds.
          const auto due = start + std::chrono::seconds(round) +
                           std::chrono::nanoseconds(std::chrono::seconds(1)) *
                               static_cast<int64_t>(k) / static_cast<int64_t>(n);
          if (due >= end) return;
          std::this_thread::sleep_until(due);
          Beat(s, *stubs[t], s.beats[k], &per[t]);
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  Samples out;
  for (const Samples& p : per) {
    out.us.insert(out.us.end(), p.us.begin(), p.us.end());
    out.errors += p.errors;
  }
  return out;
}

int Run(const Config& cfg) {
  std::string dir = (std::filesystem::temp_directory_path() / "authbench-XXXXXX").string();
  if (mkdtemp(dir.data()) == nullptr) return 1;
  const std::string pki =
      "cd " + dir +
      " && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1"
      " -subj /CN=bench-ca -keyout ca.key -out ca.pem"
      " && openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=localhost"
      " -keyout server.key -out server.csr"
      " && printf 'subjectAltName=IP:127.0.0.1\\n' > san.ext"
      " && openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1"
      " -extfile san.ext -out server.pem";
  if (std::system(("(" + pki + ") >/dev/null 2>&1").c_str()) != 0) {
    std::cerr << "auth_overhead_bench: openssl could not make the test certificates\n";
    return 1;
  }
  Server plain(false, dir), secure(true, dir);
  std::filesystem::remove_all(dir);
  if (!plain.ok() || !secure.ok()) return 1;
  if (!Register(plain, cfg.workers) || !Register(secure, cfg.workers)) {
    std::cerr << "auth_overhead_bench: registration failed\n";
    return 1;
  }
  Samples ps, ss, pp, sp;  // plain/secure x serial/paced
  for (int r = 0; r < cfg.rounds; ++r) {
    auto merge = [](Samples* into, const Samples& s) {
      into->us.insert(into->us.end(), s.us.begin(), s.us.end());
      into->errors += s.errors;
    };
    merge(&ps, Serial(plain, cfg.serial_calls));
    merge(&ss, Serial(secure, cfg.serial_calls));
    merge(&pp, Paced(plain, cfg));
    merge(&sp, Paced(secure, cfg));
  }
  struct Line {
    const char* phase;
    const Samples& plain;
    const Samples& secure;
  };
  const Line lines[] = {{"heartbeat_serial", ps, ss}, {"heartbeat_paced", pp, sp}};
  if (!cfg.json) {
    std::cout << absl::StrFormat(
        "auth_overhead_bench: %d simulated workers, %d rounds, paced window %.1f s, %d client "
        "threads, %u CPUs\n",
        cfg.workers, cfg.rounds, cfg.seconds, cfg.client_threads,
        std::thread::hardware_concurrency());
    std::cout << absl::StrFormat("%-17s %-7s %8s %6s %10s %10s %9s %9s\n", "phase", "config",
                                 "calls", "errors", "p50_us", "p99_us", "p50_ratio", "p99_ratio");
  }
  for (const Line& l : lines) {
    const double p50 = bench::Percentile(l.plain.us, 0.5),
                 p99 = bench::Percentile(l.plain.us, 0.99);
    for (int secure_row = 0; secure_row < 2; ++secure_row) {
      const Samples& s = secure_row ? l.secure : l.plain;
      const double a = bench::Percentile(s.us, 0.5), b = bench::Percentile(s.us, 0.99);
      const char* config = secure_row ? "tls+tok" : "plain";
      if (cfg.json) {
        std::cout << absl::StrFormat(
            "{\"phase\": \"%s\", \"config\": \"%s\", \"workers\": %d, \"calls\": %u, "
            "\"errors\": %d, \"p50_us\": %.1f, \"p99_us\": %.1f, \"p50_ratio\": %.3f, "
            "\"p99_ratio\": %.3f}\n",
            l.phase, secure_row ? "tls+tokens" : "plain", cfg.workers, s.us.size(), s.errors, a, b,
            a / p50, b / p99);
      } else {
        std::cout << absl::StrFormat("%-17s %-7s %8u %6d %10.1f %10.1f %9.2f %9.2f\n", l.phase,
                                     config, s.us.size(), s.errors, a, b, a / p50, b / p99);
      }
    }
  }
  if (!cfg.json) std::cout << "ratios: this config's percentile / plain's, same phase, same run\n";
  return 0;
}

}  // namespace
}  // namespace shardtrain::coordinator

int main(int argc, char** argv) {
  shardtrain::coordinator::Config cfg;
  CLI::App app{
      "auth_overhead_bench: heartbeat latency of simulated workers with TLS + bearer tokens\n"
      "vs plaintext without tokens, in the same run, as ratios. A benchmark, not a test."};
  app.add_option("--workers", cfg.workers, "simulated workers")
      ->capture_default_str()
      ->check(CLI::Range(1, 100'000));
  app.add_option("--seconds", cfg.seconds, "paced window per round and config")
      ->capture_default_str()
      ->check(CLI::Range(0.5, 600.0));
  app.add_option("--rounds", cfg.rounds, "alternating plain/secure rounds")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  app.add_option("--client-threads", cfg.client_threads, "client threads, one connection each")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_option("--serial-calls", cfg.serial_calls, "heartbeats per serial phase")
      ->capture_default_str()
      ->check(CLI::Range(10, 10'000'000));
  app.add_flag("--json", cfg.json, "one JSON object per row on stdout");
  CLI11_PARSE(app, argc, argv);
  return shardtrain::coordinator::Run(cfg);
}
