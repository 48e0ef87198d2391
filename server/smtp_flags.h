// The --smtp_* flags of the collector's binaries (sonde-collector and
// sonde-cluster's nodes), defined once: the mail relay of Email actions.
#ifndef SONDE_SERVER_SMTP_FLAGS_H_
#define SONDE_SERVER_SMTP_FLAGS_H_

#include "absl/status/statusor.h"
#include "server/notifier.h"

namespace sonde::server {

// SmtpOptions from the parsed flags (SmtpOptionsFromFlags checks them).
absl::StatusOr<SmtpOptions> SmtpOptionsFromCommandLine();

}  // namespace sonde::server

#endif  // SONDE_SERVER_SMTP_FLAGS_H_
