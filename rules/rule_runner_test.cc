#include "rules/rule_runner.h"

#include "rules/builtin_rules.h"

#include <limits>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "stats/statistics.h"
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

const std::unique_ptr<RuleFactory> factory_ = BuiltinRuleFactory();

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
  auto runner = RuleRunner::Create("job", Specs(), {}, *factory_, &pool, &sink);
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
  // Had the job ended because of that stop, the other rule would say so.
  ThreadPool pool2(1, 4);
  RecordingSink sink2;
  auto again = RuleRunner::Create("job", Specs(), {}, *factory_, &pool2, &sink2);
  SONDE_ASSERT_OK(again);
  (*again)->SubmitStep(Step(0, 1.0f, 1.0f));
  v1::Action stop;
  stop.set_rule("ExplodingTensor");
  stop.set_step(3);
  (*again)->SubmitJobEnd(stop);
  (*again)->Drain();
  EXPECT_EQ((*again)->Results()[1].status(), v1::RULE_STATUS_STOPPED);
  EXPECT_NE((*again)->Results()[1].message().find("stopped by rule ExplodingTensor at step 3"),
            std::string::npos);
  absl::MutexLock lock(&sink.mu_);
  ASSERT_EQ(sink.actions.size(), 1u);
  EXPECT_EQ(sink.actions[0].type(), v1::ACTION_STOP_TRAINING);
  EXPECT_EQ(sink.actions[0].rule(), "ExplodingTensor");
  EXPECT_EQ(sink.actions[0].step(), 3);
}

TEST(RuleRunner, HealthyJobEndsNoIssuesFound) {
  ThreadPool pool(1, 4);
  RecordingSink sink;
  auto runner = RuleRunner::Create("job", Specs(), {}, *factory_, &pool, &sink);
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
  auto runner = RuleRunner::Create("job", Specs(), {previous}, *factory_, &pool, &sink);
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
  EXPECT_THAT(RuleRunner::Create("job", specs, {}, *factory_, &pool, &sink),
              StatusIs(absl::StatusCode::kInvalidArgument, "two rules are named"));
  v1::RuleSpec bad;
  bad.set_rule_type("LossNotDecreasing");
  (*bad.mutable_parameters())["num_steps"] = "ten";
  EXPECT_THAT(RuleRunner::Create("job", {bad}, {}, *factory_, &pool, &sink),
              StatusIs(absl::StatusCode::kInvalidArgument, "num_steps='ten'"));
}

// Test-only rule types, registered the way plugins register theirs.
class BlockingRule : public Rule {
 public:
  explicit BlockingRule(absl::Notification* release) : release_(release) {}
  absl::StatusOr<std::optional<Finding>> OnStep(const StepData&) override {
    release_->WaitForNotification();
    return std::optional<Finding>();
  }

 private:
  absl::Notification* release_;
};

class FailingRule : public Rule {
 public:
  absl::StatusOr<std::optional<Finding>> OnStep(const StepData& step) override {
    if (step.step == 2) return absl::InternalError("cannot divide by zero");
    return std::optional<Finding>();
  }
};

class SlowRule : public Rule {
 public:
  absl::StatusOr<std::optional<Finding>> OnStep(const StepData&) override {
    absl::SleepFor(absl::Milliseconds(30));  // longer than the test's budget
    return std::optional<Finding>();
  }
};

v1::RuleSpec Spec(const std::string& type) {
  v1::RuleSpec s;
  s.set_rule_type(type);
  return s;
}

TEST(RuleRunner, AStuckRuleDelaysOnlyItself) {
  absl::Notification release;
  RuleFactory factory;
  RegisterBuiltinRules(factory);
  SONDE_ASSERT_OK(factory.Register({"Blocking", "blocks until released", {}, {}, "", "test"},
                                   [&](RuleParams&) -> absl::StatusOr<std::unique_ptr<Rule>> {
                                     return std::make_unique<BlockingRule>(&release);
                                   }));
  v1::RuleSpec exploding = Spec("ExplodingTensor");
  exploding.add_actions("StopTraining");
  ThreadPool pool(2, 16);
  RecordingSink sink;
  auto runner = RuleRunner::Create("job", {Spec("Blocking"), exploding}, {}, factory, &pool, &sink);
  SONDE_ASSERT_OK(runner);
  (*runner)->SubmitStep(Step(0, std::numeric_limits<float>::quiet_NaN(), 1));
  // ExplodingTensor reaches its verdict while Blocking is still stuck on step 0.
  {
    absl::MutexLock lock(&sink.mu_);
    auto has_action = [&sink]() { return !sink.actions.empty(); };
    sink.mu_.Await(absl::Condition(&has_action));
  }
  auto results = (*runner)->Results();
  EXPECT_EQ(results[0].status(), v1::RULE_STATUS_IN_PROGRESS);
  EXPECT_EQ(results[1].status(), v1::RULE_STATUS_ISSUES_FOUND);
  EXPECT_FALSE(results[1].suggestion().empty());
  release.Notify();
  (*runner)->Drain();
}

TEST(RuleRunner, AFailingRuleGetsErrorWithTheReasonAndOthersGoOn) {
  RuleFactory factory;
  RegisterBuiltinRules(factory);
  SONDE_ASSERT_OK(factory.Register({"Failing", "fails at step 2", {}, {}, "", "test"},
                                   [](RuleParams&) -> absl::StatusOr<std::unique_ptr<Rule>> {
                                     return std::make_unique<FailingRule>();
                                   }));
  ThreadPool pool(2, 16);
  RecordingSink sink;
  auto runner = RuleRunner::Create("job", {Spec("Failing"), Spec("ExplodingTensor")}, {}, factory,
                                   &pool, &sink);
  SONDE_ASSERT_OK(runner);
  for (int s = 0; s < 5; ++s) (*runner)->SubmitStep(Step(s, 1, 1));
  (*runner)->SubmitJobEnd();
  (*runner)->Drain();
  auto results = (*runner)->Results();
  EXPECT_EQ(results[0].status(), v1::RULE_STATUS_ERROR);
  EXPECT_EQ(results[0].step(), 2);
  EXPECT_NE(results[0].message().find("cannot divide by zero"), std::string::npos);
  EXPECT_EQ(results[0].steps_evaluated(), 3);
  EXPECT_EQ(results[1].status(), v1::RULE_STATUS_NO_ISSUES_FOUND);
  EXPECT_EQ(results[1].steps_evaluated(), 5);
}

TEST(RuleRunner, ARuleOverItsTimeBudgetIsStoppedWithError) {
  RuleFactory factory;
  SONDE_ASSERT_OK(factory.Register({"Slow", "sleeps", {}, {}, "", "test"},
                                   [](RuleParams&) -> absl::StatusOr<std::unique_ptr<Rule>> {
                                     return std::make_unique<SlowRule>();
                                   }));
  ThreadPool pool(1, 16);
  RecordingSink sink;
  RuleBudget budget;
  budget.max_evaluation = absl::Milliseconds(5);
  auto runner = RuleRunner::Create("job", {Spec("Slow")}, {}, factory, &pool, &sink, budget);
  SONDE_ASSERT_OK(runner);
  for (int s = 0; s < 3; ++s) (*runner)->SubmitStep(Step(s, 1, 1));
  (*runner)->Drain();
  auto r = (*runner)->Results()[0];
  EXPECT_EQ(r.status(), v1::RULE_STATUS_ERROR);
  EXPECT_EQ(r.steps_evaluated(), 1);
  EXPECT_NE(r.message().find("over its budget"), std::string::npos) << r.message();
}

TEST(RuleRunner, ARuleTooFarBehindIsStoppedWithError) {
  absl::Notification release;
  RuleFactory factory;
  SONDE_ASSERT_OK(factory.Register({"Blocking", "blocks", {}, {}, "", "test"},
                                   [&](RuleParams&) -> absl::StatusOr<std::unique_ptr<Rule>> {
                                     return std::make_unique<BlockingRule>(&release);
                                   }));
  ThreadPool pool(1, 16);
  RecordingSink sink;
  RuleBudget budget;
  budget.max_backlog = 3;
  auto runner = RuleRunner::Create("job", {Spec("Blocking")}, {}, factory, &pool, &sink, budget);
  SONDE_ASSERT_OK(runner);
  for (int s = 0; s < 10; ++s) (*runner)->SubmitStep(Step(s, 1, 1));  // never blocks the caller
  release.Notify();
  (*runner)->Drain();
  auto r = (*runner)->Results()[0];
  EXPECT_EQ(r.status(), v1::RULE_STATUS_ERROR);
  EXPECT_NE(r.message().find("fell more than 3 steps behind"), std::string::npos) << r.message();
  EXPECT_LE(r.steps_evaluated(), 3);
}

// Fires when some worker's "cpu.util" goes over 90; counts what it saw.
class HotCpuRule : public Rule {
 public:
  bool WantsProfile() const override { return true; }
  absl::StatusOr<std::optional<Finding>> OnStep(const StepData&) override {
    return std::optional<Finding>();
  }
  absl::StatusOr<std::optional<Finding>> OnProfile(const ProfileData& data) override {
    for (const v1::MetricSnapshot& s : data.batch.snapshots()) {
      for (const v1::MetricSample& m : s.samples()) {
        if (m.name() == "cpu.util" && m.value() > 90) {
          Finding f;
          f.message = "cpu hot";
          f.worker = data.worker;
          f.observed = m.value();
          f.threshold = 90;
          return std::optional<Finding>(f);
        }
      }
    }
    return std::optional<Finding>();
  }
};

// HotCpuRule that keeps judging after its first issue, as profiler rules do.
class StillHotCpuRule : public HotCpuRule {
 public:
  bool KeepsJudgingAfterIssue() const override { return true; }
};

v1::ProfileBatch CpuBatch(double util) {
  v1::ProfileBatch b;
  v1::MetricSnapshot* s = b.add_snapshots();
  s->set_unix_micros(1);
  v1::MetricSample* m = s->add_samples();
  m->set_name("cpu.util");
  m->set_value(util);
  return b;
}

TEST(RuleRunner, ProfilerDataReachesOnlyRulesThatWantItAndTheirVerdictsActAsAnyRules) {
  RuleFactory factory;
  RegisterBuiltinRules(factory);
  SONDE_ASSERT_OK(factory.Register({"HotCpu", "cpu over 90", {}, {}, "", "test"},
                                   [](RuleParams&) -> absl::StatusOr<std::unique_ptr<Rule>> {
                                     return std::make_unique<HotCpuRule>();
                                   }));
  ThreadPool pool(2, 16);
  RecordingSink sink;
  v1::RuleSpec hot = Spec("HotCpu");
  hot.add_actions("StopTraining");
  auto runner = RuleRunner::Create("job", {hot, Spec("ExplodingTensor")}, {}, factory, &pool,
                                   &sink);
  SONDE_ASSERT_OK(runner);
  EXPECT_TRUE((*runner)->WantsProfile());
  (*runner)->SubmitStep(Step(0, 1, 1));
  (*runner)->SubmitProfile(0, CpuBatch(50));
  (*runner)->SubmitProfile(1, CpuBatch(50));
  (*runner)->SubmitProfile(1, CpuBatch(97));
  (*runner)->SubmitProfile(0, CpuBatch(99));  // after the verdict: not judged again
  (*runner)->Drain();
  auto results = (*runner)->Results();
  EXPECT_EQ(results[0].status(), v1::RULE_STATUS_ISSUES_FOUND);
  EXPECT_EQ(results[0].worker(), 1);
  EXPECT_EQ(results[0].observed(), 97);
  EXPECT_EQ(results[0].datapoints(), 3);
  EXPECT_EQ(results[1].status(), v1::RULE_STATUS_IN_PROGRESS);
  EXPECT_EQ(results[1].datapoints(), 0);  // never given profiler data
  absl::MutexLock lock(&sink.mu_);
  ASSERT_EQ(sink.actions.size(), 1u);
  EXPECT_EQ(sink.actions[0].type(), v1::ACTION_STOP_TRAINING);
  EXPECT_EQ(sink.actions[0].rule(), "HotCpu");
}

TEST(RuleRunner, ARuleThatKeepsJudgingCountsEveryTriggerAndActsOnce) {
  RuleFactory factory;
  SONDE_ASSERT_OK(factory.Register({"StillHotCpu", "cpu over 90", {}, {}, "", "test"},
                                   [](RuleParams&) -> absl::StatusOr<std::unique_ptr<Rule>> {
                                     return std::make_unique<StillHotCpuRule>();
                                   }));
  ThreadPool pool(2, 16);
  RecordingSink sink;
  v1::RuleSpec hot = Spec("StillHotCpu");
  hot.add_actions("StopTraining");
  hot.add_actions("Log");
  auto runner = RuleRunner::Create("job", {hot}, {}, factory, &pool, &sink);
  SONDE_ASSERT_OK(runner);
  for (double util : {50.0, 95.0, 40.0, 97.0, 99.0, 30.0}) {
    (*runner)->SubmitProfile(0, CpuBatch(util));
  }
  (*runner)->Drain();
  v1::RuleResult live = (*runner)->Results()[0];
  EXPECT_EQ(live.status(), v1::RULE_STATUS_ISSUES_FOUND);
  EXPECT_EQ(live.times_triggered(), 3);
  EXPECT_EQ(live.observed(), 99);  // the latest issue's details
  EXPECT_EQ(live.datapoints(), 6);
  {
    // Drain() published what the once-a-second limit held back.
    absl::MutexLock lock(&sink.mu_);
    ASSERT_FALSE(sink.results.empty());
    EXPECT_EQ(sink.results.back().times_triggered(), 3);
  }
  (*runner)->SubmitProfile(1, CpuBatch(91));
  (*runner)->SubmitJobEnd(std::nullopt);
  (*runner)->Drain();
  const v1::RuleResult end = (*runner)->Results()[0];
  EXPECT_EQ(end.status(), v1::RULE_STATUS_ISSUES_FOUND);
  EXPECT_EQ(end.times_triggered(), 4);
  EXPECT_EQ(end.worker(), 1);
  absl::MutexLock lock(&sink.mu_);
  ASSERT_FALSE(sink.results.empty());
  EXPECT_EQ(sink.results.back().times_triggered(), 4);  // the end is always published
  ASSERT_EQ(sink.actions.size(), 2u);  // StopTraining and Log, at the first issue only
  EXPECT_EQ(sink.actions[0].verdict().times_triggered(), 1);
  EXPECT_EQ(sink.actions[1].verdict().times_triggered(), 1);
}

// Fires over 90; fails on a negative value.
class FailsLaterRule : public StillHotCpuRule {
 public:
  absl::StatusOr<std::optional<Finding>> OnProfile(const ProfileData& data) override {
    if (data.batch.snapshots(0).samples(0).value() < 0) {
      return absl::DataLossError("negative utilisation");
    }
    return StillHotCpuRule::OnProfile(data);
  }
};

TEST(RuleRunner, ARuleThatFailsAfterItsIssueKeepsTheVerdictAndStops) {
  RuleFactory factory;
  SONDE_ASSERT_OK(factory.Register({"FailsLater", "cpu over 90", {}, {}, "", "test"},
                                   [](RuleParams&) -> absl::StatusOr<std::unique_ptr<Rule>> {
                                     return std::make_unique<FailsLaterRule>();
                                   }));
  ThreadPool pool(2, 16);
  RecordingSink sink;
  auto runner = RuleRunner::Create("job", {Spec("FailsLater")}, {}, factory, &pool, &sink);
  SONDE_ASSERT_OK(runner);
  (*runner)->SubmitStep(Step(7, 1, 1));
  for (double util : {95.0, -1.0, 99.0}) (*runner)->SubmitProfile(0, CpuBatch(util));
  (*runner)->SubmitStep(Step(8, 1, 1));
  (*runner)->SubmitJobEnd(std::nullopt);
  (*runner)->Drain();
  const v1::RuleResult r = (*runner)->Results()[0];
  EXPECT_EQ(r.status(), v1::RULE_STATUS_ISSUES_FOUND);  // not lost to the later error
  EXPECT_EQ(r.observed(), 95);                            // 99 came after it stopped
  EXPECT_EQ(r.times_triggered(), 1);
  EXPECT_NE(r.message().find("cpu hot (then rule failed at profiler data of worker 0: "
                             "DATA_LOSS: negative utilisation; it is no longer fed)"),
            std::string::npos)
      << r.message();
  EXPECT_EQ(r.step(), 7);  // the step its issue was found at, not a later one
}

TEST(RuleRunner, ARuleThatStopsAtItsIssueCountsOneTrigger) {
  RecordingSink sink;
  ThreadPool pool(2, 16);
  auto runner = RuleRunner::Create("job", Specs(), {}, *factory_, &pool, &sink);
  SONDE_ASSERT_OK(runner);
  (*runner)->SubmitStep(Step(0, 1, 1));
  (*runner)->SubmitStep(Step(1, std::numeric_limits<float>::infinity(), 1));
  (*runner)->SubmitStep(Step(2, std::numeric_limits<float>::infinity(), 1));
  (*runner)->SubmitJobEnd(std::nullopt);
  (*runner)->Drain();
  const v1::RuleResult r = (*runner)->Results()[0];
  EXPECT_EQ(r.status(), v1::RULE_STATUS_ISSUES_FOUND);
  EXPECT_EQ(r.step(), 1);
  EXPECT_EQ(r.times_triggered(), 1);
}

TEST(RuleFactory, RejectsDuplicateAndEmptyTypes) {
  auto factory = BuiltinRuleFactory();
  EXPECT_THAT(factory->Register({"ExplodingTensor", "", {}, {}, "", "test"}, nullptr),
              StatusIs(absl::StatusCode::kAlreadyExists, "ExplodingTensor"));
  EXPECT_THAT(factory->Register({"", "", {}, {}, "", "test"}, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, "empty"));
  EXPECT_THAT(factory->Create(Spec("Nope")),
              StatusIs(absl::StatusCode::kNotFound, "known: ExplodingTensor"));
}

}  // namespace
}  // namespace sonde::rules
