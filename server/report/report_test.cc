#include "server/report/report.h"

#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rules/profiler/profiler_rules.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace sonde::report {
namespace {

using ::sonde::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kStart = 1700000000000000;  // job start, unix micros

class ReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    storage::Store::Options o;
    o.path = dir_.Sub("db");
    auto s = storage::Store::Open(o);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
  }

  uint64_t MakeJob(const std::string& name) {
    v1::JobInfo info;
    info.set_job(name);
    info.set_status(v1::JOB_STATUS_FINISHED);
    info.set_world_size(1);
    info.add_workers(0);
    info.set_start_unix_micros(kStart);
    info.set_end_unix_micros(kStart + 90 * 1000000LL);
    v1::RuleSpec* spec = info.add_rules();
    spec->set_name("StepOutlier");
    spec->set_rule_type("StepOutlier");
    (*spec->mutable_parameters())["stddev"] = "4";
    spec = info.add_rules();
    spec->set_name("VanishingGradient");
    spec->set_rule_type("VanishingGradient");
    auto made = store_->CreateJob(info);
    EXPECT_TRUE(made.ok()) << made.status();
    return made.ok() ? made->job_id() : 0;
  }

  static v1::TraceEvent Step(v1::Mode mode, int64_t step, int64_t mode_step, int64_t start_ms,
                             int64_t duration_ms) {
    v1::TraceEvent e;
    e.set_kind(v1::TraceEvent::KIND_STEP);
    e.set_mode(mode);
    e.set_step(step);
    e.set_mode_step(mode_step);
    e.set_start_unix_micros(kStart + start_ms * 1000);
    e.set_end_unix_micros(kStart + (start_ms + duration_ms) * 1000);
    return e;
  }

  // Train steps 0..8 take 100, 110, ... 180 ms, step 9 takes 2 s; eval
  // steps 10..12 take 50, 70, 60 ms.
  void AddSteps(uint64_t id) {
    v1::ProfileBatch b;
    int64_t t = 0;
    for (int i = 0; i < 10; ++i) {
      const int64_t d = i < 9 ? 100 + 10 * i : 2000;
      *b.add_events() = Step(v1::MODE_TRAIN, i, i, t, d);
      v1::TraceEvent* wait = b.add_events();
      wait->set_kind(v1::TraceEvent::KIND_DATA_WAIT);
      wait->set_mode(v1::MODE_TRAIN);
      wait->set_step(i);
      wait->set_mode_step(i);
      wait->set_start_unix_micros(kStart + t * 1000);
      wait->set_end_unix_micros(kStart + (t + d / 4) * 1000);  // a quarter of each step
      t += d;
    }
    const int64_t eval_ms[] = {50, 70, 60};
    for (int i = 0; i < 3; ++i) {
      *b.add_events() = Step(v1::MODE_EVAL, 10 + i, i, t, eval_ms[i]);
      t += eval_ms[i];
    }
    ASSERT_TRUE(store_->WriteProfile(id, 0, b).ok());
  }

  std::vector<v1::RuleCatalogEntry> Catalogue() {
    v1::RuleCatalogEntry outlier;
    outlier.set_rule_type("StepOutlier");
    outlier.set_description("Detects outliers in step duration.");
    outlier.set_suggestion("Check for system bottlenecks when steps are slow.");
    v1::RuleParameterInfo* p = outlier.add_parameters();
    p->set_name("stddev");
    p->set_default_value("3");
    p = outlier.add_parameters();
    p->set_name("mode");
    p->set_default_value("None");
    v1::RuleCatalogEntry vanishing;
    vanishing.set_rule_type("VanishingGradient");
    vanishing.set_description("Detects gradients that become very small.");
    vanishing.set_suggestion("Use a different initialisation.");
    p = vanishing.add_parameters();
    p->set_name("threshold");
    p->set_default_value("0.0000001");
    return {outlier, vanishing};
  }

  testing::TempDir dir_;
  std::unique_ptr<storage::Store> store_;
};

TEST(DurationStats, MatchesNumpy) {
  // numpy: mean, percentile(50), percentile(95), max, std of the same values.
  const DurationStats st = ComputeDurationStats({0.10, 0.11, 0.12, 0.13, 0.14, 0.15, 0.16,
                                                 0.17, 0.18, 2.0});
  EXPECT_EQ(st.count, 10);
  EXPECT_NEAR(st.mean, 0.326, 1e-12);
  EXPECT_NEAR(st.p50, 0.145, 1e-12);
  EXPECT_NEAR(st.p95, 1.181, 1e-12);
  EXPECT_NEAR(st.max, 2.0, 1e-12);
  EXPECT_NEAR(st.stddev, 0.55854, 1e-5);
  EXPECT_EQ(ComputeDurationStats({}).count, 0);
}

TEST(DurationStats, LeavesOutNonFiniteValues) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const DurationStats st = ComputeDurationStats({3, nan, 1, inf, -inf, 2});
  EXPECT_EQ(st.count, 3);
  EXPECT_DOUBLE_EQ(st.mean, 2);
  EXPECT_DOUBLE_EQ(st.p50, 2);
  EXPECT_DOUBLE_EQ(st.max, 3);
  EXPECT_EQ(ComputeDurationStats({nan}).count, 0);
}

TEST(ProfilerRuleTypes, EveryTypeRulesProfilerRegistersIsOne) {
  for (const auto& [info, maker] : rules::profiler::ProfilerRuleTypes()) {
    EXPECT_TRUE(IsProfilerRuleType(info.rule_type)) << info.rule_type;
  }
}

TEST(ProfilerRuleTypes, SplitByName) {
  EXPECT_TRUE(IsProfilerRuleType("LowGPUUtilization"));
  EXPECT_TRUE(IsProfilerRuleType("ProfilerReport"));
  EXPECT_FALSE(IsProfilerRuleType("VanishingGradient"));
}

TEST_F(ReportTest, UnknownAndEmptyJobsAreErrors) {
  EXPECT_THAT(RenderJobReport(*store_, "nope", {}).status(),
              StatusIs(absl::StatusCode::kNotFound, ""));
  EXPECT_THAT(RenderJobReport(*store_, "", {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "no job"));
}

TEST_F(ReportTest, ShowsStepStatisticsOutliersAndRules) {
  const uint64_t id = MakeJob("resnet-run");
  AddSteps(id);
  v1::RuleResult outlier;
  outlier.set_job("resnet-run");
  outlier.set_rule("StepOutlier");
  outlier.set_rule_type("StepOutlier");
  outlier.set_status(v1::RULE_STATUS_ISSUES_FOUND);
  outlier.set_step(9);
  outlier.set_datapoints(13);
  outlier.set_times_triggered(4);
  outlier.set_message("step 9 took 2 s, 13.8 times the median");
  ASSERT_TRUE(store_->PutRuleResult(id, outlier).ok());
  v1::RuleResult vanishing;
  vanishing.set_job("resnet-run");
  vanishing.set_rule("VanishingGradient");
  vanishing.set_rule_type("VanishingGradient");
  vanishing.set_status(v1::RULE_STATUS_NO_ISSUES_FOUND);
  vanishing.set_steps_evaluated(17);
  ASSERT_TRUE(store_->PutRuleResult(id, vanishing).ok());

  auto html = RenderJobReport(*store_, "resnet-run", Catalogue());
  ASSERT_TRUE(html.ok()) << html.status();
  const std::string& h = *html;
  EXPECT_EQ(h.rfind("<!DOCTYPE html>", 0), 0u);
  // Self-contained: no scripts, links or remote images.
  EXPECT_THAT(h, Not(HasSubstr("<script")));
  EXPECT_THAT(h, Not(HasSubstr("<link")));
  EXPECT_THAT(h, Not(HasSubstr("src=")));

  // Step statistics per mode, numpy's numbers.
  EXPECT_THAT(h, HasSubstr("<td>train</td><td class=\"n\">10</td><td class=\"n\">0.3260</td>"
                           "<td class=\"n\">0.1450</td><td class=\"n\">1.1810</td>"
                           "<td class=\"n\">2.0000</td><td class=\"n\">0.5585</td>"));
  EXPECT_THAT(h, HasSubstr("<td>eval</td><td class=\"n\">3</td><td class=\"n\">0.0600</td>"
                           "<td class=\"n\">0.0600</td><td class=\"n\">0.0690</td>"
                           "<td class=\"n\">0.0700</td><td class=\"n\">0.0082</td>"));
  // The slowest step first: step 9, 2 s, 13.79 times the train median.
  EXPECT_THAT(h, HasSubstr("<tbody><tr><td class=\"n\">9</td><td>train</td><td class=\"n\">9"
                           "</td><td class=\"n\">0</td><td class=\"n\">2.0000</td>"
                           "<td class=\"n\">0.1450</td><td class=\"n\">13.79</td></tr>"));
  EXPECT_THAT(h, HasSubstr("Top 10 slowest steps"));
  // Histograms per mode, as SVG.
  EXPECT_THAT(h, HasSubstr("Step duration histogram, train (10 steps)"));
  EXPECT_THAT(h, HasSubstr("Step duration histogram, eval (3 steps)"));
  EXPECT_THAT(h, HasSubstr("<rect class=\"bar\""));
  // Data waits: a quarter of each train step in whole ms (the eval steps add
  // 0.18 s of step time and no waits).
  EXPECT_THAT(h, HasSubstr("Data loading"));
  EXPECT_THAT(h, HasSubstr("<td class=\"n\">0.813</td><td class=\"n\">3.440</td>"
                           "<td class=\"n\">23.6%</td>"));

  // Rules: the profiler rule in the profiler table, triggered, with its
  // data points and its parameter (set value in bold, default plain).
  const size_t profiler = h.find("id=\"profiler-rules-table\"");
  const size_t tensor = h.find("id=\"tensor-rules-table\"");
  ASSERT_NE(profiler, std::string::npos);
  ASSERT_NE(tensor, std::string::npos);
  const size_t outlier_row = h.find("<tr class=\"hit\"><td>StepOutlier</td>");
  EXPECT_GT(outlier_row, profiler);
  EXPECT_LT(outlier_row, tensor);
  EXPECT_THAT(h, HasSubstr("<td>StepOutlier</td><td>Detects outliers in step duration.</td>"
                           "<td>Check for system bottlenecks when steps are slow.</td>"
                           "<td class=\"n\">4</td><td class=\"n\">13</td>"
                           "<td><b>stddev=4</b><br>mode=None</td>"));
  const size_t vanishing_row = h.find("<tr><td>VanishingGradient</td>");
  EXPECT_GT(vanishing_row, tensor);
  EXPECT_THAT(h, HasSubstr("<td>Use a different initialisation.</td><td class=\"n\">0</td>"
                           "<td class=\"n\">17</td><td>threshold=0.0000001</td>"));
  EXPECT_THAT(h, HasSubstr("1 rule ran; 1 found issues."));
  // No system metrics were stored.
  EXPECT_THAT(h, HasSubstr("No system metrics stored for this job"));
}

TEST_F(ReportTest, EscapesEveryStringFromTheData) {
  const std::string evil = "<script>alert('job')</script>";
  const uint64_t id = MakeJob(evil);
  v1::ProfileBatch b;
  v1::MetricSnapshot* snap = b.add_snapshots();
  snap->set_unix_micros(kStart);
  v1::MetricSample* sample = snap->add_samples();
  sample->set_name("cpu.util_percent");
  sample->set_value(42);
  ASSERT_TRUE(store_->WriteProfile(id, 0, b).ok());
  v1::RuleResult r;
  r.set_rule("<b>MyRule</b>");
  r.set_rule_type("<i>type</i>");
  r.set_status(v1::RULE_STATUS_ISSUES_FOUND);
  r.set_message("<img src=x onerror=alert(1)>");
  r.set_suggestion("use \"quotes\" & <tags>");
  ASSERT_TRUE(store_->PutRuleResult(id, r).ok());
  v1::RuleCatalogEntry entry;
  entry.set_rule_type("<i>type</i>");
  entry.set_description("<style>body{display:none}</style>");

  auto html = RenderJobReport(*store_, evil, {entry});
  ASSERT_TRUE(html.ok()) << html.status();
  const std::string& h = *html;
  EXPECT_THAT(h, Not(HasSubstr("<script")));
  EXPECT_THAT(h, Not(HasSubstr("<img")));
  EXPECT_THAT(h, Not(HasSubstr("<b>MyRule")));
  EXPECT_THAT(h, Not(HasSubstr("<i>type")));
  EXPECT_THAT(h, Not(HasSubstr("<style>body{display:none}")));
  EXPECT_THAT(h, HasSubstr("&lt;script&gt;alert(&#39;job&#39;)&lt;/script&gt;"));
  EXPECT_THAT(h, HasSubstr("&lt;img src=x onerror=alert(1)&gt;"));
  EXPECT_THAT(h, HasSubstr("use &quot;quotes&quot; &amp; &lt;tags&gt;"));
  EXPECT_THAT(h, HasSubstr("&lt;style&gt;body{display:none}&lt;/style&gt;"));
}

TEST_F(ReportTest, NaNMetricSamplesReachNeitherTheStatisticsNorTheCharts) {
  const uint64_t id = MakeJob("odd-run");
  v1::ProfileBatch b;
  const double values[] = {10, std::numeric_limits<double>::quiet_NaN(), 30,
                           std::numeric_limits<double>::infinity()};
  for (int i = 0; i < 4; ++i) {
    v1::MetricSnapshot* snap = b.add_snapshots();
    snap->set_unix_micros(kStart + int64_t{i} * 1000000);
    v1::MetricSample* sample = snap->add_samples();
    sample->set_name("cpu.util_percent");
    sample->set_value(values[i]);
  }
  ASSERT_TRUE(store_->WriteProfile(id, 0, b).ok());
  auto html = RenderJobReport(*store_, "odd-run", {});
  ASSERT_TRUE(html.ok()) << html.status();
  const std::string& h = *html;
  // Two finite samples, mean 20, max 30.
  EXPECT_THAT(h, HasSubstr("<td>cpu.util_percent</td><td class=\"n\">2</td>"
                           "<td class=\"n\">20</td>"));
  EXPECT_THAT(h, HasSubstr(">CPU utilisation<"));
  EXPECT_THAT(h, Not(HasSubstr("nan")));
  EXPECT_THAT(h, Not(HasSubstr("inf")));
}

TEST_F(ReportTest, LongSeriesAreDownsampledSoTheFileStaysSmall) {
  const uint64_t id = MakeJob("long-run");
  // 100,000 snapshots of CPU, memory and a (synthetic: no GPU here) GPU.
  constexpr int kPoints = 100000;
  for (int chunk = 0; chunk < 10; ++chunk) {
    v1::ProfileBatch b;
    for (int i = chunk * kPoints / 10; i < (chunk + 1) * kPoints / 10; ++i) {
      v1::MetricSnapshot* snap = b.add_snapshots();
      snap->set_unix_micros(kStart + int64_t{i} * 100000);
      auto add = [&](const char* name, double v) {
        v1::MetricSample* s = snap->add_samples();
        s->set_name(name);
        s->set_value(v);
      };
      add("cpu.util_percent", 50 + 40 * std::sin(i / 500.0));
      add("gpu.0.util_percent", i == 61234 ? 100 : 20);
      add("memory.used_bytes", 4e9 + i * 1e4);
    }
    ASSERT_TRUE(store_->WriteProfile(id, 0, b).ok());
  }
  ReportOptions options;
  options.max_points_per_chart = 2000;
  auto html = RenderJobReport(*store_, "long-run", {}, options);
  ASSERT_TRUE(html.ok()) << html.status();
  const std::string& h = *html;
  EXPECT_THAT(h, HasSubstr(">CPU utilisation<"));
  EXPECT_THAT(h, HasSubstr(">GPU utilisation<"));
  EXPECT_THAT(h, HasSubstr(">Memory<"));
  // Every polyline holds at most the chart's budget.
  for (size_t at = h.find(" d=\"M"); at != std::string::npos; at = h.find(" d=\"M", at + 1)) {
    const size_t end = h.find('"', at + 4);
    size_t points = 1;
    for (size_t i = at; i < end; ++i) points += h[i] == 'L';
    EXPECT_LE(points, 2000u);
  }
  EXPECT_LT(h.size(), 300u << 10) << "bytes of HTML for 300,000 samples";
  // The GPU spike survives downsampling: the chart's top tick is 100.
  EXPECT_THAT(h, HasSubstr("<td class=\"n\">0</td><td>gpu.0.util_percent</td>"
                           "<td class=\"n\">100000</td>"));
}

TEST_F(ReportTest, ALongJobIsReadWithinTheBudgetAndTheReportSaysWhereItStops) {
  const uint64_t id = MakeJob("week-run");
  // Two workers, two metrics each, 1000 samples a second apart; 400 step
  // events per worker.
  for (int32_t worker : {0, 1}) {
    v1::ProfileBatch b;
    for (int i = 0; i < 1000; ++i) {
      v1::MetricSnapshot* snap = b.add_snapshots();
      snap->set_unix_micros(kStart + int64_t{i} * 1000000);
      for (const char* name : {"cpu.util_percent", "memory.used_bytes"}) {
        v1::MetricSample* sample = snap->add_samples();
        sample->set_name(name);
        sample->set_value(i < 100 ? 10 : 90);
      }
    }
    for (int i = 0; i < 400; ++i) {
      *b.add_events() = Step(v1::MODE_TRAIN, i, i, i * 100, 50);
      for (int k = 0; k < 2; ++k) {  // two data waits a step
        v1::TraceEvent wait = Step(v1::MODE_TRAIN, i, i, i * 100 + 10 * k, 5);
        wait.set_kind(v1::TraceEvent::KIND_DATA_WAIT);
        *b.add_events() = wait;
      }
    }
    ASSERT_TRUE(store_->WriteProfile(id, worker, b).ok());
  }
  ReportOptions options;
  options.max_metric_points = 400;  // 100 a series: the first 100 s of each
  // 200 per worker and kind: steps 0..199, but the waits of steps 0..99
  // only; steps are cut to the same time, so the report compares like with
  // like: steps 0..99 of each worker.
  options.max_events = 1600;
  auto html = RenderJobReport(*store_, "week-run", {}, options);
  ASSERT_TRUE(html.ok()) << html.status();
  const std::string& h = *html;
  EXPECT_THAT(h, HasSubstr("id=\"cut\""));
  EXPECT_THAT(h, HasSubstr("System metrics are shown up to "));
  EXPECT_THAT(h, HasSubstr("Framework events (step timings, data waits) are shown up to "));
  // Every series of both workers is there, cut alike: 100 samples of 10.
  for (const char* worker : {"0", "1"}) {
    EXPECT_THAT(h, HasSubstr(absl::StrCat("<td class=\"n\">", worker,
                                          "</td><td>cpu.util_percent</td>"
                                          "<td class=\"n\">100</td><td class=\"n\">10</td>")));
    EXPECT_THAT(h, HasSubstr(absl::StrCat("<td class=\"n\">", worker,
                                          "</td><td>memory.used_bytes</td>"
                                          "<td class=\"n\">100</td>")));
  }
  EXPECT_THAT(h, HasSubstr("<td>train</td><td class=\"n\">200</td>"));

  // Within the budget, nothing is cut.
  auto whole = RenderJobReport(*store_, "week-run", {});
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_THAT(*whole, Not(HasSubstr("id=\"cut\"")));
  EXPECT_THAT(*whole, HasSubstr("<td>train</td><td class=\"n\">800</td>"));
}

}  // namespace
}  // namespace sonde::report
