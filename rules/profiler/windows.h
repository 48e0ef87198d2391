// Window math shared by the profiler rules (rules/profiler) and, offline,
// by the job report (server/report: its step and metric statistics use
// Quantiles and ComputeMeanStddev): percentiles over the last N data
// points, mean and standard deviation of step durations, growth of a moving
// average, and the distance between two utilisation histograms. Plain
// values and functions, no I/O; a SlidingWindow is not thread-safe (one
// owner).
#ifndef SONDE_RULES_PROFILER_WINDOWS_H_
#define SONDE_RULES_PROFILER_WINDOWS_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace sonde::rules::profiler {

// The q-quantile (0 <= q <= 1) of `values` with linear interpolation between
// closest ranks, as numpy.quantile's default (SageMaker's rules use it).
// Empty input: nullopt. Sorts its copy.
std::optional<double> Quantile(std::vector<double> values, double q);
// Several quantiles of the same values with one sort, in the order of `qs`;
// empty for empty input.
std::vector<double> Quantiles(std::vector<double> values, const std::vector<double>& qs);

// Population mean and standard deviation (numpy.mean, numpy.std).
struct MeanStddev {
  double mean = 0;
  double stddev = 0;
};
MeanStddev ComputeMeanStddev(const std::vector<double>& values);

// Values above mean + k * stddev of the same values (the outliers inflate
// the statistics they are judged by, as SageMaker's StepOutlier does).
struct Outliers {
  MeanStddev stats;
  double threshold = 0;          // mean + k * stddev
  std::vector<size_t> indices;   // of the values above it, in order
};
Outliers FindOutliers(const std::vector<double>& values, double k);

// The last `capacity` values of a series, and how many it has ever seen
// (SageMaker's `patience` counts every value, not only those in the window).
class SlidingWindow {
 public:
  explicit SlidingWindow(size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {}

  void Add(double value);
  size_t size() const { return values_.size(); }
  size_t capacity() const { return capacity_; }
  int64_t seen() const { return seen_; }
  bool full() const { return values_.size() == capacity_; }
  double back() const { return values_.back(); }  // requires size() > 0

  // Over the values in the window; nullopt when empty.
  std::optional<double> Quantile(double q) const;
  std::vector<double> Quantiles(const std::vector<double>& qs) const;  // one sort
  std::optional<double> Mean() const;
  std::optional<double> Max() const;
  std::vector<double> Values() const { return {values_.begin(), values_.end()}; }

 private:
  size_t capacity_;
  std::deque<double> values_;
  int64_t seen_ = 0;
};

// Growth of a moving average: the mean of the last `window` values minus
// the mean of the `window` values one point earlier. Needs window + 1
// values (nullopt otherwise); only the last window + 1 are read.
std::optional<double> MovingAverageIncrease(const SlidingWindow& values, size_t window);

// A histogram of percentages in `bins` equal bins over [0, 100] (values
// outside are clamped into the first or last bin).
std::vector<double> PercentHistogram(const std::vector<double>& values, size_t bins);
// The bin PercentHistogram counts `value` in (bins 0 counts as 1); nullopt
// for NaN, which it skips. For adding one value to a running histogram.
std::optional<size_t> PercentBin(double value, size_t bins);

// Jensen-Shannon distance (natural log; 0 = same, at most sqrt(ln 2) ~ 0.83)
// between two histograms, each normalised to sum 1 first (scipy's
// entropy(p, m) does the same). Empty or all-zero input: 0.
double JensenShannonDistance(const std::vector<double>& p, const std::vector<double>& q);

}  // namespace sonde::rules::profiler

#endif  // SONDE_RULES_PROFILER_WINDOWS_H_
