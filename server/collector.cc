#include "server/collector.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "server/auth.h"
#include "server/authorizing_query_service.h"
#include "server/collector_service.h"
#include "server/job_registry.h"
#include "server/operator_views.h"
#include "proto/health.grpc.pb.h"
#include "server/query_service.h"
#include "server/reflection.h"
#include "server/store_rule_environment.h"
#include "server/notifier.h"
#include "rules/plugin_loader.h"
#include "rules/rule_factory.h"
#include "storage/store.h"
#include "rules/builtin_rules.h"

namespace sonde::server {
namespace {

// Room for a chunk's payload plus its descriptive fields.
constexpr int kMessageOverhead = 1 << 20;

}  // namespace

absl::StatusOr<std::unique_ptr<Collector>> Collector::Start(const CollectorOptions& options) {
  if (options.data_dir.empty()) return absl::InvalidArgumentError("data_dir is required");
  if (options.listen.empty()) return absl::InvalidArgumentError("listen address is empty");
  if (absl::Status s = ValidateRetentionOptions(options.retention); !s.ok()) return s;
  if (absl::Status s = CheckServerSecurity(options.listen, options.security); !s.ok()) {
    return s;
  }
  auto credentials = MakeServerCredentials(options.security);
  if (!credentials.ok()) return credentials.status();
  std::unique_ptr<TokenTable> tokens;
  if (options.security.auth()) {
    auto table = TokenTable::FromFile(options.security.auth_tokens_file);
    if (!table.ok()) return table.status();
    tokens = std::move(*table);
  }
  tensorboard::ExportOptions tensorboard_options = options.tensorboard;
  if (tensorboard_options.dir.empty()) {
    tensorboard_options.dir = absl::StrCat(options.data_dir, "/tensorboard");
  }
  if (absl::Status s = tensorboard::ValidateExportOptions(tensorboard_options); !s.ok()) {
    return s;
  }
  if (options.limits.max_chunk_bytes == 0 ||
      options.limits.max_chunk_bytes > (uint64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_chunk_bytes must be 1 byte to 1 GiB, got ", options.limits.max_chunk_bytes));
  }
  std::unique_ptr<Collector> c(new Collector());
  c->tokens_ = std::move(tokens);
  c->shutdown_grace_ = options.shutdown_grace;
  OperatorViewsOptions views_options;
  views_options.listen = options.metrics_listen;
  views_options.reports = options.reports;
  views_options.grpc_tls = options.security.tls();
  views_options.grpc_tokens = options.security.auth();
  views_options.allow_insecure = options.security.allow_insecure;
  auto views = OperatorViews::Start(views_options);  // probes answer from now on
  if (!views.ok()) return views.status();
  c->views_ = std::move(*views);
  c->metrics_address_ = c->views_->address();
  c->rule_factory_ = rules::BuiltinRuleFactory();
  for (const std::string& plugin : options.rule_plugins) {
    absl::Status loaded = rules::LoadRulePlugin(plugin, *c->rule_factory_);
    if (!loaded.ok()) return loaded;
    LOG(INFO) << "loaded rule plugin " << plugin;
  }
  storage::Store::Options store_options;
  store_options.path = options.data_dir;
  store_options.sync_writes = options.sync_writes;
  auto store = storage::Store::Open(store_options);
  if (!store.ok()) return store.status();
  c->store_ = std::move(*store);
  c->views_->StoreOpened(c->store_.get());
  c->rule_environment_ = std::make_unique<StoreRuleEnvironment>(c->store_.get());
  c->rule_factory_->SetEnvironment(c->rule_environment_.get());
  c->notifier_ = std::make_unique<Notifier>(options.notifications);
  for (const v1::RuleSpec& spec : options.default_rules) {
    auto normalized = rules::NormalizeRuleSpec(spec);
    if (!normalized.ok()) return normalized.status();
    absl::Status valid = c->rule_factory_->Create(*normalized).status();
    if (!valid.ok()) return valid;
    for (const std::string& action : normalized->actions()) {
      valid = c->notifier_->CanDeliver(action);
      if (!valid.ok()) {
        return absl::Status(valid.code(),
                            absl::StrCat("rule '", normalized->name(), "': ", valid.message()));
      }
    }
  }
  // Jobs that were running when the collector last stopped have lost their
  // streams; say so until their workers reconnect.
  auto jobs = c->store_->ListJobs();
  if (!jobs.ok()) return jobs.status();
  for (v1::JobInfo& job : *jobs) {
    if (job.status() != v1::JOB_STATUS_RUNNING) continue;
    job.set_status(v1::JOB_STATUS_DISCONNECTED);
    absl::Status s = c->store_->PutJob(job);
    if (!s.ok()) return s;
  }
  // Reads only what the store has committed, on its own thread.
  auto exporter = tensorboard::Exporter::Start(c->store_.get(), std::move(tensorboard_options));
  if (!exporter.ok()) return exporter.status();
  c->tensorboard_ = std::move(*exporter);
  c->storage_pool_ = std::make_unique<ThreadPool>(options.storage_threads, 4096);
  c->rule_pool_ = std::make_unique<ThreadPool>(options.rule_threads, 4096);
  c->views_->BindPools(c->storage_pool_.get(), c->rule_pool_.get());
  c->views_->BindNotifier(c->notifier_.get());
  {
    // The endpoint's /report pages read the store and the catalogue, with
    // the same tokens as Query.GetReport; Shutdown unbinds before closing.
    ReportSource reports;
    storage::Store* store = c->store_.get();
    const rules::RuleFactory* factory = c->rule_factory_.get();
    reports.render = [store, factory](const std::string& job) {
      return RenderReportPage(*store, factory, job);
    };
    reports.list_jobs = [store] { return store->ListJobs(); };
    reports.tokens = c->tokens_.get();
    c->views_->BindReports(std::move(reports));
  }
  c->registry_ = std::make_unique<JobRegistry>(c->store_.get(), c->rule_pool_.get(),
                                               c->rule_factory_.get(), options.default_rules,
                                               options.step_wait, c->notifier_.get());
  c->registry_->set_worker_end_timeout(options.worker_end_timeout);
  c->registry_->set_worker_lease(options.worker_lease);
  IngestLimits limits = options.limits;
  if (options.max_open_step_bytes > 0) {
    c->open_steps_ = std::make_unique<OpenStepBudget>(options.max_open_step_bytes);
    limits.open_steps = c->open_steps_.get();
  }
  c->collector_service_ = std::make_unique<CollectorService>(
      c->registry_.get(), c->storage_pool_.get(), limits, c->tokens_.get());
  c->query_service_ = std::make_unique<QueryService>(c->store_.get(), c->registry_.get(),
                                                     c->rule_factory_.get(), options.watch);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();  // v1alpha
  // gRPC's health service has no descriptor of its own; naming one of
  // proto/health.proto's types links that file's, so that reflection (both
  // versions) resolves grpc.health.v1.Health.
  (void)grpc::health::v1::HealthCheckRequest::descriptor();
  c->reflection_v1_ = std::make_unique<ReflectionV1Service>(std::vector<std::string>{
      v1::Collector::service_full_name(), v1::Query::service_full_name(),
      grpc::health::v1::Health::service_full_name(),
      grpc::reflection::v1::ServerReflection::service_full_name(),
      "grpc.reflection.v1alpha.ServerReflection"});
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen, *credentials, &port);
  const int max_message =
      static_cast<int>(options.limits.max_chunk_bytes) + kMessageOverhead;
  builder.SetMaxReceiveMessageSize(max_message);
  // Fixed HTTP/2 flow-control windows: with BDP probing each stream's window
  // grows to megabytes that gRPC buffers ahead of the reactor, and with
  // dozens of training clients the collector's memory went past 1 GiB
  // (tests/bench/load_bench, 40 clients: 977 MiB with probing, 273 MiB
  // without; see docs/reliability.md).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  builder.SetMaxSendMessageSize(max_message);
  if (options.serve_ingest) builder.RegisterService(c->collector_service_.get());
  if (c->tokens_ != nullptr) {
    c->authorizing_query_service_ =
        std::make_unique<AuthorizingQueryService>(c->tokens_.get(), c->query_service_.get());
    builder.RegisterService(c->authorizing_query_service_.get());
  } else {
    builder.RegisterService(c->query_service_.get());
  }
  builder.RegisterService(c->reflection_v1_.get());
  builder.experimental().SetInterceptorCreators(OperatorViews::Interceptors());
  c->server_ = builder.BuildAndStart();
  if (c->server_ == nullptr || port == 0) {
    c->server_.reset();
    return absl::UnavailableError(absl::StrCat("cannot listen on '", options.listen, "'"));
  }
  const size_t colon = options.listen.rfind(':');
  c->address_ = absl::StrCat(options.listen.substr(0, colon), ":", port);
  c->views_->ServerStarted(c->server_.get());  // health NOT_SERVING until Serving()
  if (options.retention.enabled()) {
    auto retention =
        RetentionThread::Start(options.retention, c->store_.get(), c->registry_.get());
    if (!retention.ok()) return retention.status();
    c->retention_ = std::move(*retention);
  }
  c->views_->Serving();
  LOG(INFO) << "collector listening on " << c->address_ << ", data in " << options.data_dir
            << (options.security.tls() ? ", TLS" : ", plaintext")
            << (options.security.tls_client_ca_file.empty() ? "" : " with client certificates")
            << (c->tokens_ != nullptr ? absl::StrCat(", ", c->tokens_->size(), " tokens")
                                      : std::string(", no authentication"));
  return c;
}

Collector::~Collector() { Shutdown(); }

size_t Collector::open_watches() const { return registry_->open_watches(); }

void Collector::Shutdown() {
  {
    absl::MutexLock lock(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  if (views_ != nullptr) views_->ShuttingDown();  // /readyz and gRPC health first
  retention_.reset();  // before the registry and the store it deletes from
  if (server_ != nullptr) {
    server_->GetHealthCheckService()->SetServingStatus(false);
    collector_service_->FinishAll();
    query_service_->Close();
    server_->Shutdown(absl::ToChronoTime(absl::Now() + shutdown_grace_));
    server_->Wait();
    collector_service_->WaitForStreams();
  }
  // Order matters: rules (which write results) before the store closes.
  if (registry_ != nullptr) registry_->DrainRules();
  // Every step is stored by now: the exporter writes what it has not yet,
  // closes its files, and lets go of the store.
  tensorboard_.reset();
  if (views_ != nullptr) views_->Unbind();  // its gauges read the pools, notifier, store
  storage_pool_.reset();
  registry_.reset();
  rule_pool_.reset();
  notifier_.reset();
  server_.reset();
  store_.reset();
  views_.reset();
  LOG(INFO) << "collector stopped";
}

}  // namespace sonde::server
