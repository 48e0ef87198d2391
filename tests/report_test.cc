// The job report end to end: a real hook streams real system metrics, step
// and data-wait events of a loop (plus a synthetic GPU series: this machine
// has no GPU), real rules judge its loss and its step times, and the report
// comes back
// through Query.GetReport, the `sonde report` CLI, and a real browser
// (Debian's chromium, headless) that must render its tables and charts.

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/hook.h"
#include "client/query_client.h"
#include "common/channel.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/auth.h"
#include "tests/testing/in_process_collector.h"
#include "tests/testing/profiled_loop.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace sonde {
namespace {

using ::sonde::testing::InProcessCollector;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kSteps = testing::kProfiledLoopSteps;
constexpr int kSlowStep = testing::kProfiledLoopSlowStep;
constexpr const char* kRules = testing::kProfiledLoopRules;

// Streams the profiled loop (tests/testing/profiled_loop.h: 110 train steps
// of ~5 ms after a 2 ms data wait each, step 7 taking ~200 ms, a decreasing
// loss) and GPU readings every 100 ms over the run (synthetic: no GPU here).
void StreamProfiledJob(const std::string& address, const std::string& job) {
  auto hook = Hook::Create(testing::ProfiledLoopOptions(address, job));
  SONDE_ASSERT_OK(hook);
  const int64_t begin = absl::ToUnixMicros(absl::Now());
  SONDE_ASSERT_OK(testing::RunProfiledLoop(**hook, kSteps));
  const int64_t end = absl::ToUnixMicros(absl::Now());
  v1::ProfileBatch gpu;
  for (int64_t t = begin, i = 0; t < end; t += 100000, ++i) {
    v1::MetricSnapshot* snap = gpu.add_snapshots();
    snap->set_unix_micros(t);
    v1::MetricSample* util = snap->add_samples();
    util->set_name("gpu.0.util_percent");
    util->set_value(60 + 30 * std::sin(i / 3.0));
    v1::MetricSample* mem = snap->add_samples();
    mem->set_name("gpu.0.memory_used_bytes");
    mem->set_value(2e9 + i * 1e7);
  }
  EXPECT_TRUE((*hook)->SaveProfile(gpu));
  SONDE_ASSERT_OK((*hook)->Close());
}

// The report through QueryClient (Query.GetReport), with `token` when given.
absl::StatusOr<std::string> GetReport(const std::string& address, const std::string& job,
                                      const std::string& token = "") {
  ChannelSecurity security;
  security.token = token;
  auto query = QueryClient::Connect(address, security);
  if (!query.ok()) return query.status();
  return (*query)->GetReport(job);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs `command` through the shell; its stdout, and the exit status.
std::pair<int, std::string> RunShell(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, ""};
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// Where files a person should look at go: Bazel's undeclared outputs (kept
// in bazel-testlogs/.../test.outputs/outputs.zip), else the temp dir.
std::string OutputDir() {
  const char* d = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  if (d != nullptr) return d;
  return std::getenv("TEST_TMPDIR") != nullptr ? std::getenv("TEST_TMPDIR") : "/tmp";
}

TEST(JobReport, RealProfiledJobThroughTheRpcAndTheCli) {
  InProcessCollector collector(kRules);
  StreamProfiledJob(collector.address(), "report-e2e");
  auto html = GetReport(collector.address(), "report-e2e");
  SONDE_ASSERT_OK(html);
  const std::string& h = *html;
  EXPECT_THAT(h, HasSubstr("<span id=\"job-name\">report-e2e</span>"));
  EXPECT_THAT(h, HasSubstr(absl::StrCat(kSteps, " from profiler step events")));
  // Step statistics of the 12 train steps, and the slow one first among
  // the outliers, many times the median.
  EXPECT_THAT(h, HasSubstr(absl::StrCat("<td>train</td><td class=\"n\">", kSteps, "</td>")));
  EXPECT_THAT(h, HasSubstr(absl::StrCat("id=\"outlier-table\"><thead>")));
  const size_t outliers = h.find("id=\"outlier-table\"");
  EXPECT_EQ(h.find(absl::StrCat("<tbody><tr><td class=\"n\">", kSlowStep, "</td><td>train</td>"),
                   outliers),
            h.find("<tbody>", outliers))
      << "step " << kSlowStep << " is the slowest";
  // Data waits, real system metrics from /proc, the synthetic GPU.
  EXPECT_THAT(h, HasSubstr("id=\"wait-table\""));
  EXPECT_THAT(h, HasSubstr(">CPU utilisation<"));
  EXPECT_THAT(h, HasSubstr(">GPU utilisation<"));
  EXPECT_THAT(h, HasSubstr(">Memory<"));
  EXPECT_THAT(h, HasSubstr("w0 cpu.util_percent"));
  EXPECT_THAT(h, HasSubstr("w0 gpu.0.util_percent"));
  EXPECT_THAT(h, HasSubstr("<td>process.rss_bytes</td>"));
  // The tensor rule the collector ran, described from the catalogue.
  const size_t tensor = h.find("id=\"tensor-rules-table\"");
  ASSERT_NE(tensor, std::string::npos);
  EXPECT_NE(h.find("<td>LossNotDecreasing</td>", tensor), std::string::npos);
  EXPECT_THAT(h, Not(HasSubstr("not in the catalogue")));
  // StepOutlier saw the slow step: first in the profiler table, with the
  // times it triggered (it kept judging after the slow step: every later
  // batch still held the outlier), the data points it judged and its
  // parameters.
  const size_t profiler = h.find("id=\"profiler-rules-table\"");
  ASSERT_NE(profiler, std::string::npos);
  const size_t row = h.find("<tr class=\"hit\"><td>StepOutlier</td>", profiler);
  ASSERT_LT(row, tensor) << h.substr(profiler, tensor - profiler);
  const std::string cells = h.substr(row, h.find("</tr>", row) - row);
  int64_t triggered = 0;
  auto results = QueryClient::Connect(collector.address())->RuleResults("report-e2e");
  SONDE_ASSERT_OK(results);
  for (const v1::RuleResult& r : *results) {
    if (r.rule() == "StepOutlier") triggered = r.times_triggered();
  }
  EXPECT_GE(triggered, 1);
  EXPECT_THAT(cells, HasSubstr(absl::StrCat("<td class=\"n\">", triggered, "</td>")));
  EXPECT_THAT(cells, HasSubstr("<b>n_outliers=0</b>"));
  EXPECT_THAT(cells, HasSubstr("stddev=3"));
  EXPECT_THAT(cells, HasSubstr("issues found"));

  // The CLI writes the same report to a file.
  const std::string out = absl::StrCat(OutputDir(), "/report-e2e.html");
  auto [rc, printed] = RunShell(absl::StrCat("client/sonde report --collector=", collector.address(),
                                        " --job=report-e2e --out=", out, " 2>&1"));
  ASSERT_EQ(rc, 0) << printed;
  EXPECT_THAT(printed, HasSubstr("wrote the report of job 'report-e2e'"));
  const std::string file = ReadFile(out);
  EXPECT_EQ(file.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_THAT(file, HasSubstr(absl::StrCat("<td>train</td><td class=\"n\">", kSteps, "</td>")));
  // An unknown job is exit code 3, as for every other command.
  EXPECT_EQ(RunShell(absl::StrCat("client/sonde report --collector=", collector.address(),
                             " --job=nope --out=", out, ".2 2>/dev/null"))
                .first,
            3);
  EXPECT_THAT(GetReport(collector.address(), "nope").status(),
              testing::StatusIs(absl::StatusCode::kNotFound, ""));
  EXPECT_THAT(GetReport(collector.address(), "").status(),
              testing::StatusIs(absl::StatusCode::kInvalidArgument, "no job given"));
}

TEST(JobReport, NeedsTheReadRightOnTheJob) {
  constexpr char kRead[] = "tok-a-read-0123456789";
  testing::TempDir dir;
  {
    std::ofstream tokens(dir.Sub("tokens.json"));
    tokens << "{\"tokens\": [{\"name\": \"a-read\", \"sha256\": \"" << server::Sha256Hex(kRead)
           << "\", \"project\": \"teamA-\", \"rights\": [\"read\"]}]}";
  }
  InProcessCollector collector("", server::IngestLimits(), [&](server::CollectorOptions& o) {
    o.security.auth_tokens_file = dir.Sub("tokens.json");
  });
  EXPECT_THAT(GetReport(collector.address(), "teamA-run").status(),
              testing::StatusIs(absl::StatusCode::kUnauthenticated, ""));
  EXPECT_THAT(GetReport(collector.address(), "teamB-run", kRead).status(),
              testing::StatusIs(absl::StatusCode::kPermissionDenied, "no read right"));
  // Past the check: the job simply does not exist.
  EXPECT_THAT(GetReport(collector.address(), "teamA-run", kRead).status(),
              testing::StatusIs(absl::StatusCode::kNotFound, ""));
}

// ---------------------------------------------------------------- browser

std::string FindChromium() {
  for (const char* p : {"/usr/bin/chromium", "/usr/bin/chromium-browser"}) {
    if (access(p, X_OK) == 0) return p;
  }
  return "";
}

TEST(JobReportInBrowser, ChromiumRendersTheTablesAndCharts) {
  const std::string chromium = FindChromium();
  if (chromium.empty()) {
    GTEST_SKIP() << "SKIPPED: chromium is not installed (deploy/install-deps.sh installs it)";
  }
  InProcessCollector collector(kRules);
  StreamProfiledJob(collector.address(), "report-browser");
  auto html = GetReport(collector.address(), "report-browser");
  SONDE_ASSERT_OK(html);
  const std::string dir = OutputDir();
  const std::string page = absl::StrCat(dir, "/report-browser.html");
  std::ofstream(page, std::ios::binary) << *html;

  // Chromium wants a writable HOME and profile; /dev/shm may be missing in
  // a sandbox; its own sandbox needs namespaces a test cannot have.
  testing::TempDir tmp;
  const std::string flags = absl::StrCat(
      "HOME=", tmp.path(), " timeout 120 ", chromium,
      " --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run"
      " --no-default-browser-check --user-data-dir=", tmp.Sub("profile"));
  auto [rc, dom] = RunShell(absl::StrCat(flags, " --dump-dom file://", page, " 2>", tmp.Sub("err")));
  ASSERT_EQ(rc, 0) << "chromium failed: " << ReadFile(tmp.Sub("err"));
  // The DOM as the browser built it: the tables parsed into rows, the
  // charts into SVG elements with their paths.
  EXPECT_THAT(dom, HasSubstr("<span id=\"job-name\">report-browser</span>"));
  EXPECT_THAT(dom, HasSubstr("<td>LossNotDecreasing</td>"));
  EXPECT_THAT(dom, HasSubstr("<tr class=\"hit\"><td>StepOutlier</td>"));
  EXPECT_THAT(dom, HasSubstr(absl::StrCat("<td>train</td><td class=\"n\">", kSteps, "</td>")));
  EXPECT_THAT(dom, HasSubstr(absl::StrCat("<tbody><tr><td class=\"n\">", kSlowStep,
                                          "</td><td>train</td>")));
  EXPECT_THAT(dom, HasSubstr("<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\""));
  EXPECT_THAT(dom, HasSubstr("<path class=\"line\""));
  EXPECT_THAT(dom, HasSubstr("<rect class=\"bar\""));
  EXPECT_THAT(dom, HasSubstr("<title>w0 gpu.0.util_percent</title>"));

  // A screenshot, as a person would see the page: a real PNG of the window.
  const std::string png = absl::StrCat(dir, "/report-browser.png");
  auto [src, shot] = RunShell(absl::StrCat(flags, " --hide-scrollbars --window-size=1280,2000",
                                      " --screenshot=", png, " file://", page, " 2>&1"));
  ASSERT_EQ(src, 0) << shot;
  const std::string bytes = ReadFile(png);
  ASSERT_GT(bytes.size(), 24u);
  EXPECT_EQ(bytes.substr(1, 3), "PNG");
  auto be32 = [&](size_t at) {
    return (uint32_t(uint8_t(bytes[at])) << 24) | (uint32_t(uint8_t(bytes[at + 1])) << 16) |
           (uint32_t(uint8_t(bytes[at + 2])) << 8) | uint32_t(uint8_t(bytes[at + 3]));
  };
  EXPECT_EQ(be32(16), 1280u);  // IHDR width
  EXPECT_EQ(be32(20), 2000u);  // and height
  // A blank page compresses to a few KB; text, tables and charts do not.
  EXPECT_GT(bytes.size(), 40u << 10);
  EXPECT_LT(bytes.size(), 10u << 20);
}

}  // namespace
}  // namespace sonde
