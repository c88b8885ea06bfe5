#ifndef SHARDTRAIN_COMMON_METRICS_HTTP_H_
#define SHARDTRAIN_COMMON_METRICS_HTTP_H_

// Serves a MetricsRegistry over HTTP (civetweb):
//   GET /metrics  200, Content-Type "text/plain; version=0.0.4; charset=utf-8",
//                 body = registry->Serialize()
//   GET /healthz  200 "ok\n" when healthy() is true (or no callback given),
//                 503 "unhealthy\n" otherwise (readiness: a coordinator that
//                 stands by is alive but not ready)
//   GET /livez    200 "ok\n" while the process serves (liveness)
//   anything else 404
//
// Thread-safe; requests are served on civetweb's own threads, so `registry`
// and `healthy` must be safe to call from other threads and must outlive the
// server. Destroying the server stops it (waiting for in-flight requests).

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

class CivetServer;
class CivetHandler;

namespace shardtrain {

class MetricsRegistry;

class MetricsHttpServer {
 public:
  // Listens on `listen` ("HOST:PORT"; port 0 picks a free port, see port()).
  // Returns INVALID_ARGUMENT for a malformed address or null registry, and
  // UNAVAILABLE naming the address when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& listen, MetricsRegistry* registry,
      std::function<bool()> healthy = nullptr);

  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // The bound TCP port.
  int port() const { return port_; }

 private:
  MetricsHttpServer() = default;

  std::unique_ptr<CivetHandler> handler_;  // outlives server_ (declared first)
  std::unique_ptr<CivetServer> server_;
  int port_ = 0;
  std::string wake_host_;  // where the destructor connects to wake the listener
};

}  // namespace shardtrain

#endif  // SHARDTRAIN_COMMON_METRICS_HTTP_H_
