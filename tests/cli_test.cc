// The `sonde` CLI binary run as a user would, against a real collector.
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/hook.h"
#include "client/query_client.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/in_process_collector.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/wait.h"

namespace sonde {
namespace {

struct CliRun {
  int exit_code;
  std::string out;  // stdout and stderr together, or stdout alone with split_stderr
  std::string err;  // stderr, with split_stderr
};

// Runs the CLI; with `split_stderr` its stderr goes to `err` and `out` holds
// only stdout (so --json output parses even when a note goes to stderr).
CliRun Cli(const std::string& args, bool split_stderr = false) {
  static int runs = 0;
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  const char* tmpdir = std::getenv("TEST_TMPDIR");
  const std::string binary = absl::StrCat(srcdir ? srcdir : ".", "/",
                                          workspace ? workspace : "sonde", "/client/sonde");
  const std::string err_file =
      absl::StrCat(tmpdir ? tmpdir : "/tmp", "/cli_stderr_", ++runs, ".txt");
  const std::string cmd =
      absl::StrCat(binary, " ", args, split_stderr ? absl::StrCat(" 2>", err_file) : " 2>&1");
  CliRun r{-1, "", ""};
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (split_stderr) {
    std::ifstream err(err_file);
    std::stringstream text;
    text << err.rdbuf();
    r.err = text.str();
  }
  return r;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HookOptions o;
    o.collector = collector_.address();
    o.job = "cli-job";
    o.config.save_config = SaveConfig::Every(1);
    o.config.include_collections = {"weights", "losses"};
    auto hook = Hook::Create(o);
    SONDE_ASSERT_OK(hook);
    (*hook)->SetMode(v1::MODE_TRAIN);
    for (int step = 0; step < 5; ++step) {
      (*hook)->StartStep();
      std::vector<float> w = {0.5f * step, -1.0f, 2.0f};
      SONDE_ASSERT_OK((*hook)->SaveTensor("fc.weight", HostTensor(w.data(), {3}), {"weights"}));
      SONDE_ASSERT_OK((*hook)->SaveScalar("loss", 4.0 / (step + 1), {"losses"}));
    }
    SONDE_ASSERT_OK((*hook)->Close());
  }

  std::string Flags() const { return absl::StrCat("--collector=", collector_.address()); }

  testing::InProcessCollector collector_{"ExplodingTensor(actions=StopTraining)"};
};

TEST_F(CliTest, JobsJsonListsTheJobWithStatusAndLastStepPerMode) {
  CliRun r = Cli(absl::StrCat("jobs --json ", Flags()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto jobs = nlohmann::json::parse(r.out);
  ASSERT_TRUE(jobs.is_array());
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0]["job"], "cli-job");
  EXPECT_EQ(jobs[0]["status"], "Finished");
  EXPECT_EQ(jobs[0]["last_step_by_mode"]["TRAIN"], 4);
}

TEST_F(CliTest, JobsTableIsReadable) {
  CliRun r = Cli(absl::StrCat("jobs ", Flags()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("JOB"), std::string::npos);
  EXPECT_NE(r.out.find("cli-job"), std::string::npos);
  EXPECT_NE(r.out.find("TRAIN:4"), std::string::npos) << r.out;
}

TEST_F(CliTest, RulesJsonHasRuleStatusStepAndMessage) {
  // Wait for the end-of-job verdict through `watch`, which returns when the job is over.
  CliRun w = Cli(absl::StrCat("watch --json --job=cli-job --timeout=30s ", Flags()));
  ASSERT_EQ(w.exit_code, 0) << w.out;
  CliRun r = Cli(absl::StrCat("rules --json --job=cli-job ", Flags()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto rules = nlohmann::json::parse(r.out);
  ASSERT_EQ(rules.size(), 1u);
  EXPECT_EQ(rules[0]["rule"], "ExplodingTensor");
  EXPECT_EQ(rules[0]["status"], "NoIssuesFound");
  EXPECT_EQ(rules[0]["step"], 4);
  EXPECT_NE(rules[0]["message"].get<std::string>().find("no issues"), std::string::npos);
}

TEST_F(CliTest, ShowPrintsTheValuesOfOneStep) {
  CliRun r = Cli(absl::StrCat("show --json --job=cli-job --tensor=fc.weight --mode=TRAIN --step=3 ",
                           Flags()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto t = nlohmann::json::parse(r.out);
  EXPECT_EQ(t["dtype"], "float32");
  EXPECT_EQ(t["values"], nlohmann::json::array({1.5, -1.0, 2.0}));
  EXPECT_EQ(t["statistics"]["max"], 2.0);
  CliRun table = Cli(absl::StrCat("show --job=cli-job --tensor=fc.weight --step=3 ", Flags()));
  ASSERT_EQ(table.exit_code, 0) << table.out;
  EXPECT_NE(table.out.find("values: [1.5, -1, 2]"), std::string::npos) << table.out;
}

TEST_F(CliTest, SeriesTensorsAndStepsCoverTheRun) {
  CliRun s = Cli(absl::StrCat("series --json --job=cli-job --tensor=loss --mode=TRAIN --start=1 --end=3 ",
                           Flags()));
  ASSERT_EQ(s.exit_code, 0) << s.out;
  auto points = nlohmann::json::parse(s.out);
  ASSERT_EQ(points.size(), 2u);
  EXPECT_EQ(points[0]["mode_step"], 1);
  EXPECT_DOUBLE_EQ(points[1]["mean"].get<double>(), 4.0 / 3);
  CliRun t = Cli(absl::StrCat("tensors --job=cli-job --collection=weights ", Flags()));
  ASSERT_EQ(t.exit_code, 0) << t.out;
  EXPECT_NE(t.out.find("fc.weight"), std::string::npos);
  EXPECT_EQ(t.out.find("loss"), std::string::npos);
  CliRun st = Cli(absl::StrCat("steps --json --job=cli-job ", Flags()));
  ASSERT_EQ(st.exit_code, 0) << st.out;
  EXPECT_EQ(nlohmann::json::parse(st.out).size(), 5u);
}

TEST_F(CliTest, RuleCatalogListsRulesWithParametersAndDefaults) {
  CliRun r = Cli(absl::StrCat("rule-catalog --json ", Flags()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto rules = nlohmann::json::parse(r.out);
  const nlohmann::json* lnd = nullptr;
  for (const auto& rule : rules) {
    if (rule["rule"] == "LossNotDecreasing") lnd = &rule;
  }
  ASSERT_NE(lnd, nullptr) << r.out;
  EXPECT_EQ((*lnd)["source"], "built-in");
  bool found = false;
  for (const auto& p : (*lnd)["parameters"]) {
    if (p["name"] == "num_steps") {
      EXPECT_EQ(p["default"], "10");
      found = true;
    }
  }
  EXPECT_TRUE(found);
  CliRun table = Cli(absl::StrCat("rule-catalog ", Flags()));
  ASSERT_EQ(table.exit_code, 0);
  EXPECT_NE(table.out.find("ExplodingTensor (built-in)"), std::string::npos) << table.out;
}

TEST_F(CliTest, EnableRulesRegistersAPendingJob) {
  CliRun r = Cli(absl::StrCat("enable-rules --job=next-run --rules='LossNotDecreasing(num_steps=5)' ",
                              Flags()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("will start with 1 rule(s): LossNotDecreasing"), std::string::npos) << r.out;
  CliRun jobs = Cli(absl::StrCat("jobs --json ", Flags()));
  EXPECT_NE(jobs.out.find("\"Pending\""), std::string::npos) << jobs.out;
  CliRun started = Cli(absl::StrCat("enable-rules --job=cli-job --rules=ExplodingTensor ", Flags()));
  EXPECT_EQ(started.exit_code, 1);
  EXPECT_NE(started.out.find("has started"), std::string::npos) << started.out;
}

TEST_F(CliTest, ErrorsSayWhatWasWrong) {
  CliRun missing = Cli(absl::StrCat("rules --job=nope ", Flags()));
  EXPECT_EQ(missing.exit_code, 3);
  EXPECT_NE(missing.out.find("no job named 'nope'"), std::string::npos) << missing.out;
  CliRun no_job = Cli(absl::StrCat("rules ", Flags()));
  EXPECT_EQ(no_job.exit_code, 2);
  EXPECT_NE(no_job.out.find("needs --job"), std::string::npos);
  CliRun unknown = Cli(absl::StrCat("frobnicate ", Flags()));
  EXPECT_EQ(unknown.exit_code, 2);
  CliRun bad_mode = Cli(absl::StrCat("steps --job=cli-job --mode=TEST ", Flags()));
  EXPECT_EQ(bad_mode.exit_code, 1);
  EXPECT_NE(bad_mode.out.find("unknown mode 'TEST'"), std::string::npos);
  CliRun down = Cli("jobs --collector=127.0.0.1:1");
  EXPECT_EQ(down.exit_code, 1);
  EXPECT_NE(down.out.find("UNAVAILABLE"), std::string::npos) << down.out;
}

TEST_F(CliTest, DeleteRemovesAnEndedJobAndSaysWhatItFreed) {
  // `watch` returns once the job is no longer live (its rules are done).
  CliRun w = Cli(absl::StrCat("watch --job=cli-job --timeout=30s ", Flags()));
  ASSERT_EQ(w.exit_code, 0) << w.out;
  CliRun r = Cli(absl::StrCat("delete --json --job=cli-job ", Flags()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto out = nlohmann::json::parse(r.out);
  EXPECT_EQ(out["job"], "cli-job");
  EXPECT_EQ(out["job_id"], 1);
  EXPECT_GT(out["approximate_bytes"].get<uint64_t>(), 0u);
  CliRun gone = Cli(absl::StrCat("job --job=cli-job ", Flags()));
  EXPECT_EQ(gone.exit_code, 3) << gone.out;
  CliRun again = Cli(absl::StrCat("delete --job=cli-job ", Flags()));
  EXPECT_EQ(again.exit_code, 3);
  EXPECT_NE(again.out.find("no job named 'cli-job'"), std::string::npos) << again.out;
  CliRun no_job = Cli(absl::StrCat("delete ", Flags()));
  EXPECT_EQ(no_job.exit_code, 2);
  EXPECT_NE(no_job.out.find("delete needs --job"), std::string::npos) << no_job.out;
}

// The profiler's data through `sonde metrics` and `sonde events`.
//
// A real profiled loop (the hook's profiler at 100 ms: system metrics from
// /proc, step, data-wait and span events), plus a metric and spans sent
// through the same hook at fixed times, so the tests can say exactly which
// points a time range keeps and how values print.
constexpr int kSteps = 6;
constexpr int64_t kT0 = 1714564800000000;  // 2024-05-01T12:00:00Z
constexpr int64_t kSecond = 1000000;

// A table's lines split on spaces (cells hold no spaces; headers may).
std::vector<std::vector<std::string>> Rows(const std::string& table) {
  std::vector<std::vector<std::string>> rows;
  for (absl::string_view line : absl::StrSplit(table, '\n', absl::SkipEmpty())) {
    rows.push_back(absl::StrSplit(line, ' ', absl::SkipEmpty()));
  }
  return rows;
}

class CliProfilerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    collector_ = new testing::InProcessCollector();
    HookOptions o;
    o.collector = collector_->address();
    o.job = "profiled-job";
    o.profiler.enabled = true;
    o.profiler.interval = absl::Milliseconds(100);
    auto hook = Hook::Create(o);
    ASSERT_TRUE(hook.ok()) << hook.status();
    begin_micros_ = absl::ToUnixMicros(absl::Now());
    (*hook)->SetMode(v1::MODE_TRAIN);
    for (int step = 0; step < kSteps; ++step) {
      {
        auto wait = (*hook)->DataWait();
        absl::SleepFor(absl::Milliseconds(3));
      }
      (*hook)->StartStep();
      auto span = (*hook)->Span("augment");
      absl::SleepFor(absl::Milliseconds(15));
    }
    const double values[] = {0.5, 1, 2.25, 250000000.0, 8589934592.0};
    v1::ProfileBatch fixed;
    for (int i = 0; i < 5; ++i) {
      v1::MetricSnapshot* snapshot = fixed.add_snapshots();
      snapshot->set_unix_micros(kT0 + i * kSecond);
      v1::MetricSample* sample = snapshot->add_samples();
      sample->set_name("test.queue_depth");
      sample->set_value(values[i]);
      v1::TraceEvent* e = fixed.add_events();
      e->set_kind(v1::TraceEvent::KIND_SPAN);
      e->set_name("mark");
      e->set_mode(v1::MODE_EVAL);
      e->set_step(100 + i);
      e->set_mode_step(i);
      e->set_start_unix_micros(kT0 + i * kSecond);
      e->set_end_unix_micros(kT0 + i * kSecond + 250000);
    }
    ASSERT_TRUE((*hook)->SaveProfile(fixed));
    // MetricsRegexReadsTheSystemSamplesOfTheRun needs two system samples:
    // the job stays open until the collector has stored them.
    auto query = QueryClient::Connect(collector_->address());
    absl::Status last;
    ASSERT_TRUE(sonde::testing::WaitUntil([&] {
      auto read = query->ReadMetrics("profiled-job", {"cpu.util_percent"});
      last = read.status();
      return read.ok() && !read->series.empty() && read->series[0].values_size() >= 2;
    })) << "two cpu.util_percent samples never arrived: " << last;
    absl::Status closed = (*hook)->Close();
    ASSERT_TRUE(closed.ok()) << closed;
    end_micros_ = absl::ToUnixMicros(absl::Now());
  }
  static void TearDownTestSuite() {
    delete collector_;
    collector_ = nullptr;
  }

  static std::string Flags() {
    return absl::StrCat("--job=profiled-job --collector=", collector_->address());
  }

  static inline testing::InProcessCollector* collector_ = nullptr;
  static inline int64_t begin_micros_ = 0;
  static inline int64_t end_micros_ = 0;
};

TEST_F(CliProfilerTest, MetricsListShowsEachWorkersMetricNames) {
  CliRun table = Cli(absl::StrCat("metrics --list ", Flags()));
  ASSERT_EQ(table.exit_code, 0) << table.out;
  const auto rows = Rows(table.out);
  ASSERT_FALSE(rows.empty());
  EXPECT_EQ(rows[0], (std::vector<std::string>{"WORKER", "METRIC"}));
  for (const std::string name : {"cpu.util_percent", "process.rss_bytes", "test.queue_depth"}) {
    EXPECT_NE(std::find(rows.begin(), rows.end(), std::vector<std::string>{"0", name}),
              rows.end())
        << name << " missing from\n" << table.out;
  }
  CliRun json = Cli(absl::StrCat("metrics --list --json ", Flags()));
  ASSERT_EQ(json.exit_code, 0) << json.out;
  auto workers = nlohmann::json::parse(json.out);
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0]["worker"], 0);
  const auto names = workers[0]["names"].get<std::vector<std::string>>();
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_EQ(names.size(), rows.size() - 1);
  CliRun other = Cli(absl::StrCat("metrics --list --json --worker=1 ", Flags()));
  ASSERT_EQ(other.exit_code, 0) << other.out;
  EXPECT_EQ(nlohmann::json::parse(other.out), nlohmann::json::array());
}

TEST_F(CliProfilerTest, MetricsTablePrintsRfc3339TimesWorkersAndExactValues) {
  CliRun r = Cli(absl::StrCat("metrics --names=test.queue_depth ", Flags()), true);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(Rows(r.out),
            (std::vector<std::vector<std::string>>{
                {"TIME", "(UTC)", "WORKER", "METRIC", "VALUE"},
                {"2024-05-01T12:00:00.000000Z", "0", "test.queue_depth", "0.5"},
                {"2024-05-01T12:00:01.000000Z", "0", "test.queue_depth", "1"},
                {"2024-05-01T12:00:02.000000Z", "0", "test.queue_depth", "2.25"},
                {"2024-05-01T12:00:03.000000Z", "0", "test.queue_depth", "250000000"},
                {"2024-05-01T12:00:04.000000Z", "0", "test.queue_depth", "8589934592"}}))
      << r.out;
}

TEST_F(CliProfilerTest, MetricsJsonKeepsTheTimeRangeGivenAsRfc3339OrMicros) {
  CliRun r = Cli(absl::StrCat("metrics --json --names=test.queue_depth "
                              "--start=2024-05-01T12:00:01Z --end=1714564803000000 ",
                              Flags()),
                 true);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.err, "");
  auto out = nlohmann::json::parse(r.out);
  EXPECT_EQ(out["truncated"], false);
  ASSERT_EQ(out["series"].size(), 1u);
  EXPECT_EQ(out["series"][0]["worker"], 0);
  EXPECT_EQ(out["series"][0]["metric"], "test.queue_depth");
  EXPECT_EQ(out["series"][0]["unix_micros"],
            nlohmann::json::array({kT0 + kSecond, kT0 + 2 * kSecond}));
  EXPECT_EQ(out["series"][0]["values"], nlohmann::json::array({1.0, 2.25}));
  // The same instant with another zone; no --end: to the last point.
  CliRun later = Cli(absl::StrCat("metrics --json --names=test.queue_depth "
                                  "--start=2024-05-01T14:00:03+02:00 ",
                                  Flags()));
  ASSERT_EQ(later.exit_code, 0) << later.out;
  auto series = nlohmann::json::parse(later.out)["series"];
  ASSERT_EQ(series.size(), 1u);
  EXPECT_EQ(series[0]["values"], nlohmann::json::array({250000000.0, 8589934592.0}));
}

TEST_F(CliProfilerTest, MetricsRegexReadsTheSystemSamplesOfTheRun) {
  CliRun r = Cli(absl::StrCat("metrics --json --regex='^cpu[.]util_percent$' ", Flags()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto series = nlohmann::json::parse(r.out)["series"];
  ASSERT_EQ(series.size(), 1u) << r.out;
  EXPECT_EQ(series[0]["metric"], "cpu.util_percent");
  const auto times = series[0]["unix_micros"].get<std::vector<int64_t>>();
  const auto values = series[0]["values"].get<std::vector<double>>();
  ASSERT_GE(times.size(), 2u) << "set-up waited for two samples: " << r.out;
  ASSERT_EQ(times.size(), values.size());
  for (size_t i = 0; i < times.size(); ++i) {
    EXPECT_GE(values[i], 0);
    EXPECT_LE(values[i], 100);
    EXPECT_GE(times[i], begin_micros_ - kSecond);  // the sampler may read once at its start
    EXPECT_LE(times[i], end_micros_);
    if (i > 0) {
      EXPECT_GT(times[i], times[i - 1]);
    }
  }
}

TEST_F(CliProfilerTest, TruncatedMetricsSayHowToNarrowOnStderrAndExitZero) {
  CliRun r = Cli(absl::StrCat("metrics --json --names=test.queue_depth --limit=2 ", Flags()), true);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto out = nlohmann::json::parse(r.out);
  EXPECT_EQ(out["truncated"], true);
  EXPECT_EQ(out["series"][0]["values"], nlohmann::json::array({0.5, 1.0}));
  EXPECT_NE(r.err.find("truncated"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("narrow the time range with --start/--end"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("'test.queue_depth' of worker 0, stops at 2024-05-01T12:00:01.000000Z"),
            std::string::npos)
      << r.err;
  CliRun table = Cli(absl::StrCat("metrics --names=test.queue_depth --limit=2 ", Flags()), true);
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_EQ(Rows(table.out).size(), 3u) << table.out;  // the header and two points
  EXPECT_NE(table.err.find("truncated"), std::string::npos) << table.err;
}

TEST_F(CliProfilerTest, EventsJsonHasEveryStepWithModeStepAndDuration) {
  CliRun r = Cli(absl::StrCat("events --json --kind=step ", Flags()), true);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.err, "");
  auto out = nlohmann::json::parse(r.out);
  EXPECT_EQ(out["truncated"], false);
  ASSERT_EQ(out["events"].size(), static_cast<size_t>(kSteps)) << r.out;
  for (int i = 0; i < kSteps; ++i) {
    const auto& e = out["events"][i];
    EXPECT_EQ(e["worker"], 0);
    EXPECT_EQ(e["kind"], "step");
    EXPECT_EQ(e["name"], "");
    EXPECT_EQ(e["mode"], "TRAIN");
    EXPECT_EQ(e["step"], i);
    EXPECT_EQ(e["mode_step"], i);
    EXPECT_GE(e["duration_micros"].get<int64_t>(), 15000) << "step " << i;
    EXPECT_EQ(e["duration_micros"].get<int64_t>(),
              e["end_unix_micros"].get<int64_t>() - e["start_unix_micros"].get<int64_t>());
  }
  // Kinds are case-insensitive.
  CliRun waits = Cli(absl::StrCat("events --json --kind=DATA_WAIT ", Flags()));
  ASSERT_EQ(waits.exit_code, 0) << waits.out;
  auto w = nlohmann::json::parse(waits.out)["events"];
  ASSERT_EQ(w.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(w[0]["kind"], "data_wait");
  EXPECT_EQ(w[0]["step"], -1);  // before the first step
}

TEST_F(CliProfilerTest, EventsTableFiltersByNameAndTimeRange) {
  CliRun r = Cli(absl::StrCat("events --kind=span --name=mark --start=2024-05-01T12:00:01Z "
                              "--end=2024-05-01T12:00:03Z ",
                              Flags()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(Rows(r.out),
            (std::vector<std::vector<std::string>>{
                {"START", "(UTC)", "WORKER", "KIND", "NAME", "MODE", "STEP", "MODE", "STEP",
                 "DURATION", "(ms)"},
                {"2024-05-01T12:00:01.000000Z", "0", "span", "mark", "EVAL", "101", "1",
                 "250.000"},
                {"2024-05-01T12:00:02.000000Z", "0", "span", "mark", "EVAL", "102", "2",
                 "250.000"}}))
      << r.out;
  CliRun augment = Cli(absl::StrCat("events --kind=span --name=augment ", Flags()));
  ASSERT_EQ(augment.exit_code, 0) << augment.out;
  const auto rows = Rows(augment.out);
  ASSERT_EQ(rows.size(), static_cast<size_t>(kSteps + 1)) << augment.out;
  for (int i = 1; i <= kSteps; ++i) {
    ASSERT_EQ(rows[i].size(), 8u) << augment.out;
    EXPECT_EQ(rows[i][3], "augment");
    EXPECT_EQ(rows[i][4], "TRAIN");
    EXPECT_EQ(rows[i][5], absl::StrCat(i - 1));  // recorded within step i-1
  }
}

TEST_F(CliProfilerTest, TruncatedEventsSayHowToNarrowOnStderrAndExitZero) {
  CliRun r = Cli(absl::StrCat("events --kind=step --limit=2 ", Flags()), true);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto rows = Rows(r.out);
  ASSERT_EQ(rows.size(), 3u) << r.out;  // the header and two steps
  EXPECT_EQ(rows[1][5], "0");
  EXPECT_EQ(rows[2][5], "1");
  EXPECT_NE(r.err.find("truncated: more events match than one answer holds (2 shown"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("narrow the time range with --start/--end"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("a step event of worker 0 starting at " + rows[2][0]), std::string::npos)
      << r.err;
  CliRun json = Cli(absl::StrCat("events --json --kind=step --limit=2 ", Flags()), true);
  ASSERT_EQ(json.exit_code, 0) << json.err;
  auto out = nlohmann::json::parse(json.out);
  EXPECT_EQ(out["truncated"], true);
  EXPECT_EQ(out["events"].size(), 2u);
}

TEST_F(CliProfilerTest, BadFlagsAreRefusedWithTheReason) {
  struct Case {
    std::string args;
    int exit_code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"events --kind=sleep", 1,
       "--kind: unknown event kind 'sleep': use step, data_wait, forward, backward, span or init"},
      {"metrics --start=yesterday", 1,
       "--start: time 'yesterday' is neither unix microseconds nor RFC3339 with a zone"},
      {"events --end=2024-05-01T12:00:00", 1, "--end: time '2024-05-01T12:00:00' is neither"},
      {"metrics --start=2024-05-01T12:00:02Z --end=2024-05-01T12:00:01Z", 1,
       "--end (2024-05-01T12:00:01.000000Z) must be after --start (2024-05-01T12:00:02.000000Z)"},
      {"metrics --limit=-1", 1, "--limit must be >= 0, got -1"},
      {"metrics --regex='('", 1, "regex '('"},
      {"series --tensor=loss --start=abc", 1, "--start: 'abc' is not a step"},
  };
  for (const Case& c : cases) {
    CliRun r = Cli(absl::StrCat(c.args, " ", Flags()));
    EXPECT_EQ(r.exit_code, c.exit_code) << c.args << ": " << r.out;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << c.args << ": " << r.out;
    EXPECT_NE(r.out.find("INVALID_ARGUMENT"), std::string::npos) << c.args << ": " << r.out;
  }
  const std::string collector = absl::StrCat("--collector=", collector_->address());
  CliRun no_job = Cli(absl::StrCat("metrics ", collector));
  EXPECT_EQ(no_job.exit_code, 2);
  EXPECT_NE(no_job.out.find("metrics needs --job"), std::string::npos) << no_job.out;
  CliRun unknown = Cli(absl::StrCat("events --job=nope ", collector));
  EXPECT_EQ(unknown.exit_code, 3);
  EXPECT_NE(unknown.out.find("no job named 'nope'"), std::string::npos) << unknown.out;
}

TEST_F(CliProfilerTest, HelpSaysHowTimesAreWritten) {
  CliRun r = Cli("--help");
  EXPECT_NE(r.out.find("sonde metrics --job=J [--names=a,b | --regex=R]"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("sonde events --job=J [--kind=step|data_wait|forward|backward|span|init]"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("Times T are unix microseconds (1714564800000000) or RFC3339 with a zone"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("--start (series: first step; metrics/events: first time"),
            std::string::npos)
      << r.out;
}

TEST_F(CliProfilerTest, ReportComesThroughTheQueryClient) {
  CliRun r = Cli(absl::StrCat("report ", Flags()), true);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("<html"), std::string::npos);
  EXPECT_NE(r.out.find("profiled-job"), std::string::npos);
  CliRun missing = Cli(absl::StrCat("report --job=nope --collector=", collector_->address()));
  EXPECT_EQ(missing.exit_code, 3);
  EXPECT_NE(missing.out.find("no job named 'nope'"), std::string::npos) << missing.out;
}

}  // namespace
}  // namespace sonde
