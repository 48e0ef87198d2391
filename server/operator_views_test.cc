#include "server/operator_views.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "gtest/gtest.h"
#include "server/auth.h"
#include "server/notifier.h"
#include "storage/store.h"
#include "tests/testing/exposition.h"
#include "proto/health.grpc.pb.h"
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
  Notifier notifier{NotifierOptions()};
  v.StoreOpened(store->get());
  v.BindPools(&storage_pool, &rule_pool);
  v.BindNotifier(&notifier);

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
  EXPECT_EQ(samples.count("sonde_email_deliveries_total{result=\"delivered\"}"), 1u);
  EXPECT_EQ(samples["sonde_email_deliveries_total{result=\"failed\"}"], 0);
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

// ------------------------------------------------------------ reports

using ::sonde::testing::ConnectTo;
using ::sonde::testing::HttpExchange;
using ::sonde::testing::HttpReply;
using ::sonde::testing::ReadReply;
using ::sonde::testing::SendAll;

// A store stand-in: jobs by name, each page "<p>report of NAME</p>".
struct FakeReports {
  std::vector<v1::JobInfo> jobs;
  absl::Status render_error;  // returned for job "broken"
  absl::Notification* started = nullptr;  // told, then `release` awaited, by job "slow"
  absl::Notification* release = nullptr;
  std::atomic<int> renders{0};

  void Add(const std::string& name, int64_t start_micros) {
    v1::JobInfo job;
    job.set_job(name);
    job.set_status(v1::JOB_STATUS_FINISHED);
    job.set_start_unix_micros(start_micros);
    job.set_last_step(41);
    job.add_workers(0);
    jobs.push_back(job);
  }

  ReportSource Source(const TokenTable* tokens = nullptr) {
    ReportSource source;
    source.tokens = tokens;
    source.render = [this](const std::string& job) -> absl::StatusOr<std::string> {
      renders.fetch_add(1);
      if (job == "slow") {
        if (!started->HasBeenNotified()) started->Notify();
        release->WaitForNotification();
        return std::string("<p>slow page</p>");
      }
      if (job == "broken") return render_error;
      for (const v1::JobInfo& j : jobs) {
        if (j.job() == job) return absl::StrCat("<p>report of ", job, "</p>");
      }
      return absl::NotFoundError(absl::StrCat("job '", job, "' not found"));
    };
    source.list_jobs = [this] { return jobs; };
    return source;
  }
};

std::unique_ptr<OperatorViews> StartViews(const OperatorViewsOptions& options) {
  auto views = OperatorViews::Start(options);
  EXPECT_THAT(views, ::sonde::testing::IsOk());
  return views.ok() ? std::move(*views) : nullptr;
}

OperatorViewsOptions Loopback() {
  OperatorViewsOptions o;
  o.listen = "127.0.0.1:0";
  return o;
}

HttpReply GetWithToken(const std::string& address, const std::string& target,
                       const std::string& token) {
  return HttpExchange(address, absl::StrCat("GET ", target, " HTTP/1.1\r\nHost: x\r\n",
                                            "Authorization: Bearer ", token, "\r\n\r\n"));
}

TEST(OperatorViewsReports, AnswersWhatTheSourceRendersWithTheRightStatus) {
  auto views = StartViews(Loopback());
  ASSERT_NE(views, nullptr);
  EXPECT_TRUE(views->serves_reports());
  const std::string http = views->address();
  // Nothing bound yet (the store is not open).
  HttpReply early = HttpGet(http, "/report?job=a");
  EXPECT_EQ(early.status, 503);
  EXPECT_THAT(early.body, HasSubstr("opening_store"));

  FakeReports fake;
  fake.Add("run-a", 1);
  fake.render_error = absl::DataLossError("checksum mismatch in step 7");
  views->BindReports(fake.Source());
  HttpReply ok = HttpGet(http, "/report?job=run-a");
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(ok.body, "<p>report of run-a</p>");
  EXPECT_EQ(ok.headers["content-type"], "text/html; charset=utf-8");
  EXPECT_THAT(ok.headers["content-security-policy"], HasSubstr("default-src 'none'"));
  // Percent-encoded names decode to the same job.
  EXPECT_EQ(HttpGet(http, "/report?job=run%2Da").status, 200);

  HttpReply missing = HttpGet(http, "/report");
  EXPECT_EQ(missing.status, 400);
  EXPECT_THAT(missing.body, HasSubstr("missing query parameter 'job'"));
  EXPECT_EQ(HttpGet(http, "/report?job=").status, 400);
  HttpReply invalid = HttpGet(http, "/report?job=..%2Fetc");
  EXPECT_EQ(invalid.status, 400);
  EXPECT_THAT(invalid.body, HasSubstr("query parameter 'job'"));
  EXPECT_EQ(HttpGet(http, "/report?job=%zz").status, 400);
  HttpReply unknown = HttpGet(http, "/report?job=nope");
  EXPECT_EQ(unknown.status, 404);
  EXPECT_EQ(unknown.body, "no job named 'nope'\n");
  HttpReply broken = HttpGet(http, "/report?job=broken");
  EXPECT_EQ(broken.status, 500);
  EXPECT_THAT(broken.body, HasSubstr("(DATA_LOSS; the collector's log says why)"));
  EXPECT_THAT(broken.body, Not(HasSubstr("checksum mismatch")));  // details stay in the log
  EXPECT_THAT(broken.body, HasSubstr("job 'broken'"));
  // Invalid names never reach the source.
  EXPECT_EQ(fake.renders.load(), 4);
}

TEST(OperatorViewsReports, IndexLinksEveryJobNewestFirstEscaped) {
  auto views = StartViews(Loopback());
  ASSERT_NE(views, nullptr);
  FakeReports fake;
  fake.Add("old-run", 1000000);
  fake.Add("new-run", 2000000);
  fake.Add("<b>&\"x'", 1500000);  // the store refuses such names; escaped anyway
  views->BindReports(fake.Source());
  HttpReply index = HttpGet(views->address(), "/reports");
  ASSERT_EQ(index.status, 200);
  EXPECT_EQ(index.headers["content-type"], "text/html; charset=utf-8");
  const std::string& h = index.body;
  EXPECT_THAT(h, HasSubstr("<a href=\"report?job=new-run\">new-run</a>"));
  EXPECT_THAT(h, HasSubstr("<a href=\"report?job=old-run\">old-run</a>"));
  EXPECT_THAT(h, HasSubstr("<a href=\"report?job=%3Cb%3E%26%22x%27\">&lt;b&gt;&amp;&quot;x&#39;</a>"));
  EXPECT_THAT(h, Not(HasSubstr("<b>&")));
  EXPECT_LT(h.find("new-run"), h.find("%3Cb%3E"));
  EXPECT_LT(h.find("%3Cb%3E"), h.find("old-run"));
  EXPECT_THAT(h, HasSubstr("<td>finished</td><td class=\"n\">1</td><td class=\"n\">41</td>"
                           "<td>1970-01-01 00:00:02</td>"));
  // No jobs at all.
  auto empty_views = StartViews(Loopback());
  FakeReports none;
  empty_views->BindReports(none.Source());
  EXPECT_THAT(HttpGet(empty_views->address(), "/reports").body, HasSubstr("No jobs."));
}

TEST(OperatorViewsReports, TokensNeedTheReadRightOnTheJob) {
  const std::string reader = "tok-reader-0123456789";
  const std::string writer = "tok-writer-0123456789";
  auto tokens = TokenTable::FromJson(absl::StrCat(
      R"({"tokens": [{"name": "a-reader", "sha256": ")", Sha256Hex(reader),
      R"(", "project": "teamA-", "rights": ["read"]},)",
      R"({"name": "a-writer", "sha256": ")", Sha256Hex(writer),
      R"(", "project": "teamA-", "rights": ["write"]}]})"));
  ASSERT_THAT(tokens, ::sonde::testing::IsOk());
  auto views = StartViews(Loopback());
  ASSERT_NE(views, nullptr);
  FakeReports fake;
  fake.Add("teamA-run", 2);
  fake.Add("teamB-run", 1);
  views->BindReports(fake.Source(tokens->get()));
  const std::string http = views->address();

  HttpReply anonymous = HttpGet(http, "/report?job=teamA-run");
  EXPECT_EQ(anonymous.status, 401);
  EXPECT_EQ(anonymous.headers["www-authenticate"], "Bearer realm=\"sonde\"");
  EXPECT_THAT(anonymous.body, HasSubstr("Authorization: Bearer"));
  HttpReply unknown = GetWithToken(http, "/report?job=teamA-run", "not-a-token");
  EXPECT_EQ(unknown.status, 401);
  EXPECT_EQ(unknown.headers["www-authenticate"], "Bearer realm=\"sonde\", error=\"invalid_token\"");
  EXPECT_THAT(unknown.body, Not(HasSubstr("not-a-token")));
  HttpReply basic = HttpExchange(http, "GET /report?job=teamA-run HTTP/1.1\r\n"
                                       "Authorization: Basic dXNlcjpwYXNz\r\n\r\n");
  EXPECT_EQ(basic.status, 401);
  // Unauthenticated requests learn nothing else, not even that 'job' is missing.
  EXPECT_EQ(HttpGet(http, "/report").status, 401);
  EXPECT_EQ(HttpGet(http, "/reports").status, 401);

  HttpReply other = GetWithToken(http, "/report?job=teamB-run", reader);
  EXPECT_EQ(other.status, 403);
  EXPECT_THAT(other.body, HasSubstr("token 'a-reader' has no read right on job 'teamB-run'"));
  EXPECT_EQ(GetWithToken(http, "/report?job=teamA-run", writer).status, 403);
  // The check comes before any lookup: an unknown job outside the grant is
  // 403, inside it 404.
  EXPECT_EQ(GetWithToken(http, "/report?job=teamB-nope", reader).status, 403);
  EXPECT_EQ(GetWithToken(http, "/report?job=teamA-nope", reader).status, 404);
  EXPECT_EQ(GetWithToken(http, "/report", reader).status, 400);
  HttpReply mine = GetWithToken(http, "/report?job=teamA-run", reader);
  EXPECT_EQ(mine.status, 200);
  EXPECT_EQ(mine.body, "<p>report of teamA-run</p>");

  HttpReply index = GetWithToken(http, "/reports", reader);
  EXPECT_EQ(index.status, 200);
  EXPECT_THAT(index.body, HasSubstr("report?job=teamA-run"));
  EXPECT_THAT(index.body, Not(HasSubstr("teamB-run")));
  EXPECT_THAT(GetWithToken(http, "/reports", writer).body,
              HasSubstr("No jobs that this token may read."));
}

TEST(OperatorViewsReports, RefusedRequestsAreAnsweredAtOnceAndNeverFillTheQueue) {
  const std::string reader = "tok-reader-0123456789";
  auto tokens = TokenTable::FromJson(absl::StrCat(
      R"({"tokens": [{"name": "s-reader", "sha256": ")", Sha256Hex(reader),
      R"(", "project": "s", "rights": ["read"]}]})"));
  ASSERT_THAT(tokens, ::sonde::testing::IsOk());
  OperatorViewsOptions options = Loopback();
  options.reports.max_queued = 1;
  auto views = StartViews(options);
  ASSERT_NE(views, nullptr);
  absl::Notification started, release;
  FakeReports fake;
  fake.started = &started;
  fake.release = &release;
  views->BindReports(fake.Source(tokens->get()));
  const std::string http = views->address();
  const std::string slow =
      absl::StrCat("GET /report?job=slow HTTP/1.1\r\nAuthorization: Bearer ", reader, "\r\n\r\n");
  // The pool full: one render running, one queued.
  const int first = ConnectTo(http);
  ASSERT_GE(first, 0);
  SendAll(first, slow);
  started.WaitForNotification();
  const int second = ConnectTo(http);
  ASSERT_GE(second, 0);
  SendAll(second, slow);
  // The server takes connections in the order they came, so the second is
  // queued before this one is read.
  EXPECT_EQ(HttpExchange(http, slow).status, 503);
  // Requests that would be refused are answered at once, not with 503.
  EXPECT_EQ(HttpGet(http, "/report?job=slow").status, 401);
  EXPECT_EQ(GetWithToken(http, "/report?job=other", reader).status, 403);
  EXPECT_EQ(GetWithToken(http, "/report", reader).status, 400);
  EXPECT_EQ(GetWithToken(http, "/report?job=..", reader).status, 400);
  EXPECT_EQ(HttpGet(http, "/reports").status, 401);
  release.Notify();
  EXPECT_EQ(ReadReply(first).status, 200);
  EXPECT_EQ(ReadReply(second).status, 200);
  close(first);
  close(second);
  EXPECT_EQ(fake.renders.load(), 2);  // none of the refused ones rendered
}

TEST(OperatorViewsReports, ProbesAnswerWhileAReportRendersAndUnbindWaitsForIt) {
  auto views = StartViews(Loopback());
  ASSERT_NE(views, nullptr);
  absl::Notification started, release, unbound;
  FakeReports fake;
  fake.started = &started;
  fake.release = &release;
  views->BindReports(fake.Source());
  const int fd = ConnectTo(views->address());
  ASSERT_GE(fd, 0);
  SendAll(fd, "GET /report?job=slow HTTP/1.1\r\nHost: x\r\n\r\n");
  started.WaitForNotification();
  // The render holds a thread; the poll thread still answers probes.
  EXPECT_EQ(HttpGet(views->address(), "/healthz").status, 200);
  EXPECT_EQ(HttpGet(views->address(), "/metrics").status, 200);
  std::thread unbinder([&] {
    views->Unbind();
    unbound.Notify();
  });
  EXPECT_FALSE(unbound.HasBeenNotified()) << "Unbind returned while a report rendered";
  release.Notify();
  HttpReply slow = ReadReply(fd);
  close(fd);
  EXPECT_EQ(slow.status, 200);
  EXPECT_EQ(slow.body, "<p>slow page</p>");
  unbinder.join();
  HttpReply after = HttpGet(views->address(), "/report?job=slow");
  EXPECT_EQ(after.status, 503);
  EXPECT_EQ(fake.renders.load(), 1);
}

TEST(OperatorViewsReports, BeyondLoopbackReportsNeedTokensAndNoTlsToProtect) {
  auto local_port = [](const std::string& address) {
    return absl::StrCat("127.0.0.1", address.substr(address.rfind(':')));
  };
  OperatorViewsOptions options;
  options.listen = "0.0.0.0:0";
  options.grpc_tls = true;
  auto refused = StartViews(options);
  ASSERT_NE(refused, nullptr);
  EXPECT_FALSE(refused->serves_reports());
  FakeReports fake;
  fake.Add("run", 1);
  refused->BindReports(fake.Source());
  HttpReply reply = HttpGet(local_port(refused->address()), "/report?job=run");
  EXPECT_EQ(reply.status, 404);
  EXPECT_THAT(reply.body, HasSubstr("--metrics_reports=on"));
  EXPECT_EQ(HttpGet(local_port(refused->address()), "/reports").status, 404);
  EXPECT_EQ(HttpGet(local_port(refused->address()), "/metrics").status, 200);

  options.reports.serve = OperatorReportOptions::Serve::kOn;  // the operator's call
  auto opted_in = StartViews(options);
  EXPECT_TRUE(opted_in->serves_reports());
  opted_in->BindReports(fake.Source());
  EXPECT_EQ(HttpGet(local_port(opted_in->address()), "/report?job=run").status, 200);

  OperatorViewsOptions loopback = Loopback();
  loopback.grpc_tls = true;
  EXPECT_TRUE(StartViews(loopback)->serves_reports());
  // gRPC in clear too, but with tokens: the report routes check them.
  options.grpc_tls = false;
  options.grpc_tokens = true;
  options.reports.serve = OperatorReportOptions::Serve::kAuto;
  EXPECT_TRUE(StartViews(options)->serves_reports());
  // Neither TLS nor tokens beyond loopback: anyone could read every job.
  options.grpc_tokens = false;
  auto open = StartViews(options);
  EXPECT_FALSE(open->serves_reports());
  open->BindReports(fake.Source());
  reply = HttpGet(local_port(open->address()), "/report?job=run");
  EXPECT_EQ(reply.status, 404);
  EXPECT_THAT(reply.body, HasSubstr("without --auth_tokens"));
  EXPECT_EQ(HttpGet(local_port(open->address()), "/metrics").status, 200);
  options.allow_insecure = true;  // as for gRPC, the operator may accept it
  EXPECT_TRUE(StartViews(options)->serves_reports());
  loopback.reports.serve = OperatorReportOptions::Serve::kOff;
  auto off = StartViews(loopback);
  EXPECT_FALSE(off->serves_reports());
  EXPECT_THAT(HttpGet(off->address(), "/report?job=run").body, HasSubstr("turned off"));
}

TEST(OperatorViewsReports, ParseReportServe) {
  EXPECT_EQ(*ParseReportServe("auto"), OperatorReportOptions::Serve::kAuto);
  EXPECT_EQ(*ParseReportServe("on"), OperatorReportOptions::Serve::kOn);
  EXPECT_EQ(*ParseReportServe("off"), OperatorReportOptions::Serve::kOff);
  EXPECT_THAT(ParseReportServe("yes"),
              StatusIs(absl::StatusCode::kInvalidArgument, "auto, on or off, got 'yes'"));
}

}  // namespace
}  // namespace sonde::server
