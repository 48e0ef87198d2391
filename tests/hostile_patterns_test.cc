// Hostile patterns on every path that takes one (issue 16): a deeply nested
// pattern (which overflowed std::regex's stack and crashed the collector)
// and a backtracking one over a long name (which kept a core busy after its
// client gave up). Each is answered with a status, and the collector still
// answers right after.
#include <string>
#include <vector>

#include "client/hook.h"
#include "client/query_client.h"
#include "gtest/gtest.h"
#include "tests/testing/in_process_collector.h"
#include "tests/testing/status_matchers.h"

namespace sonde {
namespace {

using ::sonde::testing::InProcessCollector;
using ::sonde::testing::StatusIs;

std::string Nested(int depth) {
  return std::string(depth, '(') + "t" + std::string(depth, ')');
}

// A short deadline: a pattern that made the collector spin would miss it.
void StillAnswers(const std::string& address) {
  auto q = QueryClient::Connect(address, absl::Seconds(2));
  auto jobs = q->ListJobs();
  SONDE_EXPECT_OK(jobs);
}

class HostilePatternsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A job with a 1,024-character tensor name, as in the report.
    HookOptions o;
    o.collector = collector_.address();
    o.job = "victim";
    o.config.save_config = SaveConfig::Every(1);
    o.config.include_collections = {"weights"};
    auto hook = Hook::Create(o);
    SONDE_ASSERT_OK(hook);
    std::vector<float> v(4, 1.0f);
    (*hook)->StartStep();
    SONDE_ASSERT_OK((*hook)->SaveTensor(std::string(1024 - 6, 't') + "weight",
                                        HostTensor(v.data(), {4}), {"weights"}));
    SONDE_ASSERT_OK((*hook)->Close());
  }

  const std::vector<std::string> patterns_ = {Nested(40000), Nested(2000), "(t*)*x",
                                              "^(?!gradient).*weight"};
  InProcessCollector collector_;
};

TEST_F(HostilePatternsTest, ListTensorsAndReadMetricsAnswerEveryPattern) {
  auto q = QueryClient::Connect(collector_.address(), absl::Seconds(5));
  for (const std::string& p : patterns_) {
    SCOPED_TRACE(p.substr(0, 40));
    auto tensors = q->ListTensors("victim", "", p);
    if (tensors.ok()) {
      // The nested pattern is a "t" and finds the name; the backtracking one
      // does not match (no "x"), and is answered at once.
      EXPECT_EQ(tensors->size(), p == "(t*)*x" ? 0u : 1u);
    } else {
      EXPECT_EQ(tensors.status().code(), absl::StatusCode::kInvalidArgument) << tensors.status();
    }
    auto metrics = q->ReadMetrics("victim", {}, p);
    if (!metrics.ok()) {
      EXPECT_EQ(metrics.status().code(), absl::StatusCode::kInvalidArgument) << metrics.status();
    }
    StillAnswers(collector_.address());
  }
  // The 80 KB pattern is refused for its length, the lookahead for RE2's syntax.
  EXPECT_THAT(q->ListTensors("victim", "", Nested(40000)),
              StatusIs(absl::StatusCode::kInvalidArgument, "at most 4096"));
  EXPECT_THAT(q->ListTensors("victim", "", "^(?!gradient).*weight"),
              StatusIs(absl::StatusCode::kInvalidArgument, "RE2"));
  // A good pattern still finds the name.
  auto found = q->ListTensors("victim", "", "t{1000}weight$");
  SONDE_ASSERT_OK(found);
  EXPECT_EQ(found->size(), 1u);
}

TEST_F(HostilePatternsTest, RulesInEnableRulesAndInTheHelloAreRefusedWithTheReason) {
  auto q = QueryClient::Connect(collector_.address(), absl::Seconds(5));
  for (const std::string& p : {Nested(40000), std::string("^(?!x)")}) {
    v1::RuleSpec rule;
    rule.set_rule_type("AllZero");
    (*rule.mutable_parameters())["tensor_regex"] = p;
    EXPECT_THAT(q->EnableRules("planned", {rule}),
                StatusIs(absl::StatusCode::kInvalidArgument, "tensor_regex"));
    StillAnswers(collector_.address());

    // The same rule in a hook's hello: the job is refused, training goes on.
    HookOptions o;
    o.collector = collector_.address();
    o.job = "hello-rule";
    o.rules = {rule};
    o.close_timeout = absl::Seconds(10);
    auto hook = Hook::Create(o);
    SONDE_ASSERT_OK(hook);
    (*hook)->StartStep();
    (*hook)->SaveScalar("loss", 1.0).IgnoreError();
    EXPECT_FALSE((*hook)->Close().ok());
    StillAnswers(collector_.address());
  }
  // A backtracking pattern is a fine rule: it matches in linear time.
  v1::RuleSpec ok;
  ok.set_rule_type("AllZero");
  (*ok.mutable_parameters())["tensor_regex"] = "(t*)*x";
  SONDE_EXPECT_OK(q->EnableRules("planned", {ok}));
}

TEST_F(HostilePatternsTest, AClientsIncludeRegexIsCheckedBeforeTrainingStarts) {
  HookOptions o;
  o.collector = collector_.address();
  o.job = "client-side";
  o.config.include_regex = {Nested(40000)};
  EXPECT_THAT(Hook::Create(o), StatusIs(absl::StatusCode::kInvalidArgument, "include_regex"));
  o.config.include_regex = {"(t*)*x"};
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  EXPECT_FALSE((*hook)->ShouldSave(std::string(1024, 't')));
  SONDE_EXPECT_OK((*hook)->Close());
}

}  // namespace
}  // namespace sonde
