#include "rules/tensor_selector.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace sonde::rules {

absl::StatusOr<TensorSelector> TensorSelector::Create(std::vector<std::string> collections,
                                                      const std::string& regex) {
  TensorSelector s;
  s.collections_ = std::move(collections);
  if (!regex.empty()) {
    // std::regex reports bad patterns by throwing; contain it here.
    try {
      s.regex_ = std::make_shared<std::regex>(regex, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor_regex '", regex, "' is not a valid regex: ", e.what()));
    }
  }
  return s;
}

bool TensorSelector::InCollections(const v1::TensorRecord& record) const {
  for (const std::string& c : collections_) {
    if (std::find(record.collections().begin(), record.collections().end(), c) !=
        record.collections().end()) {
      return true;
    }
  }
  return false;
}

bool TensorSelector::MatchesUncached(const v1::TensorRecord& record) const {
  if (empty() || InCollections(record)) return true;
  return regex_ && std::regex_search(record.tensor_name(), *regex_);
}

bool TensorSelector::Matches(const v1::TensorRecord& record) {
  if (empty() || InCollections(record)) return true;
  if (regex_) {
    auto it = regex_cache_.find(record.tensor_name());
    if (it == regex_cache_.end()) {
      it = regex_cache_
               .emplace(record.tensor_name(),
                        std::regex_search(record.tensor_name(), *regex_))
               .first;
    }
    return it->second;
  }
  return false;
}

}  // namespace sonde::rules
