// The value-based rules, fed from real training runs of examples/mlp where
// the failure can be produced by training (dead ReLUs, saturated tanh, a
// frozen layer, a huge learning rate, an untrained classifier), and from
// constructed data where the input itself is the problem.
#include "rules/value_rules.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "stats/statistics.h"
#include "examples/mlp.h"
#include "gtest/gtest.h"
#include "rules/builtin_rules.h"
#include "tests/testing/status_matchers.h"

namespace sonde::rules {
namespace {

using ::sonde::testing::StatusIs;
using examples::Mlp;
using examples::MlpConfig;
using examples::MlpStep;

const RuleFactory& Factory() {
  static const RuleFactory* factory = BuiltinRuleFactory().release();
  return *factory;
}

std::unique_ptr<Rule> Make(const std::string& type, std::map<std::string, std::string> params = {}) {
  v1::RuleSpec spec;
  spec.set_rule_type(type);
  for (auto& [k, v] : params) (*spec.mutable_parameters())[k] = v;
  auto rule = Factory().Create(spec);
  EXPECT_THAT(rule, ::sonde::testing::IsOk());
  return rule.ok() ? std::move(*rule) : nullptr;
}

// Builds steps the way the collector does: records with statistics, and
// values for the tensors the rule asks for.
class StepBuilder {
 public:
  StepBuilder(int64_t step, const Rule& rule) : rule_(rule) {
    data_.step = step;
    data_.mode = v1::MODE_TRAIN;
    data_.mode_step = step;
  }

  template <typename T>
  StepBuilder& Add(const std::string& name, const std::vector<T>& values,
                   std::vector<int64_t> shape, std::vector<std::string> collections = {}) {
    v1::TensorRecord r;
    r.set_tensor_name(name);
    r.set_step(data_.step);
    r.set_mode(data_.mode);
    r.set_mode_step(data_.mode_step);
    r.set_dtype(std::is_same_v<T, float> ? v1::DTYPE_F32 : v1::DTYPE_I64);
    for (int64_t d : shape) r.add_shape(d);
    for (auto& c : collections) r.add_collections(c);
    r.set_has_values(true);
    std::string bytes(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
    *r.mutable_statistics() = *ComputeStatistics(bytes, r.dtype());
    data_.values.push_back(rule_.WantsValues(r) ? std::make_shared<const std::string>(bytes)
                                                : nullptr);
    data_.tensors.push_back(std::move(r));
    return *this;
  }

  // What a PyTorch-style hook would save of one MLP step.
  StepBuilder& AddMlp(const MlpStep& s, const MlpConfig& c) {
    const std::string act = c.activation;
    Add("Net_fc1.weight", s.w1, {c.inputs, c.hidden}, {"weights"});
    Add("Net_fc2.weight", s.w2, {c.hidden, c.classes}, {"weights"});
    Add("gradient/Net_fc1.weight", s.g_w1, {c.inputs, c.hidden}, {"gradients"});
    Add("Net_" + act + "_input", s.activation_input, {c.batch, c.hidden});
    Add("Net_" + act + "_output", s.activation_output, {c.batch, c.hidden});
    Add("labels", s.labels, {c.batch}, {"labels"});
    Add("predictions", s.predictions, {c.batch}, {"predictions"});
    return *this;
  }

  const StepData& data() const { return data_; }

 private:
  const Rule& rule_;
  StepData data_;
};

// Trains `config` for `steps` steps and returns the first step at which the
// rule fires (and its finding).
std::optional<std::pair<int64_t, Finding>> FirstFiring(Rule& rule, const MlpConfig& config,
                                                       int steps) {
  Mlp mlp(config);
  for (int s = 0; s < steps; ++s) {
    StepBuilder b(s, rule);
    b.AddMlp(mlp.Step(), config);
    auto r = rule.OnStep(b.data());
    EXPECT_THAT(r, ::sonde::testing::IsOk());
    if (r.ok() && r->has_value()) return std::make_pair(int64_t{s}, **r);
  }
  return std::nullopt;
}

TEST(DeadRelu, FiresWhenANegativeBiasKillsTheHiddenLayer) {
  auto rule = Make("DeadRelu");
  MlpConfig c;
  c.hidden_bias = -20.0f;
  auto fired = FirstFiring(*rule, c, 5);
  ASSERT_TRUE(fired.has_value());
  EXPECT_EQ(fired->first, 0);
  EXPECT_EQ(fired->second.tensors, std::vector<std::string>{"Net_relu_output"});
  EXPECT_GT(fired->second.observed, 50.0);
  EXPECT_NE(fired->second.message.find("units are dead"), std::string::npos);
}

TEST(DeadRelu, QuietOnAHealthyReluNetwork) {
  auto rule = Make("DeadRelu");
  EXPECT_FALSE(FirstFiring(*rule, MlpConfig{}, 30).has_value());
}

TEST(SaturatedActivation, FiresWhenHugeWeightsSaturateTanh) {
  auto rule = Make("SaturatedActivation");
  MlpConfig c;
  c.activation = "tanh";
  // Pre-activations in the thousands: hardly a sample of a unit stays in
  // tanh's live range.
  c.init_scale = 300.0f;
  c.input_scale = 10.0f;
  auto fired = FirstFiring(*rule, c, 5);
  ASSERT_TRUE(fired.has_value());
  EXPECT_EQ(fired->second.tensors, std::vector<std::string>{"Net_tanh_input"});
  EXPECT_NE(fired->second.message.find("saturated"), std::string::npos);
}

TEST(SaturatedActivation, QuietOnWellScaledTanhAndSigmoid) {
  for (const char* act : {"tanh", "sigmoid"}) {
    auto rule = Make("SaturatedActivation");
    MlpConfig c;
    c.activation = act;
    EXPECT_FALSE(FirstFiring(*rule, c, 30).has_value()) << act;
  }
}

TEST(UnchangedTensor, FiresForAFrozenLayerOnly) {
  auto rule = Make("UnchangedTensor", {{"collection_names", "weights"}});
  MlpConfig c;
  c.freeze_first_layer = true;
  auto fired = FirstFiring(*rule, c, 10);
  ASSERT_TRUE(fired.has_value());
  EXPECT_EQ(fired->first, 2);  // three saved steps, all equal
  EXPECT_EQ(fired->second.tensors, std::vector<std::string>{"Net_fc1.weight"});
  auto healthy = Make("UnchangedTensor", {{"collection_names", "weights"}});
  EXPECT_FALSE(FirstFiring(*healthy, MlpConfig{}, 10).has_value());
  EXPECT_THAT(Factory().Create([] {
    v1::RuleSpec s;
    s.set_rule_type("UnchangedTensor");
    return s;
  }()), StatusIs(absl::StatusCode::kInvalidArgument, "collection_names or tensor_regex"));
}

TEST(WeightUpdateRatio, FrozenLayerIsTooSmallHugeLearningRateTooLarge) {
  MlpConfig frozen;
  frozen.freeze_first_layer = true;
  auto small = FirstFiring(*Make("WeightUpdateRatio"), frozen, 5);
  ASSERT_TRUE(small.has_value());
  EXPECT_EQ(small->first, 1);
  EXPECT_EQ(small->second.tensors, std::vector<std::string>{"Net_fc1.weight"});
  EXPECT_EQ(small->second.observed, 0.0);
  EXPECT_EQ(small->second.threshold, 1e-8);

  MlpConfig wild;
  wild.learning_rate = 5000.0f;
  auto large = FirstFiring(*Make("WeightUpdateRatio"), wild, 5);
  ASSERT_TRUE(large.has_value());
  EXPECT_GT(large->second.observed, 10.0);

  EXPECT_FALSE(FirstFiring(*Make("WeightUpdateRatio"), MlpConfig{}, 30).has_value());
}

TEST(Confusion, FiresOnAnUntrainedClassifierAndIsQuietOnceItHasLearned) {
  auto rule = Make("Confusion");
  MlpConfig c;
  Mlp mlp(c);
  StepBuilder first(0, *rule);
  first.AddMlp(mlp.Step(), c);
  auto untrained = rule->OnStep(first.data());
  SONDE_ASSERT_OK(untrained);
  EXPECT_TRUE(untrained->has_value());
  for (int s = 1; s < 300; ++s) mlp.Step();
  StepBuilder later(300, *rule);
  later.AddMlp(mlp.Step(), c);
  auto trained = rule->OnStep(later.data());
  SONDE_ASSERT_OK(trained);
  EXPECT_FALSE(trained->has_value()) << (*trained)->message;
}

TEST(Confusion, AnAbsurdClassIdIsAnErrorNotACrash) {
  auto rule = Make("Confusion");
  StepBuilder b(0, *rule);
  b.Add("labels", std::vector<int64_t>{0, 1000000}, {2}, {"labels"})
      .Add("predictions", std::vector<int64_t>{0, 1}, {2}, {"predictions"});
  EXPECT_THAT(rule->OnStep(b.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, "at most 4096 classes"));
}

TEST(ClassImbalance, BalancedBlobsAreQuietSkewedLabelsFire) {
  auto quiet = Make("ClassImbalance", {{"samples", "300"}});
  MlpConfig c;
  c.learning_rate = 0.2f;
  Mlp mlp(c);
  for (int s = 0; s < 200; ++s) mlp.Step();  // learn first: predictions become right
  for (int s = 0; s < 10; ++s) {
    StepBuilder b(s, *quiet);
    b.AddMlp(mlp.Step(), c);
    auto r = quiet->OnStep(b.data());
    SONDE_ASSERT_OK(r);
    EXPECT_FALSE(r->has_value()) << (*r)->message;
  }
  auto skewed = Make("ClassImbalance", {{"samples", "100"}});
  std::vector<int64_t> labels(64, 0);
  for (int i = 0; i < 4; ++i) labels[i] = 1;  // 60:4
  std::optional<Finding> found;
  for (int s = 0; s < 3 && !found; ++s) {
    StepBuilder b(s, *skewed);
    b.Add("labels", labels, {64}).Add("predictions", labels, {64});
    found = *skewed->OnStep(b.data());
  }
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->observed, 15.0);
  EXPECT_NE(found->message.find("class 0 has"), std::string::npos) << found->message;
}

TEST(CheckInputImages, UnnormalisedImagesFireNormalisedOnesDoNot) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0, 1);
  auto images = [&](float shift) {
    std::vector<float> v(100 * 3 * 4 * 4);
    for (auto& x : v) x = normal(rng) + shift;
    return v;
  };
  auto quiet = Make("CheckInputImages", {{"regex", "images"}, {"threshold_samples", "200"}});
  for (int s = 0; s < 3; ++s) {
    StepBuilder b(s, *quiet);
    b.Add("images", images(0), {100, 3, 4, 4});
    EXPECT_FALSE(quiet->OnStep(b.data())->has_value());
  }
  auto loud = Make("CheckInputImages", {{"regex", "images"}, {"threshold_samples", "200"}});
  std::optional<Finding> found;
  for (int s = 0; s < 3 && !found; ++s) {
    StepBuilder b(s, *loud);
    b.Add("images", images(120.0f), {100, 3, 4, 4});  // raw 0..255-style pixels
    found = *loud->OnStep(b.data());
  }
  ASSERT_TRUE(found.has_value());
  EXPECT_NEAR(found->observed, 120.0, 1.0);
}

TEST(NLPSequenceRatio, MostlyPaddingFires) {
  std::vector<int64_t> padded(100, 0), ok(100, 0);
  for (int i = 0; i < 100; ++i) {
    if (i < 30) padded[i] = 5 + i;
    if (i < 80) ok[i] = 5 + i;
  }
  auto rule = Make("NLPSequenceRatio", {{"tensor_regex", "tokens"}});
  StepBuilder good(0, *rule);
  good.Add("tokens", ok, {4, 25});
  EXPECT_FALSE(rule->OnStep(good.data())->has_value());
  StepBuilder bad(1, *rule);
  bad.Add("tokens", padded, {4, 25});
  auto r = rule->OnStep(bad.data());
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ((*r)->observed, 70.0);
  EXPECT_THAT(Factory().Create([] {
    v1::RuleSpec s;
    s.set_rule_type("NLPSequenceRatio");
    (*s.mutable_parameters())["token_values"] = "0,1";
    return s;
  }()), StatusIs(absl::StatusCode::kInvalidArgument, "2 token_values but 1"));
}

TEST(FeatureImportanceOverweight, AFewDominantFeaturesFire) {
  auto rule = Make("FeatureImportanceOverweight");
  StepBuilder skewed(0, *rule);
  skewed.Add("feature_importance/weight", std::vector<float>{50, 30, 10, 5, 5}, {5});
  auto r = rule->OnStep(skewed.data());
  ASSERT_TRUE(r->has_value());
  EXPECT_NEAR((*r)->observed, 0.9, 1e-6);
  // One scalar tensor per feature, as smdebug's XGBoost hook saves them.
  StepBuilder spread(1, *rule);
  for (int f = 0; f < 10; ++f) {
    spread.Add("feature_importance/weight/f" + std::to_string(f), std::vector<float>{1.0f}, {});
  }
  EXPECT_FALSE(rule->OnStep(spread.data())->has_value());
}

TEST(TreeDepth, ShallowTreesFireDeepOnesDoNot) {
  auto rule = Make("TreeDepth");
  StepBuilder shallow(0, *rule);
  shallow.Add("trees/node_id", std::vector<float>{0, 1, 2, 3, 4, 5, 6}, {7});  // depth 2
  auto r = rule->OnStep(shallow.data());
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ((*r)->observed, 2.0);
  StepBuilder deep(1, *rule);
  deep.Add("trees/node_id", std::vector<float>{0, 1, 2, 14, 30}, {5});  // depth 4
  EXPECT_FALSE(rule->OnStep(deep.data())->has_value());
}

TEST(ValueRules, AskOnlyForTheTensorsTheyRead) {
  auto dead = Make("DeadRelu");
  v1::TensorRecord relu, weight;
  relu.set_tensor_name("Net_relu_output");
  weight.set_tensor_name("Net_fc1.weight");
  weight.add_collections("weights");
  EXPECT_TRUE(dead->WantsValues(relu));
  EXPECT_FALSE(dead->WantsValues(weight));
  EXPECT_TRUE(Make("WeightUpdateRatio")->WantsValues(weight));
  EXPECT_FALSE(Make("ExplodingTensor")->WantsValues(weight));
}

}  // namespace
}  // namespace sonde::rules
