// Small inline-SVG charts for the job report: a line chart of time series
// and a histogram, drawn as plain <svg> markup so the report opens anywhere
// offline with no scripts. Every label passes through EscapeHtml. Stateless
// and thread-safe.
#ifndef SONDE_SERVER_REPORT_SVG_H_
#define SONDE_SERVER_REPORT_SVG_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace sonde::report {

// Escapes & < > " ' so any string from the data is safe in text and in
// attribute values.
std::string EscapeHtml(absl::string_view text);

struct ChartSeries {
  std::string label;
  std::vector<double> x;  // increasing
  std::vector<double> y;  // one per x
};

struct ChartOptions {
  std::string title;
  std::string x_label;
  std::string y_label;
  // Pixel size of the whole <svg>. Defaults 880 x 260.
  int width = 880;
  int height = 260;
  // Points drawn over all series together; longer series are downsampled
  // (see Downsample). Default 2000.
  size_t max_points = 2000;
  // Line charts: the y axis reaches at least this (e.g. 100 for percent);
  // 0: as far as the data.
  double y_max = 0;
};

// Indices of the points to keep so that at most `max_points` (>= 2) remain:
// the series is cut into max_points / 2 buckets by index and each keeps its
// lowest and highest point, in time order, so spikes survive. Returns every
// index when the series is short enough.
std::vector<size_t> Downsample(const std::vector<double>& y, size_t max_points);

// A line chart, one polyline <path> per series, with axes, ticks and a
// legend. Series without points are listed in the legend only.
std::string LineChart(const std::vector<ChartSeries>& series, const ChartOptions& options);

// A histogram of `values` in `bins` equal-width bins (at least 1), bars as
// <rect> elements each with a <title> giving its range and count.
std::string Histogram(const std::vector<double>& values, int bins, const ChartOptions& options);

// "Nice" tick positions (1, 2 or 5 times a power of ten) covering [lo, hi].
std::vector<double> NiceTicks(double lo, double hi, int target_count);

}  // namespace sonde::report

#endif  // SONDE_SERVER_REPORT_SVG_H_
