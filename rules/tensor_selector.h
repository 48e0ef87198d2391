// Which tensors a rule looks at: members of named collections and/or names
// matching a regular expression (searched anywhere in the name, RE2 syntax:
// common/pattern.h). An empty selector selects every tensor, and so does
// the collection "all" (whose membership records never list). Not
// thread-safe (caches match results per name).
#ifndef SONDE_RULES_TENSOR_SELECTOR_H_
#define SONDE_RULES_TENSOR_SELECTOR_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/pattern.h"
#include "proto/tensor.pb.h"

namespace sonde::rules {

class TensorSelector {
 public:
  static absl::StatusOr<TensorSelector> Create(std::vector<std::string> collections,
                                               const std::string& regex);

  bool empty() const { return collections_.empty() && !regex_.has_value(); }
  bool Matches(const v1::TensorRecord& record);
  // The same answer without the cache: const and thread-safe, slower.
  bool MatchesUncached(const v1::TensorRecord& record) const;

 private:
  bool InCollections(const v1::TensorRecord& record) const;

  std::vector<std::string> collections_;
  bool all_ = false;  // "all" is among collections_
  std::optional<Pattern> regex_;
  std::map<std::string, bool> regex_cache_;
};

}  // namespace sonde::rules

#endif  // SONDE_RULES_TENSOR_SELECTOR_H_
