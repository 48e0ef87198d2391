#include "server/reflection.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"

namespace sonde::server {
namespace {

namespace pb = google::protobuf;
using grpc::reflection::v1::ServerReflectionRequest;
using grpc::reflection::v1::ServerReflectionResponse;

void SetError(ServerReflectionResponse* response, grpc::StatusCode code, std::string message) {
  auto* error = response->mutable_error_response();
  error->set_error_code(static_cast<int32_t>(code));
  error->set_error_message(std::move(message));
}

// `file` first, then the files it imports (transitively) that this stream
// has not sent yet.
void AddFile(const pb::FileDescriptor* file, absl::flat_hash_set<std::string>* sent,
             ServerReflectionResponse* response) {
  auto* files = response->mutable_file_descriptor_response();
  std::vector<const pb::FileDescriptor*> pending = {file};
  bool first = true;
  while (!pending.empty()) {
    const pb::FileDescriptor* f = pending.back();
    pending.pop_back();
    const bool fresh = sent->insert(f->name()).second;
    if (!fresh && !first) continue;  // the file asked for is always sent
    first = false;
    pb::FileDescriptorProto proto;
    f->CopyTo(&proto);
    proto.SerializeToString(files->add_file_descriptor_proto());
    for (int i = 0; i < f->dependency_count(); ++i) pending.push_back(f->dependency(i));
  }
}

}  // namespace

ReflectionV1Service::ReflectionV1Service(std::vector<std::string> services)
    : services_(std::move(services)) {}

grpc::Status ReflectionV1Service::ServerReflectionInfo(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<ServerReflectionResponse, ServerReflectionRequest>* stream) {
  const pb::DescriptorPool* pool = pb::DescriptorPool::generated_pool();
  absl::flat_hash_set<std::string> sent;
  ServerReflectionRequest request;
  while (!context->IsCancelled() && stream->Read(&request)) {
    ServerReflectionResponse response;
    response.set_valid_host(request.host());
    *response.mutable_original_request() = request;
    switch (request.message_request_case()) {
      case ServerReflectionRequest::kListServices:
        for (const std::string& name : services_) {
          response.mutable_list_services_response()->add_service()->set_name(name);
        }
        break;
      case ServerReflectionRequest::kFileByFilename: {
        const pb::FileDescriptor* file = pool->FindFileByName(request.file_by_filename());
        if (file == nullptr) {
          SetError(&response, grpc::StatusCode::NOT_FOUND,
                   absl::StrCat("no file named '", request.file_by_filename(), "'"));
        } else {
          AddFile(file, &sent, &response);
        }
        break;
      }
      case ServerReflectionRequest::kFileContainingSymbol: {
        const pb::FileDescriptor* file =
            pool->FindFileContainingSymbol(request.file_containing_symbol());
        if (file == nullptr) {
          SetError(&response, grpc::StatusCode::NOT_FOUND,
                   absl::StrCat("no symbol named '", request.file_containing_symbol(), "'"));
        } else {
          AddFile(file, &sent, &response);
        }
        break;
      }
      case ServerReflectionRequest::kFileContainingExtension: {
        const auto& ext = request.file_containing_extension();
        const pb::Descriptor* type = pool->FindMessageTypeByName(ext.containing_type());
        const pb::FieldDescriptor* field =
            type == nullptr ? nullptr : pool->FindExtensionByNumber(type, ext.extension_number());
        if (field == nullptr) {
          SetError(&response, grpc::StatusCode::NOT_FOUND,
                   absl::StrCat("no extension ", ext.extension_number(), " of '",
                                ext.containing_type(), "'"));
        } else {
          AddFile(field->file(), &sent, &response);
        }
        break;
      }
      case ServerReflectionRequest::kAllExtensionNumbersOfType: {
        const pb::Descriptor* type =
            pool->FindMessageTypeByName(request.all_extension_numbers_of_type());
        if (type == nullptr) {
          SetError(&response, grpc::StatusCode::NOT_FOUND,
                   absl::StrCat("no message type named '",
                                request.all_extension_numbers_of_type(), "'"));
          break;
        }
        std::vector<const pb::FieldDescriptor*> extensions;
        pool->FindAllExtensions(type, &extensions);
        auto* numbers = response.mutable_all_extension_numbers_response();
        numbers->set_base_type_name(type->full_name());
        for (const pb::FieldDescriptor* e : extensions) numbers->add_extension_number(e->number());
        break;
      }
      case ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET:
        SetError(&response, grpc::StatusCode::INVALID_ARGUMENT,
                 "the request sets none of file_by_filename, file_containing_symbol, "
                 "file_containing_extension, all_extension_numbers_of_type, list_services");
        break;
    }
    if (!stream->Write(response)) break;
  }
  return grpc::Status::OK;
}

}  // namespace sonde::server
