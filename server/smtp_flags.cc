#include "server/smtp_flags.h"

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, smtp_url, "",
          "mail relay of Email actions: smtp://host:port (STARTTLS when offered) or "
          "smtps://host:port. Empty: rules asking for Email are refused");
ABSL_FLAG(std::string, smtp_from, "", "sender of Email actions (default sonde@<host name>)");
ABSL_FLAG(std::string, smtp_user, "",
          "user name for the relay's AUTH (implies --smtp_require_tls)");
ABSL_FLAG(std::string, smtp_password_file, "",
          "file whose first line is --smtp_user's password");
ABSL_FLAG(bool, smtp_require_tls, false,
          "send no mail unencrypted: smtp:// must upgrade with STARTTLS");

namespace sonde::server {

absl::StatusOr<SmtpOptions> SmtpOptionsFromCommandLine() {
  return SmtpOptionsFromFlags(absl::GetFlag(FLAGS_smtp_url), absl::GetFlag(FLAGS_smtp_from),
                              absl::GetFlag(FLAGS_smtp_user),
                              absl::GetFlag(FLAGS_smtp_password_file),
                              absl::GetFlag(FLAGS_smtp_require_tls));
}

}  // namespace sonde::server
