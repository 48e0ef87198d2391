// Reading rule configurations: the collector's --rules flag and a JSON
// rules file in the shape of SageMaker's rule configurations. Thread-safe.
//
// Flag: rules separated by ';', each `Type` or `Type(key=value,...)`. The
// keys `name` and `actions` (actions separated by '|') are not rule
// parameters: `ExplodingTensor(actions=StopTraining);LossNotDecreasing(num_steps=20)`.
//
// JSON: {"rules": [{"name": "...", "rule_type": "ExplodingTensor",
//                   "rule_parameters": {"only_nan": "true"},
//                   "actions": ["StopTraining"]}]}
// (SageMaker's spellings "RuleConfigurationName", "RuleParameters" with a
// "rule_to_invoke" entry are accepted too.)
//
// These check the syntax and the actions; whether the rule types and their
// parameters exist is checked against the collector's RuleFactory when the
// rules are used (at collector start for its defaults).
#ifndef SONDE_RULES_RULE_CONFIG_H_
#define SONDE_RULES_RULE_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/rule.pb.h"

namespace sonde::rules {

absl::StatusOr<std::vector<v1::RuleSpec>> ParseRuleFlag(absl::string_view flag);
absl::StatusOr<std::vector<v1::RuleSpec>> ParseRulesJson(absl::string_view json);
// A collector's default rules: the JSON file `config_file` when one is
// named (--rules_config), the flag's rules otherwise (--rules).
absl::StatusOr<std::vector<v1::RuleSpec>> LoadDefaultRules(absl::string_view flag,
                                                           const std::string& config_file);

}  // namespace sonde::rules

#endif  // SONDE_RULES_RULE_CONFIG_H_
