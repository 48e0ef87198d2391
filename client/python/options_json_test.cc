#include "client/python/options_json.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace sonde {
namespace {

using ::sonde::testing::StatusIs;

TEST(PythonHookOptions, EveryFieldReachesHookOptions) {
  auto parsed = ParsePythonHookOptions(R"j({
    "collector": "10.0.0.1:7070", "job": "digits", "worker": 3, "world_size": 4,
    "metadata": {"lr": "0.1"}, "rules": "ExplodingTensor(actions=StopTraining);LossNotDecreasing",
    "token": "t0k", "ca_file": "/ca.pem", "max_queue_bytes": 1024, "max_chunk_bytes": 512,
    "backpressure": "block", "max_block_seconds": 0.25, "close_timeout_seconds": 5,
    "defer_device_reads": true,
    "config": {
      "save_config": {"1": {"save_interval": 10, "start_step": 2, "end_step": 50, "save_steps": [7]},
                      "2": {"save_interval": 1}},
      "reduction_config": {"reductions": ["mean"], "abs_norms": ["l2"]},
      "include_regex": ["fc1.*"], "include_collections": ["weights"], "save_all": true,
      "collections": [{"name": "acts", "include_regex": ["relu"], "save_histogram": true,
                       "save_config": {"4": {"save_interval": 3}}, "reduction_config": null}]}})j");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const HookOptions& h = parsed->options;
  EXPECT_EQ(h.collector, "10.0.0.1:7070");
  EXPECT_EQ(h.job, "digits");
  EXPECT_EQ(h.worker, 3);
  EXPECT_EQ(h.world_size, 4);
  EXPECT_EQ(h.metadata.at("lr"), "0.1");
  ASSERT_EQ(h.rules.size(), 2u);
  EXPECT_EQ(h.rules[0].rule_type(), "ExplodingTensor");
  EXPECT_EQ(h.security.token, "t0k");
  EXPECT_EQ(h.security.ca_file, "/ca.pem");
  EXPECT_EQ(h.max_queue_bytes, 1024u);
  EXPECT_EQ(h.max_chunk_bytes, 512u);
  EXPECT_EQ(h.backpressure.policy, BackpressurePolicy::kBlock);
  EXPECT_EQ(h.backpressure.max_block, absl::Milliseconds(250));
  EXPECT_EQ(h.close_timeout, absl::Seconds(5));
  EXPECT_TRUE(h.device.defer_producer_wait);
  const SaveConfigMode& train = h.config.save_config.Get(v1::MODE_TRAIN);
  EXPECT_EQ(train.save_interval, 10);
  EXPECT_EQ(train.start_step, 2);
  EXPECT_EQ(train.end_step, 50);
  EXPECT_TRUE(h.config.save_config.ShouldSave(v1::MODE_TRAIN, 7));
  EXPECT_EQ(h.config.save_config.Get(v1::MODE_EVAL).save_interval, 1);
  EXPECT_EQ(h.config.save_config.Get(v1::MODE_PREDICT).save_interval, 500);
  ASSERT_TRUE(h.config.reduction_config.has_value());
  EXPECT_EQ(h.config.reduction_config->reductions, std::vector<std::string>{"mean"});
  EXPECT_EQ(h.config.reduction_config->abs_norms, std::vector<std::string>{"l2"});
  EXPECT_EQ(h.config.include_regex, std::vector<std::string>{"fc1.*"});
  EXPECT_EQ(h.config.include_collections, std::vector<std::string>{"weights"});
  EXPECT_TRUE(h.config.save_all);
  ASSERT_EQ(h.config.collections.size(), 1u);
  const CollectionConfig& acts = h.config.collections[0];
  EXPECT_EQ(acts.name, "acts");
  EXPECT_TRUE(acts.save_histogram);
  ASSERT_TRUE(acts.save_config.has_value());
  EXPECT_EQ(acts.save_config->Get(v1::MODE_GLOBAL).save_interval, 3);
  EXPECT_FALSE(acts.reduction_config.has_value());
}

TEST(PythonHookOptions, DefaultsAreTheCHooksDefaults) {
  auto parsed = ParsePythonHookOptions(R"({"job": "j"})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const HookOptions defaults;
  EXPECT_EQ(parsed->options.collector, defaults.collector);
  EXPECT_EQ(parsed->options.max_queue_bytes, defaults.max_queue_bytes);
  EXPECT_EQ(parsed->options.backpressure.policy, BackpressurePolicy::kSpill);
  EXPECT_FALSE(parsed->options.device.defer_producer_wait);
  EXPECT_FALSE(parsed->options.config.reduction_config.has_value());
  EXPECT_TRUE(parsed->config_file.empty());
}

TEST(PythonHookOptions, ProfilerOptions) {
  auto parsed = ParsePythonHookOptions(
      R"({"profiler": {"enabled": true, "interval_seconds": 0.1, "system": false}})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->options.profiler.enabled);
  EXPECT_EQ(parsed->options.profiler.interval, absl::Milliseconds(100));
  EXPECT_FALSE(parsed->options.profiler.system);
  EXPECT_TRUE(parsed->options.profiler.framework);
  EXPECT_EQ(parsed->options.profiler.nvml_library, "libnvidia-ml.so.1");
  EXPECT_THAT(ParsePythonHookOptions(R"({"profiler": {"interval": 1}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown option 'interval'"));
  auto elsewhere = ParsePythonHookOptions(
      R"({"profiler": {"enabled": true, "nvml_library": "/opt/nvidia/libnvidia-ml.so.1"}})");
  ASSERT_TRUE(elsewhere.ok()) << elsewhere.status();
  EXPECT_EQ(elsewhere->options.profiler.nvml_library, "/opt/nvidia/libnvidia-ml.so.1");
  EXPECT_THAT(ParsePythonHookOptions(R"({"profiler": {"nvml_library": ""}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "'nvml_library' must not be empty"));
  EXPECT_THAT(ParsePythonHookOptions(R"({"profiler": {"nvml_library": 3}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "nvml_library"));
}

TEST(PythonHookOptions, MistakesAreRefusedWithWhatWasWrong) {
  EXPECT_THAT(ParsePythonHookOptions("{"), StatusIs(absl::StatusCode::kInvalidArgument, "JSON"));
  EXPECT_THAT(ParsePythonHookOptions(R"({"jobb": "x"})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown option 'jobb'"));
  EXPECT_THAT(ParsePythonHookOptions(R"({"worker": "1"})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "'worker' must be an integer"));
  EXPECT_THAT(ParsePythonHookOptions(R"({"worker": -1})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "negative"));
  EXPECT_THAT(ParsePythonHookOptions(R"({"worker": 4294967296})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "more than 2147483647"));
  EXPECT_THAT(ParsePythonHookOptions(R"({"config_file": "/f.json", "config": {"save_all": true}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "either 'config' or 'config_file'"));
  EXPECT_THAT(ParsePythonHookOptions(R"({"backpressure": "wait"})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "'wait' is not one of"));
  EXPECT_THAT(
      ParsePythonHookOptions(R"({"config": {"save_config": {"1": {"save_interval": 0}}}})"),
      StatusIs(absl::StatusCode::kInvalidArgument, "save_interval must be positive"));
  EXPECT_THAT(ParsePythonHookOptions(R"({"config": {"save_config": {"9": {}}}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown option '9'"));
  EXPECT_THAT(ParsePythonHookOptions(
                  R"({"config": {"reduction_config": {"reductions": ["median"]}}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "median"));
  EXPECT_THAT(ParsePythonHookOptions(R"j({"rules": "ExplodingTensor(actions=Explode)"})j"),
              StatusIs(absl::StatusCode::kInvalidArgument, "Explode"));
  const char* nameless = R"({"config": {"collections": [{"include_regex": []}]}})";
  EXPECT_THAT(ParsePythonHookOptions(nameless),
              StatusIs(absl::StatusCode::kInvalidArgument, "no name"));
}

}  // namespace
}  // namespace sonde
