// Loads rule plugins (shared libraries implementing rules/plugin_api.h) and
// registers their rule types in a RuleFactory, each wrapped as a Rule. A
// loaded library stays loaded for the life of the process.
#ifndef SONDE_RULES_PLUGIN_LOADER_H_
#define SONDE_RULES_PLUGIN_LOADER_H_

#include <string>

#include "absl/status/status.h"
#include "rules/rule_factory.h"

namespace sonde::rules {

// NotFound if the library cannot be loaded, InvalidArgument if it does not
// export sonde_rules_v1 or describes an invalid rule type, AlreadyExists if
// a type clashes with a registered one.
absl::Status LoadRulePlugin(const std::string& path, RuleFactory& factory);

}  // namespace sonde::rules

#endif  // SONDE_RULES_PLUGIN_LOADER_H_
