// The collector as operators see it, end to end: a real collector with its
// metrics endpoint on port 0, real ingest streams and queries over gRPC,
// scrapes over HTTP, and the gRPC health service through a shutdown.
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tensor_chunks.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/collector.grpc.pb.h"
#include "proto/query.grpc.pb.h"
#include "rules/rule_config.h"
#include "server/collector.h"
#include "tests/testing/exposition.h"
#include "proto/health.grpc.pb.h"
#include "tests/testing/http_get.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace sonde {
namespace {

using ::grpc::health::v1::HealthCheckResponse;
using ::sonde::testing::ExpositionProblems;
using ::sonde::testing::ExpositionSamples;
using ::sonde::testing::HttpGet;
using ::sonde::testing::SampleOr0;
using ::sonde::testing::StatusIs;
using ::testing::IsEmpty;

std::unique_ptr<server::Collector> StartCollector(const std::string& data_dir,
                                                  const std::string& rules = "",
                                                  absl::Duration grace = absl::Seconds(2)) {
  server::CollectorOptions o;
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "127.0.0.1:0";
  o.data_dir = data_dir;
  o.shutdown_grace = grace;
  auto parsed = rules::ParseRuleFlag(rules);
  EXPECT_THAT(parsed, ::sonde::testing::IsOk());
  if (parsed.ok()) o.default_rules = *parsed;
  auto c = server::Collector::Start(o);
  EXPECT_THAT(c, ::sonde::testing::IsOk());
  return c.ok() ? std::move(*c) : nullptr;
}

std::map<std::string, double> Scrape(const server::Collector& c) {
  auto reply = HttpGet(c.metrics_address(), "/metrics");
  EXPECT_EQ(reply.status, 200);
  EXPECT_THAT(ExpositionProblems(reply.body), IsEmpty()) << reply.body;
  return ExpositionSamples(reply.body);
}

// Reads one series from two scrapes.
struct Delta {
  const std::map<std::string, double>& before;
  const std::map<std::string, double>& after;
  double operator()(const std::string& series) const {
    return SampleOr0(after, series) - SampleOr0(before, series);
  }
};

// A raw ingest stream: the test decides every message and waits for the
// collector's answers.
class IngestStream {
 public:
  explicit IngestStream(const std::string& address)
      : stub_(v1::Collector::NewStub(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))),
        stream_(stub_->Stream(&context_)) {}

  bool Send(v1::ClientMessage m) {
    m.set_seq(++seq_);
    return stream_->Write(m);
  }
  // Reads server messages until `pred` holds for one; false if the stream ends.
  template <typename Pred>
  bool ReadUntil(Pred pred) {
    v1::ServerMessage in;
    while (stream_->Read(&in)) {
      received_.push_back(in);
      if (pred(in)) return true;
    }
    return false;
  }
  grpc::Status Finish() {
    stream_->WritesDone();
    ReadUntil([](const v1::ServerMessage&) { return false; });
    return stream_->Finish();
  }
  uint64_t seq() const { return seq_; }
  const std::vector<v1::ServerMessage>& received() const { return received_; }

 private:
  std::unique_ptr<v1::Collector::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::ClientMessage, v1::ServerMessage>> stream_;
  uint64_t seq_ = 0;
  std::vector<v1::ServerMessage> received_;
};

// Sends one step of one float tensor and its step end.
void SendStep(IngestStream& s, int64_t step, const std::vector<float>& values) {
  v1::TensorChunk h;
  h.set_tensor_name("fc.weight");
  h.set_step(step);
  h.set_mode_step(step);
  h.set_mode(v1::MODE_TRAIN);
  h.set_dtype(v1::DTYPE_F32);
  h.add_shape(static_cast<int64_t>(values.size()));
  h.add_collections("weights");
  const std::string bytes(reinterpret_cast<const char*>(values.data()),
                          values.size() * sizeof(float));
  for (v1::TensorChunk& c : SplitIntoChunks(h, bytes, 1 << 20)) {
    v1::ClientMessage m;
    *m.mutable_chunk() = std::move(c);
    ASSERT_TRUE(s.Send(m));
  }
  v1::ClientMessage end;
  end.mutable_step_end()->set_step(step);
  end.mutable_step_end()->set_mode(v1::MODE_TRAIN);
  end.mutable_step_end()->set_mode_step(step);
  end.mutable_step_end()->set_tensor_count(1);
  ASSERT_TRUE(s.Send(end));
}

TEST(OperatorViews, MetricsEndpointServesPrometheusTextAndProbes) {
  sonde::testing::TempDir dir;
  auto c = StartCollector(dir.Sub("db"));
  ASSERT_NE(c, nullptr);
  ASSERT_THAT(c->metrics_address(), ::testing::StartsWith("127.0.0.1:"));
  EXPECT_NE(c->metrics_address(), "127.0.0.1:0");

  auto reply = HttpGet(c->metrics_address(), "/metrics");
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.headers["content-type"], "text/plain; version=0.0.4");
  auto samples = Scrape(*c);
  EXPECT_EQ(samples["sonde_collector_ready"], 1);
  EXPECT_GT(samples["process_resident_memory_bytes"], 0);
  EXPECT_GT(samples["process_open_fds"], 0);
  EXPECT_EQ(samples.count("sonde_rocksdb_live_data_bytes{cf=\"payloads\"}"), 1u);
  EXPECT_EQ(samples.count("sonde_pool_pending_tasks{pool=\"storage\"}"), 1u);
  EXPECT_EQ(samples.count("sonde_webhook_deliveries_total{result=\"failed\"}"), 1u);
  EXPECT_EQ(samples.count("sonde_ingest_streams_open"), 1u);
  EXPECT_EQ(samples.count("sonde_query_rpcs_total{method=\"ListJobs\",code=\"OK\"}"), 1u);

  EXPECT_EQ(HttpGet(c->metrics_address(), "/healthz").status, 200);
  auto ready = HttpGet(c->metrics_address(), "/readyz");
  EXPECT_EQ(ready.status, 200);
  EXPECT_EQ(ready.body, "ready\n");
  EXPECT_EQ(HttpGet(c->metrics_address(), "/nope").status, 404);
  EXPECT_EQ(sonde::testing::HttpExchange(c->metrics_address(),
                                         "POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                .status,
            405);

  const std::string address = c->metrics_address();
  c->Shutdown();
  EXPECT_EQ(HttpGet(address, "/healthz").status, 0);  // gone with the collector
}

TEST(OperatorViews, IngestRulesAndQueriesAreCounted) {
  sonde::testing::TempDir dir;
  auto c = StartCollector(dir.Sub("db"), "ExplodingTensor(actions=StopTraining)");
  ASSERT_NE(c, nullptr);
  const auto before = Scrape(*c);

  IngestStream s(c->address());
  v1::ClientMessage hello;
  hello.mutable_hello()->set_job("metrics-job");
  hello.mutable_hello()->set_world_size(1);
  ASSERT_TRUE(s.Send(hello));
  ASSERT_TRUE(s.ReadUntil([](const v1::ServerMessage& m) { return m.has_hello_ack(); }));
  {
    // The stream is open for as long as the collector sees it.
    const auto open = Scrape(*c);
    const Delta d{before, open};
    EXPECT_EQ(d("sonde_ingest_streams_open"), 1);
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t step = 0; step < 3; ++step) {
    SendStep(s, step, step < 2 ? std::vector<float>{1, 2} : std::vector<float>{nan, 2});
    const uint64_t step_end_seq = s.seq();
    ASSERT_TRUE(s.ReadUntil([&](const v1::ServerMessage& m) {
      return m.has_ack() && m.ack().acked_seq() == step_end_seq;
    })) << "step " << step;
  }
  // The NaN at step 2 makes ExplodingTensor stop training.
  bool stopped = false;
  for (const auto& m : s.received()) stopped = stopped || m.has_action();
  if (!stopped) {
    ASSERT_TRUE(s.ReadUntil([](const v1::ServerMessage& m) { return m.has_action(); }));
  }
  v1::ClientMessage job_end;
  job_end.mutable_job_end()->set_reason("stopped");
  ASSERT_TRUE(s.Send(job_end));
  const uint64_t job_end_seq = s.seq();
  ASSERT_TRUE(s.ReadUntil([&](const v1::ServerMessage& m) {
    return m.has_ack() && m.ack().acked_seq() == job_end_seq;
  }));
  ASSERT_TRUE(s.Finish().ok());

  auto query = v1::Query::NewStub(
      grpc::CreateChannel(c->address(), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext ctx;
    v1::ListJobsResponse resp;
    ASSERT_TRUE(query->ListJobs(&ctx, v1::ListJobsRequest(), &resp).ok());
  }
  {
    grpc::ClientContext ctx;
    v1::GetJobRequest req;
    req.set_job("no-such-job");
    v1::JobInfo resp;
    EXPECT_EQ(query->GetJob(&ctx, req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  }

  const auto after = Scrape(*c);
  Delta d{before, after};
  EXPECT_EQ(d("sonde_ingest_messages_received_total{kind=\"hello\"}"), 1);
  EXPECT_EQ(d("sonde_ingest_messages_received_total{kind=\"chunk\"}"), 3);
  EXPECT_EQ(d("sonde_ingest_messages_received_total{kind=\"step_end\"}"), 3);
  EXPECT_EQ(d("sonde_ingest_messages_received_total{kind=\"job_end\"}"), 1);
  EXPECT_GT(d("sonde_ingest_received_bytes_total{kind=\"chunk\"}"), 3 * 8);
  EXPECT_EQ(d("sonde_ingest_steps_committed_total"), 3);
  EXPECT_EQ(d("sonde_ingest_commit_latency_seconds_count"), 3);
  EXPECT_EQ(d("sonde_ingest_commit_latency_seconds_bucket{le=\"+Inf\"}"), 3);
  EXPECT_EQ(d("sonde_ingest_messages_sent_total{kind=\"hello_ack\"}"), 1);
  EXPECT_EQ(d("sonde_ingest_messages_sent_total{kind=\"ack\"}"), 4);  // 3 steps, 1 job end
  EXPECT_GE(d("sonde_ingest_messages_sent_total{kind=\"action\"}"), 1);
  EXPECT_EQ(d("sonde_ingest_streams_closed_total{code=\"OK\"}"), 1);
  EXPECT_EQ(d("sonde_rule_results_total{status=\"IssuesFound\"}"), 1);
  EXPECT_EQ(d("sonde_rule_actions_total{type=\"StopTraining\"}"), 1);
  EXPECT_GE(d("sonde_rule_evaluation_seconds_count{rule_type=\"ExplodingTensor\"}"), 3);
  EXPECT_EQ(d("sonde_query_rpcs_total{method=\"ListJobs\",code=\"OK\"}"), 1);
  EXPECT_EQ(d("sonde_query_rpcs_total{method=\"GetJob\",code=\"NOT_FOUND\"}"), 1);
  EXPECT_EQ(d("sonde_query_rpc_duration_seconds_count{method=\"ListJobs\"}"), 1);
  EXPECT_GT(SampleOr0(after, "sonde_rocksdb_memtable_bytes{cf=\"stats\"}"), 0);
}

TEST(OperatorViews, StreamsEndedByTheCollectorAreCountedByCode) {
  sonde::testing::TempDir dir;
  auto c = StartCollector(dir.Sub("db"));
  ASSERT_NE(c, nullptr);
  const auto before = Scrape(*c);
  IngestStream s(c->address());
  v1::ClientMessage not_hello;
  not_hello.mutable_step_end()->set_step(0);
  ASSERT_TRUE(s.Send(not_hello));
  EXPECT_EQ(s.Finish().error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  const auto after = Scrape(*c);
  const Delta d{before, after};
  EXPECT_EQ(d("sonde_ingest_streams_closed_total{code=\"FAILED_PRECONDITION\"}"), 1);
  EXPECT_EQ(d("sonde_ingest_steps_committed_total"), 0);
}

// The standard health service over real gRPC.
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

TEST(OperatorViews, HealthServiceIsServingForEveryServiceOnceStarted) {
  sonde::testing::TempDir dir;
  auto c = StartCollector(dir.Sub("db"));
  ASSERT_NE(c, nullptr);
  for (const char* service : {"", "sonde.v1.Collector", "sonde.v1.Query"}) {
    EXPECT_EQ(HealthOf(c->address(), service), HealthCheckResponse::SERVING) << service;
  }
  EXPECT_EQ(HealthOf(c->address(), "no.such.Service"), -1);  // NOT_FOUND
}

TEST(OperatorViews, HealthWatchersSeeNotServingAsSoonAsShutdownBegins) {
  sonde::testing::TempDir dir;
  // A long grace: the open watches keep the shutdown waiting until the test
  // has seen what it wants and cancels them.
  auto c = StartCollector(dir.Sub("db"), "", absl::Seconds(60));
  ASSERT_NE(c, nullptr);
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(c->address(), grpc::InsecureChannelCredentials()));
  struct Watch {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> reader;
  };
  std::vector<std::unique_ptr<Watch>> watches;
  for (const char* service : {"", "sonde.v1.Collector", "sonde.v1.Query"}) {
    auto w = std::make_unique<Watch>();
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    w->reader = stub->Watch(&w->ctx, req);
    HealthCheckResponse first;
    ASSERT_TRUE(w->reader->Read(&first)) << service;
    EXPECT_EQ(first.status(), HealthCheckResponse::SERVING) << service;
    watches.push_back(std::move(w));
  }

  std::thread shutdown([&] { c->Shutdown(); });
  for (auto& w : watches) {
    HealthCheckResponse next;
    ASSERT_TRUE(w->reader->Read(&next));
    EXPECT_EQ(next.status(), HealthCheckResponse::NOT_SERVING);
  }
  // Still shutting down (our watches hold it): not ready, yet alive.
  auto ready = HttpGet(c->metrics_address(), "/readyz");
  EXPECT_EQ(ready.status, 503);
  EXPECT_EQ(ready.body, "not ready: shutting_down\n");
  EXPECT_EQ(HttpGet(c->metrics_address(), "/healthz").status, 200);
  for (auto& w : watches) w->ctx.TryCancel();
  shutdown.join();
}

TEST(OperatorViews, BadMetricsAddressFailsStart) {
  sonde::testing::TempDir dir;
  server::CollectorOptions o;
  o.listen = "127.0.0.1:0";
  o.data_dir = dir.Sub("db");
  o.metrics_listen = "no-port";
  EXPECT_THAT(server::Collector::Start(o),
              StatusIs(absl::StatusCode::kInvalidArgument, "metrics endpoint"));
  auto running = StartCollector(dir.Sub("db2"));
  ASSERT_NE(running, nullptr);
  o.metrics_listen = running->metrics_address();
  EXPECT_THAT(server::Collector::Start(o),
              StatusIs(absl::StatusCode::kUnavailable, "metrics endpoint"));
}

TEST(OperatorViews, NoMetricsEndpointByDefault) {
  sonde::testing::TempDir dir;
  server::CollectorOptions o;
  o.listen = "127.0.0.1:0";
  o.data_dir = dir.Sub("db");
  auto c = server::Collector::Start(o);
  ASSERT_THAT(c, ::sonde::testing::IsOk());
  EXPECT_EQ((*c)->metrics_address(), "");
}

}  // namespace
}  // namespace sonde
