// A rule result as JSON, the one shape every consumer sees (the CLI's
// --json and the webhook's body): job, rule, rule_type, status, step, mode,
// mode_step, worker, tensors, message, suggestion, observed, threshold,
// steps_evaluated, actions_taken, time (RFC 3339, UTC). Thread-safe.
#ifndef SONDE_COMMON_RULE_JSON_H_
#define SONDE_COMMON_RULE_JSON_H_

#include <string>

#include "nlohmann/json.hpp"
#include "proto/rule.pb.h"

namespace sonde {

nlohmann::json RuleResultJson(const v1::RuleResult& result);

// Serialises without throwing: invalid UTF-8 (a plugin's message cut
// mid-character) is replaced.
std::string DumpJson(const nlohmann::json& doc, int indent = -1);

}  // namespace sonde

#endif  // SONDE_COMMON_RULE_JSON_H_
