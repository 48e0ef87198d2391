// The gRPC edge of ingest: a callback-API bidirectional stream per training
// process. Each stream's reactor moves messages between gRPC and an
// IngestSession; storage work runs on the storage pool, never on gRPC's
// threads. At most one read and one write are in flight per stream, and a
// stream does not read on while its step is being committed: backpressure
// reaches the client. Messages are read as raw bytes and parsed here, so a
// message that does not parse (garbage, a truncated protobuf, invalid UTF-8
// in a string) ends the stream with INVALID_ARGUMENT saying so, instead of
// looking like the client's half-close. Thread-safe.
#ifndef SONDE_SERVER_COLLECTOR_SERVICE_H_
#define SONDE_SERVER_COLLECTOR_SERVICE_H_

#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/thread_pool.h"
#include "proto/collector.grpc.pb.h"
#include "server/auth.h"
#include "server/ingest_session.h"
#include "server/job_registry.h"

namespace sonde::server {

class IngestReactor;

class CollectorService final
    : public v1::Collector::WithRawCallbackMethod_Stream<v1::Collector::Service> {
 public:
  // `tokens` non-null: a stream needs a known bearer token, and its hello's
  // job needs the token's write right (server/auth.h). Not owned.
  CollectorService(JobRegistry* registry, ThreadPool* storage_pool, IngestLimits limits,
                   const TokenTable* tokens = nullptr)
      : registry_(registry), storage_pool_(storage_pool), limits_(limits), tokens_(tokens) {}

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Stream(
      grpc::CallbackServerContext* context) override;

  // Ends every open stream with UNAVAILABLE (collector shutting down) and
  // refuses new ones. Steps already acknowledged stay stored; an open step
  // is dropped for the client to send again.
  void FinishAll();
  // Waits until every stream's reactor is gone.
  void WaitForStreams();

 private:
  friend class IngestReactor;
  void Remove(IngestReactor* reactor);

  JobRegistry* const registry_;
  ThreadPool* const storage_pool_;
  const IngestLimits limits_;
  const TokenTable* const tokens_;  // null: no authentication
  absl::Mutex mu_;
  std::set<IngestReactor*> reactors_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace sonde::server

#endif  // SONDE_SERVER_COLLECTOR_SERVICE_H_
