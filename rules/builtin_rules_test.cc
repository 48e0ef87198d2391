#include "rules/builtin_rules.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "stats/statistics.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace sonde::rules {
namespace {

using ::sonde::testing::StatusIs;

v1::TensorRecord Tensor(const std::string& name, std::vector<float> values,
                        std::vector<std::string> collections = {}) {
  v1::TensorRecord r;
  r.set_tensor_name(name);
  r.set_dtype(v1::DTYPE_F32);
  r.add_shape(static_cast<int64_t>(values.size()));
  for (auto& c : collections) r.add_collections(c);
  *r.mutable_statistics() = *ComputeStatistics(
      std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4),
      v1::DTYPE_F32);
  return r;
}

StepData Step(int64_t s, std::vector<v1::TensorRecord> tensors,
              v1::Mode mode = v1::MODE_TRAIN) {
  StepData d;
  d.step = s;
  d.mode = mode;
  d.mode_step = s;
  d.tensors = std::move(tensors);
  return d;
}

const RuleFactory& Factory() {
  static const RuleFactory* factory = BuiltinRuleFactory().release();
  return *factory;
}

std::unique_ptr<Rule> Make(const std::string& type,
                           std::map<std::string, std::string> params = {}) {
  v1::RuleSpec spec;
  spec.set_rule_type(type);
  for (auto& [k, v] : params) (*spec.mutable_parameters())[k] = v;
  auto rule = Factory().Create(spec);
  EXPECT_THAT(rule, ::sonde::testing::IsOk());
  return rule.ok() ? std::move(*rule) : nullptr;
}

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(ExplodingTensor, QuietOnFiniteValuesFiresOnFirstNaN) {
  auto rule = Make("ExplodingTensor");
  auto r0 = rule->OnStep(Step(0, {Tensor("w", {1, 2, 1e30f})}));
  SONDE_ASSERT_OK(r0);
  EXPECT_FALSE(r0->has_value());
  auto r1 = rule->OnStep(Step(1, {Tensor("w", {1, kNaN, 3}), Tensor("b", {0})}));
  SONDE_ASSERT_OK(r1);
  ASSERT_TRUE(r1->has_value());
  EXPECT_EQ((*r1)->tensors, std::vector<std::string>{"w"});
  EXPECT_EQ((*r1)->observed, 1);
  EXPECT_EQ((*r1)->message, "tensor 'w' at TRAIN step 1 has 1 NaN and 0 Inf of 3 values");
}

TEST(ExplodingTensor, InfCountsUnlessOnlyNan) {
  auto rule = Make("ExplodingTensor");
  EXPECT_TRUE(rule->OnStep(Step(0, {Tensor("w", {kInf, 1})}))->has_value());
  auto only_nan = Make("ExplodingTensor", {{"only_nan", "True"}});
  EXPECT_FALSE(only_nan->OnStep(Step(0, {Tensor("w", {kInf, -kInf})}))->has_value());
  EXPECT_TRUE(only_nan->OnStep(Step(1, {Tensor("w", {kNaN})}))->has_value());
}

TEST(ExplodingTensor, WatchesOnlySelectedTensors) {
  auto by_collection = Make("ExplodingTensor", {{"collection_names", "gradients"}});
  EXPECT_FALSE(by_collection->OnStep(Step(0, {Tensor("w", {kNaN}, {"weights"})}))->has_value());
  EXPECT_TRUE(
      by_collection->OnStep(Step(1, {Tensor("gradient/w", {kNaN}, {"gradients"})}))->has_value());
  // "all" is every tensor, though no record lists it among its collections.
  auto all = Make("ExplodingTensor", {{"collection_names", "all"}});
  EXPECT_TRUE(all->OnStep(Step(0, {Tensor("w", {kNaN}, {"weights"})}))->has_value());
  auto by_regex = Make("ExplodingTensor", {{"tensor_regex", "^fc1\\."}});
  EXPECT_FALSE(by_regex->OnStep(Step(0, {Tensor("fc2.weight", {kNaN})}))->has_value());
  EXPECT_TRUE(by_regex->OnStep(Step(1, {Tensor("fc1.weight", {kNaN})}))->has_value());
}

TEST(RuleCatalog, RejectsUnknownRulesParametersAndBadValues) {
  v1::RuleSpec spec;
  spec.set_rule_type("NoSuchRule");
  EXPECT_THAT(Factory().Create(spec), StatusIs(absl::StatusCode::kNotFound, "NoSuchRule"));
  spec.set_rule_type("ExplodingTensor");
  (*spec.mutable_parameters())["onlynan"] = "true";
  EXPECT_THAT(Factory().Create(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown parameter 'onlynan'"));
  spec.mutable_parameters()->clear();
  (*spec.mutable_parameters())["only_nan"] = "maybe";
  EXPECT_THAT(Factory().Create(spec), StatusIs(absl::StatusCode::kInvalidArgument, "maybe"));
  spec.mutable_parameters()->clear();
  (*spec.mutable_parameters())["tensor_regex"] = "([";
  EXPECT_THAT(Factory().Create(spec), StatusIs(absl::StatusCode::kInvalidArgument, "regex"));
  v1::RuleSpec lnd;
  lnd.set_rule_type("LossNotDecreasing");
  (*lnd.mutable_parameters())["num_steps"] = "0";
  EXPECT_THAT(Factory().Create(lnd), StatusIs(absl::StatusCode::kInvalidArgument, "at least 1"));
  for (const char* type : {"ExplodingTensor", "LossNotDecreasing", "UnchangedTensor",
                           "WeightUpdateRatio", "DeadRelu", "SaturatedActivation",
                           "ClassImbalance", "Confusion", "CheckInputImages", "NLPSequenceRatio",
                           "FeatureImportanceOverweight", "TreeDepth"}) {
    const RuleInfo* info = Factory().Find(type);
    ASSERT_NE(info, nullptr) << type;
    EXPECT_FALSE(info->description.empty()) << type;
    EXPECT_FALSE(info->suggestion.empty()) << type;
  }
}

TEST(RuleCatalog, NormalizeNamesAfterTypeAndChecksActions) {
  v1::RuleSpec spec;
  spec.set_rule_type("ExplodingTensor");
  EXPECT_EQ(NormalizeRuleSpec(spec)->name(), "ExplodingTensor");
  spec.add_actions("Email");
  EXPECT_THAT(NormalizeRuleSpec(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown action 'Email'"));
}

// Feeds a loss curve (one value per step, saved every `interval` steps).
std::optional<int64_t> FirstFiring(Rule& rule, const std::vector<float>& losses,
                                   int interval = 1) {
  for (size_t s = 0; s < losses.size(); s += interval) {
    auto r = rule.OnStep(Step(static_cast<int64_t>(s), {Tensor("loss", {losses[s]}, {"losses"})}));
    EXPECT_THAT(r, ::sonde::testing::IsOk());
    if (r.ok() && r->has_value()) return static_cast<int64_t>(s);
  }
  return std::nullopt;
}

TEST(LossNotDecreasing, QuietWhileLossFalls) {
  auto rule = Make("LossNotDecreasing");
  std::vector<float> losses;
  for (int s = 0; s < 100; ++s) losses.push_back(10.0f * std::exp(-0.02f * s));
  EXPECT_EQ(FirstFiring(*rule, losses), std::nullopt);
}

TEST(LossNotDecreasing, FiresWhenLossPlateaus) {
  auto rule = Make("LossNotDecreasing");
  std::vector<float> losses;
  for (int s = 0; s <= 35; ++s) losses.push_back(s < 12 ? 10.0f - 0.5f * s : 0.3f);
  // Checks run every 10 steps: 10 vs 0 and 20 vs 10 fall a lot; 30 vs 20 is
  // flat at 0.3.
  EXPECT_EQ(FirstFiring(*rule, losses), 30);
}

TEST(LossNotDecreasing, EqualLossCountsAsNotDecreasing) {
  // smdebug's own test: losses 0.3, 0.33, 0.31, 0.30 saved every 4 steps fire
  // at step 12 (compared with step 0, no decrease).
  auto rule = Make("LossNotDecreasing");
  std::vector<float> losses(17, 0);
  losses[0] = 0.3f;
  losses[4] = 0.33f;
  losses[8] = 0.31f;
  losses[12] = 0.30f;
  losses[16] = 0.28f;
  EXPECT_EQ(FirstFiring(*rule, losses, 4), 12);
}

TEST(LossNotDecreasing, SmallIncreaseIsToleratedOnceLargeIncreaseFiresAtOnce) {
  auto rule = Make("LossNotDecreasing", {{"num_steps", "1"}});
  // 1.0 -> 1.02 (+2%, tolerated) -> 0.9 (down) -> 0.91 (+1.1%, tolerated again
  // since the streak was broken) -> 0.92 (second failure in a row: fires).
  EXPECT_EQ(FirstFiring(*rule, {1.0f, 1.02f, 0.9f, 0.91f, 0.92f}), 4);
  auto jump = Make("LossNotDecreasing", {{"num_steps", "1"}});
  EXPECT_EQ(FirstFiring(*jump, {1.0f, 0.5f, 0.8f}), 2);  // +60% > 5%
}

TEST(LossNotDecreasing, NonFiniteLossFires) {
  auto rule = Make("LossNotDecreasing", {{"num_steps", "2"}});
  EXPECT_EQ(FirstFiring(*rule, {5.0f, 4.0f, kNaN}), 2);
}

TEST(LossNotDecreasing, ModesAreSeparateSeries) {
  auto rule = Make("LossNotDecreasing", {{"num_steps", "1"}});
  // TRAIN falls, EVAL is flat: only EVAL's series fires.
  EXPECT_FALSE(rule->OnStep(Step(0, {Tensor("loss", {5}, {"losses"})}))->has_value());
  EXPECT_FALSE(rule->OnStep(Step(0, {Tensor("loss", {2}, {"losses"})}, v1::MODE_EVAL))->has_value());
  EXPECT_FALSE(rule->OnStep(Step(1, {Tensor("loss", {4}, {"losses"})}))->has_value());
  auto eval = rule->OnStep(Step(1, {Tensor("loss", {2}, {"losses"})}, v1::MODE_EVAL));
  ASSERT_TRUE(eval->has_value());
  EXPECT_NE((*eval)->message.find("EVAL"), std::string::npos);
  auto train_only = Make("LossNotDecreasing", {{"num_steps", "1"}, {"mode", "TRAIN"}});
  SONDE_EXPECT_OK(
      train_only->OnStep(Step(0, {Tensor("loss", {2}, {"losses"})}, v1::MODE_EVAL)).status());
  EXPECT_FALSE(
      train_only->OnStep(Step(1, {Tensor("loss", {2}, {"losses"})}, v1::MODE_EVAL))->has_value());
}

TEST(LossNotDecreasing, IgnoresTensorsOutsideTheLossesCollection) {
  auto rule = Make("LossNotDecreasing", {{"num_steps", "1"}});
  EXPECT_FALSE(rule->OnStep(Step(0, {Tensor("w", {1}, {"weights"})}))->has_value());
  EXPECT_FALSE(rule->OnStep(Step(1, {Tensor("w", {1}, {"weights"})}))->has_value());
}

}  // namespace
}  // namespace sonde::rules

namespace sonde::rules {
namespace {

TEST(CollectionRequests, FollowTheCatalogueAndTheSpecsSelectors) {
  auto requests = [](const std::string& type, std::map<std::string, std::string> params) {
    v1::RuleSpec spec;
    spec.set_rule_type(type);
    spec.set_name(type);
    for (auto& [k, v] : params) (*spec.mutable_parameters())[k] = v;
    return CollectionRequestsFor(spec, *Factory().Find(type));
  };
  auto dead = requests("DeadRelu", {});
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].name(), "relu_output");
  EXPECT_EQ(dead[0].include_regex(0), ".*relu_output");
  EXPECT_TRUE(dead[0].values());
  EXPECT_EQ(dead[0].rule(), "DeadRelu");

  auto exploding = requests("ExplodingTensor", {{"collection_names", "gradients, weights"}});
  ASSERT_EQ(exploding.size(), 2u);
  EXPECT_EQ(exploding[1].name(), "weights");
  EXPECT_EQ(exploding[1].include_regex_size(), 0);
  EXPECT_FALSE(exploding[1].values());

  EXPECT_TRUE(requests("ExplodingTensor", {}).empty());  // judges what is saved
  auto by_regex = requests("ExplodingTensor", {{"tensor_regex", "^fc1\\\\."}});
  ASSERT_EQ(by_regex.size(), 1u);
  EXPECT_EQ(by_regex[0].name(), "rule:ExplodingTensor");
  EXPECT_EQ(by_regex[0].include_regex(0), "^fc1\\\\.");

  // Default regexes are requested too, else the rule would judge nothing.
  auto saturated = requests("SaturatedActivation", {});
  ASSERT_EQ(saturated.size(), 1u);
  EXPECT_EQ(saturated[0].name(), "rule:SaturatedActivation");
  EXPECT_EQ(saturated[0].include_regex(0), ".*tanh_input|.*sigmoid_input");
  EXPECT_TRUE(saturated[0].values());
  EXPECT_TRUE(requests("SaturatedActivation", {{"tensor_regex", ""}}).empty());
  auto imbalance = requests("ClassImbalance", {});
  ASSERT_EQ(imbalance.size(), 2u);
  EXPECT_EQ(imbalance[0].include_regex(0), ".*labels");
  EXPECT_EQ(imbalance[1].include_regex(0), ".*predictions");
  // A default regex that a default collection already asks for is not
  // asked for twice.
  auto poor = requests("PoorWeightInitialization", {});
  ASSERT_EQ(poor.size(), 3u);
  EXPECT_EQ(poor[0].name(), "relu_input");

  // collections_to_save: its settings join the default request for that
  // collection, or make a new one.
  v1::RuleSpec vanishing;
  vanishing.set_rule_type("VanishingGradient");
  vanishing.set_name("VanishingGradient");
  v1::CollectionRequest every5;
  every5.set_name("gradients");
  (*every5.mutable_parameters())["save_interval"] = "5";
  *vanishing.add_collections_to_save() = every5;
  v1::CollectionRequest relu;
  relu.set_name("relu_output");
  *vanishing.add_collections_to_save() = relu;
  auto with_settings = CollectionRequestsFor(vanishing, *Factory().Find("VanishingGradient"));
  ASSERT_EQ(with_settings.size(), 2u);
  EXPECT_EQ(with_settings[0].name(), "gradients");
  EXPECT_EQ(with_settings[0].parameters().at("save_interval"), "5");
  EXPECT_EQ(with_settings[1].name(), "relu_output");
  EXPECT_EQ(with_settings[1].include_regex(0), ".*relu_output");  // the known members
  EXPECT_EQ(with_settings[1].rule(), "VanishingGradient");

  auto loss = requests("LossNotDecreasing", {});
  ASSERT_EQ(loss.size(), 1u);
  EXPECT_EQ(loss[0].name(), "losses");
}

}  // namespace
}  // namespace sonde::rules
