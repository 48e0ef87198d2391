#include "client/collections.h"
#include "client/hook_config_json.h"
#include "client/save_config.h"

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace sonde {
namespace {

using ::sonde::testing::StatusIs;

std::vector<int64_t> SavedSteps(const SaveConfigMode& m, int64_t upto) {
  std::vector<int64_t> out;
  for (int64_t s = 0; s < upto; ++s) {
    if (m.ShouldSave(s)) out.push_back(s);
  }
  return out;
}

TEST(SaveConfig, DefaultIntervalIs500FromStepZero) {
  SaveConfigMode m;
  EXPECT_EQ(SavedSteps(m, 1501), (std::vector<int64_t>{0, 500, 1000, 1500}));
}

TEST(SaveConfig, IntervalCountsFromStepZeroNotStartStep) {
  // smdebug's documented case: save_interval=100, start_step=150 saves 200, 300, ...
  SaveConfigMode m;
  m.save_interval = 100;
  m.start_step = 150;
  EXPECT_EQ(SavedSteps(m, 401), (std::vector<int64_t>{200, 300, 400}));
}

TEST(SaveConfig, EndStepIsExclusive) {
  SaveConfigMode m;
  m.save_interval = 5;
  m.end_step = 15;
  EXPECT_EQ(SavedSteps(m, 30), (std::vector<int64_t>{0, 5, 10}));
}

TEST(SaveConfig, SaveStepsAreAddedToTheInterval) {
  // smdebug: SaveConfig(save_steps=[3,7]) saves 0, 3, 7, 500, ...
  SaveConfigMode m;
  m.save_steps = {3, 7};
  EXPECT_EQ(SavedSteps(m, 501), (std::vector<int64_t>{0, 3, 7, 500}));
}

TEST(SaveConfig, ModePrefixedKeysOverrideForThatModeOnly) {
  auto c = SaveConfig::FromParameters(
      {{"save_interval", "10"}, {"eval.save_interval", "3"}, {"train.save_steps", "7,11"}});
  SONDE_ASSERT_OK(c);
  EXPECT_TRUE(c->ShouldSave(v1::MODE_TRAIN, 10));
  EXPECT_FALSE(c->ShouldSave(v1::MODE_TRAIN, 3));
  EXPECT_TRUE(c->ShouldSave(v1::MODE_TRAIN, 7));
  EXPECT_TRUE(c->ShouldSave(v1::MODE_EVAL, 3));
  EXPECT_FALSE(c->ShouldSave(v1::MODE_EVAL, 7));
  EXPECT_TRUE(c->ShouldSave(v1::MODE_GLOBAL, 20));
}

TEST(SaveConfig, CollectionParametersOverrideHookParameters) {
  auto c = SaveConfig::FromParameters({{"save_interval", "10"}, {"start_step", "20"}},
                                      {{"save_interval", "4"}});
  SONDE_ASSERT_OK(c);
  EXPECT_FALSE(c->ShouldSave(v1::MODE_TRAIN, 16));  // start_step from the hook still applies
  EXPECT_TRUE(c->ShouldSave(v1::MODE_TRAIN, 24));
}

TEST(SaveConfig, RejectsBadValues) {
  EXPECT_THAT(SaveConfig::FromParameters({{"save_interval", "0"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "save_interval='0'"));
  EXPECT_THAT(SaveConfig::FromParameters({{"save_steps", "1,x"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "save_steps"));
}

TEST(ReductionConfig, ParsesSmdebugReductionStrings) {
  auto r = ReductionConfig::FromString("mean, abs_max, l2_norm, abs_l1_norm", false);
  SONDE_ASSERT_OK(r);
  EXPECT_EQ(r->reductions, std::vector<std::string>{"mean"});
  EXPECT_EQ(r->abs_reductions, std::vector<std::string>{"max"});
  EXPECT_EQ(r->norms, std::vector<std::string>{"l2"});
  EXPECT_EQ(r->abs_norms, std::vector<std::string>{"l1"});
  EXPECT_THAT(ReductionConfig::FromString("median", false),
              StatusIs(absl::StatusCode::kInvalidArgument, "median"));
}

TEST(Collections, OnlyLossesAreSavedByDefault) {
  auto set = CollectionSet::Create(HookConfig{});
  SONDE_ASSERT_OK(set);
  EXPECT_FALSE(set->Decide("fc1.weight", {}, v1::MODE_TRAIN, 0).save);
  SaveDecision loss = set->Decide("loss", {"losses"}, v1::MODE_TRAIN, 0);
  EXPECT_TRUE(loss.save);
  EXPECT_TRUE(loss.values);
  EXPECT_FALSE(set->Decide("loss", {"losses"}, v1::MODE_TRAIN, 1).save);  // interval 500
}

TEST(Collections, BuiltInRegexesFollowPyTorchNames) {
  HookConfig config;
  config.include_collections = {"weights", "biases", "gradients"};
  config.save_config = SaveConfig::Every(1);
  auto set = CollectionSet::Create(config);
  SONDE_ASSERT_OK(set);
  EXPECT_EQ(set->Decide("Net_fc1.weight", {}, v1::MODE_TRAIN, 0).collections,
            std::vector<std::string>{"weights"});
  EXPECT_EQ(set->Decide("gradient/Net_fc1.weight", {}, v1::MODE_TRAIN, 0).collections,
            std::vector<std::string>{"gradients"});
  EXPECT_EQ(set->Decide("Net_fc1.bias", {}, v1::MODE_TRAIN, 0).collections,
            std::vector<std::string>{"biases"});
  EXPECT_EQ(set->Decide("CrossEntropyLoss_output_0", {}, v1::MODE_TRAIN, 0).collections,
            std::vector<std::string>{"losses"});
}

TEST(Collections, AnyDueFollowsEveryIncludedCollectionsSaveConfig) {
  HookConfig config;
  config.save_config = SaveConfig::Every(100);
  CollectionConfig weights;
  weights.name = "weights";
  weights.save_config = SaveConfig::Every(7);
  config.collections = {weights};
  auto set = CollectionSet::Create(config);
  SONDE_ASSERT_OK(set);
  for (int64_t step = 0; step < 300; ++step) {
    // losses (the hook's interval 100) or weights (its own 7).
    const bool expected = step % 100 == 0 || step % 7 == 0;
    EXPECT_EQ(set->AnyDue(v1::MODE_TRAIN, step), expected) << step;
    // AnyDue is never false where Decide would save.
    if (!set->AnyDue(v1::MODE_TRAIN, step)) {
      EXPECT_FALSE(set->Decide("Net_fc1.weight", {}, v1::MODE_TRAIN, step).save);
      EXPECT_FALSE(set->Decide("MSELoss_output_0", {}, v1::MODE_TRAIN, step).save);
    }
  }
}

TEST(Collections, IncludeSavesACollectionFromThenOn) {
  HookConfig config;
  config.save_config = SaveConfig::Every(1);
  auto set = CollectionSet::Create(config);
  SONDE_ASSERT_OK(set);
  EXPECT_FALSE(set->Decide("lr", {"custom"}, v1::MODE_TRAIN, 0).save);
  set->Include("custom");
  SaveDecision d = set->Decide("lr", {"custom"}, v1::MODE_TRAIN, 1);
  EXPECT_TRUE(d.save);
  EXPECT_EQ(d.collections, std::vector<std::string>{"custom"});
}

TEST(Collections, GradientsAreNotSavedInEvalMode) {
  HookConfig config;
  config.include_collections = {"gradients"};
  config.save_config = SaveConfig::Every(1);
  auto set = CollectionSet::Create(config);
  SONDE_ASSERT_OK(set);
  EXPECT_TRUE(set->Decide("gradient/w", {}, v1::MODE_TRAIN, 3).save);
  EXPECT_FALSE(set->Decide("gradient/w", {}, v1::MODE_EVAL, 3).save);
}

TEST(Collections, ReductionsWithoutRawMeanStatisticsOnlyExceptForLosses) {
  HookConfig config;
  config.include_collections = {"weights"};
  config.save_config = SaveConfig::Every(1);
  config.reduction_config = ReductionConfig{{"mean"}, {}, {}, {}, false};
  auto set = CollectionSet::Create(config);
  SONDE_ASSERT_OK(set);
  SaveDecision w = set->Decide("w", {"weights"}, v1::MODE_TRAIN, 0);
  EXPECT_TRUE(w.save);
  EXPECT_FALSE(w.values);
  EXPECT_TRUE(set->Decide("loss", {"losses"}, v1::MODE_TRAIN, 0).values);
}

TEST(Collections, CustomCollectionWithItsOwnIntervalAndSaveAll) {
  HookConfig config;
  config.save_config = SaveConfig::Every(100);
  CollectionConfig relu;
  relu.name = "custom_relu_collection";
  relu.include_regex = {"relu"};
  relu.save_config = SaveConfig::Every(20);
  config.collections = {relu};
  auto set = CollectionSet::Create(config);
  SONDE_ASSERT_OK(set);
  EXPECT_TRUE(set->Decide("layer1_relu_output_0", {}, v1::MODE_TRAIN, 40).save);
  EXPECT_FALSE(set->Decide("layer1_conv_output_0", {}, v1::MODE_TRAIN, 40).save);
  config.save_all = true;
  auto all = CollectionSet::Create(config);
  EXPECT_TRUE(all->Decide("layer1_conv_output_0", {}, v1::MODE_TRAIN, 100).save);
}

TEST(Collections, AllHoldsEveryTensorHoweverItIsIncluded) {
  HookConfig config;
  config.save_config = SaveConfig::Every(1);
  auto plain = CollectionSet::Create(config);
  SONDE_ASSERT_OK(plain);
  EXPECT_FALSE(plain->Decide("layer1_conv_output_0", {}, v1::MODE_TRAIN, 0).save);
  // As smdebug's include_collections=["all"].
  config.include_collections = {"all"};
  auto included = CollectionSet::Create(config);
  SONDE_ASSERT_OK(included);
  EXPECT_TRUE(included->Decide("layer1_conv_output_0", {}, v1::MODE_TRAIN, 0).save);
  EXPECT_TRUE(included->Decide("layer1_conv_output_0", {}, v1::MODE_TRAIN, 0).values);
  // A rule's request for it (collection_names=all).
  v1::CollectionRequest all;
  all.set_name("all");
  all.add_include_regex(".*");
  SONDE_ASSERT_OK(plain->Require(all));
  SaveDecision d = plain->Decide("layer1_conv_output_0", {}, v1::MODE_TRAIN, 0);
  EXPECT_TRUE(d.save);
  EXPECT_TRUE(d.collections.empty());  // membership of "all" stays implicit
}

TEST(Collections, ARulesRequestIncludesItsCollectionWithValues) {
  HookConfig config;
  config.save_config = SaveConfig::Every(1);
  config.reduction_config = ReductionConfig{{"mean"}, {}, {}, {}, false};  // statistics only
  CollectionConfig weights;
  weights.name = "weights";
  weights.save_config = SaveConfig::Every(10);
  config.collections = {weights};
  auto set = CollectionSet::Create(config);
  SONDE_ASSERT_OK(set);
  EXPECT_FALSE(set->Decide("Net_relu_output", {}, v1::MODE_TRAIN, 0).save);
  v1::CollectionRequest relu;
  relu.set_name("relu_output");
  relu.add_include_regex(".*relu_output");
  relu.set_values(true);
  SONDE_ASSERT_OK(set->Require(relu));
  SaveDecision d = set->Decide("Net_relu_output", {}, v1::MODE_TRAIN, 3);
  EXPECT_TRUE(d.save);
  EXPECT_TRUE(d.values);  // the rule reads values, whatever the reductions say
  // A collection the user configured keeps the user's interval.
  v1::CollectionRequest w;
  w.set_name("weights");
  (*w.mutable_parameters())["save_interval"] = "1";
  SONDE_ASSERT_OK(set->Require(w));
  EXPECT_FALSE(set->Decide("Net_fc1.weight", {}, v1::MODE_TRAIN, 3).save);
  EXPECT_TRUE(set->Decide("Net_fc1.weight", {}, v1::MODE_TRAIN, 10).save);
  v1::CollectionRequest bad;
  bad.set_name("x");
  bad.add_include_regex("([");
  EXPECT_THAT(set->Require(bad), StatusIs(absl::StatusCode::kInvalidArgument, "regex"));
}

TEST(Collections, ARulesSaveSettingsAddToWhatIsSavedNeverThinIt) {
  HookConfig config;
  config.save_config = SaveConfig::Every(4);
  auto set = CollectionSet::Create(config);
  SONDE_ASSERT_OK(set);
  // losses (always included) every 4 steps; a rule asking for every 10
  // adds steps 10, 20, ... and keeps 4, 8, ...
  v1::CollectionRequest losses;
  losses.set_name("losses");
  (*losses.mutable_parameters())["save_interval"] = "10";
  SONDE_ASSERT_OK(set->Require(losses));
  for (int64_t s : {0, 4, 8, 10, 12, 20}) {
    EXPECT_TRUE(set->Decide("CrossEntropyLoss_output_0", {}, v1::MODE_TRAIN, s).save) << s;
  }
  EXPECT_FALSE(set->Decide("CrossEntropyLoss_output_0", {}, v1::MODE_TRAIN, 6).save);
  // A collection only a rule asks for follows the rule's settings, on top
  // of the hook's: start_step alone keeps the hook's interval (4).
  v1::CollectionRequest relu;
  relu.set_name("relu_output");
  relu.add_include_regex(".*relu_output");
  (*relu.mutable_parameters())["start_step"] = "8";
  SONDE_ASSERT_OK(set->Require(relu));
  EXPECT_FALSE(set->Decide("fc_relu_output_0", {}, v1::MODE_TRAIN, 4).save);
  EXPECT_TRUE(set->Decide("fc_relu_output_0", {}, v1::MODE_TRAIN, 8).save);
  EXPECT_FALSE(set->Decide("fc_relu_output_0", {}, v1::MODE_TRAIN, 10).save);
  // A second rule's settings for it are added to the first's.
  v1::CollectionRequest again = relu;
  (*again.mutable_parameters())["save_steps"] = "5";
  SONDE_ASSERT_OK(set->Require(again));
  EXPECT_TRUE(set->Decide("fc_relu_output_0", {}, v1::MODE_TRAIN, 5).save);
  EXPECT_TRUE(set->Decide("fc_relu_output_0", {}, v1::MODE_TRAIN, 12).save);
}

TEST(Collections, ABareRequestForAllFromAnOlderCollectorSavesNothingMore) {
  HookConfig config;
  config.save_config = SaveConfig::Every(1);
  auto set = CollectionSet::Create(config);
  SONDE_ASSERT_OK(set);
  v1::CollectionRequest bare;
  bare.set_name("all");
  SONDE_ASSERT_OK(set->Require(bare));
  EXPECT_FALSE(set->Decide("layer1_conv_output_0", {}, v1::MODE_TRAIN, 0).save);
  EXPECT_EQ(set->DueCollections(v1::MODE_TRAIN, 0), std::vector<std::string>{"losses"});
  v1::CollectionRequest every = bare;
  every.add_include_regex(".*");  // collection_names=all, from this collector
  SONDE_ASSERT_OK(set->Require(every));
  EXPECT_TRUE(set->Decide("layer1_conv_output_0", {}, v1::MODE_TRAIN, 0).save);
}

// Decisions are worked out once a mode step for all tensors; a change in
// the middle of a step, or another mode at the same step number, is seen
// by the next decision.
TEST(Collections, DecisionsFollowChangesWithinAStep) {
  HookConfig config;
  config.save_config = SaveConfig::Every(1);
  config.include_collections = {"gradients"};
  auto set = CollectionSet::Create(config);
  SONDE_ASSERT_OK(set);
  EXPECT_TRUE(set->Decide("Net_fc1.weight_grad", {"gradients"}, v1::MODE_TRAIN, 3).save);
  EXPECT_FALSE(set->Decide("Net_fc1.weight_grad", {"gradients"}, v1::MODE_EVAL, 3).save);
  EXPECT_FALSE(set->Decide("my_tensor", {}, v1::MODE_TRAIN, 3).save);
  set->AddToCollection("gradients", "my_tensor");
  EXPECT_TRUE(set->Decide("my_tensor", {}, v1::MODE_TRAIN, 3).save);
  EXPECT_FALSE(set->Decide("other", {"custom"}, v1::MODE_TRAIN, 3).save);
  set->Include("custom");
  SaveDecision d = set->Decide("other", {"custom"}, v1::MODE_TRAIN, 3);
  EXPECT_TRUE(d.save);
  EXPECT_TRUE(d.values);  // no reductions configured: values
  EXPECT_EQ(d.collections, std::vector<std::string>{"custom"});
}

TEST(HookConfigJson, ReadsSageMakersShape) {
  auto parsed = ParseHookConfigJson(R"({
      "S3OutputPath": "s3://bucket/prefix", "LocalPath": "/tmp/out",
      "HookParameters": {"save_interval": "2", "save_all": "false",
                         "include_regex": "fc1.*,fc2.*", "include_workers": "one",
                         "reductions": "mean,abs_max", "collector": "10.0.0.2:7070",
                         "job": "my-job"},
      "CollectionConfigurations": [
          {"CollectionName": "weights", "CollectionParameters": {"train.save_interval": "5"}},
          {"CollectionName": "losses", "CollectionParameters": null}]})");
  SONDE_ASSERT_OK(parsed);
  const HookConfig& c = parsed->config;
  EXPECT_EQ(c.include_regex, (std::vector<std::string>{"fc1.*", "fc2.*"}));
  ASSERT_TRUE(c.reduction_config.has_value());
  EXPECT_EQ(c.reduction_config->reductions, std::vector<std::string>{"mean"});
  EXPECT_TRUE(c.save_config.ShouldSave(v1::MODE_TRAIN, 2));
  ASSERT_EQ(c.collections.size(), 2u);
  ASSERT_TRUE(c.collections[0].save_config.has_value());
  EXPECT_TRUE(c.collections[0].save_config->ShouldSave(v1::MODE_TRAIN, 5));
  EXPECT_FALSE(c.collections[0].save_config->ShouldSave(v1::MODE_TRAIN, 2));
  EXPECT_TRUE(c.collections[0].save_config->ShouldSave(v1::MODE_EVAL, 2));
  EXPECT_FALSE(c.collections[1].save_config.has_value());
  EXPECT_EQ(parsed->sonde_parameters.at("collector"), "10.0.0.2:7070");
  EXPECT_EQ(parsed->sonde_parameters.at("job"), "my-job");
}

TEST(HookConfigJson, RejectsTyposAndMalformedDocuments) {
  EXPECT_THAT(ParseHookConfigJson("[1]"),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a JSON object"));
  EXPECT_THAT(ParseHookConfigJson(R"({"HookParameters": {"save_intervall": "2"}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "save_intervall"));
  EXPECT_THAT(ParseHookConfigJson(R"({"CollectionConfigurations": [{"CollectionParameters": {}}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "CollectionName"));
  EXPECT_THAT(ParseHookConfigJson(R"({"HookParameters": {"save_all": "maybe"}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "maybe"));
  EXPECT_THAT(ParseHookConfigJson(R"({"HookParameters": {"export_tensorboard": "yes"}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "export_tensorboard='yes'"));
  EXPECT_THAT(ParseHookConfigJson(R"({"HookParameters": {"include_workers": "some"}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "include_workers='some'"));
}

TEST(HookConfigJson, TensorBoardAndWorkersAreReadOtherSmdebugKeysAccepted) {
  auto parsed = ParseHookConfigJson(R"({"HookParameters": {
      "export_tensorboard": "True", "tensorboard_dir": "/opt/ml/output/tensorboard",
      "include_workers": "All", "dry_run": "false", "save_shape": "true"}})");
  SONDE_ASSERT_OK(parsed);
  EXPECT_EQ(parsed->sonde_parameters.at("export_tensorboard"), "true");
  EXPECT_EQ(parsed->sonde_parameters.at("include_workers"), "all");
  EXPECT_EQ(parsed->sonde_parameters.count("tensorboard_dir"), 0u);
}

}  // namespace
}  // namespace sonde
