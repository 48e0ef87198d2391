#include "rules/stats_rules.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "rules/params.h"
#include "rules/tensor_selector.h"

// Every rule here reads only the tensors' statistics records (see
// proto/tensor.proto), so it works the same for tensors saved with their
// values and for reductions-only tensors. The semantics of each rule are
// summarised in rules/stats_rules.h; the comments on each class give the
// details and where we depart from SageMaker Debugger.

namespace sonde::rules {
namespace {

using Result = absl::StatusOr<std::optional<Finding>>;

Result Quiet() { return std::optional<Finding>(); }
Result Fire(Finding f) { return std::optional<Finding>(std::move(f)); }

bool InCollection(const v1::TensorRecord& t, absl::string_view collection) {
  for (const std::string& c : t.collections()) {
    if (c == collection) return true;
  }
  return false;
}

// Gradients: the "gradients" collection, or smdebug's names ("gradient/..."
// in PyTorch and MXNet, "gradients/..." in TensorFlow).
bool IsGradient(const v1::TensorRecord& t) {
  return InCollection(t, "gradients") || absl::StartsWith(t.tensor_name(), "gradient");
}

bool IsBias(const v1::TensorRecord& t) { return absl::StrContains(t.tensor_name(), "bias"); }

uint64_t NonFiniteCount(const v1::Statistics& s) {
  return s.nan_count() + s.pos_inf_count() + s.neg_inf_count();
}

// "TRAIN step 12".
std::string Where(const StepData& step) {
  return absl::StrCat(ModeName(step.mode), " step ", step.mode_step);
}

std::string Quoted(const std::vector<std::string>& names, size_t max_names = 5) {
  std::vector<std::string> q;
  for (size_t i = 0; i < names.size() && i < max_names; ++i) {
    q.push_back(absl::StrCat("'", names[i], "'"));
  }
  std::string out = absl::StrJoin(q, ", ");
  if (names.size() > max_names) absl::StrAppend(&out, " and ", names.size() - max_names, " more");
  return out;
}

absl::Status BadParam(absl::string_view rule, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(rule, ": ", message));
}

// A number parameter whose default is "not set": "" (or SageMaker's "None").
absl::StatusOr<std::optional<double>> OptionalDouble(RuleParams& p, absl::string_view rule,
                                                     absl::string_view key) {
  SONDE_ASSIGN_OR_RETURN(std::string text, p.String(key, ""));
  text = std::string(absl::StripAsciiWhitespace(text));
  if (text.empty() || absl::EqualsIgnoreCase(text, "none")) return std::optional<double>();
  double v;
  if (!absl::SimpleAtod(text, &v) || !std::isfinite(v)) {
    return BadParam(rule, absl::StrCat("parameter ", key, "='", text, "' is not a number"));
  }
  return std::optional<double>(v);
}

absl::StatusOr<double> FiniteDouble(RuleParams& p, absl::string_view rule, absl::string_view key,
                                    double fallback) {
  SONDE_ASSIGN_OR_RETURN(double v, p.Double(key, fallback));
  if (!std::isfinite(v)) {
    return BadParam(rule, absl::StrCat("parameter ", key, " must be a finite number"));
  }
  return v;
}

// The loss of one step: the mean of every finite element of the selected
// loss tensors of all workers (for the usual scalar loss, the mean of the
// workers' losses). Non-finite when any selected element is NaN or +-Inf.
struct StepLoss {
  double value = 0;
  bool finite = true;
  std::vector<std::string> tensors;
  int32_t worker = 0;
};

std::optional<StepLoss> LossOf(const StepData& step, TensorSelector& selector) {
  StepLoss loss;
  double sum = 0;
  uint64_t n = 0;
  bool any = false;
  for (const v1::TensorRecord& t : step.tensors) {
    if (!selector.Matches(t) || t.statistics().count() == 0) continue;
    if (!any) loss.worker = t.worker();
    any = true;
    if (std::find(loss.tensors.begin(), loss.tensors.end(), t.tensor_name()) ==
        loss.tensors.end()) {
      loss.tensors.push_back(t.tensor_name());
    }
    const v1::Statistics& s = t.statistics();
    if (NonFiniteCount(s) > 0) loss.finite = false;
    sum += s.sum();
    n += s.finite_count();
  }
  if (!any) return std::nullopt;
  loss.value = loss.finite && n > 0 ? sum / static_cast<double>(n) : std::nan("");
  if (n == 0) loss.finite = false;
  return loss;
}

absl::StatusOr<TensorSelector> LossesSelector() { return TensorSelector::Create({"losses"}, ""); }

// --- VanishingGradient ----------------------------------------------------

// Fires at the first step where a gradient's mean absolute value
// (l1 / finite_count, smdebug's abs_mean reduction) is below threshold.
class VanishingGradient : public Rule {
 public:
  explicit VanishingGradient(double threshold) : threshold_(threshold) {}

  Result OnStep(const StepData& step) override {
    std::vector<std::string> names;
    const v1::TensorRecord* first = nullptr;
    double first_value = 0;
    int gradients = 0;
    for (const v1::TensorRecord& t : step.tensors) {
      if (!IsGradient(t)) continue;
      const v1::Statistics& s = t.statistics();
      if (s.finite_count() == 0) continue;
      ++gradients;
      const double abs_mean = s.l1() / static_cast<double>(s.finite_count());
      if (abs_mean >= threshold_) continue;
      if (first == nullptr) {
        first = &t;
        first_value = abs_mean;
      }
      names.push_back(t.tensor_name());
    }
    if (first == nullptr) return Quiet();
    Finding f;
    f.tensors = names;
    f.worker = first->worker();
    f.observed = first_value;
    f.threshold = threshold_;
    f.message = absl::StrFormat(
        "gradient '%s' at %s has mean |g| %.3g, below threshold %g (%d of %d "
        "gradients are)",
        first->tensor_name(), Where(step), first_value, threshold_, names.size(), gradients);
    return Fire(std::move(f));
  }

 private:
  double threshold_;
};

absl::StatusOr<std::unique_ptr<Rule>> MakeVanishingGradient(RuleParams& p) {
  SONDE_ASSIGN_OR_RETURN(double threshold, FiniteDouble(p, "VanishingGradient", "threshold", 1e-7));
  if (threshold <= 0) {
    return BadParam("VanishingGradient",
                    absl::StrCat("threshold=", threshold, " must be positive"));
  }
  return std::unique_ptr<Rule>(new VanishingGradient(threshold));
}

// --- AllZero --------------------------------------------------------------

// Fires at the first step where a selected tensor has at least threshold
// percent of its elements (NaN and Inf included in the total) equal to zero.
class AllZero : public Rule {
 public:
  AllZero(TensorSelector selector, double threshold)
      : selector_(std::move(selector)), threshold_(threshold) {}

  Result OnStep(const StepData& step) override {
    std::vector<std::string> names;
    const v1::TensorRecord* first = nullptr;
    double first_percent = 0;
    for (const v1::TensorRecord& t : step.tensors) {
      if (!selector_.Matches(t)) continue;
      const v1::Statistics& s = t.statistics();
      if (s.count() == 0) continue;
      const double percent =
          100.0 * static_cast<double>(s.zero_count()) / static_cast<double>(s.count());
      if (percent < threshold_) continue;
      if (first == nullptr) {
        first = &t;
        first_percent = percent;
      }
      names.push_back(t.tensor_name());
    }
    if (first == nullptr) return Quiet();
    const v1::Statistics& s = first->statistics();
    Finding f;
    f.tensors = names;
    f.worker = first->worker();
    f.observed = first_percent;
    f.threshold = threshold_;
    f.message = absl::StrFormat(
        "tensor '%s' at %s is %.4g%% zeros (%d of %d values), at least "
        "threshold %g%%",
        first->tensor_name(), Where(step), first_percent, s.zero_count(), s.count(), threshold_);
    if (names.size() > 1) {
      absl::StrAppend(&f.message, "; also ",
                      Quoted(std::vector<std::string>(names.begin() + 1, names.end())));
    }
    return Fire(std::move(f));
  }

 private:
  TensorSelector selector_;
  double threshold_;
};

absl::StatusOr<std::unique_ptr<Rule>> MakeAllZero(RuleParams& p) {
  SONDE_ASSIGN_OR_RETURN(auto collections, p.List("collection_names"));
  SONDE_ASSIGN_OR_RETURN(auto regex, p.String("tensor_regex", ""));
  SONDE_ASSIGN_OR_RETURN(double threshold, FiniteDouble(p, "AllZero", "threshold", 100));
  if (collections.empty() && regex.empty()) {
    return BadParam("AllZero", "give collection_names or tensor_regex");
  }
  if (threshold <= 0 || threshold > 100) {
    return BadParam("AllZero",
                    absl::StrCat("threshold=", threshold, " must be a percentage in (0, 100]"));
  }
  SONDE_ASSIGN_OR_RETURN(auto selector, TensorSelector::Create(collections, regex));
  return std::unique_ptr<Rule>(new AllZero(std::move(selector), threshold));
}

// --- TensorVariance -------------------------------------------------------

// Fires at the first step where a selected tensor's population variance
// (over its finite elements) is above max_threshold or below min_threshold.
class TensorVariance : public Rule {
 public:
  TensorVariance(TensorSelector selector, std::optional<double> max, std::optional<double> min)
      : selector_(std::move(selector)), max_(max), min_(min) {}

  Result OnStep(const StepData& step) override {
    for (const v1::TensorRecord& t : step.tensors) {
      if (!selector_.Matches(t)) continue;
      const v1::Statistics& s = t.statistics();
      if (s.finite_count() == 0) continue;
      const double var = s.variance();
      const bool high = max_.has_value() && var > *max_;
      const bool low = min_.has_value() && var < *min_;
      if (!high && !low) continue;
      Finding f;
      f.tensors.push_back(t.tensor_name());
      f.worker = t.worker();
      f.observed = var;
      f.threshold = high ? *max_ : *min_;
      f.message = absl::StrFormat("tensor '%s' at %s has variance %.4g, %s %s %g", t.tensor_name(),
                                  Where(step), var, high ? "above" : "below",
                                  high ? "max_threshold" : "min_threshold", f.threshold);
      return Fire(std::move(f));
    }
    return Quiet();
  }

 private:
  TensorSelector selector_;
  std::optional<double> max_;
  std::optional<double> min_;
};

absl::StatusOr<std::unique_ptr<Rule>> MakeTensorVariance(RuleParams& p) {
  SONDE_ASSIGN_OR_RETURN(auto collections, p.List("collection_names"));
  SONDE_ASSIGN_OR_RETURN(auto regex, p.String("tensor_regex", ""));
  SONDE_ASSIGN_OR_RETURN(auto max, OptionalDouble(p, "TensorVariance", "max_threshold"));
  SONDE_ASSIGN_OR_RETURN(auto min, OptionalDouble(p, "TensorVariance", "min_threshold"));
  if (collections.empty() && regex.empty()) {
    return BadParam("TensorVariance", "give collection_names or tensor_regex");
  }
  if (!max.has_value() && !min.has_value()) {
    return BadParam("TensorVariance", "give max_threshold or min_threshold (or both)");
  }
  if (max.has_value() && min.has_value() && *min > *max) {
    return BadParam("TensorVariance",
                    absl::StrCat("min_threshold=", *min, " is above max_threshold=", *max));
  }
  SONDE_ASSIGN_OR_RETURN(auto selector, TensorSelector::Create(collections, regex));
  return std::unique_ptr<Rule>(new TensorVariance(std::move(selector), max, min));
}

// --- Overfit --------------------------------------------------------------

// Steps with a global step below start_step are ignored. A TRAIN step's loss
// becomes "the latest train loss". At each EVAL step with a loss, once a
// train loss is known, ratio = (eval - train) / |train|; a ratio above
// ratio_threshold extends a streak, anything else ends it. Fires when the
// streak reaches patience (so patience counts consecutive EVAL steps).
// Non-finite losses, a zero train loss and GLOBAL/PREDICT steps are skipped
// (neither extend nor end the streak).
class Overfit : public Rule {
 public:
  struct Config {
    int64_t start_step;
    int64_t patience;
    double ratio_threshold;
  };
  Overfit(TensorSelector selector, Config c) : selector_(std::move(selector)), config_(c) {}

  Result OnStep(const StepData& step) override {
    if (step.step < config_.start_step) return Quiet();
    if (step.mode != v1::MODE_TRAIN && step.mode != v1::MODE_EVAL) return Quiet();
    std::optional<StepLoss> loss = LossOf(step, selector_);
    if (!loss.has_value() || !loss->finite) return Quiet();
    if (step.mode == v1::MODE_TRAIN) {
      train_ = loss->value;
      train_step_ = step.step;
      return Quiet();
    }
    if (!train_.has_value() || *train_ == 0) return Quiet();
    const double ratio = (loss->value - *train_) / std::fabs(*train_);
    streak_ = ratio > config_.ratio_threshold ? streak_ + 1 : 0;
    if (streak_ < config_.patience) return Quiet();
    Finding f;
    f.tensors = loss->tensors;
    f.worker = loss->worker;
    f.observed = ratio;
    f.threshold = config_.ratio_threshold;
    f.message = absl::StrFormat(
        "EVAL loss %.4g at step %d (EVAL step %d) vs TRAIN loss %.4g at step "
        "%d: "
        "(eval - train) / train = %.3g, above ratio_threshold %g for %d "
        "consecutive "
        "evaluation(s)",
        loss->value, step.step, step.mode_step, *train_, train_step_, ratio,
        config_.ratio_threshold, streak_);
    return Fire(std::move(f));
  }

 private:
  TensorSelector selector_;
  Config config_;
  std::optional<double> train_;
  int64_t train_step_ = 0;
  int64_t streak_ = 0;
};

absl::StatusOr<std::unique_ptr<Rule>> MakeOverfit(RuleParams& p) {
  SONDE_ASSIGN_OR_RETURN(auto regex, p.String("tensor_regex", ""));
  Overfit::Config c;
  SONDE_ASSIGN_OR_RETURN(c.start_step, p.Int("start_step", 0, 0));
  SONDE_ASSIGN_OR_RETURN(c.patience, p.Int("patience", 1, 1));
  SONDE_ASSIGN_OR_RETURN(c.ratio_threshold, FiniteDouble(p, "Overfit", "ratio_threshold", 0.1));
  if (c.ratio_threshold < 0) {
    return BadParam("Overfit",
                    absl::StrCat("ratio_threshold=", c.ratio_threshold, " must be at least 0"));
  }
  // tensor_regex picks the loss; without it, the losses collection.
  std::vector<std::string> collections;
  if (regex.empty()) collections.push_back("losses");
  SONDE_ASSIGN_OR_RETURN(auto selector, TensorSelector::Create(collections, regex));
  return std::unique_ptr<Rule>(new Overfit(std::move(selector), c));
}

// --- Overtraining ---------------------------------------------------------

// Best-loss tracking with early stopping's "min_delta" reading of delta.
struct BestTracker {
  bool has_best = false;
  double best = 0;
  int64_t best_step = 0;  // mode step
  int64_t since = 0;      // saved steps since the best

  // Returns true if `value` is a new best (by more than delta).
  bool Add(double value, bool finite, int64_t mode_step, double delta) {
    if (finite && (!has_best || value < best - delta)) {
      has_best = true;
      best = value;
      best_step = mode_step;
      since = 0;
      return true;
    }
    ++since;
    return false;
  }
};

// Per mode (TRAIN and GLOBAL with patience_train, EVAL with
// patience_validation; PREDICT is ignored), the first finite loss is the
// best; a later saved step improves only if its loss < best - delta (delta
// is absolute) and then becomes the best. Every other saved step (including
// a non-finite loss) adds one to that mode's count; the rule fires when the
// count reaches the mode's patience.
class Overtraining : public Rule {
 public:
  struct Config {
    int64_t patience_train;
    int64_t patience_validation;
    double delta;
  };
  Overtraining(TensorSelector selector, Config c) : selector_(std::move(selector)), config_(c) {}

  Result OnStep(const StepData& step) override {
    if (step.mode == v1::MODE_PREDICT || step.mode == v1::MODE_UNSPECIFIED) return Quiet();
    std::optional<StepLoss> loss = LossOf(step, selector_);
    if (!loss.has_value()) return Quiet();
    BestTracker& t = trackers_[step.mode];
    t.Add(loss->value, loss->finite, step.mode_step, config_.delta);
    const bool eval = step.mode == v1::MODE_EVAL;
    const int64_t patience = eval ? config_.patience_validation : config_.patience_train;
    if (t.since < patience) return Quiet();
    Finding f;
    f.tensors = loss->tensors;
    f.worker = loss->worker;
    f.observed = static_cast<double>(t.since);
    f.threshold = static_cast<double>(patience);
    const std::string mode(ModeName(step.mode));
    f.message = absl::StrFormat(
        "%s loss has not improved by more than delta=%g for %d saved steps "
        "(%s=%d): best %.4g at %s step %d, now %.4g at %s",
        mode, config_.delta, t.since, eval ? "patience_validation" : "patience_train", patience,
        t.best, mode, t.best_step, loss->value, Where(step));
    return Fire(std::move(f));
  }

 private:
  TensorSelector selector_;
  Config config_;
  std::map<v1::Mode, BestTracker> trackers_;
};

absl::StatusOr<std::unique_ptr<Rule>> MakeOvertraining(RuleParams& p) {
  Overtraining::Config c;
  SONDE_ASSIGN_OR_RETURN(c.patience_train, p.Int("patience_train", 5, 1));
  SONDE_ASSIGN_OR_RETURN(c.patience_validation, p.Int("patience_validation", 10, 1));
  SONDE_ASSIGN_OR_RETURN(c.delta, FiniteDouble(p, "Overtraining", "delta", 0.01));
  if (c.delta < 0) {
    return BadParam("Overtraining", absl::StrCat("delta=", c.delta, " must be at least 0"));
  }
  SONDE_ASSIGN_OR_RETURN(auto selector, LossesSelector());
  return std::unique_ptr<Rule>(new Overtraining(std::move(selector), c));
}

// --- PoorWeightInitialization ---------------------------------------------

// Looks only at TRAIN and GLOBAL steps with mode_step < steps. At each such
// step, in this order:
//  1. the activation inputs (tensors whose name matches
//     activation_inputs_regex; empty regex: check off): with at least two of
//     them and the smallest variance > 0, fires if largest / smallest
//     variance > threshold (as SageMaker);
//  2. gradients: fires if a gradient tensor with at least two finite
//     elements has max - min < distribution_range. SageMaker compares the
//     5th-95th percentile gap, which needs raw values; the full range is
//     never smaller than that gap, so this check fires on fewer tensors;
//  3. the loss (losses collection): fires if it has made no new low (strictly
//     below every earlier loss in the window) for `patience` saved steps.
class PoorWeightInitialization : public Rule {
 public:
  struct Config {
    double threshold;
    double distribution_range;
    int64_t patience;
    int64_t steps;
  };
  PoorWeightInitialization(std::optional<TensorSelector> activations, TensorSelector losses,
                           Config c)
      : activations_(std::move(activations)), losses_(std::move(losses)), config_(c) {}

  Result OnStep(const StepData& step) override {
    if (step.mode != v1::MODE_TRAIN && step.mode != v1::MODE_GLOBAL) return Quiet();
    if (step.mode_step >= config_.steps) return Quiet();
    if (activations_.has_value()) {
      const v1::TensorRecord* hi = nullptr;
      const v1::TensorRecord* lo = nullptr;
      int n = 0;
      for (const v1::TensorRecord& t : step.tensors) {
        if (!activations_->Matches(t) || t.statistics().finite_count() == 0) continue;
        ++n;
        const double v = t.statistics().variance();
        if (hi == nullptr || v > hi->statistics().variance()) hi = &t;
        if (lo == nullptr || v < lo->statistics().variance()) lo = &t;
      }
      if (n >= 2 && lo->statistics().variance() > 0) {
        const double ratio = hi->statistics().variance() / lo->statistics().variance();
        if (ratio > config_.threshold) {
          Finding f;
          f.tensors = {hi->tensor_name(), lo->tensor_name()};
          f.worker = hi->worker();
          f.observed = ratio;
          f.threshold = config_.threshold;
          f.message = absl::StrFormat(
              "activation inputs at %s differ in variance by %.3gx (largest "
              "'%s' %.3g, "
              "smallest '%s' %.3g), above threshold %g",
              Where(step), ratio, hi->tensor_name(), hi->statistics().variance(), lo->tensor_name(),
              lo->statistics().variance(), config_.threshold);
          return Fire(std::move(f));
        }
      }
    }
    for (const v1::TensorRecord& t : step.tensors) {
      if (!IsGradient(t)) continue;
      const v1::Statistics& s = t.statistics();
      if (s.finite_count() < 2) continue;
      const double range = s.max() - s.min();
      if (range >= config_.distribution_range) continue;
      Finding f;
      f.tensors = {t.tensor_name()};
      f.worker = t.worker();
      f.observed = range;
      f.threshold = config_.distribution_range;
      f.message = absl::StrFormat(
          "gradient '%s' at %s spans only %.3g (min %.3g, max %.3g), below "
          "distribution_range %g",
          t.tensor_name(), Where(step), range, s.min(), s.max(), config_.distribution_range);
      return Fire(std::move(f));
    }
    std::optional<StepLoss> loss = LossOf(step, losses_);
    if (loss.has_value()) {
      loss_.Add(loss->value, loss->finite, step.mode_step, 0);
      if (loss_.since >= config_.patience) {
        Finding f;
        f.tensors = loss->tensors;
        f.worker = loss->worker;
        f.observed = static_cast<double>(loss_.since);
        f.threshold = static_cast<double>(config_.patience);
        f.message = absl::StrFormat(
            "loss has not decreased for %d saved steps within the first %d "
            "steps "
            "(patience %d): lowest %.4g at %s step %d, now %.4g at %s",
            loss_.since, config_.steps, config_.patience, loss_.best, ModeName(step.mode),
            loss_.best_step, loss->value, Where(step));
        return Fire(std::move(f));
      }
    }
    return Quiet();
  }

 private:
  std::optional<TensorSelector> activations_;
  TensorSelector losses_;
  Config config_;
  BestTracker loss_;
};

absl::StatusOr<std::unique_ptr<Rule>> MakePoorWeightInitialization(RuleParams& p) {
  constexpr absl::string_view kRule = "PoorWeightInitialization";
  SONDE_ASSIGN_OR_RETURN(auto regex, p.String("activation_inputs_regex", ".*relu_input"));
  PoorWeightInitialization::Config c;
  SONDE_ASSIGN_OR_RETURN(c.threshold, FiniteDouble(p, kRule, "threshold", 10.0));
  SONDE_ASSIGN_OR_RETURN(c.distribution_range, FiniteDouble(p, kRule, "distribution_range", 0.001));
  SONDE_ASSIGN_OR_RETURN(c.patience, p.Int("patience", 5, 1));
  SONDE_ASSIGN_OR_RETURN(c.steps, p.Int("steps", 10, 1));
  if (c.threshold < 1) {
    return BadParam(kRule, absl::StrCat("threshold=", c.threshold,
                                        " must be at least 1 (it bounds a ratio of variances)"));
  }
  if (c.distribution_range < 0) {
    return BadParam(
        kRule, absl::StrCat("distribution_range=", c.distribution_range, " must be at least 0"));
  }
  std::optional<TensorSelector> activations;
  if (!regex.empty()) {
    SONDE_ASSIGN_OR_RETURN(activations, TensorSelector::Create({}, regex));
  }
  SONDE_ASSIGN_OR_RETURN(auto losses, LossesSelector());
  return std::unique_ptr<Rule>(
      new PoorWeightInitialization(std::move(activations), std::move(losses), c));
}

// --- GradientFlow (AUTOTRAINER, ICSE 2021) ---------------------------------

// AUTOTRAINER's vanishing/exploding gradient test (utils/monitor.py,
// gradient_issue): ratio = ||g_first|| / ||g_last|| of the weight gradients
// of the first and the last layer, for each worker on its own (workers in
// order of appearance). First: the worker's first gradient tensor (in the
// step's recorded order) matching first_layer_regex, or without it its first
// gradient whose name does not contain "bias". Last: the worker's last other
// gradient matching last_layer_regex, or without it its last non-bias one.
// Skipped when either is missing, ||g_last|| is 0 or a norm is not finite.
class GradientFlow : public Rule {
 public:
  struct Config {
    double vanishing_ratio;
    double min_first_norm;
    double exploding_ratio;
  };
  GradientFlow(std::optional<TensorSelector> first, std::optional<TensorSelector> last, Config c)
      : first_(std::move(first)), last_(std::move(last)), config_(c) {}

  Result OnStep(const StepData& step) override {
    std::vector<int32_t> workers;
    for (const v1::TensorRecord& t : step.tensors) {
      if (std::find(workers.begin(), workers.end(), t.worker()) == workers.end()) {
        workers.push_back(t.worker());
      }
    }
    for (int32_t worker : workers) {
      std::optional<Finding> f = Check(step, worker);
      if (f.has_value()) return Fire(std::move(*f));
    }
    return Quiet();
  }

 private:
  std::optional<Finding> Check(const StepData& step, int32_t worker) {
    const v1::TensorRecord* first = nullptr;
    for (const v1::TensorRecord& t : step.tensors) {
      if (t.worker() != worker || !IsGradient(t)) continue;
      if (first_.has_value() ? first_->Matches(t) : !IsBias(t)) {
        first = &t;
        break;
      }
    }
    if (first == nullptr) return std::nullopt;
    const v1::TensorRecord* last = nullptr;
    for (const v1::TensorRecord& t : step.tensors) {
      if (&t == first || t.worker() != worker || !IsGradient(t)) continue;
      if (last_.has_value() ? last_->Matches(t) : !IsBias(t)) last = &t;
    }
    if (last == nullptr) return std::nullopt;
    const double first_norm = first->statistics().l2();
    const double last_norm = last->statistics().l2();
    if (!(last_norm > 0) || !std::isfinite(first_norm) || !std::isfinite(last_norm)) {
      return std::nullopt;
    }
    const double ratio = first_norm / last_norm;
    const bool vanishing = ratio < config_.vanishing_ratio && first_norm < config_.min_first_norm;
    const bool exploding = ratio > config_.exploding_ratio;
    if (!vanishing && !exploding) return std::nullopt;
    Finding f;
    f.tensors = {first->tensor_name(), last->tensor_name()};
    f.worker = first->worker();
    f.observed = ratio;
    f.threshold = vanishing ? config_.vanishing_ratio : config_.exploding_ratio;
    const std::string norms =
        absl::StrFormat("||'%s'|| %.3g / ||'%s'|| %.3g = %.3g", first->tensor_name(), first_norm,
                        last->tensor_name(), last_norm, ratio);
    f.message = vanishing
                    ? absl::StrFormat(
                          "vanishing gradient flow at %s: %s, below vanishing_ratio "
                          "%g, and "
                          "the first norm is below min_first_norm %g",
                          Where(step), norms, config_.vanishing_ratio, config_.min_first_norm)
                    : absl::StrFormat("exploding gradient flow at %s: %s, above exploding_ratio %g",
                                      Where(step), norms, config_.exploding_ratio);
    if (worker != 0) absl::StrAppend(&f.message, " (worker ", worker, ")");
    return f;
  }

  std::optional<TensorSelector> first_;
  std::optional<TensorSelector> last_;
  Config config_;
};

absl::StatusOr<std::unique_ptr<Rule>> MakeGradientFlow(RuleParams& p) {
  constexpr absl::string_view kRule = "GradientFlow";
  SONDE_ASSIGN_OR_RETURN(auto first_regex, p.String("first_layer_regex", ""));
  SONDE_ASSIGN_OR_RETURN(auto last_regex, p.String("last_layer_regex", ""));
  GradientFlow::Config c;
  SONDE_ASSIGN_OR_RETURN(c.vanishing_ratio, FiniteDouble(p, kRule, "vanishing_ratio", 1e-3));
  SONDE_ASSIGN_OR_RETURN(c.min_first_norm, FiniteDouble(p, kRule, "min_first_norm", 1e-4));
  SONDE_ASSIGN_OR_RETURN(c.exploding_ratio, FiniteDouble(p, kRule, "exploding_ratio", 70));
  if (c.vanishing_ratio <= 0 || c.min_first_norm < 0) {
    return BadParam(kRule, "vanishing_ratio must be positive and min_first_norm at least 0");
  }
  if (c.exploding_ratio <= c.vanishing_ratio) {
    return BadParam(kRule, absl::StrCat("exploding_ratio=", c.exploding_ratio,
                                        " must be above vanishing_ratio=", c.vanishing_ratio));
  }
  std::optional<TensorSelector> first, last;
  if (!first_regex.empty()) {
    SONDE_ASSIGN_OR_RETURN(first, TensorSelector::Create({}, first_regex));
  }
  if (!last_regex.empty()) {
    SONDE_ASSIGN_OR_RETURN(last, TensorSelector::Create({}, last_regex));
  }
  return std::unique_ptr<Rule>(new GradientFlow(std::move(first), std::move(last), c));
}

// --- DyingReluGradients (AUTOTRAINER) --------------------------------------

// AUTOTRAINER's dying-ReLU test: the share of exactly-zero entries over all
// weight gradients of the step (every worker; names containing "bias" left
// out, where AUTOTRAINER counts biases too) >= threshold.
class DyingReluGradients : public Rule {
 public:
  explicit DyingReluGradients(double threshold) : threshold_(threshold) {}

  Result OnStep(const StepData& step) override {
    uint64_t zeros = 0, total = 0;
    int32_t worker = 0;
    bool any = false;
    std::vector<std::string> dead;
    for (const v1::TensorRecord& t : step.tensors) {
      if (!IsGradient(t) || IsBias(t)) continue;
      const v1::Statistics& s = t.statistics();
      if (s.count() == 0) continue;
      if (!any) worker = t.worker();
      any = true;
      zeros += s.zero_count();
      total += s.count();
      if (static_cast<double>(s.zero_count()) >= threshold_ * static_cast<double>(s.count())) {
        dead.push_back(t.tensor_name());
      }
    }
    if (total == 0) return Quiet();
    const double share = static_cast<double>(zeros) / static_cast<double>(total);
    if (share < threshold_) return Quiet();
    Finding f;
    f.tensors = dead;
    f.worker = worker;
    f.observed = share;
    f.threshold = threshold_;
    f.message = absl::StrFormat(
        "%.3g%% of the weight-gradient entries at %s are exactly zero (%d of "
        "%d), at least "
        "threshold %g",
        100 * share, Where(step), zeros, total, threshold_);
    if (!dead.empty()) absl::StrAppend(&f.message, "; mostly zero: ", Quoted(dead));
    return Fire(std::move(f));
  }

 private:
  double threshold_;
};

absl::StatusOr<std::unique_ptr<Rule>> MakeDyingReluGradients(RuleParams& p) {
  SONDE_ASSIGN_OR_RETURN(double threshold, FiniteDouble(p, "DyingReluGradients", "threshold", 0.7));
  if (threshold <= 0 || threshold > 1) {
    return BadParam("DyingReluGradients",
                    absl::StrCat("threshold=", threshold, " must be a share in (0, 1]"));
  }
  return std::unique_ptr<Rule>(new DyingReluGradients(threshold));
}

// --- NaNOrigin --------------------------------------------------------------

// Fires at the first step with any NaN or +-Inf, naming the first such
// tensor in the step's recorded order: hooks save tensors in the order they
// are computed, so that one is the likeliest origin.
class NaNOrigin : public Rule {
 public:
  Result OnStep(const StepData& step) override {
    const v1::TensorRecord* first = nullptr;
    std::vector<std::string> names;
    for (const v1::TensorRecord& t : step.tensors) {
      if (NonFiniteCount(t.statistics()) == 0) continue;
      if (first == nullptr) first = &t;
      names.push_back(t.tensor_name());
    }
    if (first == nullptr) return Quiet();
    const v1::Statistics& s = first->statistics();
    Finding f;
    f.tensors = names;
    f.worker = first->worker();
    f.observed = static_cast<double>(NonFiniteCount(s));
    f.threshold = 0;
    f.message = absl::StrCat("first non-finite tensor at step ", step.step, " (", Where(step),
                             ") is '", first->tensor_name(), "' (worker ", first->worker(), "), ",
                             s.nan_count(), " NaN / ", s.pos_inf_count() + s.neg_inf_count(),
                             " Inf of ", s.count(), " values");
    if (names.size() > 1) {
      absl::StrAppend(&f.message, "; later: ",
                      Quoted(std::vector<std::string>(names.begin() + 1, names.end()), 10));
    }
    return Fire(std::move(f));
  }
};

absl::StatusOr<std::unique_ptr<Rule>> MakeNaNOrigin(RuleParams&) {
  return std::unique_ptr<Rule>(new NaNOrigin());
}

// --- OscillatingLoss (AUTOTRAINER style) -----------------------------------

// After AUTOTRAINER's unstable-training test (ol_judge), on losses. Per mode
// (or only `mode`), keep the last `window` finite step losses. Runs of equal
// values count once. A trough is a value below both neighbours, a peak a
// value above both (the window's ends are neither). A bounce is a trough
// followed by the next peak with (peak - trough) / max(|peak|, |trough|) >=
// min_swing. Fires, at any step, when the window holds at least
// max(1, ceil(max_share * window)) bounces (defaults: 4 in 20 saved steps).
class OscillatingLoss : public Rule {
 public:
  struct Config {
    int64_t window;
    double min_swing;
    double max_share;
    std::optional<v1::Mode> mode;
  };
  OscillatingLoss(TensorSelector selector, Config c) : selector_(std::move(selector)), config_(c) {
    needed_ = std::max<int64_t>(
        1, static_cast<int64_t>(std::ceil(config_.max_share * config_.window - 1e-9)));
  }

  Result OnStep(const StepData& step) override {
    if (config_.mode.has_value() && step.mode != *config_.mode) return Quiet();
    std::optional<StepLoss> loss = LossOf(step, selector_);
    if (!loss.has_value() || !loss->finite) return Quiet();
    std::deque<Point>& series = series_[step.mode];
    series.push_back({step.mode_step, loss->value});
    if (static_cast<int64_t>(series.size()) > config_.window) series.pop_front();

    // Collapse runs of equal values, then walk the turning points.
    std::vector<Point> v;
    for (const Point& p : series) {
      if (v.empty() || v.back().value != p.value) v.push_back(p);
    }
    int64_t bounces = 0;
    double largest = 0;
    Point largest_from{}, largest_to{};
    const Point* trough = nullptr;
    for (size_t i = 1; i + 1 < v.size(); ++i) {
      const bool is_trough = v[i].value < v[i - 1].value && v[i].value < v[i + 1].value;
      const bool is_peak = v[i].value > v[i - 1].value && v[i].value > v[i + 1].value;
      if (is_trough) trough = &v[i];
      if (is_peak && trough != nullptr) {
        const double scale = std::max(std::fabs(v[i].value), std::fabs(trough->value));
        const double swing = scale > 0 ? (v[i].value - trough->value) / scale : 0;
        if (swing >= config_.min_swing) {
          ++bounces;
          if (swing > largest) {
            largest = swing;
            largest_from = *trough;
            largest_to = v[i];
          }
        }
        trough = nullptr;
      }
    }
    if (bounces < needed_) return Quiet();
    const std::string mode(ModeName(step.mode));
    Finding f;
    f.tensors = loss->tensors;
    f.worker = loss->worker;
    f.observed = static_cast<double>(bounces) / static_cast<double>(config_.window);
    f.threshold = config_.max_share;
    f.message = absl::StrFormat(
        "%s loss bounced back up %d times by at least min_swing %g within the "
        "last %d saved "
        "steps (%s steps %d..%d; window %d): %d/%d >= max_share %g; largest "
        "%.4g -> %.4g "
        "(%s steps %d -> %d)",
        mode, bounces, config_.min_swing, series.size(), mode, series.front().mode_step,
        series.back().mode_step, config_.window, bounces, config_.window, config_.max_share,
        largest_from.value, largest_to.value, mode, largest_from.mode_step, largest_to.mode_step);
    return Fire(std::move(f));
  }

 private:
  struct Point {
    int64_t mode_step;
    double value;
  };
  TensorSelector selector_;
  Config config_;
  int64_t needed_;
  std::map<v1::Mode, std::deque<Point>> series_;
};

absl::StatusOr<std::unique_ptr<Rule>> MakeOscillatingLoss(RuleParams& p) {
  constexpr absl::string_view kRule = "OscillatingLoss";
  OscillatingLoss::Config c;
  SONDE_ASSIGN_OR_RETURN(c.window, p.Int("window", 20, 3));
  SONDE_ASSIGN_OR_RETURN(c.min_swing, FiniteDouble(p, kRule, "min_swing", 0.03));
  SONDE_ASSIGN_OR_RETURN(c.max_share, FiniteDouble(p, kRule, "max_share", 0.2));
  SONDE_ASSIGN_OR_RETURN(auto mode, p.String("mode", ""));
  if (c.min_swing < 0) {
    return BadParam(kRule, absl::StrCat("min_swing=", c.min_swing, " must be at least 0"));
  }
  if (c.max_share <= 0 || c.max_share > 1) {
    return BadParam(kRule, absl::StrCat("max_share=", c.max_share, " must be in (0, 1]"));
  }
  if (!mode.empty()) {
    SONDE_ASSIGN_OR_RETURN(v1::Mode m, ParseMode(mode));
    c.mode = m;
  }
  SONDE_ASSIGN_OR_RETURN(auto selector, LossesSelector());
  return std::unique_ptr<Rule>(new OscillatingLoss(std::move(selector), c));
}

}  // namespace

void RegisterStatisticsRules(RuleFactory& factory) {
  const std::pair<RuleInfo, RuleMaker> rules[] = {
      {{"VanishingGradient",
        "Finds a gradient whose mean absolute value falls below threshold.",
        {{"threshold", "1e-7", "smallest healthy mean |gradient|"}},
        {"gradients"},
        "Use ReLU-family activations, residual connections or normalisation "
        "layers; check the "
        "initialisation and raise the learning rate if it is tiny."},
       &MakeVanishingGradient},
      {{"AllZero",
        "Finds a tensor with at least threshold percent of its values equal to "
        "zero.",
        {{"collection_names", "", "comma-separated collections to watch (this or tensor_regex)"},
         {"tensor_regex", "", "regex of tensor names to watch (this or collection_names)"},
         {"threshold", "100", "percent of zero values that fires"}},
        {},
        "Check that the tensor is connected to the loss, that its layer's "
        "inputs are not all "
        "zero, and that the ReLUs feeding it are not dead."},
       &MakeAllZero},
      {{"TensorVariance",
        "Finds a tensor whose variance is above max_threshold or below "
        "min_threshold.",
        {{"collection_names", "", "comma-separated collections to watch (this or tensor_regex)"},
         {"tensor_regex", "", "regex of tensor names to watch (this or collection_names)"},
         {"max_threshold", "", "fires above this variance; empty: no upper bound"},
         {"min_threshold", "", "fires below this variance; empty: no lower bound"}},
        {},
        "A variance too high points to exploding values (lower the learning "
        "rate, clip "
        "gradients); too low to vanishing or saturated ones (check "
        "initialisation and "
        "activations)."},
       &MakeTensorVariance},
      {{"Overfit",
        "Finds an EVAL loss more than ratio_threshold above the latest TRAIN "
        "loss, patience "
        "evaluations in a row.",
        {{"tensor_regex", "", "regex of the loss tensor; empty: the losses collection"},
         {"start_step", "0", "global step from which losses are compared"},
         {"patience", "1", "consecutive evaluations above the ratio that fire"},
         {"ratio_threshold", "0.1", "largest tolerated (eval - train) / train"}},
        {"losses"},
        "Add regularisation (weight decay, dropout, augmentation), get more "
        "data, or stop "
        "earlier."},
       &MakeOverfit},
      {{"Overtraining",
        "Finds a TRAIN or EVAL loss that has not improved by delta for its "
        "patience.",
        {{"patience_train", "5", "saved TRAIN (or GLOBAL) steps without improvement that fire"},
         {"patience_validation", "10", "saved EVAL steps without improvement that fire"},
         {"delta", "0.01", "smallest improvement of the best loss that counts (absolute)"}},
        {"losses"},
        "Stop training (early stopping) or lower the learning rate; the model "
        "has stopped "
        "learning."},
       &MakeOvertraining},
      {{"PoorWeightInitialization",
        "Finds signs of a poor initialisation in the first steps: "
        "activation-input variances "
        "far apart, gradients with almost no spread, or a loss that does not "
        "fall.",
        {{"activation_inputs_regex", ".*relu_input",
          "regex of activation inputs; empty: skip the variance check"},
         {"threshold", "10.0", "largest tolerated max/min ratio of activation-input variances"},
         {"distribution_range", "0.001",
          "smallest tolerated max - min of a gradient tensor (SageMaker: "
          "5th-95th percentile)"},
         {"patience", "5", "saved steps without a new lowest loss that fire"},
         {"steps", "10", "the rule looks at TRAIN (or GLOBAL) mode steps below this"}},
        {"relu_input", "gradients", "losses"},
        "Use a scaled initialisation (He for ReLU, Glorot for tanh/sigmoid) "
        "and normalise the "
        "inputs."},
       &MakePoorWeightInitialization},
      {{"GradientFlow",
        "Finds vanishing or exploding gradient flow: the first layer's "
        "gradient norm over the "
        "last layer's (AUTOTRAINER).",
        {{"first_layer_regex", "",
          "regex of the first layer's gradient; empty: the first non-bias "
          "gradient recorded"},
         {"last_layer_regex", "",
          "regex of the last layer's gradient; empty: the last non-bias "
          "gradient recorded"},
         {"vanishing_ratio", "1e-3", "fires below this ratio when the first norm is small too"},
         {"min_first_norm", "1e-4", "the vanishing case needs ||first|| below this"},
         {"exploding_ratio", "70", "fires above this ratio"}},
        {"gradients"},
        "Vanishing: ReLU-family activations, He initialisation, batch "
        "normalisation or "
        "residual connections. Exploding: lower the learning rate or clip "
        "gradients."},
       &MakeGradientFlow},
      {{"DyingReluGradients",
        "Finds a step where at least threshold of the weight-gradient entries "
        "are exactly zero "
        "(dead ReLUs, AUTOTRAINER).",
        {{"threshold", "0.7", "share (0-1) of zero weight-gradient entries that fires"}},
        {"gradients"},
        "Lower the learning rate, use LeakyReLU/ELU, He initialisation or "
        "batch normalisation."},
       &MakeDyingReluGradients},
      {{"NaNOrigin",
        "Finds the first step with a NaN or Inf and names the first tensor, in "
        "recorded order, "
        "that has one.",
        {},
        {},  // every tensor saved, as ExplodingTensor
        "Look at the named tensor's operation: a log or division of zero, an "
        "overflow in "
        "exp, or a learning rate too high; lower it or add clipping."},
       &MakeNaNOrigin},
      {{"OscillatingLoss",
        "Finds a loss that keeps bouncing back up: at least max_share x window "
        "bounces of "
        "min_swing in the last window saved steps.",
        {{"window", "20", "saved steps looked at (at least 3)"},
         {"min_swing", "0.03", "smallest rise from a trough to the next peak, relative"},
         {"max_share", "0.2", "bounces per saved step in the window that fire"},
         {"mode", "", "TRAIN, EVAL, PREDICT or GLOBAL; empty: each mode on its own"}},
        {"losses"},
        "Lower the learning rate or raise the batch size; check for shuffling "
        "problems."},
       &MakeOscillatingLoss},
  };
  for (const auto& [info, maker] : rules) {
    absl::Status s = factory.Register(info, maker);
    (void)s;  // built-in names are distinct
  }
}

}  // namespace sonde::rules
