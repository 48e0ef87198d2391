#include "rules/builtin_rules.h"

#include <cmath>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "rules/params.h"
#include "rules/profiler/profiler_rules.h"
#include "rules/stats_rules.h"
#include "rules/threshold_rule.h"
#include "rules/value_rules.h"
#include "rules/tensor_selector.h"

namespace sonde::rules {
namespace {

class ExplodingTensor : public Rule {
 public:
  ExplodingTensor(TensorSelector selector, bool only_nan)
      : selector_(std::move(selector)), only_nan_(only_nan) {}

  absl::StatusOr<std::optional<Finding>> OnStep(const StepData& step) override {
    for (const v1::TensorRecord& t : step.tensors) {
      if (!selector_.Matches(t)) continue;
      const v1::Statistics& s = t.statistics();
      const uint64_t inf = s.pos_inf_count() + s.neg_inf_count();
      const uint64_t bad = s.nan_count() + (only_nan_ ? 0 : inf);
      if (bad == 0) continue;
      Finding f;
      f.tensors.push_back(t.tensor_name());
      f.worker = t.worker();
      f.observed = static_cast<double>(bad);
      f.threshold = 0;
      f.message = absl::StrCat("tensor '", t.tensor_name(), "' at ", ModeName(step.mode),
                               " step ", step.mode_step, " has ", s.nan_count(), " NaN",
                               only_nan_ ? "" : absl::StrCat(" and ", inf, " Inf"), " of ",
                               s.count(), " values");
      return std::optional<Finding>(std::move(f));
    }
    return std::optional<Finding>();
  }

 private:
  TensorSelector selector_;
  bool only_nan_;
};

class LossNotDecreasing : public Rule {
 public:
  struct Config {
    int64_t num_steps;
    double diff_percent;
    double increase_threshold_percent;
    std::optional<v1::Mode> mode;
  };

  LossNotDecreasing(TensorSelector selector, Config config)
      : selector_(std::move(selector)), config_(config) {}

  absl::StatusOr<std::optional<Finding>> OnStep(const StepData& step) override {
    if (config_.mode.has_value() && step.mode != *config_.mode) {
      return std::optional<Finding>();
    }
    for (const v1::TensorRecord& t : step.tensors) {
      if (!selector_.Matches(t)) continue;
      Series& series = series_[{t.tensor_name(), step.mode}];
      const double value = LossValue(t.statistics());
      auto finding = Check(series, t, step, value);
      series.history.emplace_back(step.mode_step, value);
      // Keep only what a later comparison can still need.
      while (series.history.size() > 2 &&
             series.history[1].first <= step.mode_step - config_.num_steps) {
        series.history.erase(series.history.begin());
      }
      if (finding.has_value()) return finding;
    }
    return std::optional<Finding>();
  }

 private:
  struct Series {
    std::vector<std::pair<int64_t, double>> history;  // (mode step, loss)
    int64_t last_check = INT64_MIN;
    bool tolerated_increase = false;
  };

  static double LossValue(const v1::Statistics& s) {
    if (s.nan_count() > 0) return std::nan("");
    if (s.pos_inf_count() > 0) return INFINITY;
    if (s.neg_inf_count() > 0) return -INFINITY;
    return s.mean();
  }

  std::optional<Finding> Check(Series& series, const v1::TensorRecord& t,
                               const StepData& step, double current) {
    const int64_t s = step.mode_step;
    if (series.last_check != INT64_MIN && s - series.last_check < config_.num_steps) {
      return std::nullopt;
    }
    // The newest saved step at or before s - num_steps.
    const std::pair<int64_t, double>* prev = nullptr;
    for (const auto& h : series.history) {
      if (h.first <= s - config_.num_steps) prev = &h;
    }
    if (prev == nullptr) return std::nullopt;
    series.last_check = s;
    const double before = prev->second;
    Finding f;
    f.tensors.push_back(t.tensor_name());
    f.worker = t.worker();
    f.observed = current;
    const std::string where =
        absl::StrFormat("loss '%s' went from %g at %s step %d to %g at step %d",
                        t.tensor_name(), before, ModeName(step.mode), prev->first,
                        current, s);
    if (!std::isfinite(current) || !std::isfinite(before)) {
      f.threshold = before;
      f.message = absl::StrCat(where, ": not a finite loss");
      return f;
    }
    const double scale = std::fabs(before) > 0 ? std::fabs(before) : 1.0;
    const double decrease_percent = (before - current) / scale * 100.0;
    if (decrease_percent >= config_.diff_percent) {
      series.tolerated_increase = false;
      return std::nullopt;
    }
    const double increase_percent = -decrease_percent;
    if (increase_percent > 0 && increase_percent <= config_.increase_threshold_percent &&
        !series.tolerated_increase) {
      series.tolerated_increase = true;  // noise, once
      return std::nullopt;
    }
    if (increase_percent > config_.increase_threshold_percent) {
      f.observed = increase_percent;
      f.threshold = config_.increase_threshold_percent;
      f.message = absl::StrFormat("%s: up %.3g%%, more than increase_threshold_percent=%g",
                                  where, increase_percent,
                                  config_.increase_threshold_percent);
    } else {
      f.observed = decrease_percent;
      f.threshold = config_.diff_percent;
      f.message = absl::StrFormat(
          "%s over %d steps: decreased %.3g%%, less than diff_percent=%g", where,
          s - prev->first, decrease_percent, config_.diff_percent);
    }
    return f;
  }

  TensorSelector selector_;
  Config config_;
  std::map<std::pair<std::string, v1::Mode>, Series> series_;
};

absl::StatusOr<std::unique_ptr<Rule>> MakeExplodingTensor(RuleParams& p) {
  SONDE_ASSIGN_OR_RETURN(auto collections, p.List("collection_names"));
  SONDE_ASSIGN_OR_RETURN(auto regex, p.String("tensor_regex", ""));
  SONDE_ASSIGN_OR_RETURN(bool only_nan, p.Bool("only_nan", false));
  SONDE_ASSIGN_OR_RETURN(auto selector, TensorSelector::Create(collections, regex));
  return std::unique_ptr<Rule>(new ExplodingTensor(std::move(selector), only_nan));
}

absl::StatusOr<std::unique_ptr<Rule>> MakeLossNotDecreasing(RuleParams& p) {
  SONDE_ASSIGN_OR_RETURN(auto collections, p.List("collection_names"));
  SONDE_ASSIGN_OR_RETURN(auto regex, p.String("tensor_regex", ""));
  SONDE_ASSIGN_OR_RETURN(bool use_losses, p.Bool("use_losses_collection", true));
  LossNotDecreasing::Config c;
  SONDE_ASSIGN_OR_RETURN(c.num_steps, p.Int("num_steps", 10, 1));
  SONDE_ASSIGN_OR_RETURN(c.diff_percent, p.Double("diff_percent", 0.1));
  SONDE_ASSIGN_OR_RETURN(c.increase_threshold_percent,
                         p.Double("increase_threshold_percent", 5));
  SONDE_ASSIGN_OR_RETURN(auto mode, p.String("mode", ""));
  if (!mode.empty()) {
    SONDE_ASSIGN_OR_RETURN(v1::Mode m, ParseMode(mode));
    c.mode = m;
  }
  if (use_losses) collections.push_back("losses");
  if (collections.empty() && regex.empty()) {
    return absl::InvalidArgumentError(
        "LossNotDecreasing: with use_losses_collection=false, give collection_names "
        "or tensor_regex");
  }
  SONDE_ASSIGN_OR_RETURN(auto selector, TensorSelector::Create(collections, regex));
  return std::unique_ptr<Rule>(new LossNotDecreasing(std::move(selector), c));
}

}  // namespace

void RegisterBuiltinRules(RuleFactory& factory) {
  const std::pair<RuleInfo, RuleMaker> builtins[] = {
      {{"ExplodingTensor",
        "Finds NaN (and, unless only_nan, infinite) values in the watched tensors.",
        {{"collection_names", "", "comma-separated collections to watch"},
         {"tensor_regex", "", "regex of tensor names to watch"},
         {"only_nan", "false", "look for NaN only, not +-Inf"}},
        {},  // every tensor saved: asking for "all" would save every tensor of the model
        "Lower the learning rate, check the input scaling, or add gradient clipping."},
       &MakeExplodingTensor},
      {{"LossNotDecreasing",
        "Finds a loss that stops decreasing by at least diff_percent over num_steps.",
        {{"collection_names", "", "comma-separated collections holding losses"},
         {"tensor_regex", "", "regex of loss tensor names"},
         {"use_losses_collection", "true", "watch the losses collection"},
         {"num_steps", "10", "steps between the two losses compared"},
         {"diff_percent", "0.1", "minimum decrease, in percent of the earlier loss"},
         {"increase_threshold_percent", "5",
          "an increase up to this percent is tolerated once as noise"},
         {"mode", "", "TRAIN, EVAL, PREDICT or GLOBAL; empty: each mode on its own"}},
        {"losses"},
        "Check the learning rate (too high oscillates, too low crawls) and the data pipeline."},
       &MakeLossNotDecreasing},
  };
  for (const auto& [info, maker] : builtins) {
    absl::Status s = factory.Register(info, maker);
    (void)s;  // built-in names are distinct
  }
  RegisterStatisticsRules(factory);
  RegisterValueRules(factory);
  RegisterThresholdRule(factory);
  for (auto& [info, maker] : profiler::ProfilerRuleTypes()) {
    const std::string type = info.rule_type;
    absl::Status s = factory.Register(std::move(info), std::move(maker));
    // Profiler rule names are meant to be distinct from the others; if one
    // ever is not, say so rather than leave the rule silently missing.
    if (!s.ok()) LOG(ERROR) << "profiler rule " << type << " not registered: " << s;
  }
}

std::unique_ptr<RuleFactory> BuiltinRuleFactory() {
  auto factory = std::make_unique<RuleFactory>();
  RegisterBuiltinRules(*factory);
  return factory;
}

}  // namespace sonde::rules
