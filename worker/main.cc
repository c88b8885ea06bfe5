// shardtrain-worker: attaches one device (the CPU, or one GPU) to a
// shardtrain coordinator and runs the ranks it is assigned.
#include <atomic>
#include <filesystem>
#include <iostream>
#include <memory>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "common/address.h"
#include "common/metrics.h"
#include "common/metrics_http.h"
#include "common/process.h"
#include "common/version.h"
#include "worker/coordinator_client.h"
#include "worker/daemon.h"
#include "worker/device_probe.h"
#include "worker/job_runner.h"

int main(int argc, char** argv) {
  using namespace shardtrain;
  using namespace shardtrain::worker;
  BlockTerminationSignals();

  std::string coordinator;
  if (const char* env = std::getenv("SHARDTRAIN_COORDINATOR")) coordinator = env;
  std::string device = "cpu";
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::string metrics_listen;
  int64_t heartbeat_ms = 1000;
  std::string collective_address = "127.0.0.1";
  std::string checkpoint_root;
  std::string data_root;
  std::string token, token_file, tls_ca, tls_cert, tls_key;
  bool probe_devices = false;

  CLI::App app{
      "shardtrain-worker: runs the ranks a shardtrain coordinator assigns to this process.\n"
      "It registers its device, renews its lease with heartbeats, and trains the jobs it is\n"
      "given, talking to its peers directly (Gloo on CPU). Stop it with SIGTERM or Ctrl-C.\n"
      "Exit codes: 0 stopped, 1 it cannot run (e.g. --device cuda:N without that GPU), 2 usage\n"
      "error."};
  app.set_version_flag("--version", VersionLine("shardtrain-worker"));
  app.add_option("--coordinator", coordinator,
                 "coordinator address: " + AddressForms(AddressUse::kDial) +
                     ", or several comma-separated (coordinators on one etcd: reports and "
                     "heartbeats follow the leader) (default: $SHARDTRAIN_COORDINATOR)");
  app.add_option("--device", device,
                 "device this worker drives: cpu or cuda:N (one GPU, by CUDA ordinal; needs a "
                 "CUDA build and a GPU of compute capability 8.0 or newer, which trains in fp32, "
                 "bf16 and fp16; the cpu in fp32). Without that GPU the worker exits 1 naming the "
                 "reason")
      ->capture_default_str();
  app.add_flag("--probe-devices", probe_devices,
               "print this machine's GPUs and exit, one line each, tab-separated: NAME "
               "(cuda:N), PRECISIONS (fp32,bf16,fp16, or - for a GPU this build cannot train "
               "on), MEMORY_BYTES, COMPUTE_CAPABILITY, MODEL. Exit 0 when some GPU can train, "
               "1 otherwise with the reason on stderr (no GPU or driver, a build without CUDA). "
               "`shardtrain local` asks this before starting GPU workers");
  app.add_option("--threads", threads, "compute threads (BLAS and kernels)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option(
      "--metrics-listen", metrics_listen,
      "HTTP address for /metrics, /healthz and /livez, HOST:PORT (port 0 allowed); off when "
      "empty");
  app.add_option("--heartbeat-ms", heartbeat_ms, "heartbeat period (at most lease/3)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{10}, int64_t{60'000}));
  app.add_option("--collective-address", collective_address,
                 "address peers use to reach this worker's collectives")
      ->capture_default_str();
  app.add_option("--checkpoint-root", checkpoint_root,
                 "directory a job's relative checkpoint.dir (and --resume-from) resolves "
                 "against; every rank of a job must see the same checkpoint files through it "
                 "(a shared volume) (default: the working directory). When given, a spec's "
                 "checkpoint.dir and --resume-from must lie under it: one outside (absolute, or "
                 "escaping with ..) fails the job at once, naming the field");
  app.add_option("--data-root", data_root,
                 "directory a job's relative data.train and data.val resolve against (default: "
                 "the working directory). When given, data paths must lie under it: one outside "
                 "(absolute, or escaping with ..) fails the job at once, naming the field");
  app.add_option("--token", token,
                 "bearer token (role worker) for a coordinator started with --tokens; prefer "
                 "--token-file or $SHARDTRAIN_TOKEN, which other users cannot see in ps");
  app.add_option("--token-file", token_file,
                 "file holding the bearer token (default: $SHARDTRAIN_TOKEN)");
  app.add_option("--tls-ca", tls_ca, "CA certificate (PEM) of a TLS coordinator: TLS on");
  app.add_option("--tls-cert", tls_cert, "client certificate (PEM) for mutual TLS");
  app.add_option("--tls-key", tls_key, "private key (PEM) of --tls-cert");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help and --version exit 0; usage errors 2
  }

  if (probe_devices) {
    absl::StatusOr<std::vector<GpuInfo>> gpus = ProbeGpus();
    if (!gpus.ok()) {
      std::cerr << "shardtrain-worker: " << gpus.status().message() << "\n";
      return 1;
    }
    std::cout << ProbeLines(*gpus) << std::flush;
    for (const GpuInfo& g : *gpus) {
      if (!GpuPrecisions(g).empty()) return 0;
    }
    std::cerr << "shardtrain-worker: no CUDA device this build can train on: it needs compute "
                 "capability "
              << kMinComputeMajor << ".0 or newer\n";
    return 1;
  }

  if (coordinator.empty()) {
    std::cerr << "shardtrain-worker: no coordinator: pass --coordinator HOST:PORT or set "
                 "SHARDTRAIN_COORDINATOR\n";
    return 2;
  }
  absl::Status usage =
      CheckAddressListFlag(app.count("--coordinator") ? "--coordinator" : "SHARDTRAIN_COORDINATOR",
                           coordinator, AddressUse::kDial);
  if (usage.ok() && !metrics_listen.empty()) {
    usage = CheckAddressFlag("--metrics-listen", metrics_listen, AddressUse::kListen);
  }
  if (!usage.ok()) {
    std::cerr << "shardtrain-worker: " << usage.message() << "\n";
    return 2;
  }
  const char* env_token = std::getenv("SHARDTRAIN_TOKEN");
  absl::StatusOr<ConnectOptions> connect =
      ReadConnectOptions(token, token_file, env_token ? env_token : "", tls_ca, tls_cert, tls_key);
  if (!connect.ok()) {
    std::cerr << "shardtrain-worker: " << connect.status().message() << "\n";
    return 2;
  }
  WorkerOptions options;
  options.coordinator = coordinator;
  options.threads = threads;
  options.heartbeat_ms = heartbeat_ms;
  options.collective_address = collective_address;
  // A root as an absolute, normal path without a trailing '/' (the working
  // directory when the flag is empty); false after printing a usage error.
  auto absolute_root = [](const char* flag, const std::string& given, std::string* out) {
    std::error_code ec;
    std::filesystem::path root =
        given.empty() ? std::filesystem::current_path(ec) : std::filesystem::path(given);
    if (!ec) root = std::filesystem::absolute(root, ec).lexically_normal();
    if (ec) {
      std::cerr << "shardtrain-worker: " << flag << ": " << ec.message() << "\n";
      return false;
    }
    *out = root.string();
    if (out->size() > 1 && out->back() == '/') out->pop_back();
    return true;
  };
  if (!absolute_root("--checkpoint-root", checkpoint_root, &options.checkpoint_root) ||
      !absolute_root("--data-root", data_root, &options.data_root)) {
    return 2;
  }
  options.confine_checkpoints = !checkpoint_root.empty();
  options.confine_data = !data_root.empty();
  if (auto d = ProbeDevice(device, threads); d.ok()) {
    options.device = *d;
  } else {
    // A malformed name is a usage error; a GPU that is not there (or cannot
    // train) leaves nothing this worker could run.
    std::cerr << "shardtrain-worker: " << d.status().message() << "\n";
    return absl::IsInvalidArgument(d.status()) ? 2 : 1;
  }

  MetricsRegistry registry;
  std::unique_ptr<MetricsHttpServer> http;
  if (!metrics_listen.empty()) {
    auto started = MetricsHttpServer::Start(metrics_listen, &registry);
    if (!started.ok()) {
      std::cerr << "shardtrain-worker: " << started.status().message() << "\n";
      return 1;
    }
    http = *std::move(started);
    options.metrics_address =
        absl::StrCat(metrics_listen.substr(0, metrics_listen.rfind(':')), ":", http->port());
    std::cerr << "shardtrain-worker: metrics on http://" << options.metrics_address << "/metrics"
              << std::endl;
  }

  CoordinatorClient client(options.coordinator, 10'000, *connect);
  WorkerDaemon daemon(options, &client, NewJobRunner(&registry), &registry);
  std::atomic<bool> shutdown{false};
  std::thread signals([&] {
    WaitForTerminationSignal();
    shutdown = true;
  });
  signals.detach();
  daemon.Run(shutdown);
  return 0;
}
