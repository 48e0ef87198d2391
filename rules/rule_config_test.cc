#include "rules/rule_config.h"

#include <fstream>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace sonde::rules {
namespace {

using ::sonde::testing::StatusIs;

TEST(RuleFlag, ParsesTypesParametersNamesAndActions) {
  auto specs = ParseRuleFlag(
      "ExplodingTensor(actions=StopTraining); LossNotDecreasing(name=loss_fast, num_steps=5)");
  SONDE_ASSERT_OK(specs);
  ASSERT_EQ(specs->size(), 2u);
  EXPECT_EQ((*specs)[0].name(), "ExplodingTensor");
  ASSERT_EQ((*specs)[0].actions_size(), 1);
  EXPECT_EQ((*specs)[0].actions(0), "StopTraining");
  EXPECT_EQ((*specs)[1].name(), "loss_fast");
  EXPECT_EQ((*specs)[1].parameters().at("num_steps"), "5");
  EXPECT_TRUE(ParseRuleFlag("")->empty());
}

TEST(RuleFlag, RejectsMalformedAndUnknown) {
  EXPECT_THAT(ParseRuleFlag("ExplodingTensor(only_nan"),
              StatusIs(absl::StatusCode::kInvalidArgument, "missing ')'"));
  EXPECT_THAT(ParseRuleFlag("ExplodingTensor(only_nan)"),
              StatusIs(absl::StatusCode::kInvalidArgument, "not key=value"));
  EXPECT_THAT(ParseRuleFlag("ExplodingTensor(actions=Reboot)"),
              StatusIs(absl::StatusCode::kInvalidArgument, "Reboot"));
  EXPECT_THAT(ParseRuleFlag("ExplodingTensor(actions=Webhook:ftp://host/x)"),
              StatusIs(absl::StatusCode::kInvalidArgument, "must start with http"));
  EXPECT_THAT(ParseRuleFlag("ExplodingTensor(actions=Email:ops)"),
              StatusIs(absl::StatusCode::kInvalidArgument, "'ops' is not a mail address"));
  EXPECT_THAT(ParseRuleFlag("ExplodingTensor(actions=Email:Ops <ops@example.com>)"),
              StatusIs(absl::StatusCode::kInvalidArgument, "is not a mail address"));
  auto ok = ParseRuleFlag(
      "ExplodingTensor(actions=Log|Webhook:https://example.invalid/h|Email:ops@example.com)");
  SONDE_ASSERT_OK(ok);
  EXPECT_EQ((*ok)[0].actions_size(), 3);
  EXPECT_EQ((*ok)[0].actions(2), "Email:ops@example.com");
}

TEST(RulesJson, ReadsOurShapeAndSageMakersSpelling) {
  auto specs = ParseRulesJson(R"({"rules": [
      {"name": "nan_only", "rule_type": "ExplodingTensor",
       "rule_parameters": {"only_nan": true}, "actions": ["StopTraining"]},
      {"RuleConfigurationName": "LossNotDecreasing",
       "RuleParameters": {"rule_to_invoke": "LossNotDecreasing", "num_steps": 20}}]})");
  SONDE_ASSERT_OK(specs);
  ASSERT_EQ(specs->size(), 2u);
  EXPECT_EQ((*specs)[0].parameters().at("only_nan"), "true");
  EXPECT_EQ((*specs)[1].rule_type(), "LossNotDecreasing");
  EXPECT_EQ((*specs)[1].parameters().at("num_steps"), "20");
}

TEST(RulesJson, ReadsCollectionsToSave) {
  auto specs = ParseRulesJson(R"([{"rule_type": "VanishingGradient",
      "collections_to_save": [
          {"name": "gradients", "parameters": {"save_interval": "5", "eval.save_interval": 1}},
          {"CollectionName": "biases", "CollectionParameters": null}]}])");
  SONDE_ASSERT_OK(specs);
  const v1::RuleSpec& spec = (*specs)[0];
  ASSERT_EQ(spec.collections_to_save_size(), 2);
  EXPECT_EQ(spec.collections_to_save(0).name(), "gradients");
  EXPECT_EQ(spec.collections_to_save(0).parameters().at("save_interval"), "5");
  EXPECT_EQ(spec.collections_to_save(0).parameters().at("eval.save_interval"), "1");
  EXPECT_EQ(spec.collections_to_save(1).name(), "biases");
  EXPECT_TRUE(spec.collections_to_save(1).parameters().empty());
  // SageMaker's own example: a regex, reductions, lists.
  auto custom = ParseRulesJson(R"([{"rule_type": "DeadRelu", "collections_to_save": [
      {"CollectionName": "custom_relu", "CollectionParameters": {
          "include_regex": ".*relu_output, .*act", "save_interval": "500",
          "reductions": "mean,max", "save_raw_tensor": "True", "save_steps": [1, 2]}}]}])");
  SONDE_ASSERT_OK(custom);
  const v1::CollectionRequest& c = (*custom)[0].collections_to_save(0);
  EXPECT_EQ(c.include_regex_size(), 2);
  EXPECT_EQ(c.include_regex(1), ".*act");
  EXPECT_TRUE(c.values());
  EXPECT_EQ(c.parameters().size(), 2u);  // the reductions are kept as statistics anyway
  EXPECT_EQ(c.parameters().at("save_steps"), "1,2");
}

TEST(RulesJson, RejectsBadDocuments) {
  EXPECT_THAT(ParseRulesJson("{"), StatusIs(absl::StatusCode::kInvalidArgument, "not valid JSON"));
  EXPECT_THAT(ParseRulesJson(R"({"rules": [{"rule_type": "ExplodingTensor", "colour": 1}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "colour"));
  EXPECT_THAT(ParseRulesJson(R"([{"rule_parameters": {"only_nan": "true"}}])"),
              StatusIs(absl::StatusCode::kInvalidArgument, "no rule_type"));
  // Save settings are checked at the collector, not in training.
  EXPECT_THAT(ParseRulesJson(R"([{"rule_type": "ExplodingTensor", "collections_to_save": [
                  {"name": "weights", "parameters": {"save_intervall": "5"}}]}])"),
              StatusIs(absl::StatusCode::kInvalidArgument, "save_intervall"));
  EXPECT_THAT(ParseRulesJson(R"([{"rule_type": "ExplodingTensor", "collections_to_save": [
                  {"name": "weights", "parameters": {"save_interval": "0"}}]}])"),
              StatusIs(absl::StatusCode::kInvalidArgument, "collection 'weights'"));
  EXPECT_THAT(ParseRulesJson(R"([{"rule_type": "ExplodingTensor", "collections_to_save": [
                  {"parameters": {"save_interval": "5"}}]}])"),
              StatusIs(absl::StatusCode::kInvalidArgument, "no name"));
  EXPECT_THAT(ParseRulesJson(R"([{"rule_type": "ExplodingTensor", "collections_to_save": [
                  {"name": "w", "regex": "x"}]}])"),
              StatusIs(absl::StatusCode::kInvalidArgument, "'regex'"));
  EXPECT_THAT(ParseRulesJson(R"([{"rule_type": "ExplodingTensor", "collections_to_save": [
                  {"name": "w", "parameters": {"include_regex": "(["}}]}])"),
              StatusIs(absl::StatusCode::kInvalidArgument, "collection 'w'"));
}

TEST(DefaultRules, TheFileWhenNamedTheFlagOtherwise) {
  auto from_flag = LoadDefaultRules("ExplodingTensor;LossNotDecreasing", "");
  SONDE_ASSERT_OK(from_flag);
  EXPECT_EQ(from_flag->size(), 2u);
  ::sonde::testing::TempDir dir;
  const std::string file = dir.Sub("rules.json");
  std::ofstream(file) << R"({"rules": [{"rule_type": "ExplodingTensor",
                                       "actions": ["Email:ops@example.com"]}]})";
  auto from_file = LoadDefaultRules("ExplodingTensor;LossNotDecreasing", file);
  SONDE_ASSERT_OK(from_file);
  ASSERT_EQ(from_file->size(), 1u);
  EXPECT_EQ((*from_file)[0].actions(0), "Email:ops@example.com");
  EXPECT_THAT(LoadDefaultRules("", dir.Sub("missing.json")),
              StatusIs(absl::StatusCode::kNotFound, "cannot read --rules_config"));
  const std::string bad = dir.Sub("bad.json");
  std::ofstream(bad) << R"({"rules": [{"rule_type": "ExplodingTensor", "actions": ["Email:x"]}]})";
  EXPECT_THAT(LoadDefaultRules("", bad),
              StatusIs(absl::StatusCode::kInvalidArgument, "bad.json: rule 'ExplodingTensor': 'x'"));
}

}  // namespace
}  // namespace sonde::rules
