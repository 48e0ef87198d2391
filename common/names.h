// The names the protocol accepts, checked the same way by the client (so
// mistakes surface in training code) and the collector (which trusts no one).
// Thread-safe; no state.
#ifndef SONDE_COMMON_NAMES_H_
#define SONDE_COMMON_NAMES_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/rule.pb.h"

namespace sonde {

// Job names: 1 to 128 of [A-Za-z0-9._-], but not "." or ".." (a job's
// name is a directory name in exports).
absl::Status ValidateJobName(absl::string_view job);

// Names of recorded data (tensors, profiler metrics and events): 1 to 1024
// bytes of valid UTF-8 without NUL. `what` ("tensor name") starts the message.
absl::Status ValidateDataName(absl::string_view what, absl::string_view name);
// ValidateDataName("tensor name", name).
absl::Status ValidateTensorName(absl::string_view name);

// A mail address as an SMTP envelope and a To header take it: one plain
// name@domain of printable ASCII, at most 254 bytes; no display name, list,
// comment or line break.
absl::Status ValidateMailAddress(absl::string_view address);

// SageMaker's spellings of rule statuses: "InProgress", "IssuesFound",
// "NoIssuesFound", "Error", "Stopped".
absl::string_view RuleStatusName(v1::RuleStatus status);

}  // namespace sonde

#endif  // SONDE_COMMON_NAMES_H_
