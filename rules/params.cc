#include "rules/params.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace sonde::rules {

const std::string* RuleParams::Find(absl::string_view key) {
  used_.insert(std::string(key));
  auto it = values_.find(std::string(key));
  return it == values_.end() ? nullptr : &it->second;
}

absl::StatusOr<std::string> RuleParams::String(absl::string_view key,
                                               absl::string_view fallback) {
  const std::string* v = Find(key);
  return v == nullptr ? std::string(fallback) : *v;
}

absl::StatusOr<bool> RuleParams::Bool(absl::string_view key, bool fallback) {
  const std::string* v = Find(key);
  if (v == nullptr) return fallback;
  const std::string s = absl::AsciiStrToLower(absl::StripAsciiWhitespace(*v));
  if (s == "true" || s == "1" || s == "yes") return true;
  if (s == "false" || s == "0" || s == "no") return false;
  return absl::InvalidArgumentError(absl::StrCat(
      rule_, ": parameter ", key, "='", *v, "' is not a boolean (true/false)"));
}

absl::StatusOr<int64_t> RuleParams::Int(absl::string_view key, int64_t fallback,
                                        int64_t min) {
  const std::string* v = Find(key);
  if (v == nullptr) return fallback;
  int64_t out;
  if (!absl::SimpleAtoi(*v, &out)) {
    return absl::InvalidArgumentError(
        absl::StrCat(rule_, ": parameter ", key, "='", *v, "' is not an integer"));
  }
  if (out < min) {
    return absl::InvalidArgumentError(
        absl::StrCat(rule_, ": parameter ", key, "=", out, " must be at least ", min));
  }
  return out;
}

absl::StatusOr<double> RuleParams::Double(absl::string_view key, double fallback) {
  const std::string* v = Find(key);
  if (v == nullptr) return fallback;
  double out;
  if (!absl::SimpleAtod(*v, &out)) {
    return absl::InvalidArgumentError(
        absl::StrCat(rule_, ": parameter ", key, "='", *v, "' is not a number"));
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> RuleParams::List(absl::string_view key) {
  const std::string* v = Find(key);
  std::vector<std::string> out;
  if (v == nullptr) return out;
  for (absl::string_view part : absl::StrSplit(*v, ',', absl::SkipWhitespace())) {
    out.emplace_back(absl::StripAsciiWhitespace(part));
  }
  return out;
}

std::map<std::string, std::string> RuleParams::TakeAll() {
  for (const auto& [key, value] : values_) used_.insert(key);
  return values_;
}

absl::Status RuleParams::CheckAllUsed() const {
  for (const auto& [key, value] : values_) {
    if (used_.count(key) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(rule_, ": unknown parameter '", key, "'"));
    }
  }
  return absl::OkStatus();
}

}  // namespace sonde::rules
