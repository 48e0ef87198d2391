// Who may call what: the one table of the collector's RPCs with the right
// each needs and the request field that names its job, and the one check
// that applies it. The Collector stream (at its Hello) and every Query
// method (AuthorizingQueryService) go through Authorize; nothing else
// decides access.
//
// gRPC C++ server interceptors cannot end a call with a status of their
// own (they may observe and modify, not refuse), so the check runs at the
// edge of each service instead, as one function of (method, request).
#ifndef SONDE_SERVER_ACCESS_H_
#define SONDE_SERVER_ACCESS_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "google/protobuf/message.h"
#include "grpcpp/server_context.h"
#include "server/auth.h"

namespace sonde::server {

struct MethodAccess {
  // The full gRPC name, e.g. "/sonde.v1.Query/GetJob".
  absl::string_view method;
  Right right;
  // The request field that names the job, a dotted path of singular
  // message fields ending in a string ("job", "result.job"). Empty: the
  // call is about no job; any known token may make it.
  absl::string_view job_field;
  // The answer lists jobs and is filtered to those the token may read
  // (ListJobs) instead of being refused.
  bool filters_answer = false;
};

// Every method the collector serves under tokens, the Collector stream
// included. Health and reflection are not in it: they reveal no job.
absl::Span<const MethodAccess> AccessTable();

// The entry of `method`; null if it has none.
const MethodAccess* FindAccess(absl::string_view method);

// The job `request` names per `access.job_field`; InvalidArgument if the
// field path does not exist in the request's type (a table bug).
absl::StatusOr<std::string> JobOf(const MethodAccess& access,
                                  const google::protobuf::Message& request);

// The one check: `grant` (an authenticated token) may make the call
// `method` with `request`. PermissionDenied with a message that depends
// only on the token's name, the right and the job asked (never on whether
// the job exists), also for a method missing from the table (fail closed).
// Refusals are logged with the peer and the token's fingerprint.
absl::Status Authorize(const TokenGrant& grant, absl::string_view method,
                       const google::protobuf::Message& request, absl::string_view peer);

// Authenticates the call's token and authorizes it for `method` and
// `request`: Unauthenticated or PermissionDenied, or the grant (for answers
// filtered per job).
absl::StatusOr<const TokenGrant*> AuthorizeCall(const TokenTable& tokens,
                                                const grpc::ServerContextBase& context,
                                                absl::string_view method,
                                                const google::protobuf::Message& request);

}  // namespace sonde::server

#endif  // SONDE_SERVER_ACCESS_H_
