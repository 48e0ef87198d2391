#include "rules/profiler/windows.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

namespace sonde::rules::profiler {

std::vector<double> Quantiles(std::vector<double> values, const std::vector<double>& qs) {
  std::vector<double> out;
  if (values.empty()) return out;
  std::sort(values.begin(), values.end());
  out.reserve(qs.size());
  for (double q : qs) {
    const double rank = std::clamp(q, 0.0, 1.0) * static_cast<double>(values.size() - 1);
    const size_t lo = static_cast<size_t>(std::floor(rank));
    const size_t hi = std::min(lo + 1, values.size() - 1);
    const double frac = rank - static_cast<double>(lo);
    out.push_back(values[lo] + (values[hi] - values[lo]) * frac);
  }
  return out;
}

std::optional<double> Quantile(std::vector<double> values, double q) {
  std::vector<double> out = Quantiles(std::move(values), {q});
  if (out.empty()) return std::nullopt;
  return out[0];
}

MeanStddev ComputeMeanStddev(const std::vector<double>& values) {
  MeanStddev out;
  if (values.empty()) return out;
  const double n = static_cast<double>(values.size());
  out.mean = std::accumulate(values.begin(), values.end(), 0.0) / n;
  double squares = 0;
  for (double v : values) squares += (v - out.mean) * (v - out.mean);
  out.stddev = std::sqrt(squares / n);
  return out;
}

Outliers FindOutliers(const std::vector<double>& values, double k) {
  Outliers out;
  out.stats = ComputeMeanStddev(values);
  out.threshold = out.stats.mean + k * out.stats.stddev;
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] > out.threshold) out.indices.push_back(i);
  }
  return out;
}

void SlidingWindow::Add(double value) {
  values_.push_back(value);
  if (values_.size() > capacity_) values_.pop_front();
  ++seen_;
}

std::optional<double> SlidingWindow::Quantile(double q) const { return profiler::Quantile(Values(), q); }

std::vector<double> SlidingWindow::Quantiles(const std::vector<double>& qs) const {
  return profiler::Quantiles(Values(), qs);
}

std::optional<double> SlidingWindow::Mean() const {
  if (values_.empty()) return std::nullopt;
  return std::accumulate(values_.begin(), values_.end(), 0.0) /
         static_cast<double>(values_.size());
}

std::optional<double> SlidingWindow::Max() const {
  if (values_.empty()) return std::nullopt;
  return *std::max_element(values_.begin(), values_.end());
}

std::optional<double> MovingAverageIncrease(const SlidingWindow& values, size_t window) {
  if (window == 0 || values.size() < window + 1) return std::nullopt;
  const std::vector<double> v = values.Values();
  const size_t n = v.size();
  double now = 0;
  double before = 0;
  for (size_t i = n - window; i < n; ++i) now += v[i];
  for (size_t i = n - window - 1; i < n - 1; ++i) before += v[i];
  return (now - before) / static_cast<double>(window);
}

std::optional<size_t> PercentBin(double value, size_t bins) {
  if (std::isnan(value)) return std::nullopt;
  if (bins == 0) bins = 1;
  const double width = 100.0 / static_cast<double>(bins);
  const double b = std::floor(std::clamp(value, 0.0, 100.0) / width);
  return std::min(static_cast<size_t>(b), bins - 1);
}

std::vector<double> PercentHistogram(const std::vector<double>& values, size_t bins) {
  std::vector<double> h(bins == 0 ? 1 : bins, 0.0);
  for (double v : values) {
    if (auto b = PercentBin(v, h.size())) h[*b] += 1;
  }
  return h;
}

double JensenShannonDistance(const std::vector<double>& p, const std::vector<double>& q) {
  const size_t n = std::min(p.size(), q.size());
  double sp = 0;
  double sq = 0;
  for (size_t i = 0; i < n; ++i) {
    sp += p[i];
    sq += q[i];
  }
  if (sp <= 0 || sq <= 0) return 0;
  double divergence = 0;
  for (size_t i = 0; i < n; ++i) {
    const double a = p[i] / sp;
    const double b = q[i] / sq;
    const double m = (a + b) / 2;
    if (a > 0) divergence += a * std::log(a / m) / 2;
    if (b > 0) divergence += b * std::log(b / m) / 2;
  }
  return std::sqrt(std::max(0.0, divergence));
}

}  // namespace sonde::rules::profiler
