// Built-in rules that need the raw values of tensors (not only their
// statistics): UnchangedTensor, WeightUpdateRatio, DeadRelu,
// SaturatedActivation, ClassImbalance, Confusion, CheckInputImages,
// NLPSequenceRatio, FeatureImportanceOverweight and TreeDepth. Each asks
// for values through Rule::WantsValues, so the collector keeps only what
// some rule reads. Parameters, defaults and conditions: docs/rules.md.
#ifndef SONDE_RULES_VALUE_RULES_H_
#define SONDE_RULES_VALUE_RULES_H_

#include "rules/rule_factory.h"

namespace sonde::rules {

void RegisterValueRules(RuleFactory& factory);

}  // namespace sonde::rules

#endif  // SONDE_RULES_VALUE_RULES_H_
