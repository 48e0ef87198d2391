// The ingest stream with raw bytes on the wire, as a broken or hostile
// client writes them: for tests of what the collector does with malformed,
// stuck or oversized streams.
#ifndef SONDE_TESTS_TESTING_RAW_STREAM_H_
#define SONDE_TESTS_TESTING_RAW_STREAM_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "grpcpp/create_channel.h"
#include "grpcpp/impl/codegen/client_context.h"
#include "grpcpp/impl/codegen/rpc_method.h"
#include "grpcpp/impl/codegen/sync_stream.h"
#include "grpcpp/support/byte_buffer.h"
#include "proto/collector.pb.h"

namespace sonde::testing {

class RawStream {
 public:
  explicit RawStream(const std::string& address,
                     std::chrono::seconds deadline = std::chrono::seconds(20))
      : channel_(grpc::CreateChannel(address, grpc::InsecureChannelCredentials())),
        method_("/sonde.v1.Collector/Stream", grpc::internal::RpcMethod::BIDI_STREAMING) {
    context_.set_deadline(std::chrono::system_clock::now() + deadline);
    stream_.reset(grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::
                      Create(channel_.get(), method_, &context_));
  }
  bool WriteBytes(const std::string& bytes) {
    grpc::Slice slice(bytes);
    grpc::ByteBuffer buffer(&slice, 1);
    return stream_->Write(buffer);
  }
  bool Write(const v1::ClientMessage& m) { return WriteBytes(m.SerializeAsString()); }
  bool Read(v1::ServerMessage* m) {
    grpc::ByteBuffer buffer;
    if (!stream_->Read(&buffer)) return false;
    std::vector<grpc::Slice> slices;
    if (!buffer.Dump(&slices).ok()) return false;
    std::string bytes;
    for (const grpc::Slice& s : slices) {
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    return m->ParseFromString(bytes);
  }
  // Half-closes, reads what is left, and returns the stream's status.
  grpc::Status Finish() {
    stream_->WritesDone();
    v1::ServerMessage ignored;
    while (Read(&ignored)) {
    }
    return stream_->Finish();
  }
  void Cancel() { context_.TryCancel(); }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  grpc::internal::RpcMethod method_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream_;
};

}  // namespace sonde::testing

#endif  // SONDE_TESTS_TESTING_RAW_STREAM_H_
