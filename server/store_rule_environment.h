// The RuleEnvironment the collector gives rules: other jobs' stored tensors,
// read from the Store. Thread-safe (the Store is).
#ifndef SONDE_SERVER_STORE_RULE_ENVIRONMENT_H_
#define SONDE_SERVER_STORE_RULE_ENVIRONMENT_H_

#include <string>
#include <vector>

#include "rules/rule_factory.h"
#include "storage/store.h"

namespace sonde::server {

class StoreRuleEnvironment : public rules::RuleEnvironment {
 public:
  explicit StoreRuleEnvironment(storage::Store* store) : store_(store) {}

  absl::StatusOr<std::vector<double>> ReadValues(const std::string& job, v1::Mode mode,
                                                 int64_t mode_step, const std::string& tensor,
                                                 int32_t worker) const override;

 private:
  storage::Store* const store_;
};

}  // namespace sonde::server

#endif  // SONDE_SERVER_STORE_RULE_ENVIRONMENT_H_
