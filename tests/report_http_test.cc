// The job report over the operator endpoint, end to end: a real collector
// with --metrics_listen on port 0, a real hook streaming a profiled loop,
// and the page fetched over real TCP with libcurl (and raw sockets): the
// same HTML as Query.GetReport, the index, the 4xx answers, bearer tokens,
// and probes that keep answering while reports render.

#include <curl/curl.h>

#include <atomic>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/hook.h"
#include "client/query_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/auth.h"
#include "tests/testing/http_get.h"
#include "tests/testing/in_process_collector.h"
#include "tests/testing/profiled_loop.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace sonde {
namespace {

using ::sonde::testing::HttpGet;
using ::sonde::testing::HttpReply;
using ::sonde::testing::InProcessCollector;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kSteps = testing::kProfiledLoopSteps;
constexpr const char* kRules = testing::kProfiledLoopRules;

// The profiled loop of tests/testing/profiled_loop.h, `steps` steps of it,
// streamed as `job` (with `token`, when given).
void StreamProfiledJob(const std::string& address, const std::string& job, int steps,
                       const std::string& token = "") {
  HookOptions o = testing::ProfiledLoopOptions(address, job);
  o.security.token = token;
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  SONDE_ASSERT_OK(testing::RunProfiledLoop(**hook, steps));
  SONDE_ASSERT_OK((*hook)->Close());
}

// The report through QueryClient (Query.GetReport).
absl::StatusOr<std::string> GrpcReport(const std::string& address, const std::string& job) {
  return QueryClient::Connect(address)->GetReport(job);
}

// ------------------------------------------------------------------ curl

struct CurlReply {
  long status = 0;  // 0: no response
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  std::string error;
};

size_t AppendBody(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

size_t AppendHeader(char* data, size_t size, size_t n, void* out) {
  const std::string line(data, size * n);
  const size_t colon = line.find(':');
  if (colon != std::string::npos) {
    (*static_cast<std::map<std::string, std::string>*>(out))[absl::AsciiStrToLower(
        line.substr(0, colon))] = std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
  }
  return size * n;
}

// GET `url` with libcurl, optionally with a bearer token.
CurlReply CurlGet(const std::string& url, const std::string& token = "") {
  static const bool initialised = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
  CurlReply reply;
  if (!initialised) {
    reply.error = "curl_global_init failed";
    return reply;
  }
  CURL* curl = curl_easy_init();
  curl_slist* headers = nullptr;
  if (!token.empty()) {
    headers = curl_slist_append(headers, absl::StrCat("Authorization: Bearer ", token).c_str());
  }
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_NOPROXY, "*");
  curl_easy_setopt(curl, CURLOPT_TIMEOUT, 120L);
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, AppendBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &reply.body);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, AppendHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &reply.headers);
  const CURLcode rc = curl_easy_perform(curl);
  if (rc == CURLE_OK) {
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &reply.status);
  } else {
    reply.error = curl_easy_strerror(rc);
  }
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  return reply;
}

// The page without its "Generated <time>" line, the one part that differs
// between two renders of the same data.
std::string WithoutGeneratedLine(std::string html) {
  const size_t at = html.find("<p class=\"muted\">Generated ");
  if (at != std::string::npos) html.erase(at, html.find("</p>", at) + 4 - at);
  return html;
}

// ------------------------------------------------------------------ open

class ReportOverHttp : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    collector_ = new InProcessCollector(kRules, server::IngestLimits(),
                                        [](server::CollectorOptions& o) {
                                          o.metrics_listen = "127.0.0.1:0";
                                        });
    StreamProfiledJob(collector_->address(), "report-http", kSteps);
  }
  static void TearDownTestSuite() {
    delete collector_;
    collector_ = nullptr;
  }
  static std::string Url(const std::string& target) {
    return absl::StrCat("http://", collector_->collector().metrics_address(), target);
  }

  static InProcessCollector* collector_;
};

InProcessCollector* ReportOverHttp::collector_ = nullptr;

TEST_F(ReportOverHttp, ServesTheSamePageAsQueryGetReport) {
  CurlReply reply = CurlGet(Url("/report?job=report-http"));
  ASSERT_EQ(reply.status, 200) << reply.error << reply.body;
  EXPECT_EQ(reply.headers["content-type"], "text/html; charset=utf-8");
  EXPECT_EQ(reply.headers["cache-control"], "no-store");
  EXPECT_EQ(std::stoul(reply.headers["content-length"]), reply.body.size());
  const std::string& h = reply.body;
  EXPECT_EQ(h.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_THAT(h, HasSubstr("<span id=\"job-name\">report-http</span>"));
  EXPECT_THAT(h, HasSubstr(absl::StrCat("<td>train</td><td class=\"n\">", kSteps, "</td>")));
  EXPECT_THAT(h, HasSubstr("<svg"));
  EXPECT_THAT(h, HasSubstr(">CPU utilisation<"));
  // The rule tables: the tensor rule and the profiler rule that saw the slow step.
  const size_t tensor = h.find("id=\"tensor-rules-table\"");
  ASSERT_NE(tensor, std::string::npos);
  EXPECT_NE(h.find("<td>LossNotDecreasing</td>", tensor), std::string::npos);
  const size_t profiler = h.find("id=\"profiler-rules-table\"");
  ASSERT_NE(profiler, std::string::npos);
  EXPECT_NE(h.find("<tr class=\"hit\"><td>StepOutlier</td>", profiler), std::string::npos);

  // Byte for byte the RPC's page, but for the time it was generated. Rules
  // may still be settling after the hook closed: compare once two RPC pages
  // in a row agree around the HTTP one.
  bool compared = false;
  for (int attempt = 0; attempt < 50 && !compared; ++attempt) {
    auto before = GrpcReport(collector_->address(), "report-http");
    CurlReply page = CurlGet(Url("/report?job=report-http"));
    auto after = GrpcReport(collector_->address(), "report-http");
    SONDE_ASSERT_OK(before);
    SONDE_ASSERT_OK(after);
    ASSERT_EQ(page.status, 200);
    if (WithoutGeneratedLine(*before) != WithoutGeneratedLine(*after)) continue;
    EXPECT_EQ(WithoutGeneratedLine(page.body), WithoutGeneratedLine(*before));
    compared = true;
  }
  EXPECT_TRUE(compared) << "the RPC's page never settled";
}

TEST_F(ReportOverHttp, BadRequestsAndUnknownJobs) {
  CurlReply missing = CurlGet(Url("/report"));
  EXPECT_EQ(missing.status, 400);
  EXPECT_THAT(missing.body, HasSubstr("missing query parameter 'job'"));
  EXPECT_EQ(CurlGet(Url("/report?job=")).status, 400);
  CurlReply invalid = CurlGet(Url("/report?job=a%2Fb"));
  EXPECT_EQ(invalid.status, 400);
  EXPECT_THAT(invalid.body, HasSubstr("query parameter 'job'"));
  CurlReply malformed = CurlGet(Url("/report?job=%G0"));
  EXPECT_EQ(malformed.status, 400);
  EXPECT_THAT(malformed.body, HasSubstr("malformed percent-encoding"));
  CurlReply unknown = CurlGet(Url("/report?job=no-such-job"));
  EXPECT_EQ(unknown.status, 404);
  EXPECT_EQ(unknown.body, "no job named 'no-such-job'\n");
  // Percent-encoding of an ordinary name is the same job.
  EXPECT_EQ(CurlGet(Url("/report?job=report%2Dhttp")).status, 200);
}

TEST_F(ReportOverHttp, IndexLinksToEachReport) {
  CurlReply index = CurlGet(Url("/reports"));
  ASSERT_EQ(index.status, 200) << index.error;
  EXPECT_EQ(index.headers["content-type"], "text/html; charset=utf-8");
  const std::string link = "<a href=\"report?job=report-http\">report-http</a>";
  EXPECT_THAT(index.body, HasSubstr(link));
  // The link is relative to /reports: it resolves to /report?job=...
  CurlReply followed = CurlGet(Url("/report?job=report-http"));
  EXPECT_EQ(followed.status, 200);
  EXPECT_THAT(followed.body, HasSubstr("<span id=\"job-name\">report-http</span>"));
}

TEST_F(ReportOverHttp, ProbesAnswerWhileReportsRender) {
  // Reports fetched back to back on three threads keep the single render
  // thread busy and its queue full; probes on the poll thread must answer
  // all along. (The strict ordering, a probe answered while a render is
  // known to be blocked, is server/operator_views_test's and
  // common/http/http_server_test's; here it is the real collector.)
  const std::string http = collector_->collector().metrics_address();
  std::atomic<bool> done{false};
  std::atomic<int> in_flight{0}, pages{0}, busy{0}, other{0};
  std::vector<std::thread> fetchers;
  for (int t = 0; t < 3; ++t) {
    fetchers.emplace_back([&] {
      while (!done.load()) {
        in_flight.fetch_add(1);
        HttpReply r = HttpGet(http, "/report?job=report-http");
        in_flight.fetch_sub(1);
        if (r.status == 200) {
          pages.fetch_add(1);
        } else if (r.status == 503) {
          busy.fetch_add(1);
        } else {
          other.fetch_add(1);
        }
      }
    });
  }
  int probes = 0, overlapping = 0;
  for (int i = 0; i < 200; ++i) {
    const bool rendering = in_flight.load() > 0;
    HttpReply healthz = HttpGet(http, "/healthz");
    HttpReply readyz = HttpGet(http, "/readyz");
    EXPECT_EQ(healthz.status, 200);
    EXPECT_EQ(readyz.status, 200);
    ++probes;
    if (rendering && in_flight.load() > 0) ++overlapping;
  }
  done = true;
  for (auto& t : fetchers) t.join();
  EXPECT_EQ(probes, 200);
  EXPECT_GT(pages.load(), 0);
  EXPECT_EQ(other.load(), 0);
  // For the record in the test log: how many probes ran beside a report.
  std::cout << "probes " << probes << ", beside a report " << overlapping << "; pages "
            << pages.load() << ", 503 busy " << busy.load() << "\n";
}

// ------------------------------------------------------------------ tokens

TEST(ReportOverHttpWithTokens, NeedsABearerTokenWithTheReadRight) {
  constexpr char kAWrite[] = "tok-a-write-0123456789";
  constexpr char kARead[] = "tok-a-read-0123456789";
  constexpr char kBRead[] = "tok-b-read-0123456789";
  testing::TempDir dir;
  {
    auto entry = [](const char* name, const char* token, const char* project,
                    const char* right) {
      return absl::StrCat("{\"name\": \"", name, "\", \"sha256\": \"", server::Sha256Hex(token),
                          "\", \"project\": \"", project, "\", \"rights\": [\"", right, "\"]}");
    };
    std::ofstream tokens(dir.Sub("tokens.json"));
    tokens << "{\"tokens\": [" << entry("a-write", kAWrite, "teamA-", "write") << ", "
           << entry("a-read", kARead, "teamA-", "read") << ", "
           << entry("b-read", kBRead, "teamB-", "read") << "]}";
  }
  InProcessCollector collector("", server::IngestLimits(), [&](server::CollectorOptions& o) {
    o.metrics_listen = "127.0.0.1:0";
    o.security.auth_tokens_file = dir.Sub("tokens.json");
  });
  StreamProfiledJob(collector.address(), "teamA-run", 5, kAWrite);
  const std::string base = absl::StrCat("http://", collector.collector().metrics_address());

  CurlReply anonymous = CurlGet(base + "/report?job=teamA-run");
  EXPECT_EQ(anonymous.status, 401);
  EXPECT_EQ(anonymous.headers["www-authenticate"], "Bearer realm=\"sonde\"");
  CurlReply unknown = CurlGet(base + "/report?job=teamA-run", "tok-unknown");
  EXPECT_EQ(unknown.status, 401);
  EXPECT_THAT(unknown.headers["www-authenticate"], HasSubstr("error=\"invalid_token\""));
  EXPECT_THAT(unknown.body, Not(HasSubstr("tok-unknown")));
  EXPECT_EQ(CurlGet(base + "/reports").status, 401);

  CurlReply other_team = CurlGet(base + "/report?job=teamA-run", kBRead);
  EXPECT_EQ(other_team.status, 403);
  EXPECT_THAT(other_team.body, HasSubstr("token 'b-read' has no read right on job 'teamA-run'"));
  CurlReply write_only = CurlGet(base + "/report?job=teamA-run", kAWrite);
  EXPECT_EQ(write_only.status, 403);
  EXPECT_EQ(CurlGet(base + "/report", kARead).status, 400);
  EXPECT_EQ(CurlGet(base + "/report?job=teamA-nope", kARead).status, 404);
  EXPECT_EQ(CurlGet(base + "/report?job=teamB-nope", kARead).status, 403);

  CurlReply page = CurlGet(base + "/report?job=teamA-run", kARead);
  ASSERT_EQ(page.status, 200) << page.body;
  EXPECT_THAT(page.body, HasSubstr("<span id=\"job-name\">teamA-run</span>"));
  EXPECT_THAT(page.body, HasSubstr("<svg"));

  EXPECT_THAT(CurlGet(base + "/reports", kARead).body,
              HasSubstr("<a href=\"report?job=teamA-run\">teamA-run</a>"));
  CurlReply b_index = CurlGet(base + "/reports", kBRead);
  EXPECT_EQ(b_index.status, 200);
  EXPECT_THAT(b_index.body, Not(HasSubstr("teamA-run")));
  EXPECT_THAT(b_index.body, HasSubstr("No jobs that this token may read."));
  // Probes and metrics stay open, as before.
  EXPECT_EQ(CurlGet(base + "/healthz").status, 200);
  EXPECT_EQ(CurlGet(base + "/metrics").status, 200);
}

}  // namespace
}  // namespace sonde
