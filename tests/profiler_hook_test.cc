// The hook's profiler against a real collector: system metrics from this
// machine's /proc at the chosen interval, step events with their real
// durations, the initialisation event, spans and data waits attached to the
// step they happened in; nothing at all while the profiler is off.

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/hook.h"
#include "client/query_client.h"
#include "gtest/gtest.h"
#include "tests/testing/in_process_collector.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/wait.h"

namespace sonde {
namespace {

using ::sonde::testing::InProcessCollector;

// Every worker's events of `kind`; a failed read is a test failure and reads
// as none.
std::vector<v1::WorkerEvent> Events(QueryClient& q, const std::string& job,
                                    v1::TraceEvent::Kind kind) {
  auto read = q.ReadEvents(job, kind);
  EXPECT_TRUE(read.ok()) << read.status();
  return read.ok() ? read->events : std::vector<v1::WorkerEvent>();
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

  auto q = QueryClient::Connect(collector.address());
  // System metrics at ~100 ms over the run (loose: a shared 2-core machine).
  auto metrics = q->ReadMetrics("profiled", {"cpu.util_percent", "process.rss_bytes"});
  SONDE_ASSERT_OK(metrics);
  ASSERT_EQ(metrics->series.size(), 2u);
  const int expected = static_cast<int>(elapsed / absl::Milliseconds(100));
  for (const v1::MetricSeries& s : metrics->series) {
    EXPECT_GE(s.values_size(), expected / 3) << s.name();
    EXPECT_LE(s.values_size(), expected + 2) << s.name();
    for (int i = 0; i < s.values_size(); ++i) {
      if (s.name() == "cpu.util_percent") {
        EXPECT_GE(s.values(i), 0);
        EXPECT_LE(s.values(i), 100);
      } else {
        EXPECT_GT(s.values(i), 1 << 20);  // this test's own RSS: more than 1 MiB
      }
      if (i > 0) {
        EXPECT_GT(s.unix_micros(i), s.unix_micros(i - 1));
      }
    }
  }

  const std::vector<v1::WorkerEvent> steps = Events(*q, "profiled", v1::TraceEvent::KIND_STEP);
  ASSERT_EQ(steps.size(), 12u);
  for (int i = 0; i < 12; ++i) {
    const v1::TraceEvent& e = steps[i].event();
    EXPECT_EQ(e.step(), i);
    EXPECT_EQ(e.mode(), v1::MODE_TRAIN);
    EXPECT_EQ(e.mode_step(), i);
    const int64_t micros = e.end_unix_micros() - e.start_unix_micros();
    EXPECT_GE(micros, i == 7 ? 80000 : 20000) << "step " << i;
  }
  const std::vector<v1::WorkerEvent> init = Events(*q, "profiled", v1::TraceEvent::KIND_INIT);
  ASSERT_EQ(init.size(), 1u);
  EXPECT_EQ(init[0].event().end_unix_micros(), steps[0].event().start_unix_micros());
  EXPECT_LT(init[0].event().start_unix_micros(), absl::ToUnixMicros(begin));

  const std::vector<v1::WorkerEvent> spans = Events(*q, "profiled", v1::TraceEvent::KIND_SPAN);
  ASSERT_EQ(spans.size(), 12u);
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(spans[i].event().name(), "augment");
    EXPECT_EQ(spans[i].event().step(), i);  // recorded within step i
  }
  const std::vector<v1::WorkerEvent> waits = Events(*q, "profiled", v1::TraceEvent::KIND_DATA_WAIT);
  ASSERT_EQ(waits.size(), 12u);
  EXPECT_EQ(waits[0].event().step(), -1);  // before the first step
  EXPECT_EQ(waits[1].event().step(), 0);   // between steps 0 and 1: step 0 is open
  for (const v1::WorkerEvent& w : waits) {
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
  // A system sample taken after the refused gauges were offered, so that the
  // metric names read below show what became of them: the job stays open
  // until the collector has stored one.
  auto q = QueryClient::Connect(collector.address());
  ASSERT_TRUE(sonde::testing::WaitUntil([&] {
    auto listed = q->ListMetrics("bad-events");
    return listed.ok() && !listed->empty();
  })) << "no system sample arrived";
  SONDE_ASSERT_OK((*hook)->Close());
  EXPECT_EQ((*hook)->counters().reconnects, 0u);
  EXPECT_EQ((*hook)->counters().tensors_dropped, 0u);
  const std::vector<v1::WorkerEvent> spans = Events(*q, "bad-events", v1::TraceEvent::KIND_SPAN);
  ASSERT_EQ(spans.size(), 5u);
  for (const v1::WorkerEvent& e : spans) EXPECT_EQ(e.event().name(), "good");
  EXPECT_EQ(Events(*q, "bad-events", v1::TraceEvent::KIND_STEP).size(), 5u);
  auto listed = q->ListMetrics("bad-events");
  SONDE_ASSERT_OK(listed);
  ASSERT_EQ(listed->size(), 1u);
  for (const std::string& name : (*listed)[0].names()) EXPECT_NE(name, "framework.nan");
}

// Events pile up between samples; a batch past the stream's message limit
// would be refused again at every reconnect, and everything behind it with
// it. Batches are cut to size instead. And an answer holding them all
// would pass gRPC's message limit: it is cut too, flagged as truncated.
TEST(ProfilerHook, ManyLongEventsTravelAndAreReadInPiecesThatFit) {
  InProcessCollector collector;
  HookOptions o;
  o.collector = collector.address();
  o.job = "many-events";
  o.config.save_config = SaveConfig::Every(1);
  o.profiler.enabled = true;
  o.profiler.interval = absl::Seconds(60);  // everything waits for Close
  o.close_timeout = absl::Seconds(30);
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  // 4 x 1000 events with 1000-byte names: 4 MB, twice a stream's 2 MiB
  // message limit (1 MiB chunks and 1 MiB more) and past gRPC's 4 MiB.
  constexpr int kRounds = 4, kPerRound = 1000;
  std::vector<int64_t> bounds = {absl::ToUnixMicros(absl::Now())};
  (*hook)->StartStep();
  for (int r = 0; r < kRounds; ++r) {
    for (int i = 0; i < kPerRound; ++i) {
      auto span = (*hook)->Span(absl::StrCat(r * kPerRound + i, "-", std::string(990, 's')));
    }
    absl::SleepFor(absl::Milliseconds(2));
    bounds.push_back(absl::ToUnixMicros(absl::Now()));
  }
  SONDE_ASSERT_OK((*hook)->SaveScalar("loss", 1, {"losses"}));
  SONDE_ASSERT_OK((*hook)->Close());
  EXPECT_EQ((*hook)->counters().reconnects, 0u);
  EXPECT_EQ((*hook)->counters().steps_dropped, 0u);
  EXPECT_EQ((*hook)->counters().profile_batches_dropped, 0u);
  auto q = QueryClient::Connect(collector.address());
  auto all = q->ReadEvents("many-events", v1::TraceEvent::KIND_SPAN, "", -1, 0, 0, 1000000);
  SONDE_ASSERT_OK(all);
  EXPECT_TRUE(all->truncated);
  EXPECT_GT(all->events.size(), 2000u);
  EXPECT_LT(all->events.size(), static_cast<size_t>(kRounds * kPerRound));
  for (size_t i = 1; i < all->events.size(); ++i) {
    ASSERT_LT(all->events[i - 1].event().name(), all->events[i].event().name());
  }
  size_t stored = 0;
  for (int r = 0; r < kRounds; ++r) {
    auto part = q->ReadEvents("many-events", v1::TraceEvent::KIND_SPAN, "", -1, bounds[r],
                              bounds[r + 1]);
    SONDE_ASSERT_OK(part);
    EXPECT_FALSE(part->truncated);
    EXPECT_EQ(part->events.size(), static_cast<size_t>(kPerRound)) << "round " << r;
    stored += part->events.size();
  }
  EXPECT_EQ(stored, static_cast<size_t>(kRounds * kPerRound));
  auto steps = q->ListSteps("many-events");
  SONDE_ASSERT_OK(steps);
  EXPECT_EQ(steps->size(), 1u);
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
  auto q = QueryClient::Connect(collector.address());
  EXPECT_EQ(Events(*q, "quiet", v1::TraceEvent::KIND_UNSPECIFIED).size(), 0u);
  auto listed = q->ListMetrics("quiet");
  SONDE_ASSERT_OK(listed);
  EXPECT_EQ(listed->size(), 0u);
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
