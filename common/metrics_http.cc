#include "common/metrics_http.h"

#include <CivetServer.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
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

}  // namespace

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
