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
  };
}

}  // namespace sonde::rules::profiler
