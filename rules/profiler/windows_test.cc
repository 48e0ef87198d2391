#include "rules/profiler/windows.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace sonde::rules::profiler {
namespace {

TEST(Quantile, InterpolatesBetweenRanksLikeNumpy) {
  // numpy.quantile([1, 2, 3, 4], 0.95) == 3.85; [1..10] at 0.5 and 0.05.
  EXPECT_DOUBLE_EQ(*Quantile({4, 1, 3, 2}, 0.95), 3.85);
  std::vector<double> ten = {10, 9, 8, 7, 6, 5, 4, 3, 2, 1};
  EXPECT_DOUBLE_EQ(*Quantile(ten, 0.5), 5.5);
  EXPECT_DOUBLE_EQ(*Quantile(ten, 0.05), 1.45);
  EXPECT_DOUBLE_EQ(*Quantile(ten, 0), 1);
  EXPECT_DOUBLE_EQ(*Quantile(ten, 1), 10);
  EXPECT_DOUBLE_EQ(*Quantile({42}, 0.95), 42);
  EXPECT_FALSE(Quantile({}, 0.5).has_value());
}

TEST(Quantiles, GivesEachQuantileOfOneSortInTheOrderAsked) {
  const std::vector<double> ten = {10, 9, 8, 7, 6, 5, 4, 3, 2, 1};
  const std::vector<double> q = Quantiles(ten, {0.95, 0.05, 0.5, 1});
  ASSERT_EQ(q.size(), 4u);
  EXPECT_DOUBLE_EQ(q[0], 9.55);
  EXPECT_DOUBLE_EQ(q[1], 1.45);
  EXPECT_DOUBLE_EQ(q[2], 5.5);
  EXPECT_DOUBLE_EQ(q[3], 10);
  EXPECT_TRUE(Quantiles({}, {0.5}).empty());
  SlidingWindow w(3);
  for (double v : {100.0, 1.0, 2.0, 3.0}) w.Add(v);
  EXPECT_EQ(w.Quantiles({0, 0.5, 1}), (std::vector<double>{1, 2, 3}));
}

TEST(MeanStddev, IsThePopulationStatistic) {
  MeanStddev s = ComputeMeanStddev({2, 4, 4, 4, 5, 5, 7, 9});
  EXPECT_DOUBLE_EQ(s.mean, 5);
  EXPECT_DOUBLE_EQ(s.stddev, 2);
  EXPECT_DOUBLE_EQ(ComputeMeanStddev({}).stddev, 0);
}

TEST(FindOutliers, JudgesByStatisticsThatIncludeTheOutliers) {
  std::vector<double> v(20, 1.0);
  v.push_back(100);
  Outliers o = FindOutliers(v, 3);
  ASSERT_EQ(o.indices.size(), 1u);
  EXPECT_EQ(o.indices[0], 20u);
  EXPECT_NEAR(o.stats.mean, 120.0 / 21, 1e-12);
  EXPECT_NEAR(o.threshold, o.stats.mean + 3 * o.stats.stddev, 1e-12);
  // Constant durations have no outliers (nothing is above mean + 0).
  EXPECT_TRUE(FindOutliers(std::vector<double>(50, 2.0), 3).indices.empty());
}

TEST(SlidingWindow, KeepsTheLastCapacityValuesAndCountsEverySeen) {
  SlidingWindow w(3);
  for (double v : {1, 2, 3, 4, 5}) w.Add(v);
  EXPECT_EQ(w.size(), 3u);
  EXPECT_EQ(w.seen(), 5);
  EXPECT_TRUE(w.full());
  EXPECT_EQ(w.Values(), (std::vector<double>{3, 4, 5}));
  EXPECT_DOUBLE_EQ(*w.Mean(), 4);
  EXPECT_DOUBLE_EQ(*w.Max(), 5);
  EXPECT_DOUBLE_EQ(*w.Quantile(0.5), 4);
  EXPECT_FALSE(SlidingWindow(4).Mean().has_value());
}

TEST(MovingAverageIncrease, ComparesTheLastWindowWithTheOneBefore) {
  SlidingWindow w(5);
  for (double v : {1, 1, 1}) w.Add(v);
  EXPECT_FALSE(MovingAverageIncrease(w, 3).has_value());  // needs 4 values
  w.Add(7);
  // mean(1, 1, 7) - mean(1, 1, 1) = 2
  EXPECT_DOUBLE_EQ(*MovingAverageIncrease(w, 3), 2);
  w.Add(1);
  // mean(1, 7, 1) - mean(1, 1, 7) = 0
  EXPECT_DOUBLE_EQ(*MovingAverageIncrease(w, 3), 0);
}

TEST(PercentHistogram, BinsPercentagesAndClampsTheEnds) {
  std::vector<double> h = PercentHistogram({0, 1.9, 2, 99, 100, 130, -5}, 50);
  ASSERT_EQ(h.size(), 50u);
  EXPECT_EQ(h[0], 3);   // 0, 1.9, -5
  EXPECT_EQ(h[1], 1);   // 2
  EXPECT_EQ(h[49], 3);  // 99, 100, 130
}

TEST(JensenShannonDistance, IsZeroForTheSameShapeAndSqrtLn2ForDisjoint) {
  EXPECT_DOUBLE_EQ(JensenShannonDistance({1, 2, 3}, {2, 4, 6}), 0);
  EXPECT_NEAR(JensenShannonDistance({1, 0}, {0, 1}), std::sqrt(std::log(2.0)), 1e-12);
  // scipy.spatial.distance.jensenshannon([0.5, 0.5], [0.9, 0.1]) = 0.31898...
  EXPECT_NEAR(JensenShannonDistance({5, 5}, {9, 1}), 0.318982, 1e-6);
  EXPECT_EQ(JensenShannonDistance({0, 0}, {1, 1}), 0);
}

}  // namespace
}  // namespace sonde::rules::profiler
