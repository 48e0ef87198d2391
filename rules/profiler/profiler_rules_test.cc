// Each profiler rule through a real RuleRunner: a recorded series that shows
// the rule's problem fires with the numbers seen, a healthy one stays quiet
// and ends NoIssuesFound. This machine has no GPU: every GPU series here is
// a synthetic recording (shaped like nvidia-smi's utilisation of a real
// stalled or healthy job), and says so.
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "rules/builtin_rules.h"
#include "rules/rule_config.h"
#include "rules/rule_runner.h"
#include "tests/testing/status_matchers.h"

namespace sonde::rules {
namespace {

using ::sonde::testing::StatusIs;
using ::testing::HasSubstr;

class RecordingSink : public RuleSink {
 public:
  void OnResult(const v1::RuleResult& r) override { (void)r; }
  void OnAction(const v1::Action& a) override {
    absl::MutexLock lock(&mu);
    actions.push_back(a);
  }
  absl::Mutex mu;
  std::vector<v1::Action> actions ABSL_GUARDED_BY(mu);
};

constexpr int64_t kStart = 1700000000000000;  // unix micros of the recordings

struct Judged {
  v1::RuleResult result;
  std::vector<v1::Action> actions;
};

// Runs the rule of `flag` (--rules syntax) over `batches` (worker, batch),
// then the end of training, and returns its verdict.
Judged Judge(const std::string& flag, const std::vector<std::pair<int32_t, v1::ProfileBatch>>& batches) {
  static const std::unique_ptr<RuleFactory> factory = RuleFactory::WithBuiltins();
  auto specs = ParseRuleFlag(flag);
  EXPECT_TRUE(specs.ok()) << specs.status();
  ThreadPool pool(2, 64);
  RecordingSink sink;
  auto runner = RuleRunner::Create("job", *specs, {}, *factory, &pool, &sink);
  EXPECT_TRUE(runner.ok()) << runner.status();
  if (!runner.ok()) return {};
  for (const auto& [worker, batch] : batches) (*runner)->SubmitProfile(worker, batch);
  (*runner)->SubmitJobEnd();
  (*runner)->Drain();
  Judged out;
  out.result = (*runner)->Results().at(0);
  absl::MutexLock lock(&sink.mu);
  out.actions = sink.actions;
  return out;
}

// A deterministic jitter in [-1, 1].
double Jitter(int i) { return std::sin(i * 12.9898) ; }

v1::TraceEvent StepEvent(int64_t step, int64_t start, int64_t micros, v1::Mode mode = v1::MODE_TRAIN) {
  v1::TraceEvent e;
  e.set_kind(v1::TraceEvent::KIND_STEP);
  e.set_mode(mode);
  e.set_step(step);
  e.set_mode_step(step);
  e.set_start_unix_micros(start);
  e.set_end_unix_micros(start + micros);
  return e;
}

// Step events of `n` steps of about `ms` ms (+-10%), sent in batches of 20;
// steps in `slow` take 10x longer.
std::vector<std::pair<int32_t, v1::ProfileBatch>> StepRecording(int n, double ms,
                                                                 const std::set<int>& slow) {
  std::vector<std::pair<int32_t, v1::ProfileBatch>> out;
  int64_t t = kStart;
  for (int s = 0; s < n; ++s) {
    if (s % 20 == 0) out.emplace_back(0, v1::ProfileBatch());
    double d = ms * (1 + 0.1 * Jitter(s));
    if (slow.count(s) > 0) d *= 10;
    const int64_t micros = static_cast<int64_t>(d * 1000);
    *out.back().second.add_events() = StepEvent(s, t, micros);
    t += micros;
  }
  return out;
}

TEST(StepOutlier, FiresWhenMoreThanNOutliersStepsTakeTenTimesLonger) {
  std::set<int> slow;
  for (int s = 105; s < 160; s += 5) slow.insert(s);  // 11 slow steps: 105 ... 155
  Judged j = Judge("StepOutlier(actions=StopTraining)", StepRecording(200, 20, slow));
  EXPECT_EQ(j.result.status(), v1::RULE_STATUS_ISSUES_FOUND) << j.result.message();
  EXPECT_EQ(j.result.observed(), 11);
  EXPECT_EQ(j.result.threshold(), 10);
  EXPECT_THAT(j.result.message(), HasSubstr("worker 0, TRAIN steps: 11 of the last 160"));
  EXPECT_THAT(j.result.message(), HasSubstr("outlier steps 105, 110, 115"));
  EXPECT_EQ(j.result.datapoints(), 160);  // judged on the batch that held the 11th
  ASSERT_EQ(j.actions.size(), 1u);
  EXPECT_EQ(j.actions[0].type(), v1::ACTION_STOP_TRAINING);
}

TEST(StepOutlier, TenOutliersAreToleratedAndSteadyStepsStayQuiet) {
  std::set<int> slow;
  for (int s = 105; s < 155; s += 5) slow.insert(s);  // 10: not more than n_outliers
  Judged j = Judge("StepOutlier", StepRecording(300, 20, slow));
  EXPECT_EQ(j.result.status(), v1::RULE_STATUS_NO_ISSUES_FOUND) << j.result.message();
  EXPECT_EQ(j.result.datapoints(), 300);
  EXPECT_EQ(Judge("StepOutlier", StepRecording(300, 20, {})).result.status(),
            v1::RULE_STATUS_NO_ISSUES_FOUND);
}

TEST(StepOutlier, JudgesNothingBeforeMoreThan100StepsAndOnlyItsMode) {
  // 30 slow steps among 100: too few steps to judge.
  std::set<int> slow;
  for (int s = 0; s < 100; s += 3) slow.insert(s);
  EXPECT_EQ(Judge("StepOutlier(n_outliers=0)", StepRecording(100, 20, slow)).result.status(),
            v1::RULE_STATUS_NO_ISSUES_FOUND);
  slow = {150};
  EXPECT_EQ(Judge("StepOutlier(n_outliers=0)", StepRecording(200, 20, slow)).result.status(),
            v1::RULE_STATUS_ISSUES_FOUND);
  EXPECT_EQ(Judge("StepOutlier(n_outliers=0,mode=EVAL)", StepRecording(200, 20, slow))
                .result.status(),
            v1::RULE_STATUS_NO_ISSUES_FOUND);
}

TEST(ProfilerRules, BadParametersNameTheRuleAndTheParameter) {
  auto factory = RuleFactory::WithBuiltins();
  auto specs = ParseRuleFlag("StepOutlier(mode=SIDEWAYS)");
  ASSERT_TRUE(specs.ok());
  EXPECT_THAT(factory->Create((*specs)[0]),
              StatusIs(absl::StatusCode::kInvalidArgument, "StepOutlier"));
  specs = ParseRuleFlag("StepOutlier(stddev=-1)");
  EXPECT_THAT(factory->Create((*specs)[0]),
              StatusIs(absl::StatusCode::kInvalidArgument, "stddev"));
  specs = ParseRuleFlag("StepOutlier(scan_interval_us=0)");
  EXPECT_THAT(factory->Create((*specs)[0]),
              StatusIs(absl::StatusCode::kInvalidArgument, "scan_interval_us"));
}

}  // namespace
}  // namespace sonde::rules
