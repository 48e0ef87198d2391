#include "server/operator_views.h"

#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "gtest/gtest.h"
#include "server/webhook_notifier.h"
#include "storage/store.h"
#include "tests/testing/exposition.h"
#include "tests/testing/health.grpc.pb.h"
#include "tests/testing/http_get.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace sonde::server {
namespace {

using ::grpc::health::v1::HealthCheckResponse;
using ::sonde::testing::ExpositionProblems;
using ::sonde::testing::ExpositionSamples;
using ::sonde::testing::HttpGet;
using ::sonde::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// The gRPC health status of `service`, or -1 if the Check failed.
int HealthOf(const std::string& address, const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  HealthCheckResponse resp;
  if (!stub->Check(&ctx, req, &resp).ok()) return -1;
  return resp.status();
}

// A real gRPC server with the default health service, as the collector has.
struct HealthServer {
  HealthServer() {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    server = builder.BuildAndStart();
    address = "127.0.0.1:" + std::to_string(port);
  }
  ~HealthServer() { server->Shutdown(); }
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

const char* const kServices[] = {"", "sonde.v1.Collector", "sonde.v1.Query"};

TEST(OperatorViews, ReadinessFollowsEveryPhaseOverHttpAndGrpcHealth) {
  sonde::testing::TempDir dir;
  auto views = OperatorViews::Start("127.0.0.1:0");
  ASSERT_THAT(views, ::sonde::testing::IsOk());
  OperatorViews& v = **views;
  const std::string http = v.address();
  ASSERT_THAT(http, ::testing::StartsWith("127.0.0.1:"));

  EXPECT_EQ(HttpGet(http, "/healthz").status, 200);
  auto ready = HttpGet(http, "/readyz");
  EXPECT_EQ(ready.status, 503);
  EXPECT_EQ(ready.body, "not ready: opening_store\n");

  storage::Store::Options so;
  so.path = dir.Sub("db");
  auto store = storage::Store::Open(so);
  ASSERT_THAT(store, ::sonde::testing::IsOk());
  v.StoreOpened(store->get());
  EXPECT_EQ(HttpGet(http, "/readyz").body, "not ready: recovering\n");

  HealthServer grpc_server;
  // gRPC's default health service starts SERVING; the views correct that.
  v.ServerStarted(grpc_server.server.get());
  for (const char* s : kServices) {
    EXPECT_EQ(HealthOf(grpc_server.address, s), HealthCheckResponse::NOT_SERVING) << s;
  }
  EXPECT_EQ(HttpGet(http, "/readyz").body, "not ready: starting\n");
  EXPECT_THAT(HttpGet(http, "/metrics").body, HasSubstr("\nsonde_collector_ready 0\n"));

  v.Serving();
  EXPECT_TRUE(v.ready());
  for (const char* s : kServices) {
    EXPECT_EQ(HealthOf(grpc_server.address, s), HealthCheckResponse::SERVING) << s;
  }
  ready = HttpGet(http, "/readyz");
  EXPECT_EQ(ready.status, 200);
  EXPECT_EQ(ready.body, "ready\n");
  EXPECT_THAT(HttpGet(http, "/metrics").body, HasSubstr("\nsonde_collector_ready 1\n"));

  v.ShuttingDown();
  EXPECT_FALSE(v.ready());
  for (const char* s : kServices) {
    EXPECT_EQ(HealthOf(grpc_server.address, s), HealthCheckResponse::NOT_SERVING) << s;
  }
  ready = HttpGet(http, "/readyz");
  EXPECT_EQ(ready.status, 503);
  EXPECT_EQ(ready.body, "not ready: shutting_down\n");
  EXPECT_EQ(HttpGet(http, "/healthz").status, 200);  // alive while it shuts down
  v.Serving();  // too late: shutting down is final
  EXPECT_EQ(HttpGet(http, "/readyz").status, 503);
  v.Unbind();
}

TEST(OperatorViews, MetricsShowTheStorePoolsWebhooksAndProcess) {
  sonde::testing::TempDir dir;
  auto views = OperatorViews::Start("127.0.0.1:0");
  ASSERT_THAT(views, ::sonde::testing::IsOk());
  OperatorViews& v = **views;
  storage::Store::Options so;
  so.path = dir.Sub("db");
  so.block_cache_bytes = 5 << 20;
  auto store = storage::Store::Open(so);
  ASSERT_THAT(store, ::sonde::testing::IsOk());
  v1::JobInfo job;
  job.set_job("m");
  ASSERT_THAT((*store)->CreateJob(job), ::sonde::testing::IsOk());
  ThreadPool storage_pool(1, 8), rule_pool(1, 8);
  WebhookNotifier webhooks{WebhookNotifierOptions()};
  v.StoreOpened(store->get());
  v.BindPools(&storage_pool, &rule_pool);
  v.BindWebhooks(&webhooks);

  auto reply = HttpGet(v.address(), "/metrics");
  ASSERT_EQ(reply.status, 200);
  EXPECT_EQ(reply.headers["content-type"], "text/plain; version=0.0.4");
  EXPECT_THAT(ExpositionProblems(reply.body), IsEmpty()) << reply.body;
  auto samples = ExpositionSamples(reply.body);
  for (const char* cf : {"jobs", "stats", "series", "payloads", "rules", "profile"}) {
    const std::string c = std::string("{cf=\"") + cf + "\"}";
    EXPECT_EQ(samples.count("sonde_rocksdb_live_data_bytes" + c), 1u) << cf;
    EXPECT_EQ(samples.count("sonde_rocksdb_sst_files_bytes" + c), 1u) << cf;
    EXPECT_EQ(samples.count("sonde_rocksdb_memtable_bytes" + c), 1u) << cf;
    EXPECT_EQ(samples.count("sonde_rocksdb_estimated_keys" + c), 1u) << cf;
    EXPECT_EQ(samples.count("sonde_rocksdb_pending_compaction_bytes" + c), 1u) << cf;
  }
  EXPECT_GT(samples["sonde_rocksdb_memtable_bytes{cf=\"jobs\"}"], 0);
  EXPECT_EQ(samples["sonde_rocksdb_block_cache_capacity_bytes"], 5 << 20);
  EXPECT_EQ(samples.count("sonde_rocksdb_block_cache_usage_bytes"), 1u);
  EXPECT_EQ(samples.count("sonde_rocksdb_running_compactions"), 1u);
  EXPECT_EQ(samples["sonde_rocksdb_write_stopped"], 0);
  EXPECT_EQ(samples["sonde_rocksdb_background_errors_total"], 0);
  EXPECT_EQ(samples["sonde_pool_pending_tasks{pool=\"storage\"}"], 0);
  EXPECT_EQ(samples["sonde_pool_pending_tasks{pool=\"rule\"}"], 0);
  EXPECT_EQ(samples["sonde_webhook_deliveries_total{result=\"delivered\"}"], 0);
  EXPECT_EQ(samples["sonde_webhook_deliveries_total{result=\"failed\"}"], 0);
  EXPECT_EQ(samples["sonde_webhook_deliveries_total{result=\"dropped\"}"], 0);
  EXPECT_GT(samples["process_resident_memory_bytes"], 0);
  EXPECT_GT(samples["process_open_fds"], 0);
  EXPECT_THAT(reply.body, HasSubstr("# TYPE sonde_webhook_deliveries_total counter\n"));
  EXPECT_THAT(reply.body, HasSubstr("# TYPE sonde_rocksdb_background_errors_total counter\n"));

  // A queued task shows while the only storage thread is busy.
  absl::Notification release, running;
  storage_pool.Schedule([&] {
    running.Notify();
    release.WaitForNotification();
  });
  running.WaitForNotification();
  storage_pool.Schedule([] {});
  samples = ExpositionSamples(HttpGet(v.address(), "/metrics").body);
  EXPECT_EQ(samples["sonde_pool_pending_tasks{pool=\"storage\"}"], 1);
  release.Notify();

  // Unbound, nothing reads the store, pools or webhooks any more.
  v.Unbind();
  const std::string after = HttpGet(v.address(), "/metrics").body;
  EXPECT_THAT(after, Not(HasSubstr("sonde_rocksdb_")));
  EXPECT_THAT(after, Not(HasSubstr("sonde_pool_pending_tasks")));
  EXPECT_THAT(after, Not(HasSubstr("sonde_webhook_deliveries_total")));
  EXPECT_THAT(after, HasSubstr("process_resident_memory_bytes"));
}

TEST(OperatorViews, MetricsIncludeTheDefaultRegistry) {
  metrics::Registry::Default()
      .AddCounter("sonde_test_views_default_total", "A counter elsewhere in the process.")
      ->Increment(7);
  auto views = OperatorViews::Start("127.0.0.1:0");
  ASSERT_THAT(views, ::sonde::testing::IsOk());
  EXPECT_THAT(HttpGet((*views)->address(), "/metrics").body,
              HasSubstr("\nsonde_test_views_default_total 7\n"));
  EXPECT_THAT((*views)->RenderMetrics(), HasSubstr("\nsonde_test_views_default_total 7\n"));
}

TEST(OperatorViews, NoEndpointWhenListenIsEmpty) {
  auto views = OperatorViews::Start("");
  ASSERT_THAT(views, ::sonde::testing::IsOk());
  EXPECT_EQ((*views)->address(), "");
  EXPECT_THAT((*views)->RenderMetrics(), HasSubstr("sonde_collector_ready 0"));
}

TEST(OperatorViews, BadOrBusyAddressesAreErrors) {
  EXPECT_THAT(OperatorViews::Start("nonsense"),
              StatusIs(absl::StatusCode::kInvalidArgument, "metrics endpoint"));
  auto first = OperatorViews::Start("127.0.0.1:0");
  ASSERT_THAT(first, ::sonde::testing::IsOk());
  EXPECT_THAT(OperatorViews::Start((*first)->address()),
              StatusIs(absl::StatusCode::kUnavailable, "metrics endpoint"));
}

}  // namespace
}  // namespace sonde::server
