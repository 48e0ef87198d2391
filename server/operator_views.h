// What operators see of a running collector: readiness (for /readyz and the
// gRPC health service), the collector's own metrics (scrape-time gauges of
// its store, pools, webhooks and process), and the optional HTTP endpoint
// serving them:
//
//   /metrics  Prometheus text format 0.0.4: this object's registry plus
//             metrics::Registry::Default() (ingest, queries, rules, ...)
//   /healthz  200 while the process serves HTTP at all (liveness)
//   /readyz   200 only while the collector is ready: store open, recovery
//             done, gRPC serving, not shutting down; else 503 and the phase
//
// The Collector owns one and reports each step of its life to it (the HTTP
// endpoint comes up first, so probes answer while RocksDB recovers).
// Bind* registrations read objects the Collector owns: Unbind() before
// destroying them. Thread-safe.
#ifndef SONDE_SERVER_OPERATOR_VIEWS_H_
#define SONDE_SERVER_OPERATOR_VIEWS_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/http/http_server.h"
#include "common/metrics/metrics.h"
#include "common/thread_pool.h"
#include "grpcpp/support/server_interceptor.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace sonde::storage {
class Store;
}  // namespace sonde::storage

namespace sonde::server {

class WebhookNotifier;

class OperatorViews {
 public:
  enum class Phase {
    kOpeningStore,  // RocksDB opening (and replaying its log)
    kRecovering,    // jobs from the last run being marked, rules checked
    kStarting,      // gRPC server started, Start not finished yet
    kServing,       // ready
    kShuttingDown,  // Shutdown began
  };

  // `metrics_listen`: host:port of the HTTP endpoint (port 0 picks one);
  // empty: no endpoint. InvalidArgument / Unavailable as HttpServer::Start.
  static absl::StatusOr<std::unique_ptr<OperatorViews>> Start(const std::string& metrics_listen);
  ~OperatorViews();

  // The HTTP endpoint's address, e.g. "127.0.0.1:40123"; empty when off.
  const std::string& address() const { return address_; }

  // The collector's steps. Each may be called once, in this order.
  void StoreOpened(storage::Store* store);  // -> kRecovering; RocksDB gauges
  void BindPools(ThreadPool* storage_pool, ThreadPool* rule_pool);
  void BindWebhooks(const WebhookNotifier* webhooks);
  // The gRPC server is built: its health service says NOT_SERVING for ""
  // and every Sonde service until Serving(). -> kStarting.
  void ServerStarted(grpc::Server* server);
  // Ready: health SERVING, /readyz 200. -> kServing.
  void Serving();
  // Not ready any more: health NOT_SERVING, /readyz 503. -> kShuttingDown.
  // Idempotent; call first thing in Shutdown.
  void ShuttingDown();
  // Drops every gauge reading the store, pools or webhooks; after it returns
  // none runs again.
  void Unbind();

  Phase phase() const { return phase_.load(); }
  bool ready() const { return phase() == Phase::kServing; }

  // The full exposition /metrics serves.
  std::string RenderMetrics() const;

  // Server interceptors that count ingest and query traffic
  // (server/rpc_metrics.h); install them on the collector's ServerBuilder.
  static std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
  Interceptors();

 private:
  OperatorViews();
  void SetHealth(bool serving) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  metrics::Registry registry_;  // this collector's gauges
  std::vector<metrics::Registration> process_;
  std::atomic<Phase> phase_{Phase::kOpeningStore};
  absl::Mutex mu_;
  grpc::Server* server_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::vector<metrics::Registration> bound_ ABSL_GUARDED_BY(mu_);
  std::string address_;
  std::unique_ptr<http::HttpServer> http_;  // last: stops before the rest goes
};

// "opening_store", "recovering", "starting", "serving", "shutting_down".
const char* PhaseName(OperatorViews::Phase phase);

}  // namespace sonde::server

#endif  // SONDE_SERVER_OPERATOR_VIEWS_H_
