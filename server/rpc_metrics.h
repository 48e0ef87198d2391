// Metrics of what crosses the collector's gRPC boundary, taken by a server
// interceptor so the services themselves carry little metrics code:
//
//  * the ingest stream (sonde.v1.Collector/Stream): streams open and
//    streams ended by status code (the interceptor); client messages and
//    their bytes by kind, server messages by kind, steps committed
//    (non-duplicate acks of a step end) and the commit latency (step end
//    received -> its ack sent: waiting for the storage pool, statistics,
//    the RocksDB write), kept by the stream's reactor through
//    IngestStreamMetrics, since the stream's messages cross gRPC as raw
//    bytes that only the reactor parses;
//  * queries (sonde.v1.Query/*): calls by method and status code, and their
//    duration by method.
//
// The metrics live in metrics::Registry::Default() (names in
// docs/reliability.md). Every counter is one relaxed atomic add; the per-call
// state is two atomics. Thread-safe.
#ifndef SONDE_SERVER_RPC_METRICS_H_
#define SONDE_SERVER_RPC_METRICS_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "grpcpp/support/server_interceptor.h"
#include "proto/collector.pb.h"

namespace sonde::server {

// One ingest stream's message metrics. Thread-safe.
class IngestStreamMetrics {
 public:
  void Received(const v1::ClientMessage& message, size_t bytes);
  void Sent(const v1::ServerMessage& message);

 private:
  // The last step end received; at most one is waiting for its ack, since a
  // stream reads nothing while its step commits.
  std::atomic<uint64_t> step_end_seq_{0};
  std::atomic<int64_t> step_end_nanos_{0};
};

// Install with ServerBuilder::experimental().SetInterceptorCreators.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
NewRpcMetricsInterceptorFactory();

}  // namespace sonde::server

#endif  // SONDE_SERVER_RPC_METRICS_H_
