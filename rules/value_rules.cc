#include "rules/value_rules.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "rules/tensor_selector.h"

namespace sonde::rules {
namespace {

using Result = absl::StatusOr<std::optional<Finding>>;

Result Quiet() { return std::optional<Finding>(); }

Result Fire(std::string message, std::vector<std::string> tensors, int32_t worker,
            double observed, double threshold) {
  Finding f;
  f.message = std::move(message);
  f.tensors = std::move(tensors);
  f.worker = worker;
  f.observed = observed;
  f.threshold = threshold;
  return std::optional<Finding>(std::move(f));
}

// The values of tensor i of the step, decoded; nullopt when not kept.
std::optional<std::vector<double>> ValuesAt(const StepData& step, size_t i) {
  const std::string* bytes = step.ValuesOf(i);
  if (bytes == nullptr) return std::nullopt;
  auto decoded = DecodeAsDouble(*bytes, step.tensors[i].dtype());
  if (!decoded.ok()) return std::nullopt;
  return *std::move(decoded);
}

// A tensor seen as [samples, units]: the first dimension is the batch when
// the tensor has two or more dimensions; otherwise one sample.
struct Layout {
  int64_t samples = 1;
  int64_t units = 0;
};

Layout LayoutOf(const v1::TensorRecord& r, size_t elements) {
  Layout l;
  if (r.shape_size() >= 2 && r.shape(0) > 0) l.samples = r.shape(0);
  l.units = l.samples > 0 ? static_cast<int64_t>(elements) / l.samples : 0;
  return l;
}

absl::StatusOr<TensorSelector> Selector(RuleParams& p, bool required, absl::string_view rule,
                                        const std::string& default_regex = "") {
  SONDE_ASSIGN_OR_RETURN(auto collections, p.List("collection_names"));
  SONDE_ASSIGN_OR_RETURN(auto regex, p.String("tensor_regex", default_regex));
  if (required && collections.empty() && regex.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(rule, ": give collection_names or tensor_regex"));
  }
  return TensorSelector::Create(collections, regex);
}

double L2(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

// ---------------------------------------------------------------------------
// UnchangedTensor: the last num_steps saved values of a tensor are all close
// to the newest (numpy.allclose: |a - b| <= atol + rtol * |b|).
class UnchangedTensor : public Rule {
 public:
  UnchangedTensor(TensorSelector s, int64_t n, double rtol, double atol, bool equal_nan)
      : selector_(std::move(s)), num_steps_(n), rtol_(rtol), atol_(atol), equal_nan_(equal_nan) {}

  bool WantsValues(const v1::TensorRecord& r) const override {
    return selector_.MatchesUncached(r);
  }

  Result OnStep(const StepData& step) override {
    for (size_t i = 0; i < step.tensors.size(); ++i) {
      const auto& r = step.tensors[i];
      if (!selector_.Matches(r)) continue;
      auto values = ValuesAt(step, i);
      if (!values.has_value()) continue;
      auto& h = history_[{r.tensor_name(), r.worker()}];
      h.push_back({step.step, *std::move(values)});
      while (static_cast<int64_t>(h.size()) > num_steps_) h.pop_front();
      if (static_cast<int64_t>(h.size()) < num_steps_) continue;
      bool unchanged = true;
      for (size_t k = 0; k + 1 < h.size() && unchanged; ++k) unchanged = AllClose(h[k].second, h.back().second);
      if (unchanged) {
        return Fire(absl::StrCat("tensor '", r.tensor_name(), "' did not change over the last ",
                                 num_steps_, " saved steps (", h.front().first, " to ", step.step,
                                 "; rtol=", rtol_, ", atol=", atol_, ")"),
                    {r.tensor_name()}, r.worker(), static_cast<double>(num_steps_),
                    static_cast<double>(num_steps_));
      }
    }
    return Quiet();
  }

 private:
  bool AllClose(const std::vector<double>& a, const std::vector<double>& b) const {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::isnan(a[i]) || std::isnan(b[i])) {
        if (!(equal_nan_ && std::isnan(a[i]) && std::isnan(b[i]))) return false;
        continue;
      }
      if (a[i] == b[i]) continue;  // equal infinities too
      if (!(std::fabs(a[i] - b[i]) <= atol_ + rtol_ * std::fabs(b[i]))) return false;
    }
    return true;
  }

  TensorSelector selector_;
  int64_t num_steps_;
  double rtol_, atol_;
  bool equal_nan_;
  std::map<std::pair<std::string, int32_t>, std::deque<std::pair<int64_t, std::vector<double>>>> history_;
};

absl::StatusOr<std::unique_ptr<Rule>> MakeUnchangedTensor(RuleParams& p) {
  SONDE_ASSIGN_OR_RETURN(auto selector, Selector(p, true, "UnchangedTensor"));
  SONDE_ASSIGN_OR_RETURN(int64_t n, p.Int("num_steps", 3, 2));
  SONDE_ASSIGN_OR_RETURN(double rtol, p.Double("rtol", 1e-5));
  SONDE_ASSIGN_OR_RETURN(double atol, p.Double("atol", 1e-8));
  SONDE_ASSIGN_OR_RETURN(bool equal_nan, p.Bool("equal_nan", false));
  return std::unique_ptr<Rule>(new UnchangedTensor(std::move(selector), n, rtol, atol, equal_nan));
}

// ---------------------------------------------------------------------------
// WeightUpdateRatio: ||w_s - w_prev|| / (||w_prev|| + epsilon) outside
// [small_threshold, large_threshold], for tensors in "weights", on TRAIN
// (or GLOBAL) steps. w_prev is the previous saved step, or with num_steps
// the newest saved step <= s - num_steps.
class WeightUpdateRatio : public Rule {
 public:
  WeightUpdateRatio(std::optional<int64_t> n, double large, double small, double eps)
      : num_steps_(n), large_(large), small_(small), epsilon_(eps) {}

  bool WantsValues(const v1::TensorRecord& r) const override { return IsWeight(r); }

  Result OnStep(const StepData& step) override {
    if (step.mode != v1::MODE_TRAIN && step.mode != v1::MODE_GLOBAL) return Quiet();
    for (size_t i = 0; i < step.tensors.size(); ++i) {
      const auto& r = step.tensors[i];
      if (!IsWeight(r)) continue;
      auto values = ValuesAt(step, i);
      if (!values.has_value()) continue;
      auto& h = history_[{r.tensor_name(), r.worker()}];
      const std::pair<int64_t, std::vector<double>>* prev = nullptr;
      for (const auto& e : h) {
        if (!num_steps_.has_value() || e.first <= step.mode_step - *num_steps_) prev = &e;
      }
      std::optional<Finding> finding;
      if (prev != nullptr && prev->second.size() == values->size()) {
        std::vector<double> diff(values->size());
        for (size_t k = 0; k < diff.size(); ++k) diff[k] = (*values)[k] - prev->second[k];
        const double ratio = L2(diff) / (L2(prev->second) + epsilon_);
        if (ratio > large_ || ratio < small_ || std::isnan(ratio)) {
          const bool big = !(ratio < small_);
          Finding f;
          f.tensors = {r.tensor_name()};
          f.worker = r.worker();
          f.observed = ratio;
          f.threshold = big ? large_ : small_;
          f.message = absl::StrFormat(
              "weights '%s' changed by %.3g of their norm between step %d and %d (%s %g)",
              r.tensor_name(), ratio, prev->first, step.mode_step,
              big ? "above large_threshold" : "below small_threshold", f.threshold);
          f.suggestion = big ? "The learning rate is likely too high for this layer."
                             : "The layer is not learning: check the learning rate, frozen "
                               "parameters or vanishing gradients.";
          finding = std::move(f);
        }
      }
      h.push_back({step.mode_step, *std::move(values)});
      // Keep what a later comparison can still use.
      while (h.size() > 1 && (!num_steps_.has_value() ||
                              h[1].first <= step.mode_step - *num_steps_)) {
        h.pop_front();
      }
      if (finding.has_value()) return finding;
    }
    return Quiet();
  }

 private:
  static bool IsWeight(const v1::TensorRecord& r) {
    return std::find(r.collections().begin(), r.collections().end(), "weights") !=
           r.collections().end();
  }

  std::optional<int64_t> num_steps_;
  double large_, small_, epsilon_;
  std::map<std::pair<std::string, int32_t>, std::deque<std::pair<int64_t, std::vector<double>>>> history_;
};

absl::StatusOr<std::unique_ptr<Rule>> MakeWeightUpdateRatio(RuleParams& p) {
  SONDE_ASSIGN_OR_RETURN(std::string n, p.String("num_steps", ""));
  std::optional<int64_t> num_steps;
  if (!n.empty()) {
    int64_t v;
    if (!absl::SimpleAtoi(n, &v) || v < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("WeightUpdateRatio: parameter num_steps='", n, "' must be an integer >= 1"));
    }
    num_steps = v;
  }
  SONDE_ASSIGN_OR_RETURN(double large, p.Double("large_threshold", 10.0));
  SONDE_ASSIGN_OR_RETURN(double small, p.Double("small_threshold", 1e-8));
  SONDE_ASSIGN_OR_RETURN(double eps, p.Double("epsilon", 1e-9));
  return std::unique_ptr<Rule>(new WeightUpdateRatio(num_steps, large, small, eps));
}

// ---------------------------------------------------------------------------
// DeadRelu and SaturatedActivation share the per-unit activity count: a
// tensor is [samples, units]; a unit is inactive when it is "active" in
// fewer than threshold_inactivity percent of the samples; the rule fires
// when more than threshold_layer percent of a tensor's units are inactive.
class InactiveUnits : public Rule {
 public:
  // `active` says whether one value of the named tensor counts as active.
  using Activity = std::function<bool(const std::string& tensor, double value)>;

  InactiveUnits(std::string what, TensorSelector s, double inactivity, double layer,
                Activity active, std::string suggestion)
      : what_(std::move(what)),
        selector_(std::move(s)),
        inactivity_(inactivity),
        layer_(layer),
        active_(std::move(active)),
        suggestion_(std::move(suggestion)) {}

  bool WantsValues(const v1::TensorRecord& r) const override {
    return selector_.MatchesUncached(r);
  }

  Result OnStep(const StepData& step) override {
    for (size_t i = 0; i < step.tensors.size(); ++i) {
      const auto& r = step.tensors[i];
      if (!selector_.Matches(r)) continue;
      auto values = ValuesAt(step, i);
      if (!values.has_value() || values->empty()) continue;
      const Layout l = LayoutOf(r, values->size());
      if (l.units == 0) continue;
      int64_t inactive = 0;
      for (int64_t u = 0; u < l.units; ++u) {
        int64_t active = 0;
        for (int64_t s = 0; s < l.samples; ++s) {
          if (active_(r.tensor_name(), (*values)[s * l.units + u])) ++active;
        }
        if (100.0 * active / l.samples < inactivity_) ++inactive;
      }
      const double share = 100.0 * inactive / l.units;
      if (share > layer_) {
        Finding f;
        f.tensors = {r.tensor_name()};
        f.worker = r.worker();
        f.observed = share;
        f.threshold = layer_;
        f.suggestion = suggestion_;
        f.message = absl::StrFormat(
            "'%s' at step %d: %.1f%% of %d units are %s (active in < %g%% of %d samples), more "
            "than threshold_layer=%g%%",
            r.tensor_name(), step.step, share, l.units, what_, inactivity_, l.samples, layer_);
        return std::optional<Finding>(std::move(f));
      }
    }
    return Quiet();
  }

 private:
  std::string what_;
  TensorSelector selector_;
  double inactivity_, layer_;
  Activity active_;
  std::string suggestion_;
};

absl::StatusOr<std::unique_ptr<Rule>> MakeDeadRelu(RuleParams& p) {
  SONDE_ASSIGN_OR_RETURN(auto regex, p.String("tensor_regex", ".*relu_output"));
  SONDE_ASSIGN_OR_RETURN(double inactivity, p.Double("threshold_inactivity", 1.0));
  SONDE_ASSIGN_OR_RETURN(double layer, p.Double("threshold_layer", 50.0));
  SONDE_ASSIGN_OR_RETURN(auto selector, TensorSelector::Create({}, regex));
  return std::unique_ptr<Rule>(new InactiveUnits(
      "dead", std::move(selector), inactivity, layer,
      [](const std::string&, double v) { return v > 0; },
      "Lower the learning rate, use a leaky ReLU, or initialise with He initialisation."));
}

absl::StatusOr<std::unique_ptr<Rule>> MakeSaturatedActivation(RuleParams& p) {
  SONDE_ASSIGN_OR_RETURN(auto collections, p.List("collection_names"));
  SONDE_ASSIGN_OR_RETURN(auto regex, p.String("tensor_regex", ".*tanh_input|.*sigmoid_input"));
  SONDE_ASSIGN_OR_RETURN(double tanh_min, p.Double("threshold_tanh_min", -9.4999));
  SONDE_ASSIGN_OR_RETURN(double tanh_max, p.Double("threshold_tanh_max", 9.4999));
  SONDE_ASSIGN_OR_RETURN(double sig_min, p.Double("threshold_sigmoid_min", -23));
  SONDE_ASSIGN_OR_RETURN(double sig_max, p.Double("threshold_sigmoid_max", 16.99999));
  SONDE_ASSIGN_OR_RETURN(double inactivity, p.Double("threshold_inactivity", 1.0));
  SONDE_ASSIGN_OR_RETURN(double layer, p.Double("threshold_layer", 50.0));
  if (!(tanh_min < tanh_max) || !(sig_min < sig_max)) {
    return absl::InvalidArgumentError("SaturatedActivation: each min must be below its max");
  }
  SONDE_ASSIGN_OR_RETURN(auto selector, TensorSelector::Create(collections, regex));
  return std::unique_ptr<Rule>(new InactiveUnits(
      "saturated", std::move(selector), inactivity, layer,
      [=](const std::string& tensor, double v) {
        const bool sigmoid = tensor.find("sigmoid") != std::string::npos;
        const double lo = sigmoid ? sig_min : tanh_min;
        const double hi = sigmoid ? sig_max : tanh_max;
        return v > lo && v < hi;
      },
      "Normalise the inputs, lower the learning rate, add batch normalisation before the "
      "activation, or use ReLU."));
}

// ---------------------------------------------------------------------------
// Labels and predictions as class ids (predictions optionally argmax over
// the last dimension).
std::vector<int64_t> ClassIds(const v1::TensorRecord& r, const std::vector<double>& v, bool argmax) {
  std::vector<int64_t> out;
  if (argmax && r.shape_size() >= 2) {
    const int64_t classes = r.shape(r.shape_size() - 1);
    if (classes <= 0) return out;
    for (size_t row = 0; row + classes <= v.size(); row += classes) {
      out.push_back(std::max_element(v.begin() + row, v.begin() + row + classes) - (v.begin() + row));
    }
    return out;
  }
  for (double x : v) out.push_back(static_cast<int64_t>(std::llround(x)));
  return out;
}

// Finds the first tensor of the step matching `sel` that has values.
std::optional<std::pair<size_t, std::vector<double>>> FindValues(const StepData& step,
                                                                 TensorSelector& sel) {
  for (size_t i = 0; i < step.tensors.size(); ++i) {
    if (!sel.Matches(step.tensors[i])) continue;
    auto v = ValuesAt(step, i);
    if (v.has_value()) return std::make_pair(i, *std::move(v));
  }
  return std::nullopt;
}

// ClassImbalance: after `samples` labels, the most frequent class has more
// than threshold_imbalance times the samples of the rarest, or a class is
// mispredicted more often than threshold_misprediction.
class ClassImbalance : public Rule {
 public:
  ClassImbalance(double imbalance, double mispred, int64_t samples, bool argmax,
                 TensorSelector labels, TensorSelector predictions)
      : imbalance_(imbalance),
        mispred_(mispred),
        samples_(samples),
        argmax_(argmax),
        labels_(std::move(labels)),
        predictions_(std::move(predictions)) {}

  bool WantsValues(const v1::TensorRecord& r) const override {
    return labels_.MatchesUncached(r) || predictions_.MatchesUncached(r);
  }

  Result OnStep(const StepData& step) override {
    auto labels = FindValues(step, labels_);
    if (!labels.has_value()) return Quiet();
    const auto& lr = step.tensors[labels->first];
    std::vector<int64_t> y = ClassIds(lr, labels->second, false);
    auto preds = FindValues(step, predictions_);
    std::vector<int64_t> p;
    if (preds.has_value()) p = ClassIds(step.tensors[preds->first], preds->second, argmax_);
    for (size_t i = 0; i < y.size(); ++i) {
      ++count_[y[i]];
      if (i < p.size() && p[i] != y[i]) ++wrong_[y[i]];
      ++seen_;
    }
    if (seen_ < samples_ || count_.empty()) return Quiet();
    auto [rare, common] = std::minmax_element(
        count_.begin(), count_.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    const double ratio = static_cast<double>(common->second) / rare->second;
    if (ratio > imbalance_) {
      return Fire(absl::StrFormat("after %d samples class %d has %d samples and class %d only %d "
                                  "(ratio %.3g > threshold_imbalance=%g)",
                                  seen_, common->first, common->second, rare->first, rare->second,
                                  ratio, imbalance_),
                  {lr.tensor_name()}, lr.worker(), ratio, imbalance_);
    }
    if (!p.empty()) {
      for (const auto& [cls, n] : count_) {
        const double share = static_cast<double>(wrong_[cls]) / n;
        if (share > mispred_) {
          return Fire(absl::StrFormat("class %d is mispredicted in %.1f%% of its %d samples "
                                      "(> threshold_misprediction=%g)",
                                      cls, 100 * share, n, mispred_),
                      {lr.tensor_name()}, lr.worker(), share, mispred_);
        }
      }
    }
    return Quiet();
  }

 private:
  double imbalance_, mispred_;
  int64_t samples_;
  bool argmax_;
  TensorSelector labels_, predictions_;
  std::map<int64_t, int64_t> count_, wrong_;
  int64_t seen_ = 0;
};

absl::StatusOr<std::unique_ptr<Rule>> MakeClassImbalance(RuleParams& p) {
  SONDE_ASSIGN_OR_RETURN(double imbalance, p.Double("threshold_imbalance", 10));
  SONDE_ASSIGN_OR_RETURN(double mispred, p.Double("threshold_misprediction", 0.7));
  SONDE_ASSIGN_OR_RETURN(int64_t samples, p.Int("samples", 500, 1));
  SONDE_ASSIGN_OR_RETURN(bool argmax, p.Bool("argmax", false));
  SONDE_ASSIGN_OR_RETURN(auto lr, p.String("labels_regex", ".*labels"));
  SONDE_ASSIGN_OR_RETURN(auto pr, p.String("predictions_regex", ".*predictions"));
  SONDE_ASSIGN_OR_RETURN(auto labels, TensorSelector::Create({}, lr));
  SONDE_ASSIGN_OR_RETURN(auto preds, TensorSelector::Create({}, pr));
  return std::unique_ptr<Rule>(
      new ClassImbalance(imbalance, mispred, samples, argmax, std::move(labels), std::move(preds)));
}

// Confusion: per step, the confusion matrix of labels and predictions; a
// class's recall (diagonal over its row) below min_diag, or a share of a
// predicted class's column that really belongs to another class above
// max_off_diag, is an issue.
class Confusion : public Rule {
 public:
  Confusion(std::optional<int64_t> categories, TensorSelector labels, TensorSelector predictions,
            double min_diag, double max_off)
      : categories_(categories),
        labels_(std::move(labels)),
        predictions_(std::move(predictions)),
        min_diag_(min_diag),
        max_off_(max_off) {}

  bool WantsValues(const v1::TensorRecord& r) const override {
    return labels_.MatchesUncached(r) || predictions_.MatchesUncached(r);
  }

  Result OnStep(const StepData& step) override {
    auto labels = FindValues(step, labels_);
    auto preds = FindValues(step, predictions_);
    if (!labels.has_value() || !preds.has_value()) return Quiet();
    const auto& lr = step.tensors[labels->first];
    std::vector<int64_t> y = ClassIds(lr, labels->second, false);
    std::vector<int64_t> p = ClassIds(step.tensors[preds->first], preds->second, false);
    const size_t n = std::min(y.size(), p.size());
    if (n == 0) return Quiet();
    constexpr int64_t kMaxCategories = 4096;  // a k x k matrix per step
    int64_t k = categories_.value_or(0);
    if (!categories_.has_value()) {
      for (size_t i = 0; i < n; ++i) k = std::max({k, y[i] + 1, p[i] + 1});
    }
    if (k > kMaxCategories) {
      return absl::InvalidArgumentError(absl::StrCat(
          "labels or predictions reach class ", k - 1, "; Confusion handles at most ",
          kMaxCategories, " classes (set category_no, or check the labels tensor)"));
    }
    std::vector<std::vector<int64_t>> m(k, std::vector<int64_t>(k, 0));
    for (size_t i = 0; i < n; ++i) {
      if (y[i] < 0 || p[i] < 0 || y[i] >= k || p[i] >= k) {
        return absl::InvalidArgumentError(absl::StrCat(
            "label ", y[i], " or prediction ", p[i], " is outside category_no=", k));
      }
      ++m[y[i]][p[i]];
    }
    for (int64_t c = 0; c < k; ++c) {
      const int64_t row = std::accumulate(m[c].begin(), m[c].end(), int64_t{0});
      if (row > 0 && static_cast<double>(m[c][c]) / row < min_diag_) {
        const double recall = static_cast<double>(m[c][c]) / row;
        return Fire(absl::StrFormat("step %d: only %.1f%% of class %d is predicted as %d "
                                    "(min_diag=%g)",
                                    step.step, 100 * recall, c, c, min_diag_),
                    {lr.tensor_name()}, lr.worker(), recall, min_diag_);
      }
      int64_t col = 0;
      for (int64_t r = 0; r < k; ++r) col += m[r][c];
      for (int64_t r = 0; r < k && col > 0; ++r) {
        const double share = static_cast<double>(m[r][c]) / col;
        if (r != c && share > max_off_) {
          return Fire(absl::StrFormat("step %d: %.1f%% of predictions of class %d are class %d "
                                      "(max_off_diag=%g)",
                                      step.step, 100 * share, c, r, max_off_),
                      {lr.tensor_name()}, lr.worker(), share, max_off_);
        }
      }
    }
    return Quiet();
  }

 private:
  std::optional<int64_t> categories_;
  TensorSelector labels_, predictions_;
  double min_diag_, max_off_;
};

absl::StatusOr<TensorSelector> NameOrCollection(RuleParams& p, absl::string_view name_key,
                                                absl::string_view collection_key,
                                                absl::string_view default_name) {
  SONDE_ASSIGN_OR_RETURN(auto name, p.String(name_key, default_name));
  SONDE_ASSIGN_OR_RETURN(auto coll, p.String(collection_key, default_name));
  std::vector<std::string> collections;
  if (!coll.empty()) collections.push_back(coll);
  // The tensor name matches exactly.
  std::string regex;
  if (!name.empty()) {
    for (char c : name) {
      if (std::string("\\^$.|?*+()[]{}").find(c) != std::string::npos) regex.push_back('\\');
      regex.push_back(c);
    }
    regex = absl::StrCat("^", regex, "$");
  }
  return TensorSelector::Create(collections, regex);
}

absl::StatusOr<std::unique_ptr<Rule>> MakeConfusion(RuleParams& p) {
  SONDE_ASSIGN_OR_RETURN(std::string cat, p.String("category_no", ""));
  std::optional<int64_t> categories;
  if (!cat.empty()) {
    int64_t v;
    if (!absl::SimpleAtoi(cat, &v) || v < 2 || v > 4096) {
      return absl::InvalidArgumentError(
          absl::StrCat("Confusion: parameter category_no='", cat, "' must be an integer from 2 to 4096"));
    }
    categories = v;
  }
  SONDE_ASSIGN_OR_RETURN(auto labels, NameOrCollection(p, "labels", "labels_collection", "labels"));
  SONDE_ASSIGN_OR_RETURN(auto preds,
                         NameOrCollection(p, "predictions", "predictions_collection", "predictions"));
  SONDE_ASSIGN_OR_RETURN(double min_diag, p.Double("min_diag", 0.9));
  SONDE_ASSIGN_OR_RETURN(double max_off, p.Double("max_off_diag", 0.1));
  return std::unique_ptr<Rule>(
      new Confusion(categories, std::move(labels), std::move(preds), min_diag, max_off));
}

// ---------------------------------------------------------------------------
// CheckInputImages: once threshold_samples images have been seen, the mean
// of some channel is further than threshold_mean from 0 (not normalised).
class CheckInputImages : public Rule {
 public:
  CheckInputImages(double mean, int64_t samples, TensorSelector s, int64_t channel)
      : threshold_mean_(mean), threshold_samples_(samples), selector_(std::move(s)), channel_(channel) {}

  bool WantsValues(const v1::TensorRecord& r) const override {
    return selector_.MatchesUncached(r);
  }

  Result OnStep(const StepData& step) override {
    for (size_t i = 0; i < step.tensors.size(); ++i) {
      const auto& r = step.tensors[i];
      if (!selector_.Matches(r)) continue;
      auto v = ValuesAt(step, i);
      if (!v.has_value() || r.shape_size() <= channel_ || r.shape(0) <= 0) continue;
      const int64_t channels = r.shape(channel_);
      int64_t inner = 1;
      for (int d = channel_ + 1; d < r.shape_size(); ++d) inner *= r.shape(d);
      if (channels <= 0 || inner <= 0) continue;
      sums_.resize(std::max<size_t>(sums_.size(), channels));
      counts_.resize(sums_.size());
      for (size_t k = 0; k < v->size(); ++k) {
        const size_t c = (k / inner) % channels;
        if (!std::isfinite((*v)[k])) continue;
        sums_[c] += (*v)[k];
        ++counts_[c];
      }
      images_ += r.shape(0);
      if (images_ < threshold_samples_) continue;
      for (size_t c = 0; c < sums_.size(); ++c) {
        if (counts_[c] == 0) continue;
        const double mean = sums_[c] / counts_[c];
        if (std::fabs(mean) > threshold_mean_) {
          return Fire(absl::StrFormat("input '%s': channel %d has mean %.4g over %d images "
                                      "(|mean| > threshold_mean=%g): inputs look unnormalised",
                                      r.tensor_name(), c, mean, images_, threshold_mean_),
                      {r.tensor_name()}, r.worker(), mean, threshold_mean_);
        }
      }
    }
    return Quiet();
  }

 private:
  double threshold_mean_;
  int64_t threshold_samples_;
  TensorSelector selector_;
  int64_t channel_;
  std::vector<double> sums_;
  std::vector<int64_t> counts_;
  int64_t images_ = 0;
};

absl::StatusOr<std::unique_ptr<Rule>> MakeCheckInputImages(RuleParams& p) {
  SONDE_ASSIGN_OR_RETURN(double mean, p.Double("threshold_mean", 0.2));
  SONDE_ASSIGN_OR_RETURN(int64_t samples, p.Int("threshold_samples", 500, 1));
  SONDE_ASSIGN_OR_RETURN(auto regex, p.String("regex", ".*hybridsequential0_input_0"));
  SONDE_ASSIGN_OR_RETURN(int64_t channel, p.Int("channel", 1, 1));
  SONDE_ASSIGN_OR_RETURN(auto selector, TensorSelector::Create({}, regex));
  return std::unique_ptr<Rule>(new CheckInputImages(mean, samples, std::move(selector), channel));
}

// NLPSequenceRatio: the share of each listed token value in an input
// sequence tensor is above its threshold (percent).
class NLPSequenceRatio : public Rule {
 public:
  NLPSequenceRatio(TensorSelector s, std::vector<double> tokens, std::vector<double> thresholds)
      : selector_(std::move(s)), tokens_(std::move(tokens)), thresholds_(std::move(thresholds)) {}

  bool WantsValues(const v1::TensorRecord& r) const override {
    return selector_.MatchesUncached(r);
  }

  Result OnStep(const StepData& step) override {
    for (size_t i = 0; i < step.tensors.size(); ++i) {
      const auto& r = step.tensors[i];
      if (!selector_.Matches(r)) continue;
      auto v = ValuesAt(step, i);
      if (!v.has_value() || v->empty()) continue;
      for (size_t t = 0; t < tokens_.size(); ++t) {
        const double share =
            100.0 * std::count(v->begin(), v->end(), tokens_[t]) / static_cast<double>(v->size());
        if (share > thresholds_[t]) {
          return Fire(absl::StrFormat("input '%s' at step %d is %.1f%% token %g (threshold %g%%)",
                                      r.tensor_name(), step.step, share, tokens_[t], thresholds_[t]),
                      {r.tensor_name()}, r.worker(), share, thresholds_[t]);
        }
      }
    }
    return Quiet();
  }

 private:
  TensorSelector selector_;
  std::vector<double> tokens_, thresholds_;
};

absl::StatusOr<std::unique_ptr<Rule>> MakeNLPSequenceRatio(RuleParams& p) {
  SONDE_ASSIGN_OR_RETURN(auto regex, p.String("tensor_regex", ".*embedding0_input_0"));
  SONDE_ASSIGN_OR_RETURN(auto tokens_s, p.List("token_values"));
  SONDE_ASSIGN_OR_RETURN(auto thresholds_s, p.List("token_thresholds_percent"));
  if (tokens_s.empty()) tokens_s = {"0"};
  if (thresholds_s.empty()) thresholds_s = {"50"};
  if (tokens_s.size() != thresholds_s.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NLPSequenceRatio: ", tokens_s.size(), " token_values but ", thresholds_s.size(),
        " token_thresholds_percent"));
  }
  std::vector<double> tokens, thresholds;
  for (size_t i = 0; i < tokens_s.size(); ++i) {
    double a, b;
    if (!absl::SimpleAtod(tokens_s[i], &a) || !absl::SimpleAtod(thresholds_s[i], &b)) {
      return absl::InvalidArgumentError(absl::StrCat("NLPSequenceRatio: '", tokens_s[i], "'/'",
                                                     thresholds_s[i], "' are not numbers"));
    }
    tokens.push_back(a);
    thresholds.push_back(b);
  }
  SONDE_ASSIGN_OR_RETURN(auto selector, TensorSelector::Create({}, regex));
  return std::unique_ptr<Rule>(new NLPSequenceRatio(std::move(selector), tokens, thresholds));
}

// ---------------------------------------------------------------------------
// FeatureImportanceOverweight: the nfeatures largest importances hold more
// than `threshold` of the total. Importances come either as one vector
// tensor or as one scalar tensor per feature (smdebug's
// feature_importance/weight/f0, .../f1, ...).
class FeatureImportanceOverweight : public Rule {
 public:
  FeatureImportanceOverweight(double threshold, int64_t n, TensorSelector s)
      : threshold_(threshold), nfeatures_(n), selector_(std::move(s)) {}

  bool WantsValues(const v1::TensorRecord& r) const override {
    return selector_.MatchesUncached(r);
  }

  Result OnStep(const StepData& step) override {
    std::vector<double> importance;
    std::vector<std::string> names;
    int32_t worker = 0;
    for (size_t i = 0; i < step.tensors.size(); ++i) {
      if (!selector_.Matches(step.tensors[i])) continue;
      auto v = ValuesAt(step, i);
      if (!v.has_value()) continue;
      importance.insert(importance.end(), v->begin(), v->end());
      names.push_back(step.tensors[i].tensor_name());
      worker = step.tensors[i].worker();
    }
    if (static_cast<int64_t>(importance.size()) <= nfeatures_) return Quiet();
    std::sort(importance.begin(), importance.end(), std::greater<double>());
    const double total = std::accumulate(importance.begin(), importance.end(), 0.0);
    const double top = std::accumulate(importance.begin(), importance.begin() + nfeatures_, 0.0);
    if (total > 0 && top / total > threshold_) {
      return Fire(absl::StrFormat("step %d: the %d most important of %d features carry %.1f%% of "
                                  "the importance (threshold %g)",
                                  step.step, nfeatures_, importance.size(), 100 * top / total,
                                  threshold_),
                  names, worker, top / total, threshold_);
    }
    return Quiet();
  }

 private:
  double threshold_;
  int64_t nfeatures_;
  TensorSelector selector_;
};

absl::StatusOr<std::unique_ptr<Rule>> MakeFeatureImportanceOverweight(RuleParams& p) {
  SONDE_ASSIGN_OR_RETURN(double threshold, p.Double("threshold", 0.8));
  SONDE_ASSIGN_OR_RETURN(int64_t n, p.Int("nfeatures", 3, 1));
  SONDE_ASSIGN_OR_RETURN(auto regex, p.String("tensor_regex", ".*feature_importance/weight"));
  SONDE_ASSIGN_OR_RETURN(auto selector, TensorSelector::Create({}, regex));
  return std::unique_ptr<Rule>(new FeatureImportanceOverweight(threshold, n, std::move(selector)));
}

// TreeDepth: node ids of a tree (XGBoost numbers nodes breadth first from 0,
// so node n sits at depth floor(log2(n + 1))); the deepest tree of a step is
// shallower than `depth`. SageMaker documents the parameter but not the
// direction; its text ("the tree might not grow as deep as defined") is
// read here as "fires when trees stay shallower than depth".
class TreeDepth : public Rule {
 public:
  TreeDepth(int64_t depth, TensorSelector s) : depth_(depth), selector_(std::move(s)) {}

  bool WantsValues(const v1::TensorRecord& r) const override {
    return selector_.MatchesUncached(r);
  }

  Result OnStep(const StepData& step) override {
    double max_id = -1;
    std::vector<std::string> names;
    int32_t worker = 0;
    for (size_t i = 0; i < step.tensors.size(); ++i) {
      if (!selector_.Matches(step.tensors[i])) continue;
      auto v = ValuesAt(step, i);
      if (!v.has_value() || v->empty()) continue;
      max_id = std::max(max_id, *std::max_element(v->begin(), v->end()));
      names.push_back(step.tensors[i].tensor_name());
      worker = step.tensors[i].worker();
    }
    if (max_id < 0) return Quiet();
    const int64_t depth = static_cast<int64_t>(std::floor(std::log2(max_id + 1)));
    if (depth < depth_) {
      return Fire(absl::StrFormat("step %d: the deepest tree has depth %d (largest node id %g), "
                                  "shallower than depth=%d",
                                  step.step, depth, max_id, depth_),
                  names, worker, static_cast<double>(depth), static_cast<double>(depth_));
    }
    return Quiet();
  }

 private:
  int64_t depth_;
  TensorSelector selector_;
};

absl::StatusOr<std::unique_ptr<Rule>> MakeTreeDepth(RuleParams& p) {
  SONDE_ASSIGN_OR_RETURN(int64_t depth, p.Int("depth", 4, 1));
  SONDE_ASSIGN_OR_RETURN(auto regex, p.String("tensor_regex", "^trees/.*node_?id"));
  SONDE_ASSIGN_OR_RETURN(auto selector, TensorSelector::Create({}, regex));
  return std::unique_ptr<Rule>(new TreeDepth(depth, std::move(selector)));
}

// SimilarAcrossRuns: compares each selected tensor with the same tensor
// (same mode step and worker) of reference jobs stored by this collector;
// fires at the first step where they differ beyond numpy.allclose's
// tolerance. SageMaker leaves the tolerance undocumented: rtol and atol are
// parameters here. A tensor the reference job does not have is skipped.
class SimilarAcrossRuns : public Rule {
 public:
  SimilarAcrossRuns(std::vector<std::string> others, TensorSelector s, double rtol, double atol,
                    const RuleEnvironment* env)
      : others_(std::move(others)), selector_(std::move(s)), rtol_(rtol), atol_(atol), env_(env) {}

  bool WantsValues(const v1::TensorRecord& r) const override {
    return selector_.MatchesUncached(r);
  }

  Result OnStep(const StepData& step) override {
    for (size_t i = 0; i < step.tensors.size(); ++i) {
      const auto& r = step.tensors[i];
      if (!selector_.Matches(r)) continue;
      auto mine = ValuesAt(step, i);
      if (!mine.has_value()) continue;
      for (const std::string& other : others_) {
        auto theirs = env_->ReadValues(other, step.mode, step.mode_step, r.tensor_name(), r.worker());
        if (!theirs.ok()) {
          if (theirs.status().code() == absl::StatusCode::kNotFound) continue;
          return theirs.status();
        }
        size_t differ = theirs->size() == mine->size() ? 0 : mine->size();
        double worst = 0;
        for (size_t k = 0; k < mine->size() && k < theirs->size(); ++k) {
          const double a = (*mine)[k], b = (*theirs)[k];
          const double d = std::fabs(a - b);
          if (!(d <= atol_ + rtol_ * std::fabs(b)) && !(a == b)) {
            ++differ;
            worst = std::max(worst, d);
          }
        }
        if (differ > 0) {
          return Fire(absl::StrFormat("tensor '%s' at %s step %d differs from job '%s' in %d of %d "
                                      "values (largest difference %g)",
                                      r.tensor_name(), ModeName(step.mode), step.mode_step, other,
                                      differ, mine->size(), worst),
                      {r.tensor_name()}, r.worker(), worst, atol_);
        }
      }
    }
    return Quiet();
  }

 private:
  std::vector<std::string> others_;
  TensorSelector selector_;
  double rtol_, atol_;
  const RuleEnvironment* env_;
};

absl::StatusOr<std::unique_ptr<Rule>> MakeSimilarAcrossRuns(RuleParams& p) {
  SONDE_ASSIGN_OR_RETURN(auto others, p.List("other_trials"));
  if (others.empty()) {
    return absl::InvalidArgumentError(
        "SimilarAcrossRuns: other_trials (the job names to compare with) is required");
  }
  SONDE_ASSIGN_OR_RETURN(auto selector, Selector(p, false, "SimilarAcrossRuns"));
  SONDE_ASSIGN_OR_RETURN(double rtol, p.Double("rtol", 1e-5));
  SONDE_ASSIGN_OR_RETURN(double atol, p.Double("atol", 1e-8));
  if (p.environment() == nullptr) {
    return absl::FailedPreconditionError(
        "SimilarAcrossRuns needs the collector's store to read the other jobs");
  }
  return std::unique_ptr<Rule>(
      new SimilarAcrossRuns(std::move(others), std::move(selector), rtol, atol, p.environment()));
}

}  // namespace

void RegisterValueRules(RuleFactory& factory) {
  const std::pair<RuleInfo, RuleMaker> rules[] = {
      {{"UnchangedTensor",
        "Finds tensors whose values stop changing (numpy.allclose over the last num_steps saved "
        "steps).",
        {{"collection_names", "", "collections to watch (this or tensor_regex is required)"},
         {"tensor_regex", "", "regex of tensor names to watch"},
         {"num_steps", "3", "saved steps that must all be close"},
         {"rtol", "1e-05", "relative tolerance"},
         {"atol", "1e-08", "absolute tolerance"},
         {"equal_nan", "false", "treat NaN as equal to NaN"}},
        {},
        "Check that the layer is trainable and receives gradients; check the learning rate."},
       &MakeUnchangedTensor},
      {{"WeightUpdateRatio",
        "Finds weights whose update is too large or too small relative to the weights.",
        {{"num_steps", "", "compare with the newest step at least this far back (empty: the "
                           "previous saved step)"},
         {"large_threshold", "10.0", "largest healthy ||update|| / ||weights||"},
         {"small_threshold", "1e-08", "smallest healthy ||update|| / ||weights||"},
         {"epsilon", "1e-09", "added to ||weights|| to avoid dividing by zero"}},
        {"weights"},
        "Tune the learning rate of the layer (too high if large, too low or frozen if small)."},
       &MakeWeightUpdateRatio},
      {{"DeadRelu",
        "Finds ReLU layers where most units are inactive (output 0) for almost every sample.",
        {{"tensor_regex", ".*relu_output", "ReLU outputs to watch"},
         {"threshold_inactivity", "1.0", "percent of samples below which a unit is dead"},
         {"threshold_layer", "50.0", "percent of dead units above which the layer fires"}},
        {"relu_output"},
        "Lower the learning rate, use a leaky ReLU, or initialise with He initialisation."},
       &MakeDeadRelu},
      {{"SaturatedActivation",
        "Finds tanh/sigmoid layers whose inputs sit in the flat, saturated region.",
        {{"collection_names", "", "collections of activation inputs"},
         {"tensor_regex", ".*tanh_input|.*sigmoid_input", "activation inputs to watch"},
         {"threshold_tanh_min", "-9.4999", "tanh input below this is saturated"},
         {"threshold_tanh_max", "9.4999", "tanh input above this is saturated"},
         {"threshold_sigmoid_min", "-23", "sigmoid input below this is saturated"},
         {"threshold_sigmoid_max", "16.99999", "sigmoid input above this is saturated"},
         {"threshold_inactivity", "1.0", "percent of unsaturated samples below which a unit is "
                                         "saturated"},
         {"threshold_layer", "50.0", "percent of saturated units above which the layer fires"}},
        {},
        "Normalise inputs, add batch normalisation before the activation, or use ReLU."},
       &MakeSaturatedActivation},
      {{"ClassImbalance",
        "Finds imbalanced classes in the labels, or classes mispredicted most of the time.",
        {{"threshold_imbalance", "10", "largest allowed ratio of the most to the least frequent "
                                       "class"},
         {"threshold_misprediction", "0.7", "largest allowed share of mispredictions of a class"},
         {"samples", "500", "labels to see before judging"},
         {"argmax", "false", "predictions are scores: take the argmax of the last dimension"},
         {"labels_regex", ".*labels", "labels tensor"},
         {"predictions_regex", ".*predictions", "predictions tensor"}},
        {},
        "Resample or reweight the classes, or collect more data for the rare ones."},
       &MakeClassImbalance},
      {{"Confusion",
        "Checks the confusion matrix of labels and predictions at each step.",
        {{"category_no", "", "number of classes (empty: inferred)"},
         {"labels", "labels", "labels tensor name"},
         {"predictions", "predictions", "predictions tensor name"},
         {"labels_collection", "labels", "collection holding the labels"},
         {"predictions_collection", "predictions", "collection holding the predictions"},
         {"min_diag", "0.9", "smallest allowed per-class recall"},
         {"max_off_diag", "0.1", "largest allowed share of a predicted class that is another "
                                 "class"}},
        {},
        "Look at the classes that are confused: more data, features or capacity for them."},
       &MakeConfusion},
      {{"CheckInputImages",
        "Finds input images that are not normalised (per-channel mean far from 0).",
        {{"threshold_mean", "0.2", "largest allowed |mean| of a channel"},
         {"threshold_samples", "500", "images to see before judging"},
         {"regex", ".*hybridsequential0_input_0", "input tensor"},
         {"channel", "1", "dimension of the colour channel"}},
        {"input_image"},
        "Normalise the inputs (subtract the mean, divide by the standard deviation)."},
       &MakeCheckInputImages},
      {{"NLPSequenceRatio",
        "Finds input sequences made mostly of one token (e.g. padding).",
        {{"tensor_regex", ".*embedding0_input_0", "input sequences"},
         {"token_values", "0", "comma-separated token values"},
         {"token_thresholds_percent", "50", "comma-separated largest allowed percent per token"}},
        {"input_sequence"},
        "Bucket sequences by length or shorten the padding."},
       &MakeNLPSequenceRatio},
      {{"FeatureImportanceOverweight",
        "Finds models that rely on a few features only (tree models).",
        {{"threshold", "0.8", "largest allowed share of the nfeatures most important features"},
         {"nfeatures", "3", "how many top features to add up"},
         {"tensor_regex", ".*feature_importance/weight", "feature importance tensors"}},
        {"feature_importance"},
        "Check for leaked or dominant features; regularise the model."},
       &MakeFeatureImportanceOverweight},
      {{"SimilarAcrossRuns",
        "Finds tensors that differ from the same tensors of reference jobs at the same step.",
        {{"other_trials", "", "comma-separated job names to compare with (required)"},
         {"collection_names", "", "collections to compare"},
         {"tensor_regex", "", "tensor names to compare; with neither, every tensor"},
         {"rtol", "1e-05", "relative tolerance"},
         {"atol", "1e-08", "absolute tolerance"}},
        {},
        "Check what changed between the runs: seeds, data order, code or library versions."},
       &MakeSimilarAcrossRuns},
      {{"TreeDepth",
        "Finds tree models whose trees stay shallower than depth.",
        {{"depth", "4", "expected tree depth"},
         {"tensor_regex", "^trees/.*node_?id", "node id tensors of the trees"}},
        {"trees"},
        "Check max_depth and min_child_weight, or whether the data allows deeper splits."},
       &MakeTreeDepth},
  };
  for (auto [info, maker] : rules) {
    info.needs_values = true;
    absl::Status s = factory.Register(info, maker);
    (void)s;  // built-in names are distinct
  }
}

}  // namespace sonde::rules
