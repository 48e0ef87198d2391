#include "common/names.h"

#include "absl/strings/str_cat.h"
#include "common/utf8.h"

namespace sonde {

absl::Status ValidateJobName(absl::string_view job) {
  if (job.empty() || job.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("job name must be 1 to 128 characters, got ", job.size()));
  }
  if (job == "." || job == "..") {
    // Exports (TensorBoard) use the name as a directory: these would be the
    // export directory itself or its parent.
    return absl::InvalidArgumentError(
        absl::StrCat("job name '", job, "' is a directory reference; use a name with a letter, "
                     "digit, '_' or '-' in it"));
  }
  for (char c : job) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job name '", job, "' may only contain letters, digits, '.', '_' and '-'"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateDataName(absl::string_view what, absl::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  if (name.size() > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " is ", name.size(), " bytes long; the limit is 1024"));
  }
  // Keys end names with 0x00 (storage/keys.h).
  if (name.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(what, " contains a NUL byte"));
  }
  // Records hold names in protobuf strings, which refuse invalid UTF-8.
  if (!IsValidUtf8(name)) return absl::InvalidArgumentError(absl::StrCat(what, " is not valid UTF-8"));
  return absl::OkStatus();
}

absl::Status ValidateTensorName(absl::string_view name) {
  return ValidateDataName("tensor name", name);
}

absl::Status ValidateMailAddress(absl::string_view address) {
  const size_t at = address.find('@');
  bool ok = at != absl::string_view::npos && at > 0 && at + 1 < address.size() &&
            address.find('@', at + 1) == absl::string_view::npos && address.size() <= 254;
  for (unsigned char c : address) {
    if (c <= 0x20 || c >= 0x7f || absl::string_view("<>()[],;:\\\"").find(c) !=
                                       absl::string_view::npos) {
      ok = false;
    }
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("'", address, "' is not a mail address (one name@domain, e.g. ops@example.com)"));
}

absl::string_view RuleStatusName(v1::RuleStatus status) {
  switch (status) {
    case v1::RULE_STATUS_IN_PROGRESS: return "InProgress";
    case v1::RULE_STATUS_ISSUES_FOUND: return "IssuesFound";
    case v1::RULE_STATUS_NO_ISSUES_FOUND: return "NoIssuesFound";
    case v1::RULE_STATUS_ERROR: return "Error";
    case v1::RULE_STATUS_STOPPED: return "Stopped";
    default: return "Unknown";
  }
}

}  // namespace sonde
