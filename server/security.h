// The collector's transport security and the rule that keeps plaintext
// without authentication on loopback: TLS server credentials from PEM
// files (optionally requiring client certificates signed by a given CA),
// and the check run before listening. Stateless; thread-safe.
#ifndef SONDE_SERVER_SECURITY_H_
#define SONDE_SERVER_SECURITY_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/security/server_credentials.h"

namespace sonde::server {

struct ServerSecurityOptions {
  // PEM files of the server's certificate chain and private key. Both or
  // neither; with both the collector serves TLS only. Default empty:
  // plaintext.
  std::string tls_cert_file;
  std::string tls_key_file;
  // PEM file of the CA(s) whose client certificates are accepted. Given:
  // every client must present a certificate that verifies against it
  // (mutual TLS). Needs tls_cert_file. Default empty: no client
  // certificates asked for.
  std::string tls_client_ca_file;
  // JSON tokens file (server/auth.h). Given: every call needs a known
  // bearer token with the right for the job it names. Default empty: no
  // authentication.
  std::string auth_tokens_file;
  // Serve plaintext without authentication on an address that is not
  // loopback. Default false: refused.
  bool allow_insecure = false;

  bool tls() const { return !tls_cert_file.empty(); }
  bool auth() const { return !auth_tokens_file.empty(); }
};

// True for 127.0.0.0/8, ::1 and "localhost" hosts of a host:port address.
bool IsLoopbackListen(const std::string& listen);

// FailedPrecondition when `listen` is not loopback and `security` has
// neither TLS nor tokens nor allow_insecure; InvalidArgument for
// inconsistent options (a key without a certificate, a client CA without
// TLS).
absl::Status CheckServerSecurity(const std::string& listen,
                                 const ServerSecurityOptions& security);

// Insecure credentials without TLS, TLS credentials otherwise. Errors of
// reading the PEM files as they come (NotFound, PermissionDenied).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerSecurityOptions& security);

}  // namespace sonde::server

#endif  // SONDE_SERVER_SECURITY_H_
