// Profiler data on the ingest stream: stored as it arrives, in order with
// the tensors, between steps and within them; read back by worker, name
// and time; stored once after lost acks and a cut connection; bad batches
// refused with a message that says what was wrong. (Names that are not
// UTF-8 never get this far: protobuf refuses to parse such a message.)

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "client/hook.h"
#include "client/query_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/collector.grpc.pb.h"
#include "tests/testing/in_process_collector.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tcp_proxy.h"
#include "tests/testing/wait.h"

namespace sonde {
namespace {

using ::sonde::testing::InProcessCollector;
using ::sonde::testing::TcpProxy;

constexpr int64_t kT0 = 1700000000000000;  // micros

// Batch `b`: two snapshots 100 ms apart and one event per kind.
v1::ProfileBatch Batch(int b, int64_t step) {
  v1::ProfileBatch batch;
  for (int i = 0; i < 2; ++i) {
    v1::MetricSnapshot* s = batch.add_snapshots();
    s->set_unix_micros(kT0 + (2 * b + i) * 100000);
    v1::MetricSample* cpu = s->add_samples();
    cpu->set_name("cpu.util");
    cpu->set_value(2 * b + i);
    v1::MetricSample* rss = s->add_samples();
    rss->set_name("process.rss_bytes");
    rss->set_value(1e6 * (2 * b + i));
  }
  v1::TraceEvent* wait = batch.add_events();
  wait->set_kind(v1::TraceEvent::KIND_DATA_WAIT);
  wait->set_mode(v1::MODE_TRAIN);
  wait->set_step(step);
  wait->set_mode_step(step);
  wait->set_start_unix_micros(kT0 + b * 200000);
  wait->set_end_unix_micros(kT0 + b * 200000 + 5000);
  v1::TraceEvent* span = batch.add_events();
  span->set_kind(v1::TraceEvent::KIND_SPAN);
  span->set_name("augment");
  span->set_step(step);
  span->set_start_unix_micros(kT0 + b * 200000 + 6000);
  span->set_end_unix_micros(kT0 + b * 200000 + 9000);
  return batch;
}

HookOptions Options(const std::string& address, const std::string& job) {
  HookOptions o;
  o.collector = address;
  o.job = job;
  o.config.save_config = SaveConfig::Every(1);
  o.close_timeout = absl::Seconds(60);
  return o;
}

// Steps [0, steps), each with a loss, and batch 2*step before the step's
// tensors (between steps) and 2*step+1 after them (within the step).
void RunSteps(Hook& hook, int steps) {
  for (int step = 0; step < steps; ++step) {
    EXPECT_TRUE(hook.SaveProfile(Batch(2 * step, step)));
    hook.StartStep();
    SONDE_EXPECT_OK(hook.SaveScalar("loss", step, {"losses"}));
    EXPECT_TRUE(hook.SaveProfile(Batch(2 * step + 1, step)));
  }
  hook.EndStep();
}

// Profiler reads through QueryClient, every worker; a failed read is a
// test failure and reads as nothing.
struct Query {
  explicit Query(const std::string& address) : client(QueryClient::Connect(address)) {}
  MetricsRead Metrics(const std::string& job, std::vector<std::string> names, int64_t start = 0,
                      int64_t end = 0, uint32_t max_points = 0) {
    auto read = client->ReadMetrics(job, names, "", -1, start, end, max_points);
    EXPECT_TRUE(read.ok()) << read.status();
    return read.ok() ? *std::move(read) : MetricsRead();
  }
  EventsRead Events(const std::string& job, v1::TraceEvent::Kind kind, uint32_t max_events = 0) {
    auto read = client->ReadEvents(job, kind, "", -1, 0, 0, max_events);
    EXPECT_TRUE(read.ok()) << read.status();
    return read.ok() ? *std::move(read) : EventsRead();
  }
  std::unique_ptr<QueryClient> client;
};

// Batches 0 .. batches-1 (as RunSteps sends them) are stored exactly once.
void ExpectStored(Query& q, const std::string& job, int batches) {
  MetricsRead cpu = q.Metrics(job, {"cpu.util"});
  ASSERT_EQ(cpu.series.size(), 1u);
  ASSERT_EQ(cpu.series[0].values_size(), 2 * batches);
  for (int i = 0; i < 2 * batches; ++i) {
    EXPECT_EQ(cpu.series[0].unix_micros(i), kT0 + i * 100000);
    EXPECT_EQ(cpu.series[0].values(i), i);
  }
  EventsRead spans = q.Events(job, v1::TraceEvent::KIND_SPAN);
  ASSERT_EQ(spans.events.size(), static_cast<size_t>(batches));
  for (int b = 0; b < batches; ++b) {
    const v1::TraceEvent& e = spans.events[b].event();
    EXPECT_EQ(e.name(), "augment");
    EXPECT_EQ(e.step(), b / 2);
    EXPECT_EQ(e.end_unix_micros() - e.start_unix_micros(), 3000);
  }
  EXPECT_EQ(q.Events(job, v1::TraceEvent::KIND_DATA_WAIT).events.size(),
            static_cast<size_t>(batches));
}

// A hook of `job` that ran RunSteps(steps) and had every batch acknowledged.
std::unique_ptr<Hook> RunAndFlush(InProcessCollector& collector, const std::string& job,
                                  int steps) {
  auto hook = Hook::Create(Options(collector.address(), job));
  EXPECT_TRUE(hook.ok()) << hook.status();
  if (!hook.ok()) return nullptr;
  RunSteps(**hook, steps);
  EXPECT_TRUE((*hook)->Flush(absl::Seconds(30)).ok());
  return std::move(*hook);
}

TEST(ProfileIngest, ReadsOverTheirLimitReturnTheFirstPointsAndSayTruncated) {
  InProcessCollector collector;
  std::unique_ptr<Hook> hook = RunAndFlush(collector, "limited", 3);
  ASSERT_NE(hook, nullptr);
  Query q(collector.address());
  // The default limits are far above what 3 steps send.
  MetricsRead all = q.Metrics("limited", {"cpu.util"});
  EXPECT_FALSE(all.truncated);
  ASSERT_EQ(all.series.size(), 1u);
  ASSERT_GT(all.series[0].values_size(), 5);
  MetricsRead five = q.Metrics("limited", {"cpu.util"}, 0, 0, 5);
  EXPECT_TRUE(five.truncated);
  ASSERT_EQ(five.series.size(), 1u);
  ASSERT_EQ(five.series[0].values_size(), 5);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(five.series[0].values(i), all.series[0].values(i));
  EXPECT_FALSE(q.Metrics("limited", {"cpu.util"}, 0, 0, all.series[0].values_size()).truncated);

  EventsRead spans = q.Events("limited", v1::TraceEvent::KIND_SPAN);
  EXPECT_FALSE(spans.truncated);
  ASSERT_EQ(spans.events.size(), 6u);
  EventsRead two = q.Events("limited", v1::TraceEvent::KIND_SPAN, 2);
  EXPECT_TRUE(two.truncated);
  ASSERT_EQ(two.events.size(), 2u);
  EXPECT_EQ(two.events[1].SerializeAsString(), spans.events[1].SerializeAsString());
  SONDE_ASSERT_OK(hook->Close());
}

// 300,000 points within a request's max_points pass gRPC's 4 MiB (the
// answer used to fail with RESOURCE_EXHAUSTED): the answer is cut by its
// size as well, the last series partial, and says so.
TEST(ProfileIngest, AnAnswerPastAMessagesSizeIsCutAndSaysTruncated) {
  InProcessCollector collector;
  auto hook = Hook::Create(Options(collector.address(), "dense"));
  SONDE_ASSERT_OK(hook);
  constexpr int kSeries = 200, kBatches = 300, kSnapshots = 5;
  for (int b = 0; b < kBatches; ++b) {
    v1::ProfileBatch batch;
    for (int i = 0; i < kSnapshots; ++i) {
      v1::MetricSnapshot* s = batch.add_snapshots();
      s->set_unix_micros(kT0 + (b * kSnapshots + i) * 1000);
      for (int m = 0; m < kSeries; ++m) {
        v1::MetricSample* sample = s->add_samples();
        sample->set_name(absl::StrCat("framework.m", 1000 + m));
        sample->set_value(b * kSnapshots + i);
      }
    }
    ASSERT_TRUE((*hook)->SaveProfile(std::move(batch)));
  }
  SONDE_ASSERT_OK((*hook)->Flush(absl::Seconds(60)));
  Query q(collector.address());
  auto read = q.client->ReadMetrics("dense", {}, "^framework\\.m", -1, 0, 0, 1000000);
  SONDE_ASSERT_OK(read);
  EXPECT_TRUE(read->truncated);
  size_t points = 0;
  for (size_t i = 0; i < read->series.size(); ++i) {
    const v1::MetricSeries& s = read->series[i];
    ASSERT_EQ(s.unix_micros_size(), s.values_size());
    if (i + 1 < read->series.size()) {
      EXPECT_EQ(s.values_size(), kBatches * kSnapshots) << s.name();  // whole
    }
    points += s.values_size();
  }
  EXPECT_GT(points, 150000u);
  EXPECT_LT(points, 200000u);
  EXPECT_LT(points, static_cast<size_t>(kSeries * kBatches * kSnapshots));
  // The rest of the cut series reads on from its last time, as the
  // Python trial does.
  const v1::MetricSeries& last = read->series.back();
  MetricsRead rest =
      q.Metrics("dense", {last.name()}, last.unix_micros(last.unix_micros_size() - 1) + 1);
  ASSERT_EQ(rest.series.size(), 1u);
  EXPECT_FALSE(rest.truncated);
  EXPECT_EQ(last.values_size() + rest.series[0].values_size(), kBatches * kSnapshots);
  SONDE_ASSERT_OK((*hook)->Close());
}

TEST(ProfileIngest, ManySeriesWithoutPointsInTheRangeAreCutToo) {
  // 11,200 series of 500-byte names, none with a point in the range read:
  // the empty series alone pass a message's size.
  InProcessCollector collector;
  auto hook = Hook::Create(Options(collector.address(), "names"));
  SONDE_ASSERT_OK(hook);
  constexpr int kBatches = 28, kPerBatch = 400;
  const std::string stem(490, 'n');
  for (int b = 0; b < kBatches; ++b) {
    v1::ProfileBatch batch;
    v1::MetricSnapshot* s = batch.add_snapshots();
    s->set_unix_micros(kT0 + b);
    for (int m = 0; m < kPerBatch; ++m) {
      v1::MetricSample* sample = s->add_samples();
      sample->set_name(absl::StrCat("framework.", stem, 100000 + b * kPerBatch + m));
      sample->set_value(m);
    }
    ASSERT_TRUE((*hook)->SaveProfile(std::move(batch)));
  }
  SONDE_ASSERT_OK((*hook)->Flush(absl::Seconds(60)));
  Query q(collector.address());
  // Before, every empty series went in: 5.8 MB, past the collector's
  // 5 MiB send limit (RESOURCE_EXHAUSTED).
  auto read = q.client->ReadMetrics("names", {}, "^framework\\.", -1, kT0 + kBatches, 0, 0);
  SONDE_ASSERT_OK(read);
  EXPECT_TRUE(read->truncated);
  EXPECT_GT(read->series.size(), 1000u);
  EXPECT_LT(read->series.size(), static_cast<size_t>(kBatches * kPerBatch));
  for (const v1::MetricSeries& series : read->series) EXPECT_EQ(series.values_size(), 0);
  SONDE_ASSERT_OK((*hook)->Close());
}

TEST(ProfileIngest, ARegexThatDoesNotCompileIsInvalidArgumentNamingIt) {
  InProcessCollector collector;
  std::unique_ptr<Hook> hook = RunAndFlush(collector, "regex", 1);
  ASSERT_NE(hook, nullptr);
  auto query = QueryClient::Connect(collector.address());
  EXPECT_THAT(query->ReadMetrics("regex", {}, "cpu.(").status(),
              ::sonde::testing::StatusIs(absl::StatusCode::kInvalidArgument, "regex 'cpu.('"));
  auto read = query->ReadMetrics("regex", {}, "^cpu\\.");
  SONDE_ASSERT_OK(read);
  ASSERT_EQ(read->series.size(), 1u);
  EXPECT_EQ(read->series[0].name(), "cpu.util");
  SONDE_ASSERT_OK(hook->Close());
}

TEST(ProfileIngest, BatchesBetweenAndWithinStepsAreStoredAndReadBackByNameAndTime) {
  InProcessCollector collector;
  auto hook = Hook::Create(Options(collector.address(), "prof"));
  SONDE_ASSERT_OK(hook);
  RunSteps(**hook, 5);
  SONDE_ASSERT_OK((*hook)->Flush(absl::Seconds(30)));
  EXPECT_EQ((*hook)->counters().memory_bytes, 0u);  // every batch acknowledged
  Query q(collector.address());
  ExpectStored(q, "prof", 2 * 5);
  // A time range and a second metric.
  MetricsRead rss =
      q.Metrics("prof", {"process.rss_bytes"}, kT0 + 300000, kT0 + 700000);
  ASSERT_EQ(rss.series.size(), 1u);
  ASSERT_EQ(rss.series[0].values_size(), 4);
  EXPECT_EQ(rss.series[0].values(0), 3e6);
  EXPECT_EQ(rss.series[0].worker(), 0);
  auto listed = q.client->ListMetrics("prof");
  SONDE_ASSERT_OK(listed);
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ(std::vector<std::string>((*listed)[0].names().begin(), (*listed)[0].names().end()),
            (std::vector<std::string>{"cpu.util", "process.rss_bytes"}));
  SONDE_ASSERT_OK((*hook)->Close());
}

// What a rule judged, from its stored result.
int64_t Datapoints(const std::string& address, const std::string& job, const std::string& rule) {
  auto results = QueryClient::Connect(address)->RuleResults(job);
  EXPECT_TRUE(results.ok()) << results.status();
  if (results.ok()) {
    for (const v1::RuleResult& r : *results) {
      if (r.rule() == rule) return r.datapoints();
    }
  }
  ADD_FAILURE() << "no result of " << rule;
  return -1;
}

TEST(ProfileIngest, LostAcksAndACutConnectionStillStoreEveryBatchOnce) {
  // OverallSystemUsage judges every batch: its data points show whether a
  // resent batch reached the rules twice.
  InProcessCollector collector("OverallSystemUsage");
  TcpProxy proxy(collector.address());
  auto hook = Hook::Create(Options(proxy.address(), "prof-cut"));
  SONDE_ASSERT_OK(hook);
  SONDE_ASSERT_OK((*hook)->WaitUntilConnected(absl::Seconds(30)));
  proxy.set_forward_to_client(false);  // stored, but the acks are lost
  RunSteps(**hook, 4);
  // A batch after the last step: nothing later tells the client it was
  // stored, so it is sent again after the cut.
  EXPECT_TRUE((*hook)->SaveProfile(Batch(8, 4)));
  Query q(collector.address());
  sonde::testing::WaitUntil(
      [&] { return q.Events("prof-cut", v1::TraceEvent::KIND_SPAN).events.size() >= 9; });
  EXPECT_GT((*hook)->counters().memory_bytes, 0u);  // still held: never acknowledged
  proxy.set_forward_to_client(true);
  proxy.CutAll();  // reconnect; unacknowledged batches are sent again
  SONDE_ASSERT_OK((*hook)->Close());
  EXPECT_GE((*hook)->counters().reconnects, 1u);
  EXPECT_EQ((*hook)->counters().memory_bytes, 0u);
  EXPECT_EQ((*hook)->counters().profile_batches_queued, 9u);
  EXPECT_GE((*hook)->counters().messages_resent, 1u);  // the last batch, at least
  ExpectStored(q, "prof-cut", 9);
  // 9 batches of 2 snapshots and 2 events, each judged once.
  EXPECT_EQ(Datapoints(collector.address(), "prof-cut", "OverallSystemUsage"), 9 * 4);
}

// A raw stream: hello, then `batch`; returns how the collector ended it.
grpc::Status SendRaw(const std::string& address, const v1::ProfileBatch& batch) {
  auto stub = v1::Collector::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  auto stream = stub->Stream(&ctx);
  v1::ClientMessage hello;
  hello.set_seq(1);
  hello.mutable_hello()->set_job("raw");
  hello.mutable_hello()->set_world_size(1);
  // One client reconnecting: the collector may not have released the
  // worker from the stream it just ended when the next hello arrives, and
  // only the same client may take it over (a new one gets ALREADY_EXISTS).
  hello.mutable_hello()->set_client_id(42);
  EXPECT_TRUE(stream->Write(hello));
  v1::ServerMessage in;
  EXPECT_TRUE(stream->Read(&in));
  EXPECT_TRUE(in.has_hello_ack());
  v1::ClientMessage m;
  m.set_seq(2);
  *m.mutable_profile() = batch;
  stream->Write(m);
  while (stream->Read(&in)) {
    if (in.has_ack()) {
      stream->WritesDone();
    }
  }
  return stream->Finish();
}

TEST(ProfileIngest, BadBatchesAreRefusedWithWhatWasWrongAndNothingOfThemIsStored) {
  InProcessCollector collector;
  struct Case {
    std::string why;
    std::function<void(v1::ProfileBatch&)> spoil;
  };
  const std::vector<Case> cases = {
      {"end >= start",
       [](v1::ProfileBatch& b) { b.mutable_events(0)->set_end_unix_micros(1); }},
      {"unknown kind", [](v1::ProfileBatch& b) {
         b.mutable_events(0)->set_kind(static_cast<v1::TraceEvent::Kind>(99));
       }},
      {"unknown mode",
       [](v1::ProfileBatch& b) { b.mutable_events(0)->set_mode(static_cast<v1::Mode>(42)); }},
      {"must be > 0", [](v1::ProfileBatch& b) { b.mutable_snapshots(1)->set_unix_micros(0); }},
      {"metric name", [](v1::ProfileBatch& b) {
         b.mutable_snapshots(0)->mutable_samples(0)->set_name(std::string("a\0b", 3));
       }},
      {"event name", [](v1::ProfileBatch& b) { b.mutable_events(1)->set_name(""); }},
  };
  for (const Case& c : cases) {
    v1::ProfileBatch batch = Batch(0, 0);
    c.spoil(batch);
    grpc::Status s = SendRaw(collector.address(), batch);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.why;
    EXPECT_NE(s.error_message().find(c.why), std::string::npos)
        << c.why << " not in: " << s.error_message();
  }
  Query q(collector.address());
  EXPECT_EQ(q.Metrics("raw", {}).series.size(), 0u);
  EXPECT_EQ(q.Events("raw", v1::TraceEvent::KIND_UNSPECIFIED).events.size(), 0u);
  // A good batch on the same job is stored and acknowledged at once.
  EXPECT_TRUE(SendRaw(collector.address(), Batch(0, 0)).ok());
  MetricsRead good = q.Metrics("raw", {"cpu.util"});
  ASSERT_EQ(good.series.size(), 1u);
  EXPECT_EQ(good.series[0].values_size(), 2);
}

}  // namespace
}  // namespace sonde
