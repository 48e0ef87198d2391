// Typed access to a rule's string parameters (SageMaker's rule_parameters),
// with smdebug's spellings of booleans and a check that every parameter the
// user passed is one the rule knows. Not thread-safe.
#ifndef SONDE_RULES_PARAMS_H_
#define SONDE_RULES_PARAMS_H_

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sonde::rules {

class RuleEnvironment;

class RuleParams {
 public:
  RuleParams(std::string rule, std::map<std::string, std::string> values,
             const RuleEnvironment* environment = nullptr)
      : rule_(std::move(rule)), values_(std::move(values)), environment_(environment) {}

  // What the collector offers rules beyond their steps (may be null, e.g. in
  // unit tests of rules that do not need it).
  const RuleEnvironment* environment() const { return environment_; }

  absl::StatusOr<std::string> String(absl::string_view key, absl::string_view fallback);
  absl::StatusOr<bool> Bool(absl::string_view key, bool fallback);
  absl::StatusOr<int64_t> Int(absl::string_view key, int64_t fallback, int64_t min);
  absl::StatusOr<double> Double(absl::string_view key, double fallback);
  // Every parameter given, all marked as read (for rules that check their
  // parameters themselves, such as plugins).
  std::map<std::string, std::string> TakeAll();
  // A comma-separated list; empty entries dropped.
  absl::StatusOr<std::vector<std::string>> List(absl::string_view key);

  // InvalidArgument naming the first parameter no accessor asked for.
  absl::Status CheckAllUsed() const;

 private:
  const std::string* Find(absl::string_view key);
  std::string rule_;
  std::map<std::string, std::string> values_;
  const RuleEnvironment* environment_;
  std::set<std::string> used_;
};

}  // namespace sonde::rules

#endif  // SONDE_RULES_PARAMS_H_
