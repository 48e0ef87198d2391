#include "common/metrics/metrics.h"

#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/exposition.h"

namespace sonde::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::sonde::testing::ExpositionProblems;

std::string Render(const Registry& r) { return RenderText(r.Collect()); }

TEST(RenderText, CounterHasHelpTypeAndIntegerValue) {
  Registry r;
  Counter* c = r.AddCounter("sonde_things_total", "Things seen.");
  c->Increment();
  c->Increment(41);
  EXPECT_EQ(Render(r),
            "# HELP sonde_things_total Things seen.\n"
            "# TYPE sonde_things_total counter\n"
            "sonde_things_total 42\n");
}

TEST(RenderText, UnlabelledMetricsAreExportedAtZeroBeforeUse) {
  Registry r;
  r.AddCounter("a_total", "A.");
  r.AddGauge("b", "B.");
  EXPECT_EQ(Render(r),
            "# HELP a_total A.\n# TYPE a_total counter\na_total 0\n"
            "# HELP b B.\n# TYPE b gauge\nb 0\n");
}

TEST(RenderText, LabelledFamilyAppearsOnceItHasASeriesAndSortsSeries) {
  Registry r;
  Family<Counter>* f = r.AddCounterFamily("msgs_total", "Messages.", {"kind", "dir"});
  EXPECT_EQ(Render(r), "");
  f->Get({"chunk", "in"})->Increment(3);
  f->Get({"ack", "out"})->Increment();
  EXPECT_EQ(Render(r),
            "# HELP msgs_total Messages.\n"
            "# TYPE msgs_total counter\n"
            "msgs_total{kind=\"ack\",dir=\"out\"} 1\n"
            "msgs_total{kind=\"chunk\",dir=\"in\"} 3\n");
}

TEST(RenderText, EscapesLabelValuesBackslashQuoteAndNewline) {
  Registry r;
  r.AddGaugeFamily("g", "G.", {"path"})->Get({"C:\\dir \"x\"\nnext"})->Set(1);
  EXPECT_THAT(Render(r), HasSubstr("g{path=\"C:\\\\dir \\\"x\\\"\\nnext\"} 1\n"));
  EXPECT_THAT(ExpositionProblems(Render(r)), ::testing::IsEmpty());
}

TEST(RenderText, EscapesHelpBackslashAndNewlineButNotQuotes) {
  Registry r;
  r.AddGauge("g", "A \"quoted\" C:\\path\nsecond line");
  EXPECT_THAT(Render(r), HasSubstr("# HELP g A \"quoted\" C:\\\\path\\nsecond line\n"));
}

TEST(RenderText, GaugeValuesUseExpositionNumberSyntax) {
  Registry r;
  Family<Gauge>* f = r.AddGaugeFamily("g", "G.", {"v"});
  f->Get({"neg"})->Set(-2.5);
  f->Get({"nan"})->Set(std::nan(""));
  f->Get({"inf"})->Set(std::numeric_limits<double>::infinity());
  f->Get({"ninf"})->Set(-std::numeric_limits<double>::infinity());
  f->Get({"tenth"})->Set(0.1);
  f->Get({"big"})->Set(1.5e20);
  const std::string text = Render(r);
  EXPECT_THAT(text, HasSubstr("g{v=\"neg\"} -2.5\n"));
  EXPECT_THAT(text, HasSubstr("g{v=\"nan\"} NaN\n"));
  EXPECT_THAT(text, HasSubstr("g{v=\"inf\"} +Inf\n"));
  EXPECT_THAT(text, HasSubstr("g{v=\"ninf\"} -Inf\n"));
  EXPECT_THAT(text, HasSubstr("g{v=\"tenth\"} 0.1\n"));
  EXPECT_THAT(text, HasSubstr("g{v=\"big\"} 1.5e+20\n"));
  EXPECT_THAT(ExpositionProblems(text), ::testing::IsEmpty());
}

TEST(FormatValue, ShortestExactForm) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(-0.0), "0");
  EXPECT_EQ(FormatValue(1), "1");
  EXPECT_EQ(FormatValue(-7), "-7");
  EXPECT_EQ(FormatValue(9007199254740992.0), "9007199254740992");
  EXPECT_EQ(FormatValue(1e15), "1e+15");
  EXPECT_EQ(FormatValue(123456789012345.0), "123456789012345");
  EXPECT_EQ(FormatValue(0.0005), "0.0005");
  EXPECT_EQ(FormatValue(1e-05), "1e-05");
  EXPECT_EQ(FormatValue(2.5), "2.5");
  const double third = 1.0 / 3;
  EXPECT_EQ(std::stod(FormatValue(third)), third);
}

TEST(RenderText, HistogramBucketsAreCumulativeAndEndWithInf) {
  Registry r;
  Histogram* h = r.AddHistogramFamily("op_seconds", "Op latency.", {0.5, 1}, {"op"})
                     ->Get({"read"});
  h->Observe(0.25);
  h->Observe(0.5);  // on a bound: counts in that bucket (le is inclusive)
  h->Observe(0.75);
  h->Observe(3);
  EXPECT_EQ(Render(r),
            "# HELP op_seconds Op latency.\n"
            "# TYPE op_seconds histogram\n"
            "op_seconds_bucket{op=\"read\",le=\"0.5\"} 2\n"
            "op_seconds_bucket{op=\"read\",le=\"1\"} 3\n"
            "op_seconds_bucket{op=\"read\",le=\"+Inf\"} 4\n"
            "op_seconds_sum{op=\"read\"} 4.5\n"
            "op_seconds_count{op=\"read\"} 4\n");
}

TEST(RenderText, UnlabelledHistogramHasOnlyLe) {
  Registry r;
  Histogram* h = r.AddHistogram("lat_seconds", "Latency.", LatencyBuckets());
  h->ObserveDuration(absl::Milliseconds(3));
  const std::string text = Render(r);
  EXPECT_THAT(text, HasSubstr("lat_seconds_bucket{le=\"0.0025\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("lat_seconds_bucket{le=\"0.005\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("lat_seconds_bucket{le=\"+Inf\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("lat_seconds_sum 0.003\n"));
  EXPECT_THAT(text, HasSubstr("lat_seconds_count 1\n"));
  EXPECT_THAT(ExpositionProblems(text), ::testing::IsEmpty());
}

TEST(Histogram, NanGoesToTheInfBucket) {
  Histogram h({1});
  h.Observe(std::nan(""));
  Histogram::Snapshot s = h.snapshot();
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(s.count, 1u);
  EXPECT_TRUE(std::isnan(s.sum));
}

TEST(ExponentialBuckets, MultipliesFromStart) {
  EXPECT_EQ(ExponentialBuckets(1, 2, 4), (std::vector<double>{1, 2, 4, 8}));
  EXPECT_TRUE(ExponentialBuckets(0, 2, 4).empty());
}

TEST(Registry, SameDefinitionTwiceReturnsTheSameFamily) {
  Registry r;
  Counter* a = r.AddCounter("x_total", "X.");
  Counter* b = r.AddCounter("x_total", "X.");
  EXPECT_EQ(a, b);
  a->Increment();
  b->Increment();
  EXPECT_THAT(Render(r), HasSubstr("x_total 2\n"));
}

TEST(Registry, ConflictingDefinitionWorksButIsNotExported) {
  Registry r;
  r.AddCounter("x_total", "X.")->Increment();
  Gauge* g = r.AddGauge("x_total", "X as a gauge.");
  g->Set(5);
  EXPECT_EQ(g->value(), 5);
  Counter* other_help = r.AddCounter("x_total", "Different help.");
  other_help->Increment(100);
  const std::string text = Render(r);
  EXPECT_THAT(text, HasSubstr("x_total 1\n"));
  EXPECT_THAT(text, Not(HasSubstr("gauge")));
  EXPECT_THAT(text, Not(HasSubstr("100")));
}

TEST(Registry, RejectsMalformedNames) {
  Registry r;
  r.AddCounter("1starts_with_digit", "bad")->Increment();
  r.AddCounter("has-dash", "bad")->Increment();
  r.AddCounterFamily("reserved_label_total", "bad", {"__name"})->Get({"v"})->Increment();
  r.AddCounterFamily("dup_label_total", "bad", {"a", "a"})->Get({"v", "w"})->Increment();
  r.AddHistogramFamily("le_label", "bad", {1}, {"le"})->Get({"v"})->Observe(1);
  r.AddHistogram("unsorted_bounds", "bad", {2, 1})->Observe(1);
  r.AddHistogram("infinite_bound", "bad", {1, std::numeric_limits<double>::infinity()})
      ->Observe(1);
  r.AddCounter("ok:name_total", "good")->Increment();
  EXPECT_EQ(Render(r), "# HELP ok:name_total good\n# TYPE ok:name_total counter\n"
                       "ok:name_total 1\n");
}

TEST(Family, WrongNumberOfLabelValuesGetsAnUnexportedSeries) {
  Registry r;
  Family<Counter>* f = r.AddCounterFamily("f_total", "F.", {"a"});
  f->Get({"x", "y"})->Increment();
  f->Get({})->Increment();
  EXPECT_EQ(Render(r), "");
}

TEST(Registry, CallbackGaugeIsEvaluatedAtScrapeTime) {
  Registry r;
  double depth = 3;
  Registration reg = r.AddCallbackGauge("queue_depth", "Depth.", [&] { return depth; });
  EXPECT_THAT(Render(r), HasSubstr("queue_depth 3\n"));
  depth = 7;
  EXPECT_THAT(Render(r), HasSubstr("queue_depth 7\n"));
}

TEST(Registry, ResetRegistrationRemovesTheCallback) {
  Registry r;
  int calls = 0;
  Registration reg = r.AddCallbackCounter("c_total", "C.", [&] {
    ++calls;
    return 1.0;
  });
  EXPECT_THAT(Render(r), HasSubstr("c_total 1\n"));
  reg.Reset();
  EXPECT_EQ(Render(r), "");
  EXPECT_EQ(calls, 1);
  {
    Registration scoped = r.AddCallbackCounter("c_total", "C.", [] { return 2.0; });
    Registration moved = std::move(scoped);
    EXPECT_THAT(Render(r), HasSubstr("c_total 2\n"));
  }
  EXPECT_EQ(Render(r), "");
}

TEST(Registry, SeveralCallbacksFeedOneFamilyAndDuplicatesAreExportedOnce) {
  Registry r;
  Registration storage =
      r.AddCallback(MetricType::kGauge, "pending", "Pending.", {"pool"},
                    [] { return std::vector<Sample>{{{"storage"}, 4}}; });
  Registration rule = r.AddCallback(MetricType::kGauge, "pending", "Pending.", {"pool"}, [] {
    return std::vector<Sample>{{{"rule"}, 1}, {{"storage"}, 99}, {{"bad", "arity"}, 5}};
  });
  EXPECT_EQ(Render(r),
            "# HELP pending Pending.\n# TYPE pending gauge\n"
            "pending{pool=\"rule\"} 1\n"
            "pending{pool=\"storage\"} 4\n");
}

TEST(Registry, CallbackCannotTakeAnInstrumentedName) {
  Registry r;
  r.AddGauge("g", "G.")->Set(1);
  Registration reg = r.AddCallbackGauge("g", "G.", [] { return 2.0; });
  EXPECT_EQ(Render(r), "# HELP g G.\n# TYPE g gauge\ng 1\n");
}

TEST(RenderText, MergesRegistriesByName) {
  Registry a, b;
  a.AddGaugeFamily("shared", "S.", {"k"})->Get({"a"})->Set(1);
  b.AddGaugeFamily("shared", "S.", {"k"})->Get({"b"})->Set(2);
  b.AddGaugeFamily("shared_dup", "D.", {"k"})->Get({"a"})->Set(3);
  a.AddGaugeFamily("shared_dup", "D.", {"k"})->Get({"a"})->Set(4);
  b.AddCounter("conflict", "C.")->Increment();
  a.AddGauge("conflict", "C.")->Set(9);
  b.AddCounter("only_b_total", "B.")->Increment();
  const Registry* both[] = {&a, &b};
  EXPECT_EQ(RenderText(both),
            "# HELP conflict C.\n# TYPE conflict gauge\nconflict 9\n"
            "# HELP only_b_total B.\n# TYPE only_b_total counter\nonly_b_total 1\n"
            "# HELP shared S.\n# TYPE shared gauge\nshared{k=\"a\"} 1\nshared{k=\"b\"} 2\n"
            "# HELP shared_dup D.\n# TYPE shared_dup gauge\nshared_dup{k=\"a\"} 4\n");
}

TEST(RenderText, MixedRegistryPassesTheFormatRules) {
  Registry r;
  r.AddCounterFamily("sonde_msgs_total", "Messages, by kind.", {"kind"})->Get({"a"})->Increment();
  r.AddGauge("sonde_open", "Open.")->Set(2);
  Family<Histogram>* h = r.AddHistogramFamily("sonde_lat_seconds", "Latency.",
                                              LatencyBuckets(), {"method", "code"});
  for (double v : {0.0001, 0.003, 0.2, 42.0}) h->Get({"Get", "OK"})->Observe(v);
  h->Get({"Put", "NOT_FOUND"})->Observe(0.01);
  Registration cb = r.AddCallback(MetricType::kGauge, "sonde_cb", "CB.", {"cf"}, [] {
    return std::vector<Sample>{{{"default"}, 1e9}, {{"x\"y"}, 0.5}};
  });
  const std::string text = Render(r);
  EXPECT_THAT(ExpositionProblems(text), ::testing::IsEmpty()) << text;
}

TEST(ExpositionProblems, CatchesBrokenExpositions) {
  // The checker itself must reject what the format forbids.
  EXPECT_THAT(ExpositionProblems("a 1"), Not(::testing::IsEmpty()));
  EXPECT_THAT(ExpositionProblems("a 1\n"), Not(::testing::IsEmpty()));  // no TYPE
  EXPECT_THAT(ExpositionProblems("# TYPE a gauge\na{x=\"\"\"} 1\n"), Not(::testing::IsEmpty()));
  EXPECT_THAT(ExpositionProblems("# TYPE h histogram\nh_bucket{le=\"1\"} 2\n"
                             "h_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n"),
              Not(::testing::IsEmpty()));
  EXPECT_THAT(ExpositionProblems("# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n"),
              Not(::testing::IsEmpty()));
  EXPECT_THAT(ExpositionProblems("# TYPE a gauge\n# TYPE b gauge\na 1\nb 1\na 2\n"),
              Not(::testing::IsEmpty()));
}

TEST(Counter, ConcurrentIncrementsAreAllCounted) {
  Registry r;
  Family<Counter>* f = r.AddCounterFamily("n_total", "N.", {"t"});
  Histogram* h = r.AddHistogram("h", "H.", {1});
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      Counter* c = f->Get({"x"});
      for (int i = 0; i < 10000; ++i) {
        c->Increment();
        h->Observe(0.5);
      }
    });
  }
  std::string during;
  for (int i = 0; i < 10; ++i) during = Render(r);  // scrapes while counting
  for (auto& t : threads) t.join();
  EXPECT_EQ(f->Get({"x"})->value(), 80000u);
  EXPECT_EQ(h->snapshot().count, 80000u);
  EXPECT_EQ(h->snapshot().sum, 40000);
  EXPECT_THAT(ExpositionProblems(during), ::testing::IsEmpty());
}

TEST(Registry, DefaultIsOneProcessWideRegistry) {
  Counter* a = Registry::Default().AddCounter("sonde_test_default_total", "Test.");
  Counter* b = Registry::Default().AddCounter("sonde_test_default_total", "Test.");
  EXPECT_EQ(a, b);
  EXPECT_EQ(&Registry::Default(), &Registry::Default());
}

}  // namespace
}  // namespace sonde::metrics
