#include "common/metrics_http.h"

#include <CivetServer.h>
#include <arpa/inet.h>
#include <dlfcn.h>
#include <link.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/metrics.h"

namespace shardtrain {
namespace {

void Reply(mg_connection* conn, int code, const char* reason, const char* content_type,
           const std::string& body) {
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
            "Cache-Control: no-cache\r\nConnection: close\r\n\r\n",
            code, reason, content_type, body.size());
  mg_write(conn, body.data(), body.size());
}

// One handler for every path; dispatches on the exact URI.
class Handler : public CivetHandler {
 public:
  Handler(MetricsRegistry* registry, std::function<bool()> healthy)
      : registry_(registry), healthy_(std::move(healthy)) {}

  bool handleGet(CivetServer*, mg_connection* conn) override {
    const mg_request_info* info = mg_get_request_info(conn);
    std::string uri = info != nullptr && info->local_uri != nullptr ? info->local_uri : "";
    if (uri == "/metrics") {
      Reply(conn, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", registry_->Serialize());
    } else if (uri == "/livez") {
      Reply(conn, 200, "OK", "text/plain; charset=utf-8", "ok\n");
    } else if (uri == "/healthz") {
      if (!healthy_ || healthy_()) {
        Reply(conn, 200, "OK", "text/plain; charset=utf-8", "ok\n");
      } else {
        Reply(conn, 503, "Service Unavailable", "text/plain; charset=utf-8", "unhealthy\n");
      }
    } else {
      Reply(conn, 404, "Not Found", "text/plain; charset=utf-8", "not found\n");
    }
    return true;
  }

 private:
  MetricsRegistry* const registry_;
  const std::function<bool()> healthy_;
};

// Opens and closes one TCP connection to host:port (IPv4 only), ignoring errors.
void Poke(const std::string& host, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) return;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return;
  connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  close(fd);
}

// Bytes of thread-local storage glibc carves out of every thread's stack:
// the PT_TLS segments of the loaded objects, each with its alignment.
size_t StaticTlsBytes() {
  size_t total = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type == PT_TLS) *static_cast<size_t*>(data) += ph.p_memsz + ph.p_align;
        }
        return 0;
      },
      &total);
  return total;
}

}  // namespace

}  // namespace shardtrain

// civetweb (Debian's, built with USE_STACK_SIZE=102400) gives its threads
// 100 KiB stacks, and glibc takes each thread's static TLS out of the stack
// it is given: OpenBLAS alone holds 60 KiB of it, the CUDA runtime 4 KiB, so
// in a worker civetweb's threads were left with too little and died on the
// first request (or failed to start: "Cannot create first worker thread").
// This definition, in the program, is the one civetweb's call binds to: it
// hands glibc the requested size plus the TLS, so a thread gets the stack its
// creator asked for (the rule of glibc bug 11787). Any other library that
// sets a stack size gets the same, never less than it asked.
extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  using Fn = int (*)(pthread_attr_t*, size_t);
  static const Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  if (real == nullptr) return ENOSYS;
  return real(attr, size + shardtrain::StaticTlsBytes());
}

namespace shardtrain {

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& listen, MetricsRegistry* registry, std::function<bool()> healthy) {
  if (registry == nullptr) return absl::InvalidArgumentError("metrics server: null registry");
  size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon + 1 == listen.size() ||
      listen.find_first_not_of("0123456789", colon + 1) != std::string::npos ||
      listen.find(',') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics listen address \"", listen, "\": expected HOST:PORT"));
  }
  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer());
  server->handler_ = std::make_unique<Handler>(registry, std::move(healthy));
  std::vector<std::string> options = {"listening_ports",   listen, "num_threads", "4",
                                      "enable_keep_alive", "no"};
  try {
    server->server_ = std::make_unique<CivetServer>(options);
  } catch (const CivetException& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics server cannot listen on ", listen, ": ", e.what()));
  }
  server->server_->addHandler("/", server->handler_.get());
  std::vector<int> ports = server->server_->getListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(
        absl::StrCat("metrics server cannot listen on ", listen, ": no port bound"));
  }
  server->port_ = ports[0];
  std::string host = listen.substr(0, colon);
  server->wake_host_ = (host.empty() || host == "0.0.0.0") ? "127.0.0.1" : host;
  return server;
}

MetricsHttpServer::~MetricsHttpServer() {
  if (server_ == nullptr) return;
  // civetweb's listener polls in 2 s quanta and only notices the stop flag
  // when poll returns; poking the port while close() runs makes stopping take
  // milliseconds instead of up to 2 s.
  std::atomic<bool> closed{false};
  std::thread waker([&] {
    while (!closed.load()) {
      Poke(wake_host_, port_);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  server_->close();
  closed = true;
  waker.join();
}

}  // namespace shardtrain
