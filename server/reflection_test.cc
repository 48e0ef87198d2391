// Server reflection on a real collector over a real socket, both versions:
// v1 (server/reflection.h) and gRPC's own v1alpha, whose messages are the
// same on the wire, so one set of generated types serves both.
#include "server/reflection.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/descriptor_database.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/codegen/client_unary_call.h"
#include "grpcpp/impl/codegen/sync_stream.h"
#include "gtest/gtest.h"
#include "tests/testing/in_process_collector.h"

namespace sonde::server {
namespace {

namespace pb = google::protobuf;
using grpc::reflection::v1::ServerReflectionRequest;
using grpc::reflection::v1::ServerReflectionResponse;
using ::testing::Contains;
using ::testing::HasSubstr;

// One reflection stream, for either version (by its full service name).
class ReflectionStream {
 public:
  ReflectionStream(const std::string& address, const std::string& service)
      : channel_(grpc::CreateChannel(address, grpc::InsecureChannelCredentials())),
        method_(("/" + service + "/ServerReflectionInfo").c_str(),
                grpc::internal::RpcMethod::BIDI_STREAMING, channel_),
        stream_(grpc::internal::ClientReaderWriterFactory<
                ServerReflectionRequest, ServerReflectionResponse>::Create(channel_.get(), method_,
                                                                           &context_)) {}

  ~ReflectionStream() {
    stream_->WritesDone();
    EXPECT_TRUE(stream_->Finish().ok());
  }

  ServerReflectionResponse Ask(const ServerReflectionRequest& request) {
    ServerReflectionResponse response;
    EXPECT_TRUE(stream_->Write(request));
    EXPECT_TRUE(stream_->Read(&response));
    return response;
  }

  ServerReflectionResponse Symbol(const std::string& symbol) {
    ServerReflectionRequest request;
    request.set_file_containing_symbol(symbol);
    return Ask(request);
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  grpc::internal::RpcMethod method_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<ServerReflectionRequest, ServerReflectionResponse>>
      stream_;
};

std::vector<pb::FileDescriptorProto> Files(const ServerReflectionResponse& response) {
  std::vector<pb::FileDescriptorProto> files;
  for (const std::string& bytes : response.file_descriptor_response().file_descriptor_proto()) {
    files.emplace_back();
    EXPECT_TRUE(files.back().ParseFromString(bytes));
  }
  return files;
}

class ReflectionTest : public ::testing::TestWithParam<std::string> {
 protected:
  testing::InProcessCollector collector_;
};

TEST_P(ReflectionTest, ListsEveryService) {
  ReflectionStream stream(collector_.address(), GetParam());
  ServerReflectionRequest request;
  request.set_host("localhost");
  request.set_list_services("*");
  ServerReflectionResponse response = stream.Ask(request);
  EXPECT_EQ(response.valid_host(), "localhost");
  EXPECT_EQ(response.original_request().list_services(), "*");
  std::vector<std::string> names;
  for (const auto& s : response.list_services_response().service()) names.push_back(s.name());
  EXPECT_THAT(names, Contains("sonde.v1.Collector"));
  EXPECT_THAT(names, Contains("sonde.v1.Query"));
  EXPECT_THAT(names, Contains("grpc.health.v1.Health"));
  EXPECT_THAT(names, Contains("grpc.reflection.v1.ServerReflection"));
}

// Health's descriptor is linked into the collector, so a client that knows
// nothing but reflection can call it (the issue: "Symbol not found").
TEST_P(ReflectionTest, ResolvesTheHealthService) {
  ReflectionStream stream(collector_.address(), GetParam());
  ServerReflectionResponse response = stream.Symbol("grpc.health.v1.Health");
  ASSERT_FALSE(response.has_error_response()) << response.error_response().error_message();
  std::vector<pb::FileDescriptorProto> files = Files(response);
  ASSERT_FALSE(files.empty());
  EXPECT_EQ(files[0].package(), "grpc.health.v1");
  ASSERT_EQ(files[0].service_size(), 1);
  EXPECT_EQ(files[0].service(0).name(), "Health");
  EXPECT_EQ(files[0].service(0).method(0).name(), "Check");
}

// The files sent for a service are enough to build its descriptors: the
// file asked for comes with every file it imports.
TEST_P(ReflectionTest, SendsAFileWithItsImports) {
  ReflectionStream stream(collector_.address(), GetParam());
  ServerReflectionResponse response = stream.Symbol("sonde.v1.Query");
  ASSERT_FALSE(response.has_error_response()) << response.error_response().error_message();
  std::vector<pb::FileDescriptorProto> files = Files(response);
  ASSERT_GE(files.size(), 2u);
  EXPECT_EQ(files[0].name(), "proto/query.proto");

  pb::SimpleDescriptorDatabase database;
  for (const auto& f : files) ASSERT_TRUE(database.Add(f)) << f.name();
  pb::DescriptorPool pool(&database);
  const pb::ServiceDescriptor* query = pool.FindServiceByName("sonde.v1.Query");
  ASSERT_NE(query, nullptr);
  const pb::MethodDescriptor* read = query->FindMethodByName("ReadTensor");
  ASSERT_NE(read, nullptr);
  EXPECT_EQ(read->output_type()->full_name(), "sonde.v1.TensorChunk");
  EXPECT_TRUE(read->server_streaming());
}

TEST_P(ReflectionTest, ResolvesMethodsMessagesAndFiles) {
  ReflectionStream stream(collector_.address(), GetParam());
  // First on the stream: v1alpha sends each file once per stream at most.
  ServerReflectionRequest request;
  request.set_file_by_filename("proto/tensor.proto");
  std::vector<pb::FileDescriptorProto> files = Files(stream.Ask(request));
  ASSERT_FALSE(files.empty());
  EXPECT_EQ(files[0].name(), "proto/tensor.proto");
  EXPECT_EQ(files[0].package(), "sonde.v1");
  for (const char* symbol : {"sonde.v1.Query.ListJobs", "sonde.v1.Collector"}) {
    ServerReflectionResponse response = stream.Symbol(symbol);
    ASSERT_FALSE(response.has_error_response()) << symbol;
    ASSERT_FALSE(Files(response).empty()) << symbol;
  }
}

TEST_P(ReflectionTest, UnknownNamesAreNotFound) {
  ReflectionStream stream(collector_.address(), GetParam());
  ServerReflectionResponse response = stream.Symbol("sonde.v1.NoSuchService");
  ASSERT_TRUE(response.has_error_response());
  EXPECT_EQ(response.error_response().error_code(), grpc::StatusCode::NOT_FOUND);
  if (GetParam() == "grpc.reflection.v1.ServerReflection") {
    EXPECT_THAT(response.error_response().error_message(), HasSubstr("sonde.v1.NoSuchService"));
  }
  ServerReflectionRequest request;
  request.set_file_by_filename("no/such.proto");
  EXPECT_EQ(stream.Ask(request).error_response().error_code(), grpc::StatusCode::NOT_FOUND);
  // The stream goes on answering after errors.
  EXPECT_FALSE(stream.Symbol("sonde.v1.Query").has_error_response());
}

INSTANTIATE_TEST_SUITE_P(Versions, ReflectionTest,
                         ::testing::Values("grpc.reflection.v1.ServerReflection",
                                           "grpc.reflection.v1alpha.ServerReflection"),
                         [](const auto& info) {
                           return info.param == "grpc.reflection.v1.ServerReflection"
                                      ? std::string("v1")
                                      : std::string("v1alpha");
                         });

// v1 only: what this implementation promises beyond v1alpha's.
TEST(ReflectionV1, ImportsAreSentOncePerStreamButTheFileAskedForAlways) {
  testing::InProcessCollector collector;
  ReflectionStream stream(collector.address(), "grpc.reflection.v1.ServerReflection");
  std::vector<pb::FileDescriptorProto> first = Files(stream.Symbol("sonde.v1.Query"));
  ASSERT_GE(first.size(), 2u);
  std::vector<pb::FileDescriptorProto> again = Files(stream.Symbol("sonde.v1.Query"));
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].name(), "proto/query.proto");
}

TEST(ReflectionV1, ExtensionsAndEmptyRequests) {
  testing::InProcessCollector collector;
  ReflectionStream stream(collector.address(), "grpc.reflection.v1.ServerReflection");
  ServerReflectionRequest request;
  request.set_all_extension_numbers_of_type("sonde.v1.TensorChunk");
  ServerReflectionResponse response = stream.Ask(request);
  ASSERT_TRUE(response.has_all_extension_numbers_response());
  EXPECT_EQ(response.all_extension_numbers_response().base_type_name(), "sonde.v1.TensorChunk");
  EXPECT_EQ(response.all_extension_numbers_response().extension_number_size(), 0);

  request.mutable_file_containing_extension()->set_containing_type("sonde.v1.TensorChunk");
  request.mutable_file_containing_extension()->set_extension_number(1000);
  response = stream.Ask(request);
  EXPECT_EQ(response.error_response().error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(response.error_response().error_message(), HasSubstr("1000"));

  response = stream.Ask(ServerReflectionRequest());
  EXPECT_EQ(response.error_response().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace sonde::server
