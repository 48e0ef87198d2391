#include "common/grpc_status.h"

#include "gtest/gtest.h"

namespace sonde {
namespace {

TEST(GrpcStatus, MapsEveryCodeBothWaysAndKeepsMessage) {
  const struct {
    absl::StatusCode absl_code;
    grpc::StatusCode grpc_code;
  } cases[] = {
      {absl::StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
      {absl::StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND},
      {absl::StatusCode::kAlreadyExists, grpc::StatusCode::ALREADY_EXISTS},
      {absl::StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE},
      {absl::StatusCode::kDataLoss, grpc::StatusCode::DATA_LOSS},
      {absl::StatusCode::kResourceExhausted, grpc::StatusCode::RESOURCE_EXHAUSTED},
      {absl::StatusCode::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION},
      {absl::StatusCode::kPermissionDenied, grpc::StatusCode::PERMISSION_DENIED},
      {absl::StatusCode::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED},
      {absl::StatusCode::kInternal, grpc::StatusCode::INTERNAL},
      {absl::StatusCode::kCancelled, grpc::StatusCode::CANCELLED},
      {absl::StatusCode::kDeadlineExceeded, grpc::StatusCode::DEADLINE_EXCEEDED},
  };
  for (const auto& c : cases) {
    const grpc::Status g = ToGrpcStatus(absl::Status(c.absl_code, "what went wrong"));
    EXPECT_EQ(g.error_code(), c.grpc_code);
    EXPECT_EQ(g.error_message(), "what went wrong");
    const absl::Status back = FromGrpcStatus(g);
    EXPECT_EQ(back.code(), c.absl_code);
    EXPECT_EQ(back.message(), "what went wrong");
  }
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

}  // namespace
}  // namespace sonde
