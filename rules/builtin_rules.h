// Sonde's built-in rules, with SageMaker Debugger's names, parameters and
// defaults, and the catalogue that creates them from a RuleSpec.
//
// ExplodingTensor (collection_names="", tensor_regex="", only_nan=false):
//   IssuesFound at the first step where a selected tensor (every tensor if
//   neither selector is given) has a NaN, or, unless only_nan, a +-Inf
//   element. Works on statistics, so reductions-only tensors are covered too.
//
// LossNotDecreasing (collection_names="", tensor_regex="",
//   use_losses_collection=true, num_steps=10, diff_percent=0.1,
//   increase_threshold_percent=5, mode=""):
//   Watches the value (mean) of each loss tensor, per mode (or only `mode`).
//   Every num_steps steps it compares the loss at step s with the loss at the
//   newest saved step <= s - num_steps (smdebug's documented comparison).
//   - A non-finite loss, or one that fell by less than diff_percent percent
//     of the earlier value, is an issue...
//   - ...except that an increase of at most increase_threshold_percent is
//     taken as noise once: the rule fires only if the next comparison also
//     fails. A larger increase fires at once.
//   smdebug's source for this rule is not public; this reading of its two
//   thresholds is ours, chosen so that each parameter has an effect.
#ifndef SONDE_RULES_BUILTIN_RULES_H_
#define SONDE_RULES_BUILTIN_RULES_H_

#include <memory>

#include "rules/rule.h"
#include "rules/rule_factory.h"

namespace sonde::rules {

// Registers every built-in rule in `factory`.
void RegisterBuiltinRules(RuleFactory& factory);

// A factory with every built-in rule registered.
std::unique_ptr<RuleFactory> BuiltinRuleFactory();

}  // namespace sonde::rules

#endif  // SONDE_RULES_BUILTIN_RULES_H_
