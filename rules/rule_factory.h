// The catalogue of rule types a collector can run: built-ins, and whatever
// plugins register. Creates rule instances from RuleSpecs, checking every
// parameter. Register everything before sharing the factory; after that it
// is read-only and thread-safe.
#ifndef SONDE_RULES_RULE_FACTORY_H_
#define SONDE_RULES_RULE_FACTORY_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/rule.pb.h"
#include "rules/params.h"
#include "rules/rule.h"

namespace sonde::rules {

struct RuleParameterInfo {
  std::string name;
  std::string default_value;
  std::string description;
};

struct RuleInfo {
  std::string rule_type;
  std::string description;
  std::vector<RuleParameterInfo> parameters;
  std::vector<std::string> default_collections;  // what the rule reads
  std::string suggestion;                        // what to try when it fires
  std::string source = "built-in";               // or the plugin's path
  bool needs_values = false;                     // reads raw values, not only statistics
};

// What the collector lets rules read beyond the steps they are fed: other
// jobs' stored tensors (for rules that compare runs). Thread-safe.
class RuleEnvironment {
 public:
  virtual ~RuleEnvironment() = default;
  // The values of `tensor` of `worker` at a mode step of another job, as
  // doubles; NotFound if it is not stored (or stored as statistics only).
  virtual absl::StatusOr<std::vector<double>> ReadValues(const std::string& job, v1::Mode mode,
                                                         int64_t mode_step,
                                                         const std::string& tensor,
                                                         int32_t worker) const = 0;
};

// Builds a rule from its parameters; read each one through `params` (an
// unread parameter is reported to the user as unknown).
using RuleMaker = std::function<absl::StatusOr<std::unique_ptr<Rule>>(RuleParams& params)>;

class RuleFactory {
 public:
  RuleFactory() = default;
  RuleFactory(const RuleFactory&) = delete;
  RuleFactory& operator=(const RuleFactory&) = delete;

  // AlreadyExists if the type is taken; InvalidArgument for an empty type.
  absl::Status Register(RuleInfo info, RuleMaker maker);

  // NotFound for an unknown type (naming the known ones); InvalidArgument
  // for unknown parameters and bad values.
  absl::StatusOr<std::unique_ptr<Rule>> Create(const v1::RuleSpec& spec) const;

  std::vector<RuleInfo> Catalog() const;

  // Offered to rules as RuleParams::environment(); set before creating rules.
  void SetEnvironment(const RuleEnvironment* environment) { environment_ = environment; }
  const RuleInfo* Find(const std::string& rule_type) const;

 private:
  struct Entry {
    RuleInfo info;
    RuleMaker maker;
  };
  std::vector<Entry> entries_;
  const RuleEnvironment* environment_ = nullptr;
};

// Fills name from rule_type when empty and checks actions.
absl::StatusOr<v1::RuleSpec> NormalizeRuleSpec(v1::RuleSpec spec);

// What the training clients must save for one rule instance: its
// collections (default_collections, or the spec's collection_names) and, for
// the spec's regex parameters, a collection "rule:<name>" of those tensors.
std::vector<v1::CollectionRequest> CollectionRequestsFor(const v1::RuleSpec& spec,
                                                         const RuleInfo& info);

// The catalogue entry as it travels in the Query service.
v1::RuleCatalogEntry ToProto(const RuleInfo& info);

}  // namespace sonde::rules

#endif  // SONDE_RULES_RULE_FACTORY_H_
