// The one place where absl::Status and grpc::Status are converted. Codes map
// one to one (both follow google.rpc.Code); messages are kept.
#ifndef SONDE_COMMON_GRPC_STATUS_H_
#define SONDE_COMMON_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace sonde {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace sonde

#endif  // SONDE_COMMON_GRPC_STATUS_H_
