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
      Series& s = series_[{data.worker, e.mode()}];
      s.ms.push_back(static_cast<double>(e.end_unix_micros() - e.start_unix_micros()) / 1000.0);
      s.steps.push_back(e.step());
      if (s.ms.size() > kMaxSteps) {
        s.ms.pop_front();
        s.steps.pop_front();
      }
      touched.insert(e.mode());
    }
    for (v1::Mode mode : touched) {
      const Series& s = series_[{data.worker, mode}];
      if (s.ms.size() <= kMinSteps) continue;
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
      return Fire(std::move(f));
    }
    return Quiet();
  }

 private:
  struct Series {
    std::deque<double> ms;
    std::deque<int64_t> steps;
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
      const double p95 = *w.Quantile(0.95);
      const double p5 = *w.Quantile(0.05);
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
                                  data.worker, gpu, what, w.size(), w.seen(), p5,
                                  *w.Quantile(0.5), *w.Max());
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
  SONDE_ASSIGN_OR_RETURN(c.window, p.Int("window", 500, 1));
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
  SONDE_ASSIGN_OR_RETURN(c.window, p.Int("window", 10, 1));
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
  };
}

}  // namespace sonde::rules::profiler
