// What operators see of a running collector: readiness (for /readyz and the
// gRPC health service), the collector's own metrics (scrape-time gauges of
// its store, pools, notifier and process), and the optional HTTP endpoint
// serving them:
//
//   /metrics  Prometheus text format 0.0.4: this object's registry plus
//             metrics::Registry::Default() (ingest, queries, rules, ...)
//   /healthz  200 while the process serves HTTP at all (liveness)
//   /readyz   200 only while the collector is ready: store open, recovery
//             done, gRPC serving, not shutting down; else 503 and the phase
//   /report?job=J  the job's HTML report, the page Query.GetReport returns
//   /reports  an HTML index of the jobs (those the token may read), each
//             linking to its report
//
// The report routes run on the endpoint's blocking pool (a report of a big
// job can take seconds), never on its poll thread, so probes and scrapes
// answer while one renders; see OperatorReportOptions for the limits and for
// when they are served at all. With a TokenTable they need
// "Authorization: Bearer <token>" with the read right on the job (401 with
// WWW-Authenticate without a known token, 403 without the right), as
// Query.GetReport does; without one they are open, like /metrics. Tokens are
// never logged (only the grant's name and fingerprint).
//
// The Collector owns one and reports each step of its life to it (the HTTP
// endpoint comes up first, so probes answer while RocksDB recovers).
// Bind* registrations read objects the Collector owns: Unbind() (which waits
// for a report that is rendering) before destroying them. Thread-safe.
#ifndef SONDE_SERVER_OPERATOR_VIEWS_H_
#define SONDE_SERVER_OPERATOR_VIEWS_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/http/http_server.h"
#include "common/metrics/metrics.h"
#include "common/thread_pool.h"
#include "grpcpp/support/server_interceptor.h"
#include "proto/query.pb.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace sonde::storage {
class Store;
}  // namespace sonde::storage

namespace sonde::server {

class TokenTable;
class Notifier;

// /report and /reports on the operator endpoint.
struct OperatorReportOptions {
  enum class Serve {
    // Served, except when the collector's gRPC uses TLS and the endpoint
    // listens beyond loopback: the endpoint is plain HTTP, so bearer tokens
    // (which may also carry write or admin rights over gRPC) and the reports
    // would cross the network in clear where the operator asked gRPC not
    // to. Nor beyond loopback when the collector checks no tokens (anyone
    // who reaches the address would read every job), unless allow_insecure.
    // There the routes answer 404 saying why.
    kAuto,
    // Always served (e.g. behind a TLS-terminating proxy on the same host).
    kOn,
    // Never served (404 saying so).
    kOff,
  };
  // Default kAuto.
  Serve serve = Serve::kAuto;
  // Reports rendered at once (the endpoint's blocking threads), 1 to 16.
  // Default 1: a render reads RocksDB hard, and the collector's ingest
  // comes first.
  int render_threads = 1;
  // Report requests that may wait for a render thread; more are answered
  // 503 with Retry-After. Requests refused anyway (no or a bad token, no
  // right, a bad name) are answered at once and never wait. 0 to 1024.
  // Default 4.
  int max_queued = 4;
  // How long a report request may wait for a thread and render before the
  // client gets 503 (the render still finishes; its page is dropped).
  // Reading the request and sending the page each have the endpoint's own
  // 5 s. Default 60 s.
  absl::Duration timeout = absl::Seconds(60);
};

// "auto", "on", "off"; InvalidArgument otherwise.
absl::StatusOr<OperatorReportOptions::Serve> ParseReportServe(absl::string_view text);

struct OperatorViewsOptions {
  // host:port of the HTTP endpoint (port 0 picks one); empty: no endpoint.
  std::string listen;
  OperatorReportOptions reports;
  // Whether the collector's gRPC serves TLS, checks bearer tokens, and was
  // allowed to listen beyond loopback with neither (--allow_insecure): these
  // decide Serve::kAuto. Default false.
  bool grpc_tls = false;
  bool grpc_tokens = false;
  bool allow_insecure = false;
};

// What /report and /reports read; the Collector binds it once the store is
// open (before that, and after Unbind, they answer 503).
struct ReportSource {
  // The page of `job`, the one Query.GetReport returns. NotFound only for
  // an unknown job. Called on the endpoint's render threads.
  std::function<absl::StatusOr<std::string>(const std::string& job)> render;
  // Every job, for the index.
  std::function<absl::StatusOr<std::vector<v1::JobInfo>>()> list_jobs;
  // Bearer tokens, not owned; null: no authentication.
  const TokenTable* tokens = nullptr;
};

class OperatorViews {
 public:
  enum class Phase {
    kOpeningStore,  // RocksDB opening (and replaying its log)
    kRecovering,    // jobs from the last run being marked, rules checked
    kStarting,      // gRPC server started, Start not finished yet
    kServing,       // ready
    kShuttingDown,  // Shutdown began
  };

  // InvalidArgument / Unavailable as HttpServer::Start.
  static absl::StatusOr<std::unique_ptr<OperatorViews>> Start(
      const OperatorViewsOptions& options);
  // The same with default report options.
  static absl::StatusOr<std::unique_ptr<OperatorViews>> Start(const std::string& metrics_listen);
  ~OperatorViews();

  // The HTTP endpoint's address, e.g. "127.0.0.1:40123"; empty when off.
  const std::string& address() const { return address_; }
  // Whether /report and /reports serve reports (endpoint on and not turned
  // off by OperatorReportOptions).
  bool serves_reports() const { return serves_reports_; }

  // The collector's steps. Each may be called once, in this order.
  void StoreOpened(storage::Store* store);  // -> kRecovering; RocksDB gauges
  void BindPools(ThreadPool* storage_pool, ThreadPool* rule_pool);
  void BindNotifier(const Notifier* notifier);
  // What the report routes read, until Unbind().
  void BindReports(ReportSource source);
  // The gRPC server is built: its health service says NOT_SERVING for ""
  // and every Sonde service until Serving(). -> kStarting.
  void ServerStarted(grpc::Server* server);
  // Ready: health SERVING, /readyz 200. -> kServing.
  void Serving();
  // Not ready any more: health NOT_SERVING, /readyz 503. -> kShuttingDown.
  // Idempotent; call first thing in Shutdown.
  void ShuttingDown();
  // Drops every gauge reading the store, pools or notifier and the report
  // source; after it returns none runs again (it waits for a scrape or a
  // report that is running).
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
  // The report routes' handlers (on the endpoint's render threads).
  // Before a report request is queued: the answer to a request that would
  // be refused (no source, no or a bad token, no right, a bad job name).
  std::optional<http::HttpResponse> AdmitReport(const http::HttpRequest& request);
  http::HttpResponse ServeReport(const http::HttpRequest& request);
  http::HttpResponse ServeReportIndex(const http::HttpRequest& request);
  // The bound report source, counted as in use (Unbind waits for it) for
  // as long as this holder lives. Empty when none was bound.
  class ReportsInUse {
   public:
    ReportsInUse(OperatorViews* views, std::shared_ptr<const ReportSource> source)
        : views_(views), source_(std::move(source)) {}
    ~ReportsInUse() {
      if (source_ != nullptr) views_->ReleaseReports();
    }
    ReportsInUse(const ReportsInUse&) = delete;
    ReportsInUse& operator=(const ReportsInUse&) = delete;

    explicit operator bool() const { return source_ != nullptr; }
    const ReportSource& operator*() const { return *source_; }
    const ReportSource* operator->() const { return source_.get(); }

   private:
    OperatorViews* const views_;
    const std::shared_ptr<const ReportSource> source_;
  };
  // The bound source; empty (with the 503 to send in *refusal) when none is
  // bound.
  ReportsInUse AcquireReports(http::HttpResponse* refusal);
  void ReleaseReports();
  bool ReportsIdle() const ABSL_SHARED_LOCKS_REQUIRED(reports_mu_) {
    return reports_in_use_ == 0;
  }

  metrics::Registry registry_;  // this collector's gauges
  std::vector<metrics::Registration> process_;
  std::atomic<Phase> phase_{Phase::kOpeningStore};
  absl::Mutex mu_;
  grpc::Server* server_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::vector<metrics::Registration> bound_ ABSL_GUARDED_BY(mu_);
  absl::Mutex reports_mu_;
  std::shared_ptr<const ReportSource> reports_ ABSL_GUARDED_BY(reports_mu_);
  int reports_in_use_ ABSL_GUARDED_BY(reports_mu_) = 0;  // handlers holding reports_
  std::string address_;
  bool serves_reports_ = false;
  std::unique_ptr<http::HttpServer> http_;  // last: stops before the rest goes
};

// "opening_store", "recovering", "starting", "serving", "shutting_down".
const char* PhaseName(OperatorViews::Phase phase);

}  // namespace sonde::server

#endif  // SONDE_SERVER_OPERATOR_VIEWS_H_
