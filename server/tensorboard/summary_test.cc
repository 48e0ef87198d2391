#include "server/tensorboard/summary.h"

#include <cfloat>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "stats/histogram.h"
#include "stats/statistics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace sonde::server::tensorboard {
namespace {

using ::sonde::testing::IsOk;
using ::sonde::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

v1::Statistics StatsOf(const std::vector<double>& values) {
  auto s = ComputeStatistics(
      std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(double)),
      v1::DTYPE_F64);
  EXPECT_THAT(s, IsOk());
  return s.ok() ? *s : v1::Statistics();
}

v1::Histogram HistogramOf(const HistogramSpecHD& spec, const std::vector<double>& values) {
  HistogramCounts h = HistogramCounts::Empty(spec);
  AccumulateHistogramScalar(h, values.data(), v1::DTYPE_F64, values.size());
  return ToProto(h);
}

v1::TensorRecord Record(const std::string& name, int worker, const std::vector<double>& values,
                        const HistogramSpecHD* spec = nullptr) {
  v1::TensorRecord r;
  r.set_tensor_name(name);
  r.set_worker(worker);
  *r.mutable_statistics() = StatsOf(values);
  if (spec != nullptr) *r.mutable_histogram() = HistogramOf(*spec, values);
  return r;
}

std::vector<double> Limits(const tfevents::HistogramProto& h) {
  return {h.bucket_limit().begin(), h.bucket_limit().end()};
}
std::vector<double> Buckets(const tfevents::HistogramProto& h) {
  return {h.bucket().begin(), h.bucket().end()};
}

TEST(ToHistogramProto, FixedBinsKeepNonEmptyRangeAndJoinEmptyRuns) {
  // Counters: [x<0] [0,1) [1,2) [2,3) [3,4] [x>4].
  const HistogramSpecHD spec = FixedSpec(0, 4, 4);
  const std::vector<double> values = {0.5, 0.25, 3.5, 3.0, 3.9, 7.0};
  auto h = ToHistogramProto(HistogramOf(spec, values), StatsOf(values));
  ASSERT_THAT(h, IsOk());
  ASSERT_TRUE(h->has_value());
  const tfevents::HistogramProto& p = **h;
  // Leading [x<0] dropped; [1,2) and [2,3) joined into one empty bucket up
  // to 3; the overflow counter's limit is DBL_MAX.
  EXPECT_THAT(Limits(p), ElementsAre(1.0, 3.0, 4.0, DBL_MAX));
  EXPECT_THAT(Buckets(p), ElementsAre(2.0, 0.0, 3.0, 1.0));
  EXPECT_EQ(p.min(), 0.25);
  EXPECT_EQ(p.max(), 7.0);
  EXPECT_EQ(p.num(), 6.0);
  EXPECT_DOUBLE_EQ(p.sum(), 0.5 + 0.25 + 3.5 + 3.0 + 3.9 + 7.0);
  EXPECT_DOUBLE_EQ(p.sum_squares(), 0.25 + 0.0625 + 12.25 + 9.0 + 3.9 * 3.9 + 49.0);
}

TEST(ToHistogramProto, ExponentialBinsOfBothSigns) {
  // 2^-1 <= |x| < 2^2, one bin per octave. Counters: [x<=-4] [-4,-2] [-2,-1]
  // [-1,-0.5] [|x|<0.5] [0.5,1) [1,2) [2,4) [x>=4].
  const HistogramSpecHD spec = ExponentialSpec(-1, 2, 0);
  const std::vector<double> values = {-3, -0.75, 0, 0.1, 1.5, 1.25, 100};
  auto h = ToHistogramProto(HistogramOf(spec, values), StatsOf(values));
  ASSERT_THAT(h, IsOk());
  ASSERT_TRUE(h->has_value());
  EXPECT_THAT(Limits(**h), ElementsAre(-2.0, -1.0, -0.5, 0.5, 1.0, 2.0, 4.0, DBL_MAX));
  EXPECT_THAT(Buckets(**h), ElementsAre(1.0, 0.0, 1.0, 2.0, 0.0, 2.0, 0.0, 1.0));
  EXPECT_EQ((*h)->min(), -3.0);
  EXPECT_EQ((*h)->max(), 100.0);
  EXPECT_EQ((*h)->num(), 7.0);
}

TEST(ToHistogramProto, InfinitiesAndNaNHaveNoBucket) {
  const HistogramSpecHD spec = ExponentialSpec(-1, 2, 0);
  const std::vector<double> values = {1.5, kInf, kNaN, -kInf};
  auto h = ToHistogramProto(HistogramOf(spec, values), StatsOf(values));
  ASSERT_THAT(h, IsOk());
  ASSERT_TRUE(h->has_value());
  EXPECT_THAT(Limits(**h), ElementsAre(2.0));
  EXPECT_THAT(Buckets(**h), ElementsAre(1.0));
  EXPECT_EQ((*h)->num(), 1.0);
  // The statistics' min and max are infinite: the bucket's edges stand in.
  EXPECT_EQ((*h)->min(), 1.0);
  EXPECT_EQ((*h)->max(), 2.0);
}

TEST(ToHistogramProto, NothingFiniteGivesNoHistogram) {
  const HistogramSpecHD spec = FixedSpec(0, 1, 2);
  const std::vector<double> values = {kNaN, kInf};
  auto h = ToHistogramProto(HistogramOf(spec, values), StatsOf(values));
  ASSERT_THAT(h, IsOk());
  EXPECT_FALSE(h->has_value());
}

TEST(ToHistogramProto, MalformedHistogramIsInvalidArgument) {
  v1::Histogram bad = HistogramOf(FixedSpec(0, 1, 2), {0.5});
  bad.add_counts(1);  // one counter too many
  EXPECT_THAT(ToHistogramProto(bad, StatsOf({0.5})),
              StatusIs(absl::StatusCode::kInvalidArgument, ""));
}

TEST(StatisticValue, NamesAndHolesAreNaN) {
  const v1::Statistics s = StatsOf({-3, 4, 0});
  EXPECT_DOUBLE_EQ(*StatisticValue(s, "mean"), 1.0 / 3);
  EXPECT_DOUBLE_EQ(*StatisticValue(s, "l2"), 5.0);
  EXPECT_DOUBLE_EQ(*StatisticValue(s, "abs_max"), 4.0);
  EXPECT_DOUBLE_EQ(*StatisticValue(s, "min"), -3.0);
  EXPECT_EQ(*StatisticValue(s, "zero_count"), 1.0);
  EXPECT_THAT(StatisticValue(s, "median"), StatusIs(absl::StatusCode::kNotFound, "median"));
  const v1::Statistics nan_only = StatsOf({kNaN, kNaN});
  EXPECT_TRUE(std::isnan(*StatisticValue(nan_only, "mean")));
  EXPECT_TRUE(std::isnan(*StatisticValue(nan_only, "max")));
  EXPECT_EQ(*StatisticValue(nan_only, "nan_count"), 2.0);
  // Only infinities: no finite mean, but min and max exist.
  const v1::Statistics inf_only = StatsOf({kInf});
  EXPECT_TRUE(std::isnan(*StatisticValue(inf_only, "std")));
  EXPECT_EQ(*StatisticValue(inf_only, "max"), kInf);
}

TEST(ValidateStatisticNames, RefusesUnknownAndRepeatedNames) {
  EXPECT_THAT(ValidateStatisticNames(DefaultStatistics()), IsOk());
  EXPECT_THAT(ValidateStatisticNames({"abs_mean", "nan_count", "sum_squares", "variance"}),
              IsOk());
  EXPECT_THAT(ValidateStatisticNames({"mean", "norm"}),
              StatusIs(absl::StatusCode::kInvalidArgument, "'norm'"));
  EXPECT_THAT(ValidateStatisticNames({"l2", "l2"}),
              StatusIs(absl::StatusCode::kInvalidArgument, "twice"));
}

TEST(ScalarValue, ValueNaNAndInfinities) {
  EXPECT_EQ(ScalarValue(StatsOf({0.125})), 0.125);
  EXPECT_EQ(ScalarValue(StatsOf({1, 2, 6})), 3.0);  // merged one-element tensors
  EXPECT_TRUE(std::isnan(ScalarValue(StatsOf({1, kNaN}))));
  EXPECT_TRUE(std::isnan(ScalarValue(StatsOf({kInf, -kInf}))));
  EXPECT_EQ(ScalarValue(StatsOf({2, -kInf})), -kInf);
}

TEST(AddTensorValues, ScalarsStatisticsAndHistogramsWithSortedTags) {
  const HistogramSpecHD spec = FixedSpec(0, 4, 4);
  const std::vector<v1::TensorRecord> records = {
      Record("w", 0, {1, 2, 3, 4}, &spec),
      Record("loss", 0, {0.5}),
      Record("b", 0, {-1, 1}),
  };
  std::vector<const v1::TensorRecord*> pointers;
  for (const auto& r : records) pointers.push_back(&r);
  tfevents::Summary summary;
  ASSERT_THAT(AddTensorValues(pointers, {"mean", "max"}, summary), IsOk());
  std::vector<std::string> tags;
  for (const auto& v : summary.value()) tags.push_back(v.tag());
  EXPECT_THAT(tags, ElementsAre("b/mean", "b/max", "loss", "w/mean", "w/max", "w"));
  EXPECT_EQ(summary.value(0).simple_value(), 0.0f);
  EXPECT_EQ(summary.value(1).simple_value(), 1.0f);
  EXPECT_EQ(summary.value(2).simple_value(), 0.5f);
  EXPECT_EQ(summary.value(3).simple_value(), 2.5f);
  EXPECT_EQ(summary.value(4).simple_value(), 4.0f);
  ASSERT_TRUE(summary.value(5).has_histo());
  // 1 in [1,2), 2 in [2,3), 3 and 4 (the upper bound) in [3,4].
  EXPECT_THAT(Limits(summary.value(5).histo()), ElementsAre(2.0, 3.0, 4.0));
  EXPECT_THAT(Buckets(summary.value(5).histo()), ElementsAre(1.0, 1.0, 2.0));
}

TEST(AddTensorValues, WorkersMergeScalarsToTheirMeanAndAddHistograms) {
  const HistogramSpecHD spec = FixedSpec(0, 4, 4);
  const std::vector<v1::TensorRecord> records = {
      Record("loss", 0, {1.0}),
      Record("loss", 1, {4.0}),
      Record("w", 0, {0.5, 1.5}, &spec),
      Record("w", 1, {1.5, 3.5}, &spec),
  };
  std::vector<const v1::TensorRecord*> pointers;
  for (const auto& r : records) pointers.push_back(&r);
  tfevents::Summary summary;
  ASSERT_THAT(AddTensorValues(pointers, {"mean"}, summary), IsOk());
  ASSERT_EQ(summary.value_size(), 3);
  EXPECT_EQ(summary.value(0).tag(), "loss");
  EXPECT_EQ(summary.value(0).simple_value(), 2.5f);
  EXPECT_EQ(summary.value(1).tag(), "w/mean");
  EXPECT_EQ(summary.value(1).simple_value(), 1.75f);
  EXPECT_THAT(Buckets(summary.value(2).histo()), ElementsAre(1.0, 2.0, 0.0, 1.0));
  EXPECT_EQ(summary.value(2).histo().num(), 4.0);
}

TEST(AddTensorValues, HistogramsThatDoNotMergeAreLeftOutAndReported) {
  const HistogramSpecHD a = FixedSpec(0, 4, 4);
  const HistogramSpecHD b = FixedSpec(0, 8, 4);
  const std::vector<v1::TensorRecord> records = {
      Record("w", 0, {0.5, 1.5}, &a),
      Record("w", 1, {1.5, 3.5}, &b),
      Record("x", 0, {}),  // empty tensor: nothing to show
  };
  std::vector<const v1::TensorRecord*> pointers;
  for (const auto& r : records) pointers.push_back(&r);
  tfevents::Summary summary;
  EXPECT_THAT(AddTensorValues(pointers, {"mean"}, summary),
              StatusIs(absl::StatusCode::kFailedPrecondition, "histogram of 'w'"));
  ASSERT_EQ(summary.value_size(), 1);
  EXPECT_EQ(summary.value(0).tag(), "w/mean");
}

}  // namespace
}  // namespace sonde::server::tensorboard
