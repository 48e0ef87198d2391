#include "server/operator_views.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/metrics/process_metrics.h"
#include "glog/logging.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server.h"
#include "proto/collector.grpc.pb.h"
#include "proto/query.grpc.pb.h"
#include "server/rpc_metrics.h"
#include "server/webhook_notifier.h"
#include "storage/store.h"

namespace sonde::server {
namespace {

struct PropertyGauge {
  const char* property;
  const char* name;
  const char* help;
  metrics::MetricType type = metrics::MetricType::kGauge;
};

// Per column family (label cf): cheap estimates RocksDB keeps anyway.
const PropertyGauge kFamilyGauges[] = {
    {"rocksdb.estimate-live-data-size", "sonde_rocksdb_live_data_bytes",
     "Estimated bytes of live data, by column family."},
    {"rocksdb.total-sst-files-size", "sonde_rocksdb_sst_files_bytes",
     "Bytes of all SST files (every version), by column family."},
    {"rocksdb.cur-size-all-mem-tables", "sonde_rocksdb_memtable_bytes",
     "Bytes in active and unflushed immutable memtables, by column family."},
    {"rocksdb.estimate-num-keys", "sonde_rocksdb_estimated_keys",
     "Estimated number of keys, by column family."},
    {"rocksdb.estimate-pending-compaction-bytes", "sonde_rocksdb_pending_compaction_bytes",
     "Estimated bytes compaction still has to rewrite, by column family."},
};

// Database-wide.
const PropertyGauge kDbGauges[] = {
    {"rocksdb.num-running-compactions", "sonde_rocksdb_running_compactions",
     "Compactions running now."},
    {"rocksdb.num-running-flushes", "sonde_rocksdb_running_flushes", "Flushes running now."},
    {"rocksdb.is-write-stopped", "sonde_rocksdb_write_stopped",
     "1 while RocksDB stops writes (too many memtables or L0 files), else 0."},
    {"rocksdb.block-cache-usage", "sonde_rocksdb_block_cache_usage_bytes",
     "Bytes held in the block cache."},
    {"rocksdb.block-cache-pinned-usage", "sonde_rocksdb_block_cache_pinned_bytes",
     "Bytes of the block cache pinned by readers."},
    {"rocksdb.block-cache-capacity", "sonde_rocksdb_block_cache_capacity_bytes",
     "Capacity of the block cache in bytes."},
    {"rocksdb.background-errors", "sonde_rocksdb_background_errors_total",
     "Background errors (failed flushes or compactions) since the store opened.",
     metrics::MetricType::kCounter},
};

http::HttpResponse Text(int status, std::string body) {
  http::HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

}  // namespace

const char* PhaseName(OperatorViews::Phase phase) {
  switch (phase) {
    case OperatorViews::Phase::kOpeningStore:
      return "opening_store";
    case OperatorViews::Phase::kRecovering:
      return "recovering";
    case OperatorViews::Phase::kStarting:
      return "starting";
    case OperatorViews::Phase::kServing:
      return "serving";
    case OperatorViews::Phase::kShuttingDown:
      return "shutting_down";
  }
  return "unknown";
}

OperatorViews::OperatorViews() {
  process_ = metrics::RegisterProcessMetrics(registry_);
  process_.push_back(registry_.AddCallbackGauge(
      "sonde_collector_ready",
      "1 while the collector is ready (store open, recovery done, serving, not shutting "
      "down), else 0.",
      [this] { return ready() ? 1.0 : 0.0; }));
}

OperatorViews::~OperatorViews() {
  http_.reset();  // no handler runs after this
  Unbind();
}

absl::StatusOr<std::unique_ptr<OperatorViews>> OperatorViews::Start(
    const std::string& metrics_listen) {
  std::unique_ptr<OperatorViews> views(new OperatorViews());
  if (metrics_listen.empty()) return views;
  http::HttpServerOptions options;
  options.listen = metrics_listen;
  OperatorViews* v = views.get();
  std::map<std::string, http::HttpRoute> routes;
  routes["/metrics"].handler = [v](const http::HttpRequest&) {
    http::HttpResponse r;
    r.content_type = metrics::kTextContentType;
    r.body = v->RenderMetrics();
    return r;
  };
  routes["/healthz"].handler = [](const http::HttpRequest&) { return Text(200, "ok\n"); };
  routes["/readyz"].handler = [v](const http::HttpRequest&) {
    const Phase phase = v->phase();
    if (phase == Phase::kServing) return Text(200, "ready\n");
    return Text(503, absl::StrCat("not ready: ", PhaseName(phase), "\n"));
  };
  auto http = http::HttpServer::Start(options, std::move(routes));
  if (!http.ok()) {
    return absl::Status(http.status().code(),
                        absl::StrCat("metrics endpoint: ", http.status().message()));
  }
  views->http_ = std::move(*http);
  views->address_ = views->http_->address();
  LOG(INFO) << "metrics and health on http://" << views->address_
            << "/metrics, /healthz, /readyz";
  return views;
}

void OperatorViews::StoreOpened(storage::Store* store) {
  std::vector<metrics::Registration> regs;
  for (const PropertyGauge& g : kFamilyGauges) {
    const std::string property = g.property;
    regs.push_back(registry_.AddCallback(g.type, g.name, g.help, {"cf"}, [store, property] {
      std::vector<metrics::Sample> out;
      for (const auto& [family, value] : store->ColumnFamilyIntProperty(property)) {
        out.push_back({{family}, static_cast<double>(value)});
      }
      return out;
    }));
  }
  for (const PropertyGauge& g : kDbGauges) {
    const std::string property = g.property;
    regs.push_back(registry_.AddCallback(g.type, g.name, g.help, {}, [store, property] {
      std::vector<metrics::Sample> out;
      if (auto v = store->DbIntProperty(property)) {
        out.push_back({{}, static_cast<double>(*v)});
      }
      return out;
    }));
  }
  {
    absl::MutexLock lock(&mu_);
    for (auto& r : regs) bound_.push_back(std::move(r));
  }
  phase_ = Phase::kRecovering;
}

void OperatorViews::BindPools(ThreadPool* storage_pool, ThreadPool* rule_pool) {
  metrics::Registration r = registry_.AddCallback(
      metrics::MetricType::kGauge, "sonde_pool_pending_tasks",
      "Tasks queued and not yet started, by pool (storage: step commits, stream joins and "
      "ends; rule: rule strands ready to run).",
      {"pool"}, [storage_pool, rule_pool] {
        return std::vector<metrics::Sample>{
            {{"storage"}, static_cast<double>(storage_pool->queue_depth())},
            {{"rule"}, static_cast<double>(rule_pool->queue_depth())}};
      });
  absl::MutexLock lock(&mu_);
  bound_.push_back(std::move(r));
}

void OperatorViews::BindWebhooks(const WebhookNotifier* webhooks) {
  metrics::Registration r = registry_.AddCallback(
      metrics::MetricType::kCounter, "sonde_webhook_deliveries_total",
      "Webhook deliveries by result: delivered, failed (every attempt failed), dropped "
      "(queue full).",
      {"result"}, [webhooks] {
        const WebhookNotifier::Counters c = webhooks->counters();
        return std::vector<metrics::Sample>{{{"delivered"}, static_cast<double>(c.delivered)},
                                            {{"failed"}, static_cast<double>(c.failed)},
                                            {{"dropped"}, static_cast<double>(c.dropped)}};
      });
  absl::MutexLock lock(&mu_);
  bound_.push_back(std::move(r));
}

void OperatorViews::SetHealth(bool serving) {
  if (server_ == nullptr) return;
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  if (health == nullptr) return;
  for (const std::string& service :
       {std::string(), std::string(v1::Collector::service_full_name()),
        std::string(v1::Query::service_full_name())}) {
    health->SetServingStatus(service, serving);
  }
}

void OperatorViews::ServerStarted(grpc::Server* server) {
  absl::MutexLock lock(&mu_);
  if (phase_ == Phase::kShuttingDown) return;
  server_ = server;
  SetHealth(false);
  phase_ = Phase::kStarting;
}

void OperatorViews::Serving() {
  absl::MutexLock lock(&mu_);
  if (phase_ == Phase::kShuttingDown) return;
  SetHealth(true);
  phase_ = Phase::kServing;
}

void OperatorViews::ShuttingDown() {
  absl::MutexLock lock(&mu_);
  phase_ = Phase::kShuttingDown;
  SetHealth(false);
  server_ = nullptr;  // the collector shuts it down next
}

void OperatorViews::Unbind() {
  std::vector<metrics::Registration> bound;
  {
    absl::MutexLock lock(&mu_);
    bound.swap(bound_);
  }
  bound.clear();  // waits for a scrape that is running them
}

std::string OperatorViews::RenderMetrics() const {
  const metrics::Registry* registries[] = {&registry_, &metrics::Registry::Default()};
  return metrics::RenderText(registries);
}

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
OperatorViews::Interceptors() {
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> out;
  out.push_back(NewRpcMetricsInterceptorFactory());
  return out;
}

}  // namespace sonde::server
