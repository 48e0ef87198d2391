// The declarative rule, for the common case without code: pick tensors (a
// regex and/or collections), one statistic, a comparison and a threshold,
// and for how many consecutive saved steps it must hold. Configured like
// any rule, e.g. in a rules file:
//   {"name": "grad_too_large", "rule_type": "Threshold",
//    "rule_parameters": {"collection_names": "gradients", "statistic": "abs_max",
//                        "comparison": ">", "threshold": "100", "consecutive_steps": "3"},
//    "actions": ["Log"]}
#ifndef SONDE_RULES_THRESHOLD_RULE_H_
#define SONDE_RULES_THRESHOLD_RULE_H_

#include "rules/rule_factory.h"

namespace sonde::rules {

void RegisterThresholdRule(RuleFactory& factory);

}  // namespace sonde::rules

#endif  // SONDE_RULES_THRESHOLD_RULE_H_
