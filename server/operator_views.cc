#include "server/operator_views.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "common/metrics/process_metrics.h"
#include "common/names.h"
#include "glog/logging.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server.h"
#include "proto/collector.grpc.pb.h"
#include "proto/query.grpc.pb.h"
#include "server/auth.h"
#include "server/report/svg.h"
#include "server/rpc_metrics.h"
#include "server/security.h"
#include "server/notifier.h"
#include "storage/store.h"

namespace sonde::server {
namespace {

using report::EscapeHtml;

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

constexpr char kHtml[] = "text/html; charset=utf-8";
// The report and the index are self-contained: inline CSS and SVG, no
// scripts, nothing fetched. Saying so lets a browser refuse anything else a
// job's data might smuggle in.
constexpr char kHtmlPolicy[] = "default-src 'none'; style-src 'unsafe-inline'; img-src data:";

http::HttpResponse Html(std::string body) {
  http::HttpResponse r;
  r.content_type = kHtml;
  r.body = std::move(body);
  r.headers.emplace_back("Content-Security-Policy", kHtmlPolicy);
  return r;
}

// "running" for JOB_STATUS_RUNNING.
std::string StatusText(v1::JobStatus status) {
  return absl::AsciiStrToLower(absl::StripPrefix(v1::JobStatus_Name(status), "JOB_STATUS_"));
}

std::string UtcTime(int64_t unix_micros) {
  if (unix_micros <= 0) return "";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMicros(unix_micros),
                          absl::UTCTimeZone());
}

// Who is asking, for the report routes: the grant of the request's bearer
// token. Without a TokenTable, null (the routes are open). A refusal is the
// 401 to send; it is logged with the peer, never with the header.
absl::StatusOr<const TokenGrant*> Authenticate(const ReportSource& source,
                                               const http::HttpRequest& request,
                                               http::HttpResponse* refusal) {
  if (source.tokens == nullptr) return nullptr;
  const std::string* header = request.Header("authorization");
  auto grant = source.tokens->Authenticate(header);
  if (grant.ok()) return grant;
  LOG(WARNING) << "refused " << request.path << " from " << request.peer << ": "
               << grant.status().message();
  *refusal = Text(401, header == nullptr
                           ? "this endpoint needs 'Authorization: Bearer <token>' (a token with "
                             "the read right on the job)\n"
                           : absl::StrCat(grant.status().message(), "\n"));
  // RFC 6750: a challenge always; "invalid_token" when one was sent.
  refusal->headers.emplace_back(
      "WWW-Authenticate", header == nullptr ? "Bearer realm=\"sonde\""
                                            : "Bearer realm=\"sonde\", error=\"invalid_token\"");
  return grant.status();
}

// The job a /report request names, if it is valid and the grant (null: no
// tokens) may read it; else `refusal` says why (400 or 403).
absl::StatusOr<std::string> CheckReportRequest(const http::HttpRequest& request,
                                               const TokenGrant* grant,
                                               http::HttpResponse* refusal) {
  const std::string* job = request.QueryParam("job");
  if (job == nullptr || job->empty()) {
    *refusal = Text(
        400, "missing query parameter 'job': ask /report?job=NAME; /reports lists the jobs\n");
    return absl::InvalidArgumentError("no job");
  }
  if (absl::Status valid = ValidateJobName(*job); !valid.ok()) {
    *refusal = Text(400, absl::StrCat("query parameter 'job': ", valid.message(), "\n"));
    return valid;
  }
  if (grant != nullptr) {
    absl::Status allowed = TokenTable::Check(*grant, *job, Right::kRead);
    if (!allowed.ok()) {
      LOG(WARNING) << "refused " << request.path << " from " << request.peer
                   << " (token fingerprint " << grant->fingerprint << "): " << allowed.message();
      *refusal = Text(403, absl::StrCat(allowed.message(), "\n"));
      return allowed;
    }
  }
  return *job;
}

}  // namespace

absl::StatusOr<OperatorReportOptions::Serve> ParseReportServe(absl::string_view text) {
  if (text == "auto") return OperatorReportOptions::Serve::kAuto;
  if (text == "on") return OperatorReportOptions::Serve::kOn;
  if (text == "off") return OperatorReportOptions::Serve::kOff;
  return absl::InvalidArgumentError(
      absl::StrCat("reports serving must be auto, on or off, got '", text, "'"));
}

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
  OperatorViewsOptions options;
  options.listen = metrics_listen;
  return Start(options);
}

absl::StatusOr<std::unique_ptr<OperatorViews>> OperatorViews::Start(
    const OperatorViewsOptions& views_options) {
  std::unique_ptr<OperatorViews> views(new OperatorViews());
  if (views_options.listen.empty()) return views;
  const OperatorReportOptions& reports = views_options.reports;
  http::HttpServerOptions options;
  options.listen = views_options.listen;
  options.blocking_threads = reports.render_threads;
  options.blocking_queue = reports.max_queued;
  options.blocking_timeout = reports.timeout;
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
  std::string why_not;
  switch (reports.serve) {
    case OperatorReportOptions::Serve::kOn:
      break;
    case OperatorReportOptions::Serve::kOff:
      why_not = "reports are turned off on this endpoint (--metrics_reports=off)";
      break;
    case OperatorReportOptions::Serve::kAuto:
      // Plain HTTP beyond loopback while gRPC is TLS: tokens and reports
      // would travel in clear where the operator chose encryption.
      if (views_options.grpc_tls && !IsLoopbackListen(views_options.listen)) {
        why_not = absl::StrCat(
            "reports are not served over plain HTTP on ", views_options.listen,
            " (not loopback) while the collector's gRPC uses TLS: bearer tokens and reports "
            "would cross the network in clear. Use `sonde report`, bind --metrics_listen to "
            "127.0.0.1, or pass --metrics_reports=on (e.g. behind a TLS proxy)");
      } else if (!views_options.grpc_tokens && !views_options.allow_insecure &&
                 !IsLoopbackListen(views_options.listen)) {
        // Without tokens anyone who reaches the address reads every job,
        // which the collector refuses for gRPC too (--allow_insecure).
        why_not = absl::StrCat(
            "reports are not served on ", views_options.listen,
            " (not loopback) without --auth_tokens: anyone who reaches it could read every "
            "job. Use `sonde report`, bind --metrics_listen to 127.0.0.1, set --auth_tokens, "
            "or pass --metrics_reports=on (or --allow_insecure)");
      }
      break;
  }
  if (why_not.empty()) {
    // Refusals are answered on the poll thread, so requests without the
    // right never hold a place in the render queue.
    auto admit = [v](const http::HttpRequest& r) { return v->AdmitReport(r); };
    routes["/report"] = {[v](const http::HttpRequest& r) { return v->ServeReport(r); },
                         /*blocking=*/true, admit};
    routes["/reports"] = {[v](const http::HttpRequest& r) { return v->ServeReportIndex(r); },
                          /*blocking=*/true, admit};
  } else {
    for (const char* path : {"/report", "/reports"}) {
      routes[path].handler = [why_not](const http::HttpRequest&) {
        return Text(404, absl::StrCat(why_not, "\n"));
      };
    }
  }
  auto http = http::HttpServer::Start(options, std::move(routes));
  if (!http.ok()) {
    return absl::Status(http.status().code(),
                        absl::StrCat("metrics endpoint: ", http.status().message()));
  }
  views->http_ = std::move(*http);
  views->address_ = views->http_->address();
  views->serves_reports_ = why_not.empty();
  LOG(INFO) << "metrics and health on http://" << views->address_
            << "/metrics, /healthz, /readyz"
            << (why_not.empty() ? ", job reports on /reports and /report?job=NAME" : "");
  if (!why_not.empty() && reports.serve == OperatorReportOptions::Serve::kAuto) {
    LOG(WARNING) << why_not;
  }
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

void OperatorViews::BindNotifier(const Notifier* notifier) {
  auto samples = [](const Notifier::Counters& c) {
    return std::vector<metrics::Sample>{{{"delivered"}, static_cast<double>(c.delivered)},
                                        {{"failed"}, static_cast<double>(c.failed)},
                                        {{"dropped"}, static_cast<double>(c.dropped)}};
  };
  metrics::Registration webhooks = registry_.AddCallback(
      metrics::MetricType::kCounter, "sonde_webhook_deliveries_total",
      "Webhook deliveries by result: delivered, failed (every attempt failed), dropped "
      "(queue full).",
      {"result"}, [notifier, samples] { return samples(notifier->webhooks()); });
  metrics::Registration emails = registry_.AddCallback(
      metrics::MetricType::kCounter, "sonde_email_deliveries_total",
      "Email deliveries (Email actions) by result: delivered (the relay took the mail), "
      "failed (every attempt failed), dropped (queue full).",
      {"result"}, [notifier, samples] { return samples(notifier->emails()); });
  absl::MutexLock lock(&mu_);
  bound_.push_back(std::move(webhooks));
  bound_.push_back(std::move(emails));
}

void OperatorViews::BindReports(ReportSource source) {
  auto shared = std::make_shared<const ReportSource>(std::move(source));
  absl::MutexLock lock(&reports_mu_);
  reports_ = std::move(shared);
}

OperatorViews::ReportsInUse OperatorViews::AcquireReports(http::HttpResponse* refusal) {
  {
    absl::MutexLock lock(&reports_mu_);
    if (reports_ != nullptr) {
      ++reports_in_use_;
      return ReportsInUse(this, reports_);
    }
  }
  *refusal = Text(503, absl::StrCat("reports are not available: ", PhaseName(phase()), "\n"));
  refusal->headers.emplace_back("Retry-After", "5");
  return ReportsInUse(this, nullptr);
}

void OperatorViews::ReleaseReports() {
  absl::MutexLock lock(&reports_mu_);
  --reports_in_use_;
}

std::optional<http::HttpResponse> OperatorViews::AdmitReport(const http::HttpRequest& request) {
  http::HttpResponse refusal;
  ReportsInUse source = AcquireReports(&refusal);
  if (!source) return refusal;
  auto grant = Authenticate(*source, request, &refusal);
  if (!grant.ok()) return refusal;
  if (request.path != "/report") return std::nullopt;  // the index filters by the grant
  if (!CheckReportRequest(request, *grant, &refusal).ok()) return refusal;
  return std::nullopt;
}

http::HttpResponse OperatorViews::ServeReport(const http::HttpRequest& request) {
  http::HttpResponse refusal;
  ReportsInUse source = AcquireReports(&refusal);
  if (!source) return refusal;
  auto grant = Authenticate(*source, request, &refusal);
  if (!grant.ok()) return refusal;
  // Checked again: the source may have been bound anew since admission.
  auto job = CheckReportRequest(request, *grant, &refusal);
  if (!job.ok()) return refusal;
  auto html = source->render(*job);
  if (absl::IsNotFound(html.status())) {
    return Text(404, absl::StrCat("no job named '", *job, "'\n"));
  }
  if (!html.ok()) {
    LOG(ERROR) << "report of job '" << *job << "' for " << request.peer << ": " << html.status();
    // The details (store paths, RocksDB's words) stay in the log.
    return Text(500, absl::StrCat("cannot render the report of job '", *job, "' (",
                                  absl::StatusCodeToString(html.status().code()),
                                  "; the collector's log says why)\n"));
  }
  return Html(std::move(*html));
}

http::HttpResponse OperatorViews::ServeReportIndex(const http::HttpRequest& request) {
  http::HttpResponse refusal;
  ReportsInUse source = AcquireReports(&refusal);
  if (!source) return refusal;
  auto grant = Authenticate(*source, request, &refusal);
  if (!grant.ok()) return refusal;
  auto listed = source->list_jobs();
  if (!listed.ok()) {
    LOG(ERROR) << "report index for " << request.peer << ": " << listed.status();
    return Text(500, absl::StrCat("cannot list the jobs (",
                                  absl::StatusCodeToString(listed.status().code()),
                                  "; the collector's log says why)\n"));
  }
  std::vector<v1::JobInfo> jobs;
  for (v1::JobInfo& job : *listed) {
    if (*grant == nullptr || TokenTable::Check(**grant, job.job(), Right::kRead).ok()) {
      jobs.push_back(std::move(job));
    }
  }
  // Newest first: the job an operator looks for is usually the latest.
  std::sort(jobs.begin(), jobs.end(), [](const v1::JobInfo& a, const v1::JobInfo& b) {
    if (a.start_unix_micros() != b.start_unix_micros()) {
      return a.start_unix_micros() > b.start_unix_micros();
    }
    return a.job() < b.job();
  });
  std::string out =
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<title>Sonde job reports</title><style>"
      "body{font-family:sans-serif;margin:2em;color:#222}"
      "table{border-collapse:collapse}th,td{padding:.3em .8em;border-bottom:1px solid #ddd;"
      "text-align:left}td.n{text-align:right}"
      "</style></head><body><h1>Sonde job reports</h1>";
  if (jobs.empty()) {
    absl::StrAppend(&out, "<p id=\"no-jobs\">No jobs",
                    *grant != nullptr ? " that this token may read" : "", ".</p>");
  } else {
    absl::StrAppend(&out, "<table id=\"jobs\"><thead><tr><th>job</th><th>status</th>"
                          "<th>workers</th><th>last step</th><th>started (UTC)</th>"
                          "<th>ended (UTC)</th></tr></thead><tbody>");
    for (const v1::JobInfo& job : jobs) {
      absl::StrAppend(&out, "<tr><td><a href=\"report?job=",
                      EscapeHtml(http::PercentEncode(job.job())), "\">", EscapeHtml(job.job()),
                      "</a></td><td>", EscapeHtml(StatusText(job.status())),
                      "</td><td class=\"n\">", job.workers_size(), "</td><td class=\"n\">",
                      job.last_step() >= 0 ? absl::StrCat(job.last_step()) : std::string(),
                      "</td><td>", UtcTime(job.start_unix_micros()), "</td><td>",
                      UtcTime(job.end_unix_micros()), "</td></tr>");
    }
    absl::StrAppend(&out, "</tbody></table>");
  }
  absl::StrAppend(&out, "</body></html>\n");
  return Html(std::move(out));
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
  absl::MutexLock lock(&reports_mu_);
  reports_.reset();
  reports_mu_.Await(absl::Condition(this, &OperatorViews::ReportsIdle));  // a render in progress
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
