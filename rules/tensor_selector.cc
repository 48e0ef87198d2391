#include "rules/tensor_selector.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace sonde::rules {

absl::StatusOr<TensorSelector> TensorSelector::Create(std::vector<std::string> collections,
                                                      const std::string& regex) {
  TensorSelector s;
  s.collections_ = std::move(collections);
  s.all_ = std::find(s.collections_.begin(), s.collections_.end(), "all") != s.collections_.end();
  if (!regex.empty()) {
    absl::StatusOr<Pattern> p = Pattern::Compile(regex, "tensor_regex");
    if (!p.ok()) return p.status();
    s.regex_ = std::move(*p);
  }
  return s;
}

bool TensorSelector::InCollections(const v1::TensorRecord& record) const {
  if (all_) return true;
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
  return regex_.has_value() && regex_->Search(record.tensor_name());
}

bool TensorSelector::Matches(const v1::TensorRecord& record) {
  if (empty() || InCollections(record)) return true;
  if (regex_.has_value()) {
    auto it = regex_cache_.find(record.tensor_name());
    if (it == regex_cache_.end()) {
      it = regex_cache_.emplace(record.tensor_name(), regex_->Search(record.tensor_name())).first;
    }
    return it->second;
  }
  return false;
}

}  // namespace sonde::rules
