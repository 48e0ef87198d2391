#include "server/security.h"

#include <arpa/inet.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/channel.h"

namespace sonde::server {

bool IsLoopbackListen(const std::string& listen) {
  std::string host = listen;
  const size_t colon = host.rfind(':');
  if (colon != std::string::npos && host.find(']') != std::string::npos) {
    host = host.substr(0, colon);  // "[::1]:7070"
  } else if (colon != std::string::npos && host.find(':') == colon) {
    host = host.substr(0, colon);  // "127.0.0.1:7070"
  }
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    host = host.substr(1, host.size() - 2);
  }
  if (host == "localhost") return true;
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    return IN6_IS_ADDR_LOOPBACK(&v6);
  }
  return false;
}

absl::Status CheckServerSecurity(const std::string& listen,
                                 const ServerSecurityOptions& security) {
  if (security.tls_cert_file.empty() != security.tls_key_file.empty()) {
    return absl::InvalidArgumentError("TLS needs both a certificate file and a key file");
  }
  if (!security.tls_client_ca_file.empty() && !security.tls()) {
    return absl::InvalidArgumentError(
        "client certificates (tls_client_ca) need TLS: give a certificate and key too");
  }
  if (!security.tls() && !security.auth() && !security.allow_insecure &&
      !IsLoopbackListen(listen)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to listen on '", listen,
        "' without TLS or authentication: anyone who can reach it could read and write "
        "every job. Give --tls_cert/--tls_key and/or --auth_tokens, listen on 127.0.0.1, "
        "or pass --allow_insecure"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerSecurityOptions& security) {
  if (!security.tls()) return grpc::InsecureServerCredentials();
  auto cert = ReadSecretFile(security.tls_cert_file);
  if (!cert.ok()) return cert.status();
  auto key = ReadSecretFile(security.tls_key_file);
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({std::move(*key), std::move(*cert)});
  if (!security.tls_client_ca_file.empty()) {
    auto ca = ReadSecretFile(security.tls_client_ca_file);
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = std::move(*ca);
    ssl.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

}  // namespace sonde::server
