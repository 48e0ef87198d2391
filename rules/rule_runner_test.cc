#include "rules/rule_runner.h"

#include <limits>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/statistics.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace sonde::rules {
namespace {

using ::sonde::testing::StatusIs;

// Records what the runner reports; the collector's sink persists instead.
class RecordingSink : public RuleSink {
 public:
  void OnResult(const v1::RuleResult& r) override {
    absl::MutexLock lock(&mu_);
    results.push_back(r);
  }
  void OnAction(const v1::Action& a) override {
    absl::MutexLock lock(&mu_);
    actions.push_back(a);
  }
  absl::Mutex mu_;
  std::vector<v1::RuleResult> results;
  std::vector<v1::Action> actions;
};

v1::TensorRecord Tensor(const std::string& name, float value, const std::string& coll) {
  v1::TensorRecord r;
  r.set_tensor_name(name);
  r.add_collections(coll);
  *r.mutable_statistics() = *ComputeStatistics(
      std::string(reinterpret_cast<const char*>(&value), 4), v1::DTYPE_F32);
  return r;
}

StepData Step(int64_t s, float w, float loss) {
  StepData d;
  d.step = s;
  d.mode = v1::MODE_TRAIN;
  d.mode_step = s;
  d.tensors = {Tensor("w", w, "weights"), Tensor("loss", loss, "losses")};
  return d;
}

std::vector<v1::RuleSpec> Specs() {
  v1::RuleSpec exploding;
  exploding.set_rule_type("ExplodingTensor");
  exploding.add_actions("StopTraining");
  v1::RuleSpec loss;
  loss.set_rule_type("LossNotDecreasing");
  return {exploding, loss};
}

TEST(RuleRunner, IssueFoundAtFirstBadStepTriggersStopOnce) {
  ThreadPool pool(2, 16);
  RecordingSink sink;
  auto runner = RuleRunner::Create("job", Specs(), {}, &pool, &sink);
  SONDE_ASSERT_OK(runner);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int s = 0; s < 8; ++s) (*runner)->SubmitStep(Step(s, s < 3 ? 1.0f : nan, 10.0f - s));
  (*runner)->SubmitJobEnd();
  (*runner)->Drain();
  auto results = (*runner)->Results();
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].rule(), "ExplodingTensor");
  EXPECT_EQ(results[0].status(), v1::RULE_STATUS_ISSUES_FOUND);
  EXPECT_EQ(results[0].step(), 3);
  EXPECT_EQ(results[0].steps_evaluated(), 4);  // stops evaluating once it fired
  EXPECT_EQ(results[0].actions_taken_size(), 1);
  EXPECT_EQ(results[1].status(), v1::RULE_STATUS_NO_ISSUES_FOUND);
  absl::MutexLock lock(&sink.mu_);
  ASSERT_EQ(sink.actions.size(), 1u);
  EXPECT_EQ(sink.actions[0].type(), v1::ACTION_STOP_TRAINING);
  EXPECT_EQ(sink.actions[0].rule(), "ExplodingTensor");
  EXPECT_EQ(sink.actions[0].step(), 3);
}

TEST(RuleRunner, HealthyJobEndsNoIssuesFound) {
  ThreadPool pool(1, 4);
  RecordingSink sink;
  auto runner = RuleRunner::Create("job", Specs(), {}, &pool, &sink);
  SONDE_ASSERT_OK(runner);
  for (int s = 0; s < 40; ++s) (*runner)->SubmitStep(Step(s, 1.0f, 100.0f / (s + 1)));
  (*runner)->SubmitJobEnd();
  (*runner)->Drain();
  for (const auto& r : (*runner)->Results()) {
    EXPECT_EQ(r.status(), v1::RULE_STATUS_NO_ISSUES_FOUND) << r.rule();
    EXPECT_EQ(r.steps_evaluated(), 40);
  }
  absl::MutexLock lock(&sink.mu_);
  EXPECT_TRUE(sink.actions.empty());
  EXPECT_EQ(sink.results.back().status(), v1::RULE_STATUS_NO_ISSUES_FOUND);
}

TEST(RuleRunner, FinalResultsFromAnEarlierRunAreKeptAndNotReFired) {
  ThreadPool pool(1, 4);
  RecordingSink sink;
  v1::RuleResult previous;
  previous.set_rule("ExplodingTensor");
  previous.set_status(v1::RULE_STATUS_ISSUES_FOUND);
  previous.set_step(3);
  auto runner = RuleRunner::Create("job", Specs(), {previous}, &pool, &sink);
  SONDE_ASSERT_OK(runner);
  (*runner)->SubmitStep(Step(9, std::numeric_limits<float>::infinity(), 1));
  (*runner)->Drain();
  EXPECT_EQ((*runner)->Results()[0].step(), 3);
  absl::MutexLock lock(&sink.mu_);
  EXPECT_TRUE(sink.actions.empty());
}

TEST(RuleRunner, RejectsDuplicateNamesAndBadSpecs) {
  ThreadPool pool(1, 4);
  RecordingSink sink;
  auto specs = Specs();
  specs.push_back(specs[0]);
  EXPECT_THAT(RuleRunner::Create("job", specs, {}, &pool, &sink),
              StatusIs(absl::StatusCode::kInvalidArgument, "two rules are named"));
  v1::RuleSpec bad;
  bad.set_rule_type("LossNotDecreasing");
  (*bad.mutable_parameters())["num_steps"] = "ten";
  EXPECT_THAT(RuleRunner::Create("job", {bad}, {}, &pool, &sink),
              StatusIs(absl::StatusCode::kInvalidArgument, "num_steps='ten'"));
}

}  // namespace
}  // namespace sonde::rules
