// The hook's profiler against a real collector: system metrics from this
// machine's /proc at the chosen interval, step events with their real
// durations, the initialisation event, spans and data waits attached to the
// step they happened in; nothing at all while the profiler is off.

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "client/hook.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "proto/query.grpc.pb.h"
#include "tests/testing/in_process_collector.h"
#include "tests/testing/status_matchers.h"

namespace sonde {
namespace {

using ::sonde::testing::InProcessCollector;

std::unique_ptr<v1::Query::Stub> QueryStub(const std::string& address) {
  return v1::Query::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

v1::ReadEventsResponse Events(v1::Query::Stub& q, const std::string& job,
                              v1::TraceEvent::Kind kind) {
  grpc::ClientContext ctx;
  v1::ReadEventsRequest req;
  req.set_job(job);
  req.set_kind(kind);
  req.set_worker(-1);
  v1::ReadEventsResponse resp;
  EXPECT_TRUE(q.ReadEvents(&ctx, req, &resp).ok());
  return resp;
}

TEST(ProfilerHook, StreamsSystemMetricsAndStepTimingsOfARealLoop) {
  InProcessCollector collector;
  HookOptions o;
  o.collector = collector.address();
  o.job = "profiled";
  o.profiler.enabled = true;
  o.profiler.interval = absl::Milliseconds(100);
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  const absl::Time begin = absl::Now();
  (*hook)->SetMode(v1::MODE_TRAIN);
  for (int step = 0; step < 12; ++step) {
    {
      auto wait = (*hook)->DataWait();
      absl::SleepFor(absl::Milliseconds(5));
    }
    (*hook)->StartStep();
    {
      auto span = (*hook)->Span("augment");
      absl::SleepFor(absl::Milliseconds(step == 7 ? 80 : 20));  // one slow step
    }
  }
  SONDE_ASSERT_OK((*hook)->Close());
  const absl::Duration elapsed = absl::Now() - begin;

  auto q = QueryStub(collector.address());
  // System metrics at ~100 ms over the run (loose: a shared 2-core machine).
  grpc::ClientContext ctx;
  v1::ReadMetricsRequest req;
  req.set_job("profiled");
  req.add_names("cpu.util_percent");
  req.add_names("process.rss_bytes");
  req.set_worker(-1);
  v1::ReadMetricsResponse metrics;
  ASSERT_TRUE(q->ReadMetrics(&ctx, req, &metrics).ok());
  ASSERT_EQ(metrics.series_size(), 2);
  const int expected = static_cast<int>(elapsed / absl::Milliseconds(100));
  for (const v1::MetricSeries& s : metrics.series()) {
    EXPECT_GE(s.values_size(), expected / 3) << s.name();
    EXPECT_LE(s.values_size(), expected + 2) << s.name();
    for (int i = 0; i < s.values_size(); ++i) {
      if (s.name() == "cpu.util_percent") {
        EXPECT_GE(s.values(i), 0);
        EXPECT_LE(s.values(i), 100);
      } else {
        EXPECT_GT(s.values(i), 1 << 20);  // this test's own RSS: more than 1 MiB
      }
      if (i > 0) EXPECT_GT(s.unix_micros(i), s.unix_micros(i - 1));
    }
  }

  v1::ReadEventsResponse steps = Events(*q, "profiled", v1::TraceEvent::KIND_STEP);
  ASSERT_EQ(steps.events_size(), 12);
  for (int i = 0; i < 12; ++i) {
    const v1::TraceEvent& e = steps.events(i).event();
    EXPECT_EQ(e.step(), i);
    EXPECT_EQ(e.mode(), v1::MODE_TRAIN);
    EXPECT_EQ(e.mode_step(), i);
    const int64_t micros = e.end_unix_micros() - e.start_unix_micros();
    EXPECT_GE(micros, i == 7 ? 80000 : 20000) << "step " << i;
  }
  v1::ReadEventsResponse init = Events(*q, "profiled", v1::TraceEvent::KIND_INIT);
  ASSERT_EQ(init.events_size(), 1);
  EXPECT_EQ(init.events(0).event().end_unix_micros(), steps.events(0).event().start_unix_micros());
  EXPECT_LT(init.events(0).event().start_unix_micros(), absl::ToUnixMicros(begin));

  v1::ReadEventsResponse spans = Events(*q, "profiled", v1::TraceEvent::KIND_SPAN);
  ASSERT_EQ(spans.events_size(), 12);
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(spans.events(i).event().name(), "augment");
    EXPECT_EQ(spans.events(i).event().step(), i);  // recorded within step i
  }
  v1::ReadEventsResponse waits = Events(*q, "profiled", v1::TraceEvent::KIND_DATA_WAIT);
  ASSERT_EQ(waits.events_size(), 12);
  EXPECT_EQ(waits.events(0).event().step(), -1);  // before the first step
  EXPECT_EQ(waits.events(1).event().step(), 0);   // between steps 0 and 1: step 0 is open
  for (const v1::WorkerEvent& w : waits.events()) {
    EXPECT_GE(w.event().end_unix_micros() - w.event().start_unix_micros(), 5000);
  }
}

TEST(ProfilerHook, EventsTheCollectorWouldRefuseAreDroppedAndTheStreamGoesOn) {
  InProcessCollector collector;
  HookOptions o;
  o.collector = collector.address();
  o.job = "bad-events";
  o.config.save_config = SaveConfig::Every(1);
  o.profiler.enabled = true;
  o.profiler.interval = absl::Milliseconds(100);
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  for (int step = 0; step < 5; ++step) {
    (*hook)->StartStep();
    { auto nameless = (*hook)->Span(""); }  // would end the stream if sent
    (*hook)->SetProfilerGauge("", 1);
    (*hook)->SetProfilerGauge("framework.nan", std::nan(""));
    { auto span = (*hook)->Span("good"); }
    SONDE_ASSERT_OK((*hook)->SaveScalar("loss", step, {"losses"}));
    absl::SleepFor(absl::Milliseconds(30));
  }
  SONDE_ASSERT_OK((*hook)->Close());
  EXPECT_EQ((*hook)->counters().reconnects, 0u);
  EXPECT_EQ((*hook)->counters().tensors_dropped, 0u);
  auto q = QueryStub(collector.address());
  v1::ReadEventsResponse spans = Events(*q, "bad-events", v1::TraceEvent::KIND_SPAN);
  ASSERT_EQ(spans.events_size(), 5);
  for (const v1::WorkerEvent& e : spans.events()) EXPECT_EQ(e.event().name(), "good");
  EXPECT_EQ(Events(*q, "bad-events", v1::TraceEvent::KIND_STEP).events_size(), 5);
  grpc::ClientContext ctx;
  v1::ListMetricsRequest req;
  req.set_job("bad-events");
  v1::ListMetricsResponse listed;
  ASSERT_TRUE(q->ListMetrics(&ctx, req, &listed).ok());
  ASSERT_EQ(listed.workers_size(), 1);
  for (const std::string& name : listed.workers(0).names()) EXPECT_NE(name, "framework.nan");
}

TEST(ProfilerHook, OffByDefaultSendsNothing) {
  InProcessCollector collector;
  HookOptions o;
  o.collector = collector.address();
  o.job = "quiet";
  o.config.save_config = SaveConfig::Every(1);
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  for (int step = 0; step < 3; ++step) {
    (*hook)->StartStep();
    auto span = (*hook)->Span("ignored");
    SONDE_ASSERT_OK((*hook)->SaveScalar("loss", step, {"losses"}));
  }
  SONDE_ASSERT_OK((*hook)->Close());
  auto q = QueryStub(collector.address());
  EXPECT_EQ(Events(*q, "quiet", v1::TraceEvent::KIND_UNSPECIFIED).events_size(), 0);
  grpc::ClientContext ctx;
  v1::ListMetricsRequest req;
  req.set_job("quiet");
  v1::ListMetricsResponse listed;
  ASSERT_TRUE(q->ListMetrics(&ctx, req, &listed).ok());
  EXPECT_EQ(listed.workers_size(), 0);
}

TEST(ProfilerHook, AnIntervalOutOfRangeIsRefused) {
  HookOptions o;
  o.job = "bad-interval";
  o.profiler.enabled = true;
  o.profiler.interval = absl::Milliseconds(10);
  EXPECT_THAT(Hook::Create(o).status(),
              ::sonde::testing::StatusIs(absl::StatusCode::kInvalidArgument, "100ms..60s"));
}

}  // namespace
}  // namespace sonde
