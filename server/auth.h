// Bearer-token authentication and per-job authorization for the collector.
// A TokenTable is read once from a JSON file (--auth_tokens) and holds only
// the SHA-256 of each token, never the token itself. Each entry has a name
// (what logs and messages show), rights, and the jobs it covers: a project
// (a job-name prefix such as "teamA-", or "*" for every job) and/or an
// explicit list of jobs.
//
//   {"tokens": [
//     {"name": "teamA-training", "sha256": "<64 hex digits>",
//      "project": "teamA-", "rights": ["write"]},
//     {"name": "alice", "sha256": "...", "jobs": ["resnet-1"], "rights": ["read"]}
//   ]}
//
// Rights: "read" (Query RPCs that read), "write" (the Collector stream,
// EnableRules, PostRuleResult), "admin" (DeleteJob; implies read and write).
// A refusal never says whether the job exists: the check runs before any
// lookup and its message depends only on the token and the job name asked.
// Immutable after creation; thread-safe.
#ifndef SONDE_SERVER_AUTH_H_
#define SONDE_SERVER_AUTH_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/server_context.h"

namespace sonde::server {

enum class Right : uint8_t { kRead = 1, kWrite = 2, kAdmin = 4 };

// "read", "write", "admin".
absl::string_view RightName(Right right);

// What one token may do. Owned by its TokenTable.
struct TokenGrant {
  std::string name;                 // from the file; safe to log
  std::array<uint8_t, 32> sha256;   // of the token
  std::string fingerprint;          // first 8 hex digits of sha256; safe to log
  uint8_t rights = 0;               // bits of Right
  bool all_jobs = false;            // project "*"
  std::string project;              // job-name prefix; empty: none
  std::set<std::string> jobs;       // explicit jobs

  bool Covers(absl::string_view job) const;
};

// Lowercase hex SHA-256 of `text` (what a tokens file stores:
// `printf %s "$TOKEN" | sha256sum`).
std::string Sha256Hex(absl::string_view text);

class TokenTable {
 public:
  // InvalidArgument naming the entry for a malformed file: bad JSON, a
  // missing or duplicate name, a sha256 that is not 64 hex digits, an
  // unknown right, no project and no jobs.
  static absl::StatusOr<std::unique_ptr<TokenTable>> FromJson(absl::string_view text);
  static absl::StatusOr<std::unique_ptr<TokenTable>> FromFile(const std::string& path);

  // The grant of the token in an `authorization` header value
  // ("Bearer <token>"). `header` null: no such header. Unauthenticated for
  // a missing header, another scheme, or an unknown token. Compares hashes
  // in constant time.
  absl::StatusOr<const TokenGrant*> Authenticate(const std::string* header) const;

  // OK if `grant` has `right` on `job`; PermissionDenied otherwise, with a
  // message that depends only on the grant's name, the right and `job`.
  static absl::Status Check(const TokenGrant& grant, absl::string_view job, Right right);

  size_t size() const { return grants_.size(); }

 private:
  TokenTable() = default;
  std::vector<TokenGrant> grants_;
};

// The grant of the call's `authorization` metadata; Unauthenticated if
// missing or unknown (logged with the peer, never with the token).
absl::StatusOr<const TokenGrant*> AuthenticateCall(const TokenTable& tokens,
                                                   const grpc::ServerContextBase& context);

}  // namespace sonde::server

#endif  // SONDE_SERVER_AUTH_H_
