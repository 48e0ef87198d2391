// How clients (the hook's sender, the query client, the CLI) open a gRPC
// channel to the collector: plaintext or TLS (optionally with a client
// certificate for mutual TLS), and a bearer token sent as
// `authorization: Bearer <token>` metadata on every call. The one place
// channel credentials are made. Thread-safe (no state).
#ifndef SONDE_COMMON_CHANNEL_H_
#define SONDE_COMMON_CHANNEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"
#include "grpcpp/support/channel_arguments.h"

namespace sonde {

struct ChannelSecurity {
  // PEM file of the CA(s) to trust for the collector's certificate. Empty:
  // plaintext (no TLS). Default empty.
  std::string ca_file;
  // PEM files of this client's certificate chain and private key, for a
  // collector that requires client certificates (mutual TLS). Both or
  // neither; only with ca_file. Default empty.
  std::string cert_file;
  std::string key_file;
  // Name checked against the collector's certificate instead of the
  // target's host (tests, or a collector reached through an IP whose
  // certificate names a host). Default empty: the target's host.
  std::string server_name_override;
  // Bearer token sent with every call. Default empty: none.
  std::string token;
};

// A channel to `target` (host:port) with `args` plus what `security` asks.
// InvalidArgument for an inconsistent `security` (a key without a
// certificate, a certificate without ca_file, a token with line breaks),
// NotFound/PermissionDenied when a PEM file cannot be read. Does not
// connect.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                          const ChannelSecurity& security,
                                                          grpc::ChannelArguments args);

// Reads a whole file (PEM files, token files). NotFound if it is missing.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path);

}  // namespace sonde

#endif  // SONDE_COMMON_CHANNEL_H_
