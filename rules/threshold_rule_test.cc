#include "rules/threshold_rule.h"

#include <string>
#include <vector>

#include "stats/statistics.h"
#include "gtest/gtest.h"
#include "rules/builtin_rules.h"
#include "rules/rule_config.h"
#include "tests/testing/status_matchers.h"

namespace sonde::rules {
namespace {

using ::sonde::testing::StatusIs;

const RuleFactory& Factory() {
  static const RuleFactory* factory = BuiltinRuleFactory().release();
  return *factory;
}

v1::TensorRecord Tensor(const std::string& name, std::vector<float> v, const std::string& coll) {
  v1::TensorRecord r;
  r.set_tensor_name(name);
  r.add_collections(coll);
  *r.mutable_statistics() = *ComputeStatistics(
      std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4), v1::DTYPE_F32);
  return r;
}

StepData Step(int64_t s, std::vector<v1::TensorRecord> tensors) {
  StepData d;
  d.step = s;
  d.mode = v1::MODE_TRAIN;
  d.mode_step = s;
  d.tensors = std::move(tensors);
  return d;
}

std::unique_ptr<Rule> FromJson(const std::string& json) {
  auto specs = ParseRulesJson(json);
  EXPECT_THAT(specs, ::sonde::testing::IsOk());
  auto rule = Factory().Create((*specs)[0]);
  EXPECT_THAT(rule, ::sonde::testing::IsOk());
  return rule.ok() ? std::move(*rule) : nullptr;
}

TEST(Threshold, FiresAfterTheConfiguredNumberOfConsecutiveSteps) {
  auto rule = FromJson(R"({"rules": [{"name": "grad_too_large", "rule_type": "Threshold",
      "rule_parameters": {"collection_names": "gradients", "statistic": "abs_max",
                          "comparison": ">", "threshold": "100", "consecutive_steps": "3"},
      "actions": ["Log"]}]})");
  // 150, 5, 150, 150, 150: the streak restarts after the 5.
  const float values[] = {150, 5, 150, 150, 150};
  for (int s = 0; s < 5; ++s) {
    auto r = rule->OnStep(Step(s, {Tensor("gradient/w", {values[s], -1}, "gradients"),
                                   Tensor("w", {1000}, "weights")}));
    SONDE_ASSERT_OK(r);
    if (s < 4) {
      EXPECT_FALSE(r->has_value()) << "step " << s;
    } else {
      ASSERT_TRUE(r->has_value());
      EXPECT_EQ((*r)->tensors, std::vector<std::string>{"gradient/w"});
      EXPECT_EQ((*r)->observed, 150);
      EXPECT_EQ((*r)->threshold, 100);
      EXPECT_EQ((*r)->message, "abs_max of 'gradient/w' is 150 > 100 for 3 saved steps at step 4");
    }
  }
}

TEST(Threshold, EveryStatisticAndComparisonCanBeUsed) {
  struct Case {
    const char* statistic;
    const char* comparison;
    const char* threshold;
    bool fires;
  } cases[] = {
      {"mean", "<", "0", true},         {"mean", ">=", "0", false},
      {"zero_fraction", ">=", "0.5", true}, {"nan_count", "==", "0", true},
      {"l2", "<=", "1", true},          {"l2", "<", "1", false},
      {"abs_mean", "!=", "0.5", false},
  };
  for (const auto& c : cases) {
    v1::RuleSpec spec;
    spec.set_rule_type("Threshold");
    (*spec.mutable_parameters())["tensor_regex"] = "^w$";
    (*spec.mutable_parameters())["statistic"] = c.statistic;
    (*spec.mutable_parameters())["comparison"] = c.comparison;
    (*spec.mutable_parameters())["threshold"] = c.threshold;
    auto rule = Factory().Create(spec);
    SONDE_ASSERT_OK(rule);
    // w = {0, -1}: mean -0.5, zero share 0.5, no NaN, l2 1, abs mean 0.5.
    auto r = (*rule)->OnStep(Step(0, {Tensor("w", {0, -1}, "weights")}));
    SONDE_ASSERT_OK(r);
    EXPECT_EQ(r->has_value(), c.fires) << c.statistic << " " << c.comparison << " " << c.threshold;
  }
}

TEST(Threshold, RejectsIncompleteOrWrongConfigurations) {
  auto make = [](std::map<std::string, std::string> params) {
    v1::RuleSpec spec;
    spec.set_rule_type("Threshold");
    for (auto& [k, v] : params) (*spec.mutable_parameters())[k] = v;
    return Factory().Create(spec).status();
  };
  EXPECT_THAT(make({{"threshold", "1"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "collection_names or tensor_regex"));
  EXPECT_THAT(make({{"tensor_regex", "w"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "threshold='' must be a number"));
  EXPECT_THAT(make({{"tensor_regex", "w"}, {"threshold", "1"}, {"statistic", "median"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown statistic 'median'"));
  EXPECT_THAT(make({{"tensor_regex", "w"}, {"threshold", "1"}, {"comparison", "=>"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown comparison '=>'"));
  EXPECT_THAT(make({{"tensor_regex", "w"}, {"threshold", "1"}, {"consecutive_steps", "0"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "at least 1"));
}

TEST(Threshold, TheFlagSyntaxCarriesComparisons) {
  auto specs = ParseRuleFlag(
      "Threshold(name=loss_high,collection_names=losses,statistic=mean,comparison=>=,threshold=5)");
  SONDE_ASSERT_OK(specs);
  EXPECT_EQ((*specs)[0].parameters().at("comparison"), ">=");
  SONDE_EXPECT_OK(Factory().Create((*specs)[0]).status());
}

TEST(StalledTrainingRule, FiresWhenNoStepArrivesWithinTheThreshold) {
  v1::RuleSpec spec;
  spec.set_rule_type("StalledTrainingRule");
  (*spec.mutable_parameters())["threshold"] = "60";
  (*spec.mutable_parameters())["stop_training_on_fire"] = "true";
  (*spec.mutable_parameters())["training_job_name_prefix"] = "ignored";
  auto rule = Factory().Create(spec);
  SONDE_ASSERT_OK(rule);
  EXPECT_TRUE((*rule)->WantsTicks());
  const absl::Time start = absl::Now();
  SONDE_ASSERT_OK((*rule)->OnStep(Step(7, {})).status());
  auto early = (*rule)->OnTick(start + absl::Seconds(30));
  SONDE_ASSERT_OK(early);
  EXPECT_FALSE(early->has_value());
  auto late = (*rule)->OnTick(absl::Now() + absl::Seconds(90));
  SONDE_ASSERT_OK(late);
  ASSERT_TRUE(late->has_value());
  EXPECT_TRUE((*late)->stop_training);
  EXPECT_EQ((*late)->threshold, 60);
  EXPECT_GE((*late)->observed, 90);
  EXPECT_NE((*late)->message.find("after step 7"), std::string::npos) << (*late)->message;
  spec.mutable_parameters()->clear();
  (*spec.mutable_parameters())["threshold"] = "0";
  EXPECT_THAT(Factory().Create(spec), StatusIs(absl::StatusCode::kInvalidArgument, "positive"));
}

}  // namespace
}  // namespace sonde::rules
