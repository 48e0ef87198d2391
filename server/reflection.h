// gRPC server reflection, version v1 (grpc.reflection.v1.ServerReflection),
// over the protobuf descriptors linked into the binary. Debian's gRPC 1.51
// serves only v1alpha (its plugin stays registered beside this one); tools
// built on gRPC 1.57+ (grpcurl, grpcui, Postman) ask for v1 first.
//
// Answers, per request on the stream: list_services (the names given at
// construction), file_by_filename, file_containing_symbol (services,
// methods, messages, enums, fields), file_containing_extension and
// all_extension_numbers_of_type. A file comes with the files it imports,
// each sent once per stream. What cannot be found gets an error_response
// with NOT_FOUND and the name; a request with no message_request gets
// INVALID_ARGUMENT. Thread-safe.
#ifndef SONDE_SERVER_REFLECTION_H_
#define SONDE_SERVER_REFLECTION_H_

#include <string>
#include <vector>

#include "proto/reflection.grpc.pb.h"

namespace sonde::server {

class ReflectionV1Service final : public grpc::reflection::v1::ServerReflection::Service {
 public:
  // `services`: the fully-qualified names list_services answers with.
  explicit ReflectionV1Service(std::vector<std::string> services);

  grpc::Status ServerReflectionInfo(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<grpc::reflection::v1::ServerReflectionResponse,
                               grpc::reflection::v1::ServerReflectionRequest>* stream) override;

 private:
  const std::vector<std::string> services_;
};

}  // namespace sonde::server

#endif  // SONDE_SERVER_REFLECTION_H_
