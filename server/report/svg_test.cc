#include "server/report/svg.h"

#include <cmath>
#include <string>

#include "gtest/gtest.h"

namespace sonde::report {
namespace {

size_t Count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

TEST(EscapeHtml, EscapesEveryMarkupCharacter) {
  EXPECT_EQ(EscapeHtml("<a href=\"x\" title='y'>&</a>"),
            "&lt;a href=&quot;x&quot; title=&#39;y&#39;&gt;&amp;&lt;/a&gt;");
  EXPECT_EQ(EscapeHtml("plain text"), "plain text");
}

TEST(Downsample, KeepsShortSeriesWhole) {
  EXPECT_EQ(Downsample({1, 2, 3}, 10).size(), 3u);
}

TEST(Downsample, BoundsLongSeriesAndKeepsSpikes) {
  std::vector<double> y(100000, 1.0);
  y[54321] = 99;  // a spike in the middle of a bucket
  y[77777] = -5;
  const std::vector<size_t> keep = Downsample(y, 2000);
  EXPECT_LE(keep.size(), 2000u);
  EXPECT_GE(keep.size(), 1000u);
  bool spike = false, dip = false;
  for (size_t i = 0; i < keep.size(); ++i) {
    if (i > 0) {
      EXPECT_LT(keep[i - 1], keep[i]) << "indices in time order";
    }
    spike = spike || keep[i] == 54321;
    dip = dip || keep[i] == 77777;
  }
  EXPECT_TRUE(spike);
  EXPECT_TRUE(dip);
}

TEST(NiceTicks, UsesRoundSteps) {
  EXPECT_EQ(NiceTicks(0, 100, 5), (std::vector<double>{0, 20, 40, 60, 80, 100}));
  EXPECT_EQ(NiceTicks(0.3, 1.1, 4), (std::vector<double>{0.4, 0.6, 0.8, 1.0}));
  EXPECT_TRUE(NiceTicks(1, 1, 5).empty());
}

TEST(LineChart, DrawsOnePathPerSeriesWithEscapedLabels) {
  ChartSeries a{"w0 <cpu>", {0, 1, 2}, {10, 50, 30}};
  ChartSeries b{"w1 cpu", {0, 1}, {5, 6}};
  ChartOptions o;
  o.title = "CPU & more";
  const std::string svg = LineChart({a, b}, o);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_EQ(Count(svg, "<path class=\"line\""), 2u);
  EXPECT_NE(svg.find("w0 &lt;cpu&gt;"), std::string::npos);
  EXPECT_NE(svg.find("CPU &amp; more"), std::string::npos);
  EXPECT_EQ(svg.find("<cpu>"), std::string::npos);
}

TEST(LineChart, LongSeriesStaysWithinThePointBudget) {
  ChartSeries s{"long", {}, {}};
  for (int i = 0; i < 200000; ++i) {
    s.x.push_back(i);
    s.y.push_back(std::sin(i / 100.0));
  }
  ChartOptions o;
  o.max_points = 2000;
  const std::string svg = LineChart({s}, o);
  EXPECT_LE(Count(svg, " L") + 1, 2000u);
  EXPECT_LT(svg.size(), 64u << 10);
}

TEST(Histogram, CountsValuesIntoBins) {
  ChartOptions o;
  // 0..9 in 5 bins of width 1.8: 2 values each.
  const std::string svg = Histogram({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 5, o);
  EXPECT_EQ(Count(svg, "<rect class=\"bar\""), 5u);
  EXPECT_EQ(Count(svg, ": 2</title>"), 5u);
}

TEST(Histogram, EmptyAndConstantInputsStillDraw) {
  ChartOptions o;
  EXPECT_EQ(Count(Histogram({}, 10, o), "<rect class=\"bar\""), 0u);
  EXPECT_EQ(Count(Histogram({3, 3, 3}, 10, o), ": 3</title>"), 1u);
}

}  // namespace
}  // namespace sonde::report
