#include "rules/profiler/profiler_rules.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "rules/params.h"
#include "rules/profiler/windows.h"

namespace sonde::rules::profiler {
namespace {

using Result = absl::StatusOr<std::optional<Finding>>;

Result Quiet() { return std::optional<Finding>(); }
Result Fire(Finding f) { return std::optional<Finding>(std::move(f)); }

absl::Status BadParam(absl::string_view rule, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(rule, ": ", message));
}

absl::StatusOr<double> FiniteDouble(RuleParams& p, absl::string_view rule, absl::string_view key,
                                    double fallback, double min) {
  SONDE_ASSIGN_OR_RETURN(double v, p.Double(key, fallback));
  if (!std::isfinite(v) || v < min) {
    return BadParam(rule, absl::StrCat("parameter ", key, "=", v,
                                       " must be a finite number >= ", min));
  }
  return v;
}

// Windows are kept in memory per worker and GPU and sorted for their
// percentiles: a window above this is a typo, not a wish.
constexpr int64_t kMaxWindow = 100000;

absl::StatusOr<int64_t> ReadWindow(RuleParams& p, absl::string_view rule, int64_t fallback) {
  SONDE_ASSIGN_OR_RETURN(int64_t window, p.Int("window", fallback, 1));
  if (window > kMaxWindow) {
    return BadParam(rule, absl::StrCat("parameter window=", window, " is above the limit of ",
                                       kMaxWindow, " values"));
  }
  return window;
}

// SageMaker's scan_interval_us: how often its rule container scanned the
// timeline files. Accepted for compatibility and checked; Sonde judges each
// batch as it arrives instead.
absl::Status ReadScanInterval(RuleParams& p) {
  return p.Int("scan_interval_us", 60000000, 1).status();
}

// "gpu.3.util_percent" with prefix "gpu." and suffix ".util_percent": 3.
std::optional<int> DeviceIndex(absl::string_view name, absl::string_view prefix,
                               absl::string_view suffix) {
  if (!absl::ConsumePrefix(&name, prefix) || !absl::ConsumeSuffix(&name, suffix)) {
    return std::nullopt;
  }
  int index;
  if (name.empty() || !absl::SimpleAtoi(name, &index) || index < 0) return std::nullopt;
  return index;
}

// The metrics of one snapshot the rules read, by device.
struct SystemSample {
  std::map<int, double> gpu_util;
  std::map<int, double> gpu_memory_percent;
  std::map<int, double> cpu_core_util;
  std::optional<double> cpu_util;
  std::optional<double> iowait;
  std::optional<double> dataloader_workers;

  // cpu.util_percent, or the mean of the cores when only they are sent.
  std::optional<double> CpuTotal() const {
    if (cpu_util.has_value()) return cpu_util;
    if (cpu_core_util.empty()) return std::nullopt;
    double sum = 0;
    for (const auto& [core, v] : cpu_core_util) sum += v;
    return sum / static_cast<double>(cpu_core_util.size());
  }
};

SystemSample ReadSample(const v1::MetricSnapshot& snapshot) {
  SystemSample s;
  std::map<int, double> used;
  std::map<int, double> total;
  std::map<int, double> memory_util;
  for (const v1::MetricSample& m : snapshot.samples()) {
    const std::string& n = m.name();
    if (!std::isfinite(m.value())) continue;
    if (auto i = DeviceIndex(n, "gpu.", ".util_percent")) {
      s.gpu_util[*i] = m.value();
    } else if (auto i = DeviceIndex(n, "gpu.", ".memory_used_bytes")) {
      used[*i] = m.value();
    } else if (auto i = DeviceIndex(n, "gpu.", ".memory_total_bytes")) {
      total[*i] = m.value();
    } else if (auto i = DeviceIndex(n, "gpu.", ".memory_util_percent")) {
      memory_util[*i] = m.value();
    } else if (auto i = DeviceIndex(n, "cpu.", ".util_percent")) {
      s.cpu_core_util[*i] = m.value();
    } else if (n == "cpu.util_percent") {
      s.cpu_util = m.value();
    } else if (n == "cpu.iowait_percent") {
      s.iowait = m.value();
    } else if (n == "framework.dataloader_workers") {
      s.dataloader_workers = m.value();
    }
  }
  // SageMaker's GPUMemoryUtilization is the share of the GPU's memory in
  // use: used / total when both are sent, else NVML's memory utilisation.
  for (const auto& [gpu, u] : used) {
    auto t = total.find(gpu);
    if (t != total.end() && t->second > 0) s.gpu_memory_percent[gpu] = 100.0 * u / t->second;
  }
  for (const auto& [gpu, v] : memory_util) s.gpu_memory_percent.emplace(gpu, v);
  return s;
}

// Every profiler rule: profiler data only; tensor steps are ignored unless
// a rule says otherwise.
class ProfilerRule : public Rule {
 public:
  bool WantsProfile() const override { return true; }
  bool KeepsJudgingAfterIssue() const override { return true; }
  Result OnStep(const StepData& step) override {
    (void)step;
    return Quiet();
  }
};

std::string Steps(const std::vector<int64_t>& steps, size_t max_shown = 10) {
  std::vector<int64_t> shown(steps.begin(),
                             steps.begin() + static_cast<long>(std::min(max_shown, steps.size())));
  std::string out = absl::StrJoin(shown, ", ");
  if (steps.size() > max_shown) absl::StrAppend(&out, ", ... (", steps.size(), " in all)");
  return out;
}

// --- StepOutlier ------------------------------------------------------------

// Per worker and mode, the durations of its KIND_STEP events. Once a series
// has more than kMinSteps steps (SageMaker's fixed 100), a step is an
// outlier when its duration is above mean + stddev x standard deviation of
// the series; the rule fires when a series has more than n_outliers of them.
class StepOutlier : public ProfilerRule {
 public:
  static constexpr size_t kMinSteps = 100;
  // SageMaker keeps every duration; we keep the newest 100000 per series.
  static constexpr size_t kMaxSteps = 100000;

  struct Config {
    double stddev = 3;
    std::optional<v1::Mode> mode;
    int64_t n_outliers = 10;
  };
  explicit StepOutlier(Config c) : c_(c) {}

  Result OnProfile(const ProfileData& data) override {
    std::set<v1::Mode> touched;
    for (const v1::TraceEvent& e : data.batch.events()) {
      if (e.kind() != v1::TraceEvent::KIND_STEP) continue;
      if (c_.mode.has_value() && e.mode() != *c_.mode) continue;
      series_[{data.worker, e.mode()}].Add(
          static_cast<double>(e.end_unix_micros() - e.start_unix_micros()) / 1000.0, e.step());
      touched.insert(e.mode());
    }
    for (v1::Mode mode : touched) {
      const Series& s = series_[{data.worker, mode}];
      if (s.ms.size() <= kMinSteps) continue;
      // Running sums and the sorted durations answer "more than n_outliers
      // above the threshold?" without a pass over the (up to kMaxSteps)
      // durations; only a series that fires is copied, for the exact
      // statistics and the outlier steps of the message.
      if (!s.MaybeMoreAbove(c_.stddev, c_.n_outliers)) continue;
      const std::vector<double> ms(s.ms.begin(), s.ms.end());
      const Outliers o = FindOutliers(ms, c_.stddev);
      if (static_cast<int64_t>(o.indices.size()) <= c_.n_outliers) continue;
      std::vector<int64_t> steps;
      size_t longest = o.indices[0];
      for (size_t i : o.indices) {
        steps.push_back(s.steps[i]);
        if (ms[i] > ms[longest]) longest = i;
      }
      Finding f;
      f.worker = data.worker;
      f.observed = static_cast<double>(o.indices.size());
      f.threshold = static_cast<double>(c_.n_outliers);
      f.message = absl::StrFormat(
          "worker %d, %s steps: %d of the last %d step durations are above mean %.3g ms + "
          "stddev=%g x standard deviation %.3g ms = %.3g ms, more than n_outliers=%d; "
          "outlier steps %s; longest %.3g ms at step %d",
          data.worker, ModeName(mode), o.indices.size(), ms.size(), o.stats.mean, c_.stddev,
          o.stats.stddev, o.threshold, c_.n_outliers, Steps(steps), ms[longest],
          s.steps[longest]);
      f.step = s.steps[longest];
      return Fire(std::move(f));
    }
    return Quiet();
  }

 private:
  // The newest kMaxSteps durations (ms) and their steps, also sorted, with
  // running sums for the mean and standard deviation.
  struct Series {
    std::deque<double> ms;
    std::deque<int64_t> steps;
    std::multiset<double> sorted;
    long double sum = 0;
    long double squares = 0;

    void Add(double duration_ms, int64_t step) {
      ms.push_back(duration_ms);
      steps.push_back(step);
      sorted.insert(duration_ms);
      sum += duration_ms;
      squares += static_cast<long double>(duration_ms) * duration_ms;
      if (ms.size() > kMaxSteps) {
        const double old = ms.front();
        sorted.erase(sorted.find(old));
        sum -= old;
        squares -= static_cast<long double>(old) * old;
        ms.pop_front();
        steps.pop_front();
      }
    }

    // Whether more than n durations are above mean + k x stddev, by the
    // running sums (rounding may differ from FindOutliers' in the last
    // bits: the caller confirms with it). Reads at most n + 1 of `sorted`.
    bool MaybeMoreAbove(double k, int64_t n) const {
      const long double count = static_cast<long double>(ms.size());
      const long double mean = sum / count;
      const long double variance = std::max<long double>(0, squares / count - mean * mean);
      // A hair below the threshold, so rounding never hides an outlier.
      const double threshold =
          static_cast<double>(mean + k * std::sqrt(variance)) * (1 - 1e-9);
      int64_t above = 0;
      for (auto it = sorted.upper_bound(threshold); it != sorted.end() && above <= n; ++it) {
        ++above;
      }
      return above > n;
    }
  };
  Config c_;
  std::map<std::pair<int32_t, v1::Mode>, Series> series_;
};

// SageMaker's mode: None, or a mode as smdebug spells it ("TRAIN",
// "modes.TRAIN", "Step:ModeKeys.TRAIN").
absl::StatusOr<std::optional<v1::Mode>> ReadMode(RuleParams& p, absl::string_view rule) {
  SONDE_ASSIGN_OR_RETURN(std::string text, p.String("mode", ""));
  absl::string_view m = absl::StripAsciiWhitespace(text);
  if (m.empty() || absl::EqualsIgnoreCase(m, "none")) return std::optional<v1::Mode>();
  absl::ConsumePrefix(&m, "Step:ModeKeys.");
  absl::ConsumePrefix(&m, "modes.");
  auto mode = ParseMode(m);
  if (!mode.ok()) return BadParam(rule, mode.status().message());
  return std::optional<v1::Mode>(*mode);
}

absl::StatusOr<std::unique_ptr<Rule>> MakeStepOutlier(RuleParams& p) {
  StepOutlier::Config c;
  SONDE_ASSIGN_OR_RETURN(c.stddev, FiniteDouble(p, "StepOutlier", "stddev", 3, 0));
  SONDE_ASSIGN_OR_RETURN(c.mode, ReadMode(p, "StepOutlier"));
  SONDE_ASSIGN_OR_RETURN(c.n_outliers, p.Int("n_outliers", 10, 0));
  SONDE_RETURN_IF_ERROR(ReadScanInterval(p));
  return std::unique_ptr<Rule>(new StepOutlier(c));
}

// --- CPUBottleneck and IOBottleneck -----------------------------------------

// Per worker, every metric snapshot is a data point; it is a bottleneck
// when some GPU is below gpu_threshold while the pressure (a CPU core above
// cpu_threshold, or I/O wait above io_threshold) is high. Once a worker has
// more than `patience` data points, the rule fires when more than
// `threshold` percent of all its data points were bottlenecks (SageMaker
// counts over the whole job, not a window). Needs GPU metrics: on a
// machine without GPUs nothing is a bottleneck.
class Bottleneck : public ProfilerRule {
 public:
  enum class Pressure { kCpu, kIo };
  struct Config {
    Pressure pressure = Pressure::kCpu;
    double threshold = 50;
    double gpu_threshold = 10;
    double pressure_threshold = 90;
    int64_t patience = 1000;
  };
  explicit Bottleneck(Config c) : c_(c) {}

  Result OnProfile(const ProfileData& data) override {
    if (data.batch.snapshots_size() == 0) return Quiet();
    Counts& n = counts_[data.worker];
    for (const v1::MetricSnapshot& snapshot : data.batch.snapshots()) {
      const SystemSample s = ReadSample(snapshot);
      ++n.datapoints;
      std::optional<std::pair<int, double>> low_gpu;
      for (const auto& [gpu, v] : s.gpu_util) {
        if (v < c_.gpu_threshold && (!low_gpu || v < low_gpu->second)) low_gpu = {gpu, v};
      }
      if (!low_gpu) continue;
      ++n.low_gpu;
      std::optional<std::pair<int, double>> high;  // (core or -1, value)
      if (c_.pressure == Pressure::kIo) {
        if (s.iowait.has_value() && *s.iowait > c_.pressure_threshold) high = {-1, *s.iowait};
      } else if (!s.cpu_core_util.empty()) {
        for (const auto& [core, v] : s.cpu_core_util) {
          if (v > c_.pressure_threshold && (!high || v > high->second)) high = {core, v};
        }
      } else if (s.cpu_util.has_value() && *s.cpu_util > c_.pressure_threshold) {
        high = {-1, *s.cpu_util};
      }
      if (!high) continue;
      ++n.bottlenecks;
      n.last = absl::StrFormat("GPU %d at %.3g%% while %s at %.3g%%", low_gpu->first,
                               low_gpu->second,
                               c_.pressure == Pressure::kIo ? std::string("I/O wait")
                               : high->first >= 0 ? absl::StrCat("CPU core ", high->first)
                                                  : std::string("the CPU"),
                               high->second);
    }
    if (n.datapoints <= c_.patience) return Quiet();
    const double percent = 100.0 * static_cast<double>(n.bottlenecks) /
                           static_cast<double>(n.datapoints);
    if (percent <= c_.threshold) return Quiet();
    const bool io = c_.pressure == Pressure::kIo;
    Finding f;
    f.worker = data.worker;
    f.observed = percent;
    f.threshold = c_.threshold;
    f.message = absl::StrFormat(
        "worker %d: %d of %d system snapshots (%.3g%%) had a GPU below gpu_threshold=%g%% while "
        "%s above %s=%g%%, more than threshold=%g%% (%d snapshots had a GPU that low); "
        "last: %s",
        data.worker, n.bottlenecks, n.datapoints, percent, c_.gpu_threshold,
        io ? "I/O wait was" : "a CPU core was", io ? "io_threshold" : "cpu_threshold",
        c_.pressure_threshold, c_.threshold, n.low_gpu, n.last);
    return Fire(std::move(f));
  }

 private:
  struct Counts {
    int64_t datapoints = 0;
    int64_t low_gpu = 0;
    int64_t bottlenecks = 0;
    std::string last;
  };
  Config c_;
  std::map<int32_t, Counts> counts_;
};

absl::StatusOr<std::unique_ptr<Rule>> MakeBottleneck(RuleParams& p, Bottleneck::Pressure kind) {
  const bool io = kind == Bottleneck::Pressure::kIo;
  const char* rule = io ? "IOBottleneck" : "CPUBottleneck";
  Bottleneck::Config c;
  c.pressure = kind;
  SONDE_ASSIGN_OR_RETURN(c.threshold, FiniteDouble(p, rule, "threshold", 50, 0));
  SONDE_ASSIGN_OR_RETURN(c.gpu_threshold, FiniteDouble(p, rule, "gpu_threshold", 10, 0));
  SONDE_ASSIGN_OR_RETURN(c.pressure_threshold,
                         FiniteDouble(p, rule, io ? "io_threshold" : "cpu_threshold",
                                      io ? 50 : 90, 0));
  SONDE_ASSIGN_OR_RETURN(c.patience, p.Int("patience", 1000, 0));
  SONDE_RETURN_IF_ERROR(ReadScanInterval(p));
  return std::unique_ptr<Rule>(new Bottleneck(c));
}

absl::StatusOr<std::unique_ptr<Rule>> MakeCPUBottleneck(RuleParams& p) {
  return MakeBottleneck(p, Bottleneck::Pressure::kCpu);
}
absl::StatusOr<std::unique_ptr<Rule>> MakeIOBottleneck(RuleParams& p) {
  return MakeBottleneck(p, Bottleneck::Pressure::kIo);
}

// --- LowGPUUtilization ------------------------------------------------------

// Per worker and GPU, the last `window` utilisation values; once a GPU has
// sent more than `patience` values: p95 < threshold_p95 is
// under-utilisation; p95 > threshold_p95 with p5 < threshold_p5 is a
// fluctuating GPU. Both fire.
class LowGPUUtilization : public ProfilerRule {
 public:
  struct Config {
    double threshold_p95 = 70;
    double threshold_p5 = 10;
    int64_t window = 500;
    int64_t patience = 1000;
  };
  explicit LowGPUUtilization(Config c) : c_(c) {}

  Result OnProfile(const ProfileData& data) override {
    std::set<int> touched;
    for (const v1::MetricSnapshot& snapshot : data.batch.snapshots()) {
      for (const auto& [gpu, v] : ReadSample(snapshot).gpu_util) {
        Window(data.worker, gpu).Add(v);
        touched.insert(gpu);
      }
    }
    for (int gpu : touched) {
      const SlidingWindow& w = Window(data.worker, gpu);
      if (w.seen() <= c_.patience) continue;
      // One sort of the window for every percentile the verdict names.
      const std::vector<double> q = w.Quantiles({0.05, 0.5, 0.95, 1});
      const double p5 = q[0];
      const double p95 = q[2];
      std::string what;
      if (p95 < c_.threshold_p95) {
        what = absl::StrFormat("p95 utilisation %.3g%% < threshold_p95=%g%% (under-utilised)",
                               p95, c_.threshold_p95);
      } else if (p95 > c_.threshold_p95 && p5 < c_.threshold_p5) {
        what = absl::StrFormat(
            "p95 utilisation %.3g%% > threshold_p95=%g%% but p5 %.3g%% < threshold_p5=%g%% "
            "(fluctuating)",
            p95, c_.threshold_p95, p5, c_.threshold_p5);
      } else {
        continue;
      }
      Finding f;
      f.worker = data.worker;
      f.observed = p95;
      f.threshold = c_.threshold_p95;
      f.message = absl::StrFormat("worker %d GPU %d: %s over the last %d of %d values (p5 %.3g%%, "
                                  "p50 %.3g%%, max %.3g%%)",
                                  data.worker, gpu, what, w.size(), w.seen(), p5, q[1], q[3]);
      return Fire(std::move(f));
    }
    return Quiet();
  }

 private:
  SlidingWindow& Window(int32_t worker, int gpu) {
    return windows_.try_emplace({worker, gpu}, static_cast<size_t>(c_.window)).first->second;
  }
  Config c_;
  std::map<std::pair<int32_t, int>, SlidingWindow> windows_;
};

absl::StatusOr<std::unique_ptr<Rule>> MakeLowGPUUtilization(RuleParams& p) {
  LowGPUUtilization::Config c;
  const char* rule = "LowGPUUtilization";
  SONDE_ASSIGN_OR_RETURN(c.threshold_p95, FiniteDouble(p, rule, "threshold_p95", 70, 0));
  SONDE_ASSIGN_OR_RETURN(c.threshold_p5, FiniteDouble(p, rule, "threshold_p5", 10, 0));
  SONDE_ASSIGN_OR_RETURN(c.window, ReadWindow(p, rule, 500));
  SONDE_ASSIGN_OR_RETURN(c.patience, p.Int("patience", 1000, 0));
  SONDE_RETURN_IF_ERROR(ReadScanInterval(p));
  return std::unique_ptr<Rule>(new LowGPUUtilization(c));
}

// --- GPUMemoryIncrease ------------------------------------------------------

// Per worker and GPU, the memory in use in percent of the GPU's memory.
// After each value, once more than `patience` were seen: fires when the
// moving average of the last `window` values is more than `increase`
// percentage points above the moving average one value earlier.
class GPUMemoryIncrease : public ProfilerRule {
 public:
  struct Config {
    double increase = 5;
    int64_t patience = 1000;
    int64_t window = 10;
  };
  explicit GPUMemoryIncrease(Config c) : c_(c) {}

  Result OnProfile(const ProfileData& data) override {
    for (const v1::MetricSnapshot& snapshot : data.batch.snapshots()) {
      for (const auto& [gpu, v] : ReadSample(snapshot).gpu_memory_percent) {
        SlidingWindow& w =
            windows_.try_emplace({data.worker, gpu}, static_cast<size_t>(c_.window) + 1)
                .first->second;
        w.Add(v);
        if (w.seen() <= c_.patience) continue;
        const auto diff = MovingAverageIncrease(w, static_cast<size_t>(c_.window));
        if (!diff.has_value() || *diff <= c_.increase) continue;
        Finding f;
        f.worker = data.worker;
        f.observed = *diff;
        f.threshold = c_.increase;
        f.message = absl::StrFormat(
            "worker %d GPU %d: memory in use %.3g%%; its moving average over window=%d values "
            "rose by %.3g percentage points in one value, more than increase=%g",
            data.worker, gpu, v, c_.window, *diff, c_.increase);
        return Fire(std::move(f));
      }
    }
    return Quiet();
  }

 private:
  Config c_;
  std::map<std::pair<int32_t, int>, SlidingWindow> windows_;
};

absl::StatusOr<std::unique_ptr<Rule>> MakeGPUMemoryIncrease(RuleParams& p) {
  GPUMemoryIncrease::Config c;
  SONDE_ASSIGN_OR_RETURN(c.increase, FiniteDouble(p, "GPUMemoryIncrease", "increase", 5, 0));
  SONDE_ASSIGN_OR_RETURN(c.patience, p.Int("patience", 1000, 0));
  SONDE_ASSIGN_OR_RETURN(c.window, ReadWindow(p, "GPUMemoryIncrease", 10));
  SONDE_RETURN_IF_ERROR(ReadScanInterval(p));
  return std::unique_ptr<Rule>(new GPUMemoryIncrease(c));
}

// --- MaxInitializationTime --------------------------------------------------

// Fires when initialisation takes more than `threshold` minutes: a
// KIND_INIT event (process start to first step) longer than that, or
// profiler data spanning more than that (from the earliest snapshot or
// event) while no step has been seen (no KIND_STEP event, no tensor step).
class MaxInitializationTime : public ProfilerRule {
 public:
  explicit MaxInitializationTime(double threshold_minutes) : minutes_(threshold_minutes) {}

  Result OnStep(const StepData& step) override {
    (void)step;
    started_ = true;
    return Quiet();
  }

  Result OnProfile(const ProfileData& data) override {
    const double limit_us = minutes_ * 60e6;
    for (const v1::TraceEvent& e : data.batch.events()) {
      See(e.start_unix_micros());
      See(e.end_unix_micros());
      if (e.kind() == v1::TraceEvent::KIND_STEP) started_ = true;
      if (e.kind() != v1::TraceEvent::KIND_INIT) continue;
      const double took = static_cast<double>(e.end_unix_micros() - e.start_unix_micros());
      if (took <= limit_us) continue;
      return Fire(Make(data.worker, took / 60e6,
                       absl::StrFormat("worker %d: initialisation (process start to first step) "
                                       "took %.3g minutes, more than threshold=%g minutes",
                                       data.worker, took / 60e6, minutes_)));
    }
    for (const v1::MetricSnapshot& s : data.batch.snapshots()) See(s.unix_micros());
    if (started_ || !first_.has_value()) return Quiet();
    const double waited = static_cast<double>(last_ - *first_);
    if (waited <= limit_us) return Quiet();
    return Fire(Make(data.worker, waited / 60e6,
                     absl::StrFormat("no training step yet %.3g minutes after the first profiler "
                                     "data, more than threshold=%g minutes",
                                     waited / 60e6, minutes_)));
  }

 private:
  void See(int64_t t) {
    if (t <= 0) return;
    if (!first_.has_value() || t < *first_) first_ = t;
    last_ = std::max(last_, t);
  }
  Finding Make(int32_t worker, double minutes, std::string message) const {
    Finding f;
    f.worker = worker;
    f.observed = minutes;
    f.threshold = minutes_;
    f.message = std::move(message);
    return f;
  }
  double minutes_;
  bool started_ = false;
  std::optional<int64_t> first_;
  int64_t last_ = 0;
};

absl::StatusOr<std::unique_ptr<Rule>> MakeMaxInitializationTime(RuleParams& p) {
  SONDE_ASSIGN_OR_RETURN(double minutes,
                         FiniteDouble(p, "MaxInitializationTime", "threshold", 20, 0));
  SONDE_RETURN_IF_ERROR(ReadScanInterval(p));
  return std::unique_ptr<Rule>(new MaxInitializationTime(minutes));
}

// --- BatchSize --------------------------------------------------------------

// Per worker, once more than `window` and more than `patience` CPU values
// were seen: fires when the p95 of total CPU utilisation, and for some GPU
// (with more than `window` values) the p95 of its utilisation and of its
// memory in use, over the last `window` values are all below their
// thresholds: the whole instance is under-used.
class BatchSize : public ProfilerRule {
 public:
  struct Config {
    double cpu_threshold_p95 = 70;
    double gpu_threshold_p95 = 70;
    double gpu_memory_threshold_p95 = 70;
    int64_t patience = 1000;
    int64_t window = 500;
  };
  explicit BatchSize(Config c) : c_(c) {}

  Result OnProfile(const ProfileData& data) override {
    if (data.batch.snapshots_size() == 0) return Quiet();
    Worker& w = workers_.try_emplace(data.worker, c_.window).first->second;
    for (const v1::MetricSnapshot& snapshot : data.batch.snapshots()) {
      const SystemSample s = ReadSample(snapshot);
      if (auto cpu = s.CpuTotal()) w.cpu.Add(*cpu);
      for (const auto& [gpu, v] : s.gpu_util) Window(w.gpu, gpu).Add(v);
      for (const auto& [gpu, v] : s.gpu_memory_percent) Window(w.memory, gpu).Add(v);
    }
    if (w.cpu.seen() <= c_.window || w.cpu.seen() <= c_.patience) return Quiet();
    const double cpu_p95 = *w.cpu.Quantile(0.95);
    if (cpu_p95 >= c_.cpu_threshold_p95) return Quiet();
    for (const auto& [gpu, util] : w.gpu) {
      auto memory = w.memory.find(gpu);
      if (util.seen() <= c_.window || memory == w.memory.end() || memory->second.size() == 0) {
        continue;
      }
      // Each window is sorted once, and memory's only when utilisation is low.
      const double gpu_p95 = *util.Quantile(0.95);
      if (gpu_p95 >= c_.gpu_threshold_p95) continue;
      const double memory_p95 = *memory->second.Quantile(0.95);
      if (memory_p95 >= c_.gpu_memory_threshold_p95) continue;
      Finding f;
      f.worker = data.worker;
      f.observed = gpu_p95;
      f.threshold = c_.gpu_threshold_p95;
      f.message = absl::StrFormat(
          "worker %d GPU %d over the last %d values: p95 utilisation %.3g%% < "
          "gpu_threshold_p95=%g%%, p95 memory in use %.3g%% < gpu_memory_threshold_p95=%g%%, "
          "and p95 CPU utilisation %.3g%% < cpu_threshold_p95=%g%%",
          data.worker, gpu, c_.window, gpu_p95, c_.gpu_threshold_p95, memory_p95,
          c_.gpu_memory_threshold_p95, cpu_p95, c_.cpu_threshold_p95);
      return Fire(std::move(f));
    }
    return Quiet();
  }

 private:
  struct Worker {
    explicit Worker(int64_t window) : cpu(static_cast<size_t>(window)) {}
    SlidingWindow cpu;
    std::map<int, SlidingWindow> gpu;
    std::map<int, SlidingWindow> memory;
  };
  SlidingWindow& Window(std::map<int, SlidingWindow>& windows, int gpu) {
    return windows.try_emplace(gpu, static_cast<size_t>(c_.window)).first->second;
  }
  Config c_;
  std::map<int32_t, Worker> workers_;
};

absl::StatusOr<std::unique_ptr<Rule>> MakeBatchSize(RuleParams& p) {
  BatchSize::Config c;
  const char* rule = "BatchSize";
  SONDE_ASSIGN_OR_RETURN(c.cpu_threshold_p95, FiniteDouble(p, rule, "cpu_threshold_p95", 70, 0));
  SONDE_ASSIGN_OR_RETURN(c.gpu_threshold_p95, FiniteDouble(p, rule, "gpu_threshold_p95", 70, 0));
  SONDE_ASSIGN_OR_RETURN(c.gpu_memory_threshold_p95,
                         FiniteDouble(p, rule, "gpu_memory_threshold_p95", 70, 0));
  SONDE_ASSIGN_OR_RETURN(c.patience, p.Int("patience", 1000, 0));
  SONDE_ASSIGN_OR_RETURN(c.window, ReadWindow(p, rule, 500));
  SONDE_RETURN_IF_ERROR(ReadScanInterval(p));
  return std::unique_ptr<Rule>(new BatchSize(c));
}

// --- LoadBalancing ----------------------------------------------------------

// Per worker and GPU, a histogram of every utilisation value (50 bins of 2
// percentage points). Once two GPUs of a worker have each sent more than
// `patience` values, fires when the Jensen-Shannon distance between their
// histograms is above `threshold`.
class LoadBalancing : public ProfilerRule {
 public:
  static constexpr size_t kBins = 50;
  LoadBalancing(double threshold, int64_t patience)
      : threshold_(threshold), patience_(patience) {}

  Result OnProfile(const ProfileData& data) override {
    if (data.batch.snapshots_size() == 0) return Quiet();
    std::map<int, Gpu>& gpus = workers_[data.worker];
    for (const v1::MetricSnapshot& snapshot : data.batch.snapshots()) {
      for (const auto& [gpu, v] : ReadSample(snapshot).gpu_util) {
        Gpu& g = gpus[gpu];
        if (g.histogram.empty()) g.histogram.assign(kBins, 0);
        if (auto bin = PercentBin(v, kBins)) g.histogram[*bin] += 1;
        g.sum += v;
        ++g.count;
      }
    }
    for (auto a = gpus.begin(); a != gpus.end(); ++a) {
      if (a->second.count <= patience_) continue;
      for (auto b = std::next(a); b != gpus.end(); ++b) {
        if (b->second.count <= patience_) continue;
        const double d = JensenShannonDistance(a->second.histogram, b->second.histogram);
        if (d <= threshold_) continue;
        Finding f;
        f.worker = data.worker;
        f.observed = d;
        f.threshold = threshold_;
        f.message = absl::StrFormat(
            "worker %d: utilisation of GPU %d (mean %.3g%% over %d values) and GPU %d (mean "
            "%.3g%% over %d values) differ by a Jensen-Shannon distance of %.3g, more than "
            "threshold=%g",
            data.worker, a->first, a->second.sum / static_cast<double>(a->second.count),
            a->second.count, b->first, b->second.sum / static_cast<double>(b->second.count),
            b->second.count, d, threshold_);
        return Fire(std::move(f));
      }
    }
    return Quiet();
  }

 private:
  struct Gpu {
    std::vector<double> histogram;
    double sum = 0;
    int64_t count = 0;
  };
  double threshold_;
  int64_t patience_;
  std::map<int32_t, std::map<int, Gpu>> workers_;
};

absl::StatusOr<std::unique_ptr<Rule>> MakeLoadBalancing(RuleParams& p) {
  SONDE_ASSIGN_OR_RETURN(double threshold, FiniteDouble(p, "LoadBalancing", "threshold", 0.5, 0));
  SONDE_ASSIGN_OR_RETURN(int64_t patience, p.Int("patience", 1000, 0));
  SONDE_RETURN_IF_ERROR(ReadScanInterval(p));
  return std::unique_ptr<Rule>(new LoadBalancing(threshold, patience));
}

// --- Dataloader -------------------------------------------------------------

// Per worker: the number of data-loader processes (the metric
// framework.dataloader_workers, sent by the framework hook) against the
// number of CPU cores (the cpu.<i>.util_percent metrics of a snapshot).
// Once more than `patience` counts arrived, fires when their median (of
// the last 1000) is below min_threshold percent or above max_threshold
// percent of the cores.
class Dataloader : public ProfilerRule {
 public:
  static constexpr size_t kHistory = 1000;
  struct Config {
    double min_threshold = 70;
    double max_threshold = 200;
    int64_t patience = 10;
  };
  explicit Dataloader(Config c) : c_(c) {}

  Result OnProfile(const ProfileData& data) override {
    if (data.batch.snapshots_size() == 0) return Quiet();
    Worker& w = workers_.try_emplace(data.worker).first->second;
    for (const v1::MetricSnapshot& snapshot : data.batch.snapshots()) {
      const SystemSample s = ReadSample(snapshot);
      w.cores = std::max(w.cores, s.cpu_core_util.size());
      if (s.dataloader_workers.has_value()) w.loaders.Add(*s.dataloader_workers);
    }
    if (w.loaders.seen() <= c_.patience || w.cores == 0) return Quiet();
    const double median = std::floor(*w.loaders.Quantile(0.5));
    const double cores = static_cast<double>(w.cores);
    const bool too_few = median < cores * c_.min_threshold / 100;
    const bool too_many = median > cores * c_.max_threshold / 100;
    if (!too_few && !too_many) return Quiet();
    Finding f;
    f.worker = data.worker;
    f.observed = median;
    f.threshold = cores * (too_few ? c_.min_threshold : c_.max_threshold) / 100;
    f.message = absl::StrFormat(
        "worker %d: a median of %g data-loader processes for %d CPU cores, %s %s=%g%% of the "
        "cores (%g)",
        data.worker, median, w.cores, too_few ? "fewer than" : "more than",
        too_few ? "min_threshold" : "max_threshold",
        too_few ? c_.min_threshold : c_.max_threshold, f.threshold);
    if (too_many) {
      f.suggestion = "Use fewer data-loader processes: they compete with the training for the CPU.";
    }
    return Fire(std::move(f));
  }

 private:
  struct Worker {
    size_t cores = 0;
    SlidingWindow loaders{kHistory};
  };
  Config c_;
  std::map<int32_t, Worker> workers_;
};

absl::StatusOr<std::unique_ptr<Rule>> MakeDataloader(RuleParams& p) {
  Dataloader::Config c;
  SONDE_ASSIGN_OR_RETURN(c.min_threshold, FiniteDouble(p, "Dataloader", "min_threshold", 70, 0));
  SONDE_ASSIGN_OR_RETURN(c.max_threshold, FiniteDouble(p, "Dataloader", "max_threshold", 200, 0));
  if (c.max_threshold < c.min_threshold) {
    return BadParam("Dataloader", absl::StrCat("max_threshold=", c.max_threshold,
                                               " is below min_threshold=", c.min_threshold));
  }
  SONDE_ASSIGN_OR_RETURN(c.patience, p.Int("patience", 10, 0));
  SONDE_RETURN_IF_ERROR(ReadScanInterval(p));
  return std::unique_ptr<Rule>(new Dataloader(c));
}

// --- OverallSystemUsage -----------------------------------------------------

// Summarises, per worker, p50 / p95 / max of total CPU utilisation, of each
// GPU's utilisation and of host memory in use, over the last kHistory
// snapshots. Never finds an issue.
class OverallSystemUsage : public ProfilerRule {
 public:
  static constexpr size_t kHistory = 10000;

  Result OnProfile(const ProfileData& data) override {
    Worker& w = workers_[data.worker];
    for (const v1::MetricSnapshot& snapshot : data.batch.snapshots()) {
      const SystemSample s = ReadSample(snapshot);
      if (auto cpu = s.CpuTotal()) Series(w, "CPU").Add(*cpu);
      for (const auto& [gpu, v] : s.gpu_util) Series(w, absl::StrCat("GPU ", gpu)).Add(v);
      double used = -1;
      double total = -1;
      for (const v1::MetricSample& m : snapshot.samples()) {
        if (m.name() == "memory.used_bytes") used = m.value();
        if (m.name() == "memory.total_bytes") total = m.value();
      }
      if (used >= 0 && total > 0) Series(w, "memory").Add(100.0 * used / total);
    }
    return Quiet();
  }

  // "worker 0: CPU p50 37% p95 45% max 50%, GPU 0 p50 ...; worker 1: ...",
  // or "" before any metric arrived.
  std::string Summary() const override {
    std::vector<std::string> workers;
    for (const auto& [worker, w] : workers_) {
      std::vector<std::string> parts;
      for (const auto& [name, series] : w) {
        if (series.size() == 0) continue;
        const std::vector<double> q = series.Quantiles({0.5, 0.95, 1});
        parts.push_back(
            absl::StrFormat("%s p50 %.3g%% p95 %.3g%% max %.3g%%", name, q[0], q[1], q[2]));
      }
      if (!parts.empty()) {
        workers.push_back(absl::StrCat("worker ", worker, ": ", absl::StrJoin(parts, ", ")));
      }
    }
    return absl::StrJoin(workers, "; ");
  }

 private:
  using Worker = std::map<std::string, SlidingWindow>;
  static SlidingWindow& Series(Worker& w, const std::string& name) {
    return w.try_emplace(name, kHistory).first->second;
  }
  std::map<int32_t, Worker> workers_;
};

absl::StatusOr<std::unique_ptr<Rule>> MakeOverallSystemUsage(RuleParams& p) {
  SONDE_RETURN_IF_ERROR(ReadScanInterval(p));
  return std::unique_ptr<Rule>(new OverallSystemUsage());
}

// --- ProfilerReport ---------------------------------------------------------

using Maker = absl::StatusOr<std::unique_ptr<Rule>> (*)(RuleParams&);

// The rules ProfilerReport runs, in the order its message lists them.
const std::vector<std::pair<std::string, Maker>>& ReportedRules() {
  static const auto* rules = new std::vector<std::pair<std::string, Maker>>{
      {"BatchSize", &MakeBatchSize},
      {"CPUBottleneck", &MakeCPUBottleneck},
      {"Dataloader", &MakeDataloader},
      {"GPUMemoryIncrease", &MakeGPUMemoryIncrease},
      {"IOBottleneck", &MakeIOBottleneck},
      {"LoadBalancing", &MakeLoadBalancing},
      {"LowGPUUtilization", &MakeLowGPUUtilization},
      {"MaxInitializationTime", &MakeMaxInitializationTime},
      {"StepOutlier", &MakeStepOutlier},
  };
  return *rules;
}

// Runs every other profiler rule on the same data (each with its defaults,
// or `<Rule>_<parameter>` overrides as SageMaker's ProfilerReport takes
// them) and keeps going after one triggers. At the end of training it finds
// an issue if any of them triggered, naming each with its message, and adds
// OverallSystemUsage's summary; otherwise NoIssuesFound. The individual
// rules give the live verdicts; this is the report.
class ProfilerReport : public ProfilerRule {
 public:
  struct Member {
    std::string name;
    std::unique_ptr<Rule> rule;
    std::optional<Finding> finding;
  };
  explicit ProfilerReport(std::vector<Member> members) : members_(std::move(members)) {}

  Result OnStep(const StepData& step) override {
    for (Member& m : members_) {
      if (m.finding.has_value()) continue;
      SONDE_ASSIGN_OR_RETURN(m.finding, m.rule->OnStep(step));
    }
    return Quiet();
  }

  Result OnProfile(const ProfileData& data) override {
    usage_.OnProfile(data).IgnoreError();
    for (Member& m : members_) {
      if (m.finding.has_value()) continue;
      auto finding = m.rule->OnProfile(data);
      if (!finding.ok()) {
        return absl::Status(finding.status().code(),
                            absl::StrCat(m.name, ": ", finding.status().message()));
      }
      m.finding = std::move(*finding);
    }
    return Quiet();
  }

  Result OnJobEnd() override {
    std::vector<std::string> triggered;
    int32_t worker = 0;
    for (Member& m : members_) {
      if (!m.finding.has_value()) {
        SONDE_ASSIGN_OR_RETURN(m.finding, m.rule->OnJobEnd());
      }
      if (!m.finding.has_value()) continue;
      if (triggered.empty()) worker = m.finding->worker;
      triggered.push_back(absl::StrCat(m.name, " (", m.finding->message, ")"));
    }
    if (triggered.empty()) return Quiet();
    Finding f;
    f.worker = worker;
    f.observed = static_cast<double>(triggered.size());
    f.threshold = 0;
    f.message = absl::StrCat(triggered.size(), " of ", members_.size(),
                             " profiler rules triggered: ", absl::StrJoin(triggered, "; "));
    const std::string usage = usage_.Summary();
    if (!usage.empty()) absl::StrAppend(&f.message, ". System usage: ", usage);
    return Fire(std::move(f));
  }

  // A quiet report still says what the system did.
  std::string Summary() const override { return usage_.Summary(); }

 private:
  std::vector<Member> members_;
  OverallSystemUsage usage_;
};

absl::StatusOr<std::unique_ptr<Rule>> MakeProfilerReport(RuleParams& p) {
  std::map<std::string, std::map<std::string, std::string>> overrides;
  for (const auto& [key, value] : p.TakeAll()) {
    if (key == "scan_interval_us") continue;  // SageMaker's; unused
    const size_t underscore = key.find('_');
    const std::string rule = key.substr(0, underscore);
    bool known = false;
    for (const auto& r : ReportedRules()) known = known || r.first == rule;
    if (underscore == std::string::npos || !known) {
      return BadParam("ProfilerReport",
                      absl::StrCat("unknown parameter '", key,
                                   "': expected <Rule>_<parameter>, e.g. CPUBottleneck_threshold"));
    }
    overrides[rule][key.substr(underscore + 1)] = value;
  }
  std::vector<ProfilerReport::Member> members;
  for (const auto& [name, maker] : ReportedRules()) {
    RuleParams params(name, overrides[name]);
    auto rule = maker(params);
    if (!rule.ok()) return BadParam("ProfilerReport", rule.status().message());
    absl::Status unused = params.CheckAllUsed();
    if (!unused.ok()) return BadParam("ProfilerReport", unused.message());
    members.push_back({name, std::move(*rule), std::nullopt});
  }
  return std::unique_ptr<Rule>(new ProfilerReport(std::move(members)));
}

}  // namespace

std::vector<std::pair<RuleInfo, RuleMaker>> ProfilerRuleTypes() {
  const RuleParameterInfo scan_interval = {
      "scan_interval_us", "60000000",
      "SageMaker's timeline scan interval; accepted, unused (every batch is judged on arrival)"};
  return {
      {{"StepOutlier",
        "Finds outliers in step duration: more than n_outliers steps longer than mean + stddev "
        "standard deviations (per worker and mode, once a series has more than 100 steps).",
        {{"stddev", "3", "factor of the standard deviation above the mean"},
         {"mode", "None", "TRAIN, EVAL, PREDICT or GLOBAL; None: every mode on its own"},
         {"n_outliers", "10", "outliers tolerated before the rule fires"},
         scan_interval},
        {},
        "Check for bottlenecks (CPU, I/O, data loading) at the outlier steps."},
       &MakeStepOutlier},
      {{"CPUBottleneck",
        "Finds GPUs starved by the CPU: more than threshold percent of the system snapshots "
        "(after patience) have a GPU below gpu_threshold while a CPU core is above "
        "cpu_threshold.",
        {{"threshold", "50", "percent of snapshots that are bottlenecks above which it fires"},
         {"gpu_threshold", "10", "GPU utilisation (percent) below which a GPU is idle"},
         {"cpu_threshold", "90", "CPU core utilisation (percent) above which the CPU is busy"},
         {"patience", "1000", "snapshots per worker before the rule judges"},
         scan_interval},
        {},
        "Move data pre-processing off the CPU (to the GPU or offline), use more data-loader "
        "workers, or pick an instance with more CPU cores per GPU."},
       &MakeCPUBottleneck},
      {{"IOBottleneck",
        "Finds GPUs waiting for I/O: more than threshold percent of the system snapshots "
        "(after patience) have a GPU below gpu_threshold while I/O wait is above io_threshold.",
        {{"threshold", "50", "percent of snapshots that are bottlenecks above which it fires"},
         {"gpu_threshold", "10", "GPU utilisation (percent) below which a GPU is idle"},
         {"io_threshold", "50", "I/O wait (percent of CPU time) above which I/O is the wait"},
         {"patience", "1000", "snapshots per worker before the rule judges"},
         scan_interval},
        {},
        "Pre-fetch data, read a binary format (TFRecord, RecordIO, WebDataset shards) or "
        "faster storage."},
       &MakeIOBottleneck},
      {{"LowGPUUtilization",
        "Finds a GPU that is under-utilised (p95 below threshold_p95) or fluctuating (p95 "
        "above it but p5 below threshold_p5) over its last window values.",
        {{"threshold_p95", "70", "p95 utilisation (percent) below which a GPU is under-used"},
         {"threshold_p5", "10", "p5 utilisation (percent) below which a busy GPU fluctuates"},
         {"window", "500", "values per GPU the percentiles are computed over"},
         {"patience", "1000", "values per GPU before the rule judges"},
         scan_interval},
        {},
        "Check for bottlenecks, minimise blocking calls, change the distributed training "
        "strategy, or increase the batch size."},
       &MakeLowGPUUtilization},
      {{"GPUMemoryIncrease",
        "Finds a large increase in GPU memory use: the moving average over window values "
        "rising by more than increase percentage points.",
        {{"increase", "5", "largest tolerated rise of the moving average (percentage points)"},
         {"patience", "1000", "values per GPU before the rule judges"},
         {"window", "10", "values in the moving average"},
         scan_interval},
        {},
        "Check for tensors kept alive across steps (e.g. accumulating the loss with its "
        "graph) or choose a GPU with more memory."},
       &MakeGPUMemoryIncrease},
      {{"MaxInitializationTime",
        "Finds an initialisation longer than threshold minutes: no training step that long "
        "after the job's first profiler data, or a longer init event.",
        {{"threshold", "20", "minutes the first step may take to arrive"}, scan_interval},
        {},
        "Check the data download and the model set-up before the training loop; stream "
        "data (e.g. Pipe or FastFile mode) instead of copying it first."},
       &MakeMaxInitializationTime},
      {{"BatchSize",
        "Finds an under-used instance (the batch may be too small): p95 of CPU utilisation, "
        "and of a GPU's utilisation and memory in use, all below their thresholds over the "
        "last window values.",
        {{"cpu_threshold_p95", "70", "p95 CPU utilisation (percent) below which the CPU is idle"},
         {"gpu_threshold_p95", "70", "p95 GPU utilisation (percent) below which a GPU is idle"},
         {"gpu_memory_threshold_p95", "70",
          "p95 GPU memory in use (percent) below which memory is spare"},
         {"patience", "1000", "values per worker before the rule judges"},
         {"window", "500", "values the percentiles are computed over"},
         scan_interval},
        {},
        "The batch size is too small, and GPUs are under-used. Consider running on a smaller "
        "instance type or increasing the batch size."},
       &MakeBatchSize},
      {{"LoadBalancing",
        "Finds unbalanced work between the GPUs of a worker: the Jensen-Shannon distance "
        "between two GPUs' utilisation histograms above threshold.",
        {{"threshold", "0.5", "largest tolerated Jensen-Shannon distance (0 to 0.83)"},
         {"patience", "1000", "values per GPU before the rule judges"},
         scan_interval},
        {},
        "Choose a different distributed training strategy or a different distributed data "
        "parallel library (Horovod, PyTorch DDP) so that every GPU gets the same work."},
       &MakeLoadBalancing},
      {{"Dataloader",
        "Finds too few or too many data-loader processes for the CPU cores: their median "
        "below min_threshold or above max_threshold percent of the cores (needs the metric "
        "framework.dataloader_workers).",
        {{"min_threshold", "70", "fewest data-loader processes, percent of the cores"},
         {"max_threshold", "200", "most data-loader processes, percent of the cores"},
         {"patience", "10", "counts per worker before the rule judges (smdebug's code)"},
         scan_interval},
        {},
        "Change the number of data-loader processes (e.g. num_workers of PyTorch's "
        "DataLoader)."},
       &MakeDataloader},
      {{"OverallSystemUsage",
        "Summarises system usage (p50, p95 and max of CPU, GPU and host memory per worker); "
        "never finds an issue. Its summary appears in ProfilerReport's verdict.",
        {scan_interval},
        {},
        "Nothing to do: a summary, not a check."},
       &MakeOverallSystemUsage},
      {{"ProfilerReport",
        "Runs every other profiler rule (BatchSize, CPUBottleneck, Dataloader, "
        "GPUMemoryIncrease, IOBottleneck, LoadBalancing, LowGPUUtilization, "
        "MaxInitializationTime, StepOutlier) and, at the end of training, reports which "
        "triggered with their messages and the system usage summary. Takes any parameter "
        "of those rules as <Rule>_<parameter>, e.g. CPUBottleneck_threshold=30.",
        {scan_interval},
        {},
        "Follow the advice of each rule that triggered."},
       &MakeProfilerReport},
  };
}

}  // namespace sonde::rules::profiler
