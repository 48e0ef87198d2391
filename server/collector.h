// The collector: opens the store, serves the Collector (ingest) and Query
// services plus gRPC health and reflection on one address, runs rules, and
// shuts down cleanly. Used by the sonde-collector binary, the demo (as an
// embedded collector) and tests (on port 0 with a temporary directory).
// Thread-safe.
#ifndef SONDE_SERVER_COLLECTOR_H_
#define SONDE_SERVER_COLLECTOR_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/rule.pb.h"
#include "server/ingest_limits.h"
#include "server/operator_views.h"
#include "server/retention.h"
#include "server/security.h"
#include "server/tensorboard/exporter.h"
#include "server/watch_options.h"
#include "server/notifier.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace sonde::storage {
class Store;
}  // namespace sonde::storage

namespace sonde::rules {
class RuleEnvironment;
class RuleFactory;
}  // namespace sonde::rules

namespace sonde::server {

class CollectorService;
class JobRegistry;
class OperatorViews;
class QueryService;
class ReflectionV1Service;
class AuthorizingQueryService;
class TokenTable;

struct CollectorOptions {
  // host:port to listen on. Port 0 picks a free port (see address()).
  // Default: loopback only.
  std::string listen = "127.0.0.1:7070";
  // host:port of the HTTP endpoint for operators: /metrics (Prometheus),
  // /healthz, /readyz, and the job reports /report?job=J and /reports
  // (server/operator_views.h). Port 0 picks a free port (see
  // metrics_address()). Default empty: no endpoint.
  std::string metrics_listen;
  // Whether and how that endpoint serves reports: render threads, queue,
  // timeout. Default: served (1 render at a time, 4 waiting, 60 s), except
  // over a non-loopback endpoint while gRPC uses TLS.
  OperatorReportOptions reports;
  // Directory of the RocksDB database; created if missing. Required.
  std::string data_dir;
  // fsync every commit (see storage::Store::Options). Default false.
  bool sync_writes = false;
  // Limits on what one stream may send.
  IngestLimits limits;
  // Bytes of open steps (received, not yet committed) all streams together
  // may hold in memory; past it a chunk ends its stream with
  // RESOURCE_EXHAUSTED and the client resends later. 0: no limit.
  uint64_t max_open_step_bytes = uint64_t{1} << 30;
  // Rules run for every job, besides those a client asks for in its hello.
  std::vector<v1::RuleSpec> default_rules;
  // Shared libraries of rule types (rules/plugin_api.h), loaded at start.
  std::vector<std::string> rule_plugins;
  // How long a step waits for every connected worker before the rules
  // judge it with what arrived. Default 60 s.
  absl::Duration step_wait = absl::Seconds(60);
  // A job with no worker connected for this long ends although some of its
  // world_size workers never sent their job end (they crashed, say).
  // Zero: never (the job waits, DISCONNECTED, for them to come back).
  absl::Duration worker_end_timeout = absl::ZeroDuration();
  // How long a worker stays its last client's after that client's stream
  // went: another client's hello for it is refused meanwhile (ALREADY_EXISTS,
  // which the hook retries), unless the owner ended.
  absl::Duration worker_lease = absl::Seconds(60);
  // Webhook and email deliveries: attempts, backoff, timeout, queue, and
  // the mail relay (without one, rules asking for Email are refused).
  NotifierOptions notifications;
  // Threads committing steps to RocksDB. Default 2.
  int storage_threads = 2;
  // Threads evaluating rules. Default 2.
  int rule_threads = 2;
  // How long Shutdown waits for in-flight calls before cancelling them.
  // Default 2 s.
  absl::Duration shutdown_grace = absl::Seconds(2);
  // Deleting old jobs in the background (server/retention.h). Default: off,
  // every job is kept.
  RetentionOptions retention;
  // TLS, client certificates, bearer tokens (server/security.h,
  // server/auth.h). Default: plaintext, no authentication, which is only
  // allowed on a loopback `listen`.
  ServerSecurityOptions security;
  // TensorBoard event files of jobs (server/tensorboard/exporter.h): which
  // jobs, where, per worker, which statistics. Default: only jobs whose
  // hello metadata asks ("sonde.tensorboard" = "on" or "per_worker"), into
  // <data_dir>/tensorboard when `tensorboard.dir` is empty.
  tensorboard::ExportOptions tensorboard;
  // How far a WatchSteps reader may fall behind (server/watch_calls.h).
  WatchOptions watch;
  // Serve the Collector ingest stream. A cluster node (server/cluster/)
  // takes its ingest from the log instead, through registry() and store().
  bool serve_ingest = true;
};

class Collector {
 public:
  // Opens the store and starts serving. InvalidArgument for bad options
  // (NotFound for an unknown default rule type),
  // Unavailable if the address cannot be bound, store errors as they come.
  static absl::StatusOr<std::unique_ptr<Collector>> Start(const CollectorOptions& options);
  // Bytes of open steps held now and at most (null: no limit set).
  const OpenStepBudget* open_steps() const { return open_steps_.get(); }
  ~Collector();

  // The address actually listened on, e.g. "127.0.0.1:40123".
  const std::string& address() const { return address_; }
  // The metrics endpoint's address, e.g. "127.0.0.1:9464"; empty when off.
  const std::string& metrics_address() const { return metrics_address_; }
  // WatchRuleResults and WatchSteps calls open now.
  size_t open_watches() const;

  // For a cluster node, which applies its partitions of the log here. They
  // live until Shutdown.
  JobRegistry* registry() const { return registry_.get(); }
  storage::Store* store() const { return store_.get(); }

  // Stops accepting, ends open streams (acknowledged data stays stored),
  // waits for rules to finish what they were given, closes the store.
  // Idempotent.
  void Shutdown();

 private:
  Collector() = default;

  std::string address_;
  std::string metrics_address_;
  std::unique_ptr<OperatorViews> views_;
  std::unique_ptr<rules::RuleFactory> rule_factory_;
  std::unique_ptr<storage::Store> store_;
  std::unique_ptr<rules::RuleEnvironment> rule_environment_;
  std::unique_ptr<ThreadPool> storage_pool_;
  std::unique_ptr<ThreadPool> rule_pool_;
  std::unique_ptr<Notifier> notifier_;
  std::unique_ptr<JobRegistry> registry_;
  std::unique_ptr<OpenStepBudget> open_steps_;  // null without a limit
  std::unique_ptr<CollectorService> collector_service_;
  std::unique_ptr<QueryService> query_service_;
  std::unique_ptr<TokenTable> tokens_;  // null without authentication
  std::unique_ptr<AuthorizingQueryService> authorizing_query_service_;  // likewise
  std::unique_ptr<ReflectionV1Service> reflection_v1_;
  std::unique_ptr<RetentionThread> retention_;  // null when retention is off
  std::unique_ptr<tensorboard::Exporter> tensorboard_;
  std::unique_ptr<grpc::Server> server_;
  absl::Duration shutdown_grace_;
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace sonde::server

#endif  // SONDE_SERVER_COLLECTOR_H_
