#include "rules/threshold_rule.h"

#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "rules/tensor_selector.h"

namespace sonde::rules {
namespace {

// The statistics a declarative rule can test, by the names smdebug users
// know (reductions, abs_ variants, norms) plus Sonde's counts.
const std::map<std::string, std::function<double(const v1::Statistics&)>>& Statistics() {
  static const auto* stats = new std::map<std::string, std::function<double(const v1::Statistics&)>>{
      {"min", [](const v1::Statistics& s) { return s.min(); }},
      {"max", [](const v1::Statistics& s) { return s.max(); }},
      {"mean", [](const v1::Statistics& s) { return s.mean(); }},
      {"std", [](const v1::Statistics& s) { return s.std(); }},
      {"variance", [](const v1::Statistics& s) { return s.variance(); }},
      {"sum", [](const v1::Statistics& s) { return s.sum(); }},
      {"l1", [](const v1::Statistics& s) { return s.l1(); }},
      {"l2", [](const v1::Statistics& s) { return s.l2(); }},
      {"abs_min", [](const v1::Statistics& s) { return s.abs_min(); }},
      {"abs_max", [](const v1::Statistics& s) { return s.abs_max(); }},
      {"abs_mean",
       [](const v1::Statistics& s) {
         return s.finite_count() > 0 ? s.l1() / static_cast<double>(s.finite_count()) : 0.0;
       }},
      {"nan_count", [](const v1::Statistics& s) { return static_cast<double>(s.nan_count()); }},
      {"inf_count",
       [](const v1::Statistics& s) {
         return static_cast<double>(s.pos_inf_count() + s.neg_inf_count());
       }},
      {"zero_fraction",
       [](const v1::Statistics& s) {
         return s.count() > 0 ? static_cast<double>(s.zero_count()) / s.count() : 0.0;
       }},
      {"nonfinite_fraction",
       [](const v1::Statistics& s) {
         return s.count() > 0 ? static_cast<double>(s.count() - s.finite_count()) / s.count()
                              : 0.0;
       }},
  };
  return *stats;
}

const std::map<std::string, std::function<bool(double, double)>>& Comparisons() {
  static const auto* cmp = new std::map<std::string, std::function<bool(double, double)>>{
      {">", std::greater<double>()},     {">=", std::greater_equal<double>()},
      {"<", std::less<double>()},        {"<=", std::less_equal<double>()},
      {"==", std::equal_to<double>()},   {"!=", std::not_equal_to<double>()},
  };
  return *cmp;
}

class ThresholdRule : public Rule {
 public:
  ThresholdRule(TensorSelector selector, std::string statistic, std::string comparison,
                double threshold, int64_t consecutive, std::optional<v1::Mode> mode)
      : selector_(std::move(selector)),
        statistic_(std::move(statistic)),
        get_(Statistics().at(statistic_)),
        comparison_(std::move(comparison)),
        compare_(Comparisons().at(comparison_)),
        threshold_(threshold),
        consecutive_(consecutive),
        mode_(mode) {}

  absl::StatusOr<std::optional<Finding>> OnStep(const StepData& step) override {
    if (mode_.has_value() && step.mode != *mode_) return std::optional<Finding>();
    for (const v1::TensorRecord& t : step.tensors) {
      if (!selector_.Matches(t)) continue;
      const auto key = std::make_pair(t.tensor_name(), t.worker());
      const double value = get_(t.statistics());
      int64_t& streak = streaks_[key];
      streak = compare_(value, threshold_) ? streak + 1 : 0;
      if (streak >= consecutive_) {
        Finding f;
        f.tensors = {t.tensor_name()};
        f.worker = t.worker();
        f.observed = value;
        f.threshold = threshold_;
        f.message = absl::StrFormat("%s of '%s' is %g %s %g%s at step %d", statistic_,
                                    t.tensor_name(), value, comparison_, threshold_,
                                    consecutive_ > 1
                                        ? absl::StrCat(" for ", consecutive_, " saved steps")
                                        : std::string(),
                                    step.step);
        return std::optional<Finding>(std::move(f));
      }
    }
    return std::optional<Finding>();
  }

 private:
  TensorSelector selector_;
  std::string statistic_;
  std::function<double(const v1::Statistics&)> get_;
  std::string comparison_;
  std::function<bool(double, double)> compare_;
  double threshold_;
  int64_t consecutive_;
  std::optional<v1::Mode> mode_;
  std::map<std::pair<std::string, int32_t>, int64_t> streaks_;
};

absl::StatusOr<std::unique_ptr<Rule>> MakeThreshold(RuleParams& p) {
  SONDE_ASSIGN_OR_RETURN(auto collections, p.List("collection_names"));
  SONDE_ASSIGN_OR_RETURN(auto regex, p.String("tensor_regex", ""));
  if (collections.empty() && regex.empty()) {
    return absl::InvalidArgumentError("Threshold: give collection_names or tensor_regex");
  }
  SONDE_ASSIGN_OR_RETURN(auto statistic, p.String("statistic", "abs_max"));
  if (Statistics().count(statistic) == 0) {
    std::vector<std::string> known;
    for (const auto& [name, fn] : Statistics()) known.push_back(name);
    return absl::InvalidArgumentError(absl::StrCat("Threshold: unknown statistic '", statistic,
                                                   "' (known: ", absl::StrJoin(known, ", "), ")"));
  }
  SONDE_ASSIGN_OR_RETURN(auto comparison, p.String("comparison", ">"));
  if (Comparisons().count(comparison) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Threshold: unknown comparison '", comparison, "' (known: > >= < <= == !=)"));
  }
  SONDE_ASSIGN_OR_RETURN(auto threshold_s, p.String("threshold", ""));
  double threshold;
  if (threshold_s.empty() || !absl::SimpleAtod(threshold_s, &threshold)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Threshold: parameter threshold='", threshold_s, "' must be a number"));
  }
  SONDE_ASSIGN_OR_RETURN(int64_t consecutive, p.Int("consecutive_steps", 1, 1));
  SONDE_ASSIGN_OR_RETURN(auto mode_s, p.String("mode", ""));
  std::optional<v1::Mode> mode;
  if (!mode_s.empty()) {
    SONDE_ASSIGN_OR_RETURN(v1::Mode m, ParseMode(mode_s));
    mode = m;
  }
  SONDE_ASSIGN_OR_RETURN(auto selector, TensorSelector::Create(collections, regex));
  return std::unique_ptr<Rule>(
      new ThresholdRule(std::move(selector), statistic, comparison, threshold, consecutive, mode));
}

// StalledTrainingRule: no new step has reached the rules for `threshold`
// seconds while the job runs (SageMaker: no new tensor emitted). With
// stop_training_on_fire the job is stopped, as if StopTraining were among
// its actions. training_job_name_prefix is SageMaker's way of finding the
// job to stop; here the job is known, so it is accepted and ignored.
class StalledTraining : public Rule {
 public:
  StalledTraining(absl::Duration threshold, bool stop)
      : threshold_(threshold), stop_(stop), last_(absl::Now()) {}

  bool WantsTicks() const override { return true; }

  absl::StatusOr<std::optional<Finding>> OnStep(const StepData& step) override {
    last_ = absl::Now();
    last_step_ = step.step;
    return std::optional<Finding>();
  }

  absl::StatusOr<std::optional<Finding>> OnTick(absl::Time now) override {
    const absl::Duration idle = now - last_;
    if (idle <= threshold_) return std::optional<Finding>();
    Finding f;
    f.observed = absl::ToDoubleSeconds(idle);
    f.threshold = absl::ToDoubleSeconds(threshold_);
    f.stop_training = stop_;
    f.message = last_step_ < 0
                    ? absl::StrFormat("no step in %.0f s since the job started (threshold %.0f s)",
                                      f.observed, f.threshold)
                    : absl::StrFormat("no new step for %.0f s after step %d (threshold %.0f s)",
                                      f.observed, last_step_, f.threshold);
    return std::optional<Finding>(std::move(f));
  }

 private:
  absl::Duration threshold_;
  bool stop_;
  absl::Time last_;
  int64_t last_step_ = -1;
};

absl::StatusOr<std::unique_ptr<Rule>> MakeStalledTraining(RuleParams& p) {
  SONDE_ASSIGN_OR_RETURN(double seconds, p.Double("threshold", 1800));
  if (!(seconds > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("StalledTrainingRule: threshold=", seconds, " must be positive seconds"));
  }
  SONDE_ASSIGN_OR_RETURN(bool stop, p.Bool("stop_training_on_fire", false));
  SONDE_ASSIGN_OR_RETURN(auto prefix, p.String("training_job_name_prefix", ""));
  (void)prefix;
  return std::unique_ptr<Rule>(new StalledTraining(absl::Seconds(seconds), stop));
}

}  // namespace

void RegisterThresholdRule(RuleFactory& factory) {
  {
    RuleInfo stalled{
        "StalledTrainingRule",
        "Finds a job that stopped making progress: no new step for `threshold` seconds.",
        {{"threshold", "1800", "seconds without a new step"},
         {"stop_training_on_fire", "false", "also stop the job's training"},
         {"training_job_name_prefix", "", "accepted for SageMaker compatibility; unused"}},
        {},
        "Look for a hung data loader, a deadlock between workers, or a dead worker."};
    absl::Status s = factory.Register(std::move(stalled), &MakeStalledTraining);
    (void)s;  // a built-in name
  }
  RuleInfo info{
      "Threshold",
      "Declarative: a statistic of the selected tensors compared with a threshold for a number "
      "of consecutive saved steps.",
      {{"collection_names", "", "collections to watch (this or tensor_regex is required)"},
       {"tensor_regex", "", "tensor names to watch"},
       {"statistic", "abs_max",
        "min, max, mean, std, variance, sum, l1, l2, abs_min, abs_max, abs_mean, nan_count, "
        "inf_count, zero_fraction, nonfinite_fraction"},
       {"comparison", ">", "> >= < <= == !="},
       {"threshold", "", "the number compared with (required)"},
       {"consecutive_steps", "1", "saved steps in a row the comparison must hold"},
       {"mode", "", "one mode only"}},
      {},
      "Look at the named tensor's series (sonde series) around the step."};
  absl::Status s = factory.Register(std::move(info), &MakeThreshold);
  (void)s;  // a built-in name
}

}  // namespace sonde::rules
