// Built-in rules that judge tensors by their statistics records alone (no
// raw values), so they work on reductions-only tensors too. Names,
// parameters and defaults follow SageMaker Debugger where it has the rule;
// the reference page is docs/rules.md, and stats_rules.cc has the details.
//
// Shared definitions. A gradient is a tensor in the "gradients" collection
// or whose name starts with "gradient". The loss of a step is the mean of
// every finite element of the selected loss tensors of all workers (for
// scalar losses: the mean of the workers' losses); it is non-finite if any
// selected element is NaN or +-Inf. "Recorded order" is the order of
// StepData::tensors (the order the workers sent them). Every rule fires at
// most once (the first Finding is final).
//
// VanishingGradient (threshold=1e-7): fires at the first step where a
//   gradient with finite values has mean |g| = l1 / finite_count < threshold.
//
// AllZero (collection_names="", tensor_regex="", threshold=100): one of the
//   selectors is required. Fires when a selected tensor with count > 0 has
//   100 * zero_count / count >= threshold (a percentage in (0, 100]).
//
// TensorVariance (collection_names="", tensor_regex="", max_threshold="",
//   min_threshold=""): one selector and at least one threshold required; ""
//   (or "None") means not set. Fires when a selected tensor's population
//   variance (finite elements) is > max_threshold or < min_threshold.
//
// Overfit (tensor_regex="", start_step=0, patience=1, ratio_threshold=0.1):
//   losses: tensor_regex if given, else the losses collection. Steps with
//   global step < start_step are ignored. A TRAIN step's loss becomes the
//   latest train loss; each EVAL step (once a train loss exists) computes
//   (eval - train) / |train|; above ratio_threshold extends a streak, at or
//   below ends it. Fires when the streak reaches patience. Non-finite losses
//   and a zero train loss are skipped.
//
// Overtraining (patience_train=5, patience_validation=10, delta=0.01):
//   losses collection; a best loss per mode (TRAIN and GLOBAL: patience_train,
//   EVAL: patience_validation). A saved step improves if its loss < best -
//   delta (absolute), and becomes the best; any other saved step adds one.
//   Fires when a mode's count reaches its patience.
//
// PoorWeightInitialization (activation_inputs_regex=".*relu_input",
//   threshold=10.0, distribution_range=0.001, patience=5, steps=10): only
//   TRAIN/GLOBAL steps with mode_step < steps. Fires if (1) >= 2 tensors
//   match the regex, their smallest variance is > 0 and largest / smallest
//   variance > threshold; or (2) a gradient with >= 2 finite elements has
//   max - min < distribution_range (SageMaker: the 5th-95th percentile gap,
//   which needs raw values); or (3) the loss has made no new low for
//   patience saved steps.
//
// GradientFlow (first_layer_regex="", last_layer_regex="",
//   vanishing_ratio=1e-3, min_first_norm=1e-4, exploding_ratio=70;
//   AUTOTRAINER, ICSE 2021): for each worker, ratio = l2(first) / l2(last),
//   first = the worker's first gradient (recorded order) matching
//   first_layer_regex or, by default, not named "bias"; last = its last
//   other gradient matching last_layer_regex or not named "bias". Fires
//   "vanishing" if ratio < vanishing_ratio and l2(first) < min_first_norm,
//   "exploding" if ratio > exploding_ratio.
//
// DyingReluGradients (threshold=0.7; AUTOTRAINER): fires when
//   sum(zero_count) / sum(count) over the step's gradients not named "bias"
//   is >= threshold.
//
// NaNOrigin (no parameters): fires at the first step with a NaN or +-Inf
//   in any tensor, naming the first such tensor in recorded order and
//   listing all of them.
//
// OscillatingLoss (window=20, min_swing=0.03, max_share=0.2, mode="";
//   after AUTOTRAINER): per mode (or only `mode`), the last `window` finite
//   step losses, with runs of equal values collapsed. A bounce is a trough
//   (below both neighbours) followed by the next peak (above both) with
//   (peak - trough) / max(|peak|, |trough|) >= min_swing. Fires when the
//   window holds >= max(1, ceil(max_share * window)) bounces (4 in 20).
#ifndef SONDE_RULES_STATS_RULES_H_
#define SONDE_RULES_STATS_RULES_H_

#include "rules/rule_factory.h"

namespace sonde::rules {

// Registers the statistics-based built-in rules in `factory`.
void RegisterStatisticsRules(RuleFactory& factory);

}  // namespace sonde::rules

#endif  // SONDE_RULES_STATS_RULES_H_
