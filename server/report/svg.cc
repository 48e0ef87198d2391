#include "server/report/svg.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace sonde::report {
namespace {

constexpr const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
constexpr size_t kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);

// Plot area margins, in pixels.
constexpr int kLeft = 64, kRight = 16, kTop = 28, kBottom = 40;
constexpr int kLegendColumns = 4, kLegendRow = 14;

std::string Num(double v) {
  if (v == 0) return "0";
  const double a = std::fabs(v);
  if (a >= 1e6 || a < 1e-3) return absl::StrFormat("%.3g", v);
  return absl::StrFormat("%.6g", std::round(v * 1000) / 1000);
}

std::string Px(double v) { return absl::StrFormat("%.1f", v); }

struct Scale {
  double lo, hi, from, to;
  double operator()(double v) const {
    return hi == lo ? (from + to) / 2 : from + (v - lo) / (hi - lo) * (to - from);
  }
};

void Widen(double& lo, double& hi) {
  if (!(lo <= hi)) lo = hi = 0;
  if (lo == hi) {
    const double pad = lo == 0 ? 1 : std::fabs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
}

// Frame, grid, ticks and titles of a chart; returns the opening of the <svg>.
std::string Frame(const ChartOptions& o, int top, const Scale& x, const Scale& y,
                  const std::vector<double>& xticks, const std::vector<double>& yticks) {
  std::string s = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"%d\" height=\"%d\" "
      "viewBox=\"0 0 %d %d\" role=\"img\"><title>%s</title>",
      o.width, o.height, o.width, o.height, EscapeHtml(o.title));
  absl::StrAppend(&s, "<text x=\"", kLeft, "\" y=\"16\" class=\"ct\">", EscapeHtml(o.title),
                  "</text>");
  const double x0 = kLeft, x1 = o.width - kRight, y0 = o.height - kBottom, y1 = top;
  for (double t : yticks) {
    const double py = y(t);
    absl::StrAppend(&s, "<line class=\"grid\" x1=\"", Px(x0), "\" x2=\"", Px(x1), "\" y1=\"",
                    Px(py), "\" y2=\"", Px(py), "\"/><text class=\"tk\" x=\"", Px(x0 - 4),
                    "\" y=\"", Px(py + 4), "\" text-anchor=\"end\">", Num(t), "</text>");
  }
  for (double t : xticks) {
    const double px = x(t);
    absl::StrAppend(&s, "<line class=\"tick\" x1=\"", Px(px), "\" x2=\"", Px(px), "\" y1=\"",
                    Px(y0), "\" y2=\"", Px(y0 + 4), "\"/><text class=\"tk\" x=\"", Px(px),
                    "\" y=\"", Px(y0 + 16), "\" text-anchor=\"middle\">", Num(t), "</text>");
  }
  absl::StrAppend(&s, "<rect class=\"axes\" x=\"", Px(x0), "\" y=\"", Px(y1), "\" width=\"",
                  Px(x1 - x0), "\" height=\"", Px(y0 - y1), "\"/>");
  absl::StrAppend(&s, "<text class=\"al\" x=\"", Px((x0 + x1) / 2), "\" y=\"", o.height - 6,
                  "\" text-anchor=\"middle\">", EscapeHtml(o.x_label), "</text>");
  absl::StrAppend(&s, "<text class=\"al\" transform=\"translate(14,", Px((y0 + y1) / 2),
                  ") rotate(-90)\" text-anchor=\"middle\">", EscapeHtml(o.y_label), "</text>");
  return s;
}

// hi, or the first tick at or above it, so the top grid line frames the data.
double RoundUpToTick(double lo, double hi, int target_count) {
  const std::vector<double> ticks = NiceTicks(lo, hi, target_count);
  if (ticks.size() < 2 || ticks.back() >= hi) return hi;
  return ticks.back() + (ticks[1] - ticks[0]);
}

}  // namespace

std::string EscapeHtml(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::vector<size_t> Downsample(const std::vector<double>& y, size_t max_points) {
  max_points = std::max<size_t>(max_points, 2);
  std::vector<size_t> keep;
  if (y.size() <= max_points) {
    keep.resize(y.size());
    for (size_t i = 0; i < y.size(); ++i) keep[i] = i;
    return keep;
  }
  const size_t buckets = max_points / 2;
  for (size_t b = 0; b < buckets; ++b) {
    const size_t begin = b * y.size() / buckets, end = (b + 1) * y.size() / buckets;
    size_t lo = begin, hi = begin;
    for (size_t i = begin; i < end; ++i) {
      if (y[i] < y[lo]) lo = i;
      if (y[i] > y[hi]) hi = i;
    }
    keep.push_back(std::min(lo, hi));
    if (lo != hi) keep.push_back(std::max(lo, hi));
  }
  return keep;
}

std::vector<double> NiceTicks(double lo, double hi, int target_count) {
  std::vector<double> ticks;
  if (!(hi > lo) || target_count < 1) return ticks;
  const double raw = (hi - lo) / target_count;
  const double mag = std::pow(10, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  // Multiples of the step as integers, divided by a power of ten when the
  // step is below 1 so that 0.6 prints as 0.6, not 0.6000000000000001.
  const double units = step / mag;  // 1, 2, 5 or 10
  const double inverse = mag < 1 ? std::round(1 / mag) : 0;
  for (int64_t k = static_cast<int64_t>(std::ceil(lo / step - 1e-9));
       k * step <= hi + step * 1e-9; ++k) {
    const double n = static_cast<double>(k) * units;
    ticks.push_back(inverse > 0 ? n / inverse : n * mag);
  }
  return ticks;
}

std::string LineChart(const std::vector<ChartSeries>& series, const ChartOptions& o) {
  size_t total = 0;
  double xlo = std::numeric_limits<double>::infinity(), xhi = -xlo, ylo = xlo, yhi = -xlo;
  for (const ChartSeries& s : series) {
    total += s.y.size();
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      xlo = std::min(xlo, s.x[i]);
      xhi = std::max(xhi, s.x[i]);
      ylo = std::min(ylo, s.y[i]);
      yhi = std::max(yhi, s.y[i]);
    }
  }
  if (total == 0) xlo = xhi = ylo = yhi = 0;
  ylo = std::min(ylo, 0.0);  // utilisation and memory read best from zero
  if (o.y_max > 0) yhi = std::max(yhi, o.y_max);
  Widen(xlo, xhi);
  Widen(ylo, yhi);
  yhi = RoundUpToTick(ylo, yhi, 5);
  // The legend sits above the plot, kLegendColumns entries a row.
  const int rows = static_cast<int>((series.size() + kLegendColumns - 1) / kLegendColumns);
  const int top = kTop + rows * kLegendRow;
  const Scale x{xlo, xhi, double(kLeft), double(o.width - kRight)};
  const Scale y{ylo, yhi, double(o.height - kBottom), double(top)};
  std::string s = Frame(o, top, x, y, NiceTicks(xlo, xhi, 8), NiceTicks(ylo, yhi, 5));
  // Each series gets its share of the point budget.
  const size_t budget = std::max<size_t>(2, o.max_points / std::max<size_t>(1, series.size()));
  for (size_t k = 0; k < series.size(); ++k) {
    const ChartSeries& c = series[k];
    const char* color = kPalette[k % kPaletteSize];
    const size_t n = std::min(c.x.size(), c.y.size());
    std::vector<double> ys(c.y.begin(), c.y.begin() + n);
    std::string d;
    for (size_t i : Downsample(ys, budget)) {
      absl::StrAppend(&d, d.empty() ? "M" : " L", Px(x(c.x[i])), ",", Px(y(c.y[i])));
    }
    if (n == 1) absl::StrAppend(&d, " h1");
    if (!d.empty()) {
      absl::StrAppend(&s, "<path class=\"line\" stroke=\"", color, "\" d=\"", d, "\"><title>",
                      EscapeHtml(c.label), "</title></path>");
    }
    const double lx = kLeft + (k % kLegendColumns) * 200.0;
    const double ly = kTop + (k / kLegendColumns) * double(kLegendRow) + 6;
    absl::StrAppend(&s, "<rect x=\"", Px(lx), "\" y=\"", Px(ly - 8), "\" width=\"10\" height=\"3\" "
                    "fill=\"", color, "\"/><text class=\"lg\" x=\"", Px(lx + 14), "\" y=\"",
                    Px(ly - 4), "\">", EscapeHtml(c.label), "</text>");
  }
  absl::StrAppend(&s, "</svg>");
  return s;
}

std::string Histogram(const std::vector<double>& values, int bins, const ChartOptions& o) {
  bins = std::max(bins, 1);
  double lo = 0, hi = 0;
  if (!values.empty()) {
    lo = *std::min_element(values.begin(), values.end());
    hi = *std::max_element(values.begin(), values.end());
  }
  Widen(lo, hi);
  std::vector<int64_t> counts(bins, 0);
  const double width = (hi - lo) / bins;
  for (double v : values) {
    const int b = std::clamp(static_cast<int>((v - lo) / width), 0, bins - 1);
    ++counts[b];
  }
  const int64_t top = values.empty() ? 1 : *std::max_element(counts.begin(), counts.end());
  const double yhi = RoundUpToTick(0, static_cast<double>(top), 4);
  const Scale x{lo, hi, double(kLeft), double(o.width - kRight)};
  const Scale y{0, yhi, double(o.height - kBottom), double(kTop)};
  std::string s = Frame(o, kTop, x, y, NiceTicks(lo, hi, 8), NiceTicks(0, yhi, 4));
  for (int b = 0; b < bins; ++b) {
    if (counts[b] == 0) continue;
    const double left = x(lo + b * width), right = x(lo + (b + 1) * width);
    const double ytop = y(static_cast<double>(counts[b]));
    absl::StrAppend(&s, "<rect class=\"bar\" x=\"", Px(left + 0.5), "\" y=\"", Px(ytop),
                    "\" width=\"", Px(std::max(right - left - 1, 1.0)), "\" height=\"",
                    Px(y(0) - ytop), "\"><title>", Num(lo + b * width), " to ",
                    Num(lo + (b + 1) * width), ": ", counts[b], "</title></rect>");
  }
  absl::StrAppend(&s, "</svg>");
  return s;
}

}  // namespace sonde::report
