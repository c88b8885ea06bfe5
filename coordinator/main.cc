// shardtrain-coordinator: membership, job queue, plans, rendezvous KV and
// durable state for a shardtrain cluster.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <memory>
#include <mutex>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "common/address.h"
#include "common/metrics.h"
#include "common/metrics_http.h"
#include "common/process.h"
#include "common/version.h"
#include "coordinator/auth.h"
#include "coordinator/coordinator.h"
#include "coordinator/etcd_client.h"
#include "coordinator/fencing.h"
#include "coordinator/service.h"
#include "coordinator/spec_validator.h"
#include "coordinator/state_store.h"
#if SHARDTRAIN_HAVE_ETCD
#include "coordinator/etcd_election.h"
#include "coordinator/etcd_state_store.h"
#endif

namespace {

struct Flags {
  std::string listen = "127.0.0.1:7070";
  std::string state_dir;
  std::string state = "sqlite";  // or etcd://H:P,...
  std::string etcd_cacert, etcd_cert, etcd_key, etcd_user, etcd_password;
  int64_t etcd_timeout_ms = 5000;
  int64_t leader_ttl_s = 5;
  std::string advertise;  // this coordinator's address for clients (etcd: the leader's value)
  std::string metrics_listen;
  std::string port_file;
  int64_t lease_ms = 10'000;
  shardtrain::coordinator::AdmissionLimits limits;
  int reserve_after = shardtrain::coordinator::CoordinatorOptions().reserve_after;
  std::string tls_cert, tls_key, tls_ca;  // PEM files; TLS on when cert and key are set
  std::string tokens;                     // token file; authentication on when set
  bool insecure = false;                  // plaintext on a non-loopback address
};

// The credentials --tls-cert/--tls-key/--tls-ca ask for: TLS (mutual with a
// CA: clients must present a certificate it signed), or plaintext.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const Flags& f) {
  if (f.tls_cert.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions opts(
      f.tls_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                       : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  if (auto s = shardtrain::ReadFile(f.tls_key, &pair.private_key); !s.ok()) return s;
  if (auto s = shardtrain::ReadFile(f.tls_cert, &pair.cert_chain); !s.ok()) return s;
  opts.pem_key_cert_pairs.push_back(std::move(pair));
  if (!f.tls_ca.empty()) {
    if (auto s = shardtrain::ReadFile(f.tls_ca, &opts.pem_root_certs); !s.ok()) return s;
  }
  return grpc::SslServerCredentials(opts);
}

int Fail(const std::string& msg) {
  std::cerr << "shardtrain-coordinator: " << msg << "\n";
  return 1;
}

// Usage errors exit 2, as the CLI's do.
int UsageError(const absl::Status& s) {
  std::cerr << "shardtrain-coordinator: " << s.message() << "\n";
  return 2;
}

// Replaces this process with a fresh run of the same command line (a
// deposed leader comes back as a standby, with nothing of its memory).
[[noreturn]] void ExecSelf(char** argv) {
  std::cout.flush();
  std::cerr.flush();
  ::execv("/proc/self/exe", argv);
  std::cerr << "shardtrain-coordinator: cannot restart itself: " << std::strerror(errno)
            << "; exiting" << std::endl;
  std::_Exit(1);
}

// --state etcd://... and the --etcd-* flags as the store's options.
absl::StatusOr<shardtrain::coordinator::EtcdOptions> EtcdFlags(const Flags& f) {
  absl::StatusOr<shardtrain::coordinator::EtcdOptions> o =
      shardtrain::coordinator::ParseEtcdUrl(f.state);
  if (!o.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--state: ", o.status().message(), " (or sqlite)"));
  }
  if (f.etcd_cert.empty() != f.etcd_key.empty()) {
    return absl::InvalidArgumentError("--etcd-cert and --etcd-key go together");
  }
  if (!f.etcd_cert.empty() && f.etcd_cacert.empty()) {
    return absl::InvalidArgumentError("--etcd-cert needs --etcd-cacert");
  }
  if (!f.etcd_cacert.empty()) {
    if (auto s = shardtrain::ReadFile(f.etcd_cacert, &o->ca); !s.ok()) return s;
  }
  if (!f.etcd_cert.empty()) {
    if (auto s = shardtrain::ReadFile(f.etcd_cert, &o->cert); !s.ok()) return s;
    if (auto s = shardtrain::ReadFile(f.etcd_key, &o->key); !s.ok()) return s;
  }
  if (!f.etcd_user.empty()) {
    const size_t colon = f.etcd_user.find(':');
    o->user = f.etcd_user.substr(0, colon);
    o->password = colon == std::string::npos ? f.etcd_password : f.etcd_user.substr(colon + 1);
    if (o->password.empty()) {
      return absl::InvalidArgumentError(
          "--etcd-user needs a password (USER:PASSWORD or "
          "--etcd-password)");
    }
  }
  o->timeout_ms = f.etcd_timeout_ms;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace shardtrain;
  using namespace shardtrain::coordinator;
  BlockTerminationSignals();

  Flags flags;
  CLI::App app{
      "shardtrain-coordinator: the control plane of a shardtrain cluster.\n"
      "Holds worker membership (leases), the job queue with gang scheduling, every job's\n"
      "plan, the rendezvous key-value store workers bootstrap collectives with, and the\n"
      "durable state (SQLite in --state-dir, or etcd with --state etcd://...). Stop it with\n"
      "SIGTERM or Ctrl-C.\n"
      "Without --tokens there is no authentication (every caller is an admin), and without\n"
      "--tls-cert it serves only loopback addresses unless --insecure is given."};
  app.set_version_flag("--version", VersionLine("shardtrain-coordinator"));
  app.add_option(
         "--listen", flags.listen,
         "gRPC address: " + AddressForms(AddressUse::kListen) + "; port 0 picks a free port")
      ->capture_default_str();
  app.add_option("--state-dir", flags.state_dir,
                 "directory of the durable state (created if absent); a restart on the same "
                 "directory keeps every acknowledged job. Required with --state sqlite");
  app.add_option("--state", flags.state,
                 "where the durable state lives: sqlite (in --state-dir, one machine) or "
                 "etcd://HOST:PORT[,HOST:PORT...][/PREFIX] (an etcd 3.4+ cluster: a coordinator "
                 "on another machine finds every job there; keys under PREFIX, default "
                 "/shardtrain/)")
      ->capture_default_str();
  app.add_option("--etcd-cacert", flags.etcd_cacert,
                 "etcd over TLS: verify the members' certificates with this CA bundle (PEM)");
  app.add_option("--etcd-cert", flags.etcd_cert,
                 "etcd client certificate (PEM), with --etcd-key; needs --etcd-cacert");
  app.add_option("--etcd-key", flags.etcd_key, "private key (PEM) of --etcd-cert");
  app.add_option("--etcd-user", flags.etcd_user,
                 "etcd authentication: USER[:PASSWORD] (as etcdctl's --user)");
  app.add_option("--etcd-password", flags.etcd_password,
                 "the password of --etcd-user, when it does not carry one");
  app.add_option("--leader-ttl-s", flags.leader_ttl_s,
                 "etcd: several coordinators on one etcd elect a leader; the others stand by "
                 "and take over within about this long after the leader dies or hangs (its "
                 "lease's TTL)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{600}));
  app.add_option("--advertise", flags.advertise,
                 "etcd: the HOST:PORT clients and workers reach this coordinator at, which "
                 "standbys name as the leader's (default: the --listen address as bound)");
  app.add_option(
         "--etcd-timeout-ms", flags.etcd_timeout_ms,
         "how long one etcd call may take, trying the members in turn; past it the RPC that "
         "wrote is refused UNAVAILABLE")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{100}, int64_t{600'000}));
  app.add_option("--metrics-listen", flags.metrics_listen,
                 "HTTP address for /metrics, /healthz and /livez, HOST:PORT (e.g. 127.0.0.1:9090; "
                 "port 0 allowed); off when empty. /healthz is 503 on a standby (etcd): a "
                 "readiness check; /livez is 200 on leader and standby alike: a liveness check");
  app.add_option("--port-file", flags.port_file,
                 "write the chosen gRPC port (line 1) and metrics port (line 2, if any) here");
  app.add_option("--lease-ms", flags.lease_ms, "a worker silent for this long is declared DEAD")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{100}, int64_t{3'600'000}));
  app.add_option("--max-world", flags.limits.max_world,
                 "refuse at submit a job of more ranks (dp x tp x pp) than this")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--max-params", flags.limits.max_params,
                 "refuse at submit a model of more parameters than this")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-plan-bytes", flags.limits.max_plan_bytes,
                 "refuse at submit a job whose plan (layout, shards; ~80 bytes per tensor, "
                 "12 tensors per layer) would be larger than this; GetPlan answers must fit "
                 "gRPC's 4 MiB")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-spec-bytes", flags.limits.max_spec_bytes,
                 "refuse at submit a spec (YAML and overrides together) larger than this")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--reserve-after", flags.reserve_after,
                 "backfill: a waiting job that later, smaller jobs have overtaken this many "
                 "times reserves the free workers of its device kind until it starts (0 = "
                 "strict FIFO)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--tls-cert", flags.tls_cert,
                 "serve TLS with this certificate chain (PEM); needs --tls-key");
  app.add_option("--tls-key", flags.tls_key, "private key (PEM) of --tls-cert");
  app.add_option("--tls-ca", flags.tls_ca,
                 "mutual TLS: clients must present a certificate this CA (PEM) signed");
  app.add_option("--tokens", flags.tokens,
                 "bearer tokens, one a line: TOKEN ROLE NAME (ROLE: worker, user, admin). "
                 "Without it there is no authentication: anyone who reaches the port is an "
                 "admin, which is allowed only on loopback or with --insecure");
  app.add_flag("--insecure", flags.insecure,
               "allow plaintext gRPC on a non-loopback --listen address (without TLS the "
               "coordinator binds only 127.0.0.1/::1/localhost otherwise)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help and --version exit 0
  }
  if (auto s = CheckAddressFlag("--listen", flags.listen, AddressUse::kListen); !s.ok()) {
    return UsageError(s);
  }
  if (!flags.metrics_listen.empty()) {
    auto s = CheckAddressFlag("--metrics-listen", flags.metrics_listen, AddressUse::kListen);
    if (!s.ok()) return UsageError(s);
  }

  if (flags.tls_cert.empty() != flags.tls_key.empty()) {
    return UsageError(absl::InvalidArgumentError("--tls-cert and --tls-key go together"));
  }
  if (!flags.tls_ca.empty() && flags.tls_cert.empty()) {
    return UsageError(absl::InvalidArgumentError("--tls-ca needs --tls-cert and --tls-key"));
  }
  if (flags.tls_cert.empty() && !flags.insecure) {
    absl::StatusOr<HostPort> hp = ParseAddress(flags.listen, AddressUse::kListen);
    if (hp.ok() && !IsLoopbackHost(hp->host)) {
      return UsageError(absl::InvalidArgumentError(absl::StrCat(
          "--listen ", flags.listen,
          " is not a loopback address and there is no TLS: pass --tls-cert/--tls-key (and "
          "--tokens), or --insecure to serve plaintext on it anyway")));
    }
  }
  Authenticator auth;
  if (!flags.tokens.empty()) {
    absl::StatusOr<Authenticator> loaded = Authenticator::Load(flags.tokens);
    if (!loaded.ok()) return UsageError(loaded.status());
    auth = *std::move(loaded);
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds = ServerCredentials(flags);
  if (!creds.ok()) return UsageError(creds.status());

  // The state, and the fencing key next to it: the key outlives restarts,
  // so ranks that keep running across one keep valid lease tokens.
  absl::StatusOr<std::unique_ptr<StateStore>> store;
  absl::StatusOr<FencingKey> key = absl::UnknownError("no state");
  std::string state_name = flags.state_dir;
  const bool on_etcd = flags.state != "sqlite";
  absl::StatusOr<EtcdOptions> etcd = absl::UnknownError("no etcd");
  if (!on_etcd) {
    if (flags.state_dir.empty()) {
      return UsageError(absl::InvalidArgumentError("--state sqlite needs --state-dir DIR"));
    }
    store = OpenSqliteStateStore(flags.state_dir);
    // OpenSqliteStateStore created the directory.
    if (store.ok()) key = FencingKey::LoadOrCreate(flags.state_dir + "/fencing.key");
  } else {
    etcd = EtcdFlags(flags);
    if (!etcd.ok()) return UsageError(etcd.status());
#if SHARDTRAIN_HAVE_ETCD
    // Connecting to etcd is the leader thread's (below): this coordinator
    // answers as a standby from the start, also while etcd is unreachable.
    state_name = flags.state;
#else
    return Fail(
        "this coordinator was built without etcd (golang-etcd-server-dev's protos were "
        "missing): use --state sqlite, or rebuild after scripts/setup");
#endif
  }
  if (!on_etcd && !store.ok()) return Fail(std::string(store.status().message()));
  if (!on_etcd && !key.ok()) return Fail(std::string(key.status().message()));
  RealClock clock;
  CoordinatorOptions options;
  options.lease_ms = flags.lease_ms;
  options.limits = flags.limits;
  options.reserve_after = flags.reserve_after;
  if (!on_etcd) options.fencing_key = *std::move(key);  // etcd's: once connected

  // SQLite: this coordinator serves at once. etcd: it stands by (answering
  // UNAVAILABLE with the leader's address) until elected.
  MetricsRegistry registry;
  std::unique_ptr<Coordinator> core;
  if (!on_etcd) {
    auto created = Coordinator::Create(options, *std::move(store), ValidateSpec, &clock);
    if (!created.ok()) return Fail(std::string((created.status().message())));
    core = *std::move(created);
    RegisterCoordinatorMetrics(core.get(), &registry);
  }
  std::mutex leader_mu;
  std::string leader_address;  // GUARDED_BY(leader_mu): the known leader's, for standby answers
  CoordinatorService service(core.get(), &registry, &auth, [&] {
    std::lock_guard<std::mutex> lock(leader_mu);
    return leader_address;
  });

  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(flags.listen, *creds, &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    return Fail(absl::StrCat("cannot listen on ", flags.listen,
                             " (address in use, or not this machine's? try --listen 127.0.0.1:0)"));
  }
  const std::string host = flags.listen.substr(0, flags.listen.rfind(':'));

  // The coordinator that serves (null while a standby): /healthz answers 503
  // on a standby, so a load balancer's readiness check (a Kubernetes
  // Service) sends clients to the leader alone.
  std::atomic<Coordinator*> serving{core.get()};
  std::unique_ptr<MetricsHttpServer> http;
  if (!flags.metrics_listen.empty()) {
    auto started = MetricsHttpServer::Start(flags.metrics_listen, &registry,
                                            [&] { return serving.load() != nullptr; });
    if (!started.ok()) return Fail(std::string(started.status().message()));
    http = *std::move(started);
  }
  std::cout << "shardtrain-coordinator listening on " << host << ":" << port << " (state "
            << state_name << ", lease " << flags.lease_ms << " ms, "
            << (flags.tls_cert.empty() ? "plaintext"
                : flags.tls_ca.empty() ? "TLS"
                                       : "mutual TLS")
            << ", " << (auth.enabled() ? "tokens" : "no authentication") << ")";
  if (http) std::cout << "; metrics on http://" << host << ":" << http->port() << "/metrics";
  std::cout << std::endl;
  if (!flags.port_file.empty()) {
    std::string content = absl::StrCat(port, "\n", http ? absl::StrCat(http->port(), "\n") : "");
    if (auto s = WriteFileAtomically(flags.port_file, content); !s.ok()) {
      return Fail(std::string(s.message()));
    }
  }

  // Lease checks and scheduling passes, ~10 per lease, once serving.
  std::mutex tick_mu;
  std::condition_variable tick_cv;
  bool stopping = false;
  std::thread ticker([&] {
    const auto period =
        std::chrono::milliseconds(std::clamp<int64_t>(flags.lease_ms / 10, 20, 500));
    std::unique_lock<std::mutex> lock(tick_mu);
    while (!tick_cv.wait_for(lock, period, [&] { return stopping; })) {
      Coordinator* c = serving.load();
      if (c == nullptr) continue;
      lock.unlock();
      try {
        c->Tick();
      } catch (const std::exception& e) {
        // The core turns what it can foresee into FAILED jobs; anything else
        // is logged and the next tick tries again, the coordinator stays up.
        std::cerr << "shardtrain-coordinator: scheduling pass threw: " << e.what() << std::endl;
      } catch (...) {
        std::cerr << "shardtrain-coordinator: scheduling pass threw" << std::endl;
      }
      lock.lock();
    }
  });

#if SHARDTRAIN_HAVE_ETCD
  // Several coordinators on one etcd: campaign; once elected, load the
  // state through a store whose every write is fenced by the leader key,
  // and serve. A lost lease or a fenced write ends the leadership: the
  // process starts again as a standby (exec), with nothing of the old
  // leader's memory.
  std::atomic<bool> stop_leading{false};
  std::unique_ptr<EtcdLeadership> leadership;
  std::thread leader_thread;
  if (on_etcd) {
    const std::string advertise =
        flags.advertise.empty() ? absl::StrCat(host, ":", port) : flags.advertise;
    leader_thread = std::thread([&, advertise] {
      auto restart = [&](const std::string& why) {
        std::cerr << "shardtrain-coordinator: " << why << "; starting again as a standby"
                  << std::endl;
        ExecSelf(argv);
      };
      // etcd may still be starting, or without a majority: wait for it
      // (saying so every 10 s) while answering as a standby.
      for (int attempt = 0; !stop_leading; ++attempt) {
        absl::Status s = OpenEtcdStateStore(*etcd).status();  // the schema check
        absl::StatusOr<FencingKey> fencing = s.ok() ? EtcdFencingKey(*etcd) : s;
        if (fencing.ok()) {
          auto created = EtcdLeadership::Create(*etcd, advertise, flags.leader_ttl_s);
          if (created.ok()) {
            options.fencing_key = *std::move(fencing);
            leadership = *std::move(created);
            break;
          }
          s = created.status();
        } else {
          s = fencing.status();
        }
        if (!absl::IsUnavailable(s)) {
          std::cerr << "shardtrain-coordinator: " << s.message() << std::endl;
          std::_Exit(1);
        }
        if (attempt % 10 == 0) {
          std::cerr << "shardtrain-coordinator: waiting for etcd: " << s.message() << std::endl;
        }
        std::this_thread::sleep_for(std::chrono::seconds(1));
      }
      if (stop_leading) return;
      std::thread observer([&] {  // the leader's address, for standby answers
        while (!stop_leading && serving.load() == nullptr) {
          std::string a = leadership->LeaderAddress();
          {
            std::lock_guard<std::mutex> lock(leader_mu);
            leader_address = a;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(500));
        }
      });
      std::cout << "shardtrain-coordinator: standing by; campaigning to lead (" << advertise
                << ", leader lease " << flags.leader_ttl_s << " s)" << std::endl;
      absl::StatusOr<EtcdLeaderKey> led = leadership->Campaign(stop_leading);
      if (!led.ok()) {
        stop_leading = true;
        observer.join();
        if (!absl::IsCancelled(led.status())) restart(std::string(led.status().message()));
        return;
      }
      EtcdWriteGuard guard{*led, [&](const std::string& why) { leadership->Lose(why); }};
      auto store = OpenEtcdStateStore(*etcd, guard);
      absl::StatusOr<std::unique_ptr<Coordinator>> loaded =
          store.ok() ? Coordinator::Create(options, *std::move(store), ValidateSpec, &clock)
                     : absl::StatusOr<std::unique_ptr<Coordinator>>(store.status());
      if (!loaded.ok()) {
        stop_leading = true;
        observer.join();
        restart("elected, but the state did not load: " + std::string(loaded.status().message()));
      }
      core = *std::move(loaded);
      RegisterCoordinatorMetrics(core.get(), &registry);
      serving = core.get();
      service.Serve(core.get());
      observer.join();
      std::cout << "shardtrain-coordinator: leading (elected at etcd revision " << led->rev
                << "); serving" << std::endl;
      while (!stop_leading) {
        if (leadership->lost()) {
          serving = nullptr;  // no more ticks
          restart("no longer the leader: " + leadership->lost_reason());
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
  }
#endif

  int sig = WaitForTerminationSignal();
  std::cout << "shardtrain-coordinator: signal " << sig << ", shutting down" << std::endl;
#if SHARDTRAIN_HAVE_ETCD
  stop_leading = true;
  if (leader_thread.joinable()) leader_thread.join();
#endif
  {
    std::lock_guard<std::mutex> lock(tick_mu);
    stopping = true;
  }
  tick_cv.notify_all();
  ticker.join();
  if (core) core->Shutdown();  // ends watches and KV waits
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  http.reset();
#if SHARDTRAIN_HAVE_ETCD
  leadership.reset();  // revokes the lease: a standby leads at once
#endif
  return 0;
}
