#include "rules/plugin_loader.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "stats/statistics.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace sonde::rules {
namespace {

using ::sonde::testing::StatusIs;

std::string PluginPath() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir ? srcdir : ".", "/", workspace ? workspace : "sonde",
                      "/examples/rule_plugin/liblarge_weights.so");
}

v1::TensorRecord Weight(const std::string& name, std::vector<float> v) {
  v1::TensorRecord r;
  r.set_tensor_name(name);
  r.add_collections("weights");
  r.set_worker(1);
  *r.mutable_statistics() = *ComputeStatistics(
      std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4), v1::DTYPE_F32);
  return r;
}

StepData Step(int64_t s, std::vector<v1::TensorRecord> t) {
  StepData d;
  d.step = s;
  d.mode = v1::MODE_TRAIN;
  d.mode_step = s;
  d.tensors = std::move(t);
  return d;
}

TEST(RulePlugin, ItsRuleTypesJoinTheCatalogue) {
  RuleFactory factory;
  SONDE_ASSERT_OK(LoadRulePlugin(PluginPath(), factory));
  const RuleInfo* info = factory.Find("LargeWeights");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->source, PluginPath());
  ASSERT_EQ(info->parameters.size(), 2u);
  EXPECT_EQ(info->parameters[0].name, "threshold");
  EXPECT_EQ(info->parameters[0].default_value, "10");
  EXPECT_EQ(info->default_collections, std::vector<std::string>{"weights"});
  // Loading twice clashes on the name.
  EXPECT_THAT(LoadRulePlugin(PluginPath(), factory),
              StatusIs(absl::StatusCode::kAlreadyExists, "LargeWeights"));
}

TEST(RulePlugin, RulesFromThePluginFireAndStayQuiet) {
  RuleFactory factory;
  SONDE_ASSERT_OK(LoadRulePlugin(PluginPath(), factory));
  v1::RuleSpec spec;
  spec.set_rule_type("LargeWeights");
  (*spec.mutable_parameters())["threshold"] = "5";
  (*spec.mutable_parameters())["patience"] = "2";
  auto rule = factory.Create(spec);
  SONDE_ASSERT_OK(rule);
  auto quiet = (*rule)->OnStep(Step(0, {Weight("fc1.weight", {1, -2})}));
  SONDE_ASSERT_OK(quiet);
  EXPECT_FALSE(quiet->has_value());
  EXPECT_FALSE((*rule)->OnStep(Step(1, {Weight("fc1.weight", {1, -7})}))->has_value());
  auto fired = (*rule)->OnStep(Step(2, {Weight("fc1.weight", {1, -8})}));
  SONDE_ASSERT_OK(fired);
  ASSERT_TRUE(fired->has_value());
  EXPECT_EQ((*fired)->message, "weights 'fc1.weight' reach 8 at step 2 (threshold 5)");
  EXPECT_EQ((*fired)->tensors, std::vector<std::string>{"fc1.weight"});
  EXPECT_EQ((*fired)->worker, 1);
  EXPECT_EQ((*fired)->observed, 8);
  EXPECT_EQ((*fired)->threshold, 5);
}

TEST(RulePlugin, ThePluginChecksItsParameters) {
  RuleFactory factory;
  SONDE_ASSERT_OK(LoadRulePlugin(PluginPath(), factory));
  v1::RuleSpec spec;
  spec.set_rule_type("LargeWeights");
  (*spec.mutable_parameters())["threshold"] = "-1";
  EXPECT_THAT(factory.Create(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, "threshold='-1' must be a positive"));
  spec.mutable_parameters()->clear();
  (*spec.mutable_parameters())["colour"] = "red";
  EXPECT_THAT(factory.Create(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown parameter 'colour'"));
}

TEST(RulePlugin, BadLibrariesAreRefusedWithTheReason) {
  RuleFactory factory;
  EXPECT_THAT(LoadRulePlugin("/nonexistent/libnothing.so", factory),
              StatusIs(absl::StatusCode::kNotFound, "libnothing.so"));
  // A real shared library without the entry point: the C library.
  EXPECT_THAT(LoadRulePlugin("libc.so.6", factory),
              StatusIs(absl::StatusCode::kInvalidArgument, "does not export sonde_rules_v1"));
  EXPECT_TRUE(factory.Catalog().empty());
}

}  // namespace
}  // namespace sonde::rules
