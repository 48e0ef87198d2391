// Metrics of what crosses the collector's gRPC boundary, taken by a server
// interceptor so the services themselves carry no metrics code:
//
//  * the ingest stream (sonde.v1.Collector/Stream): streams open, streams
//    ended by status code, client messages and their bytes by kind, server
//    messages by kind, steps committed (non-duplicate acks of a step end)
//    and the commit latency (step end received -> its ack sent: waiting for
//    the storage pool, statistics, the RocksDB write);
//  * queries (sonde.v1.Query/*): calls by method and status code, and their
//    duration by method.
//
// The metrics live in metrics::Registry::Default() (names in
// docs/reliability.md). Every counter is one relaxed atomic add; the per-call
// state is two atomics. Thread-safe.
#ifndef SONDE_SERVER_RPC_METRICS_H_
#define SONDE_SERVER_RPC_METRICS_H_

#include <memory>

#include "grpcpp/support/server_interceptor.h"

namespace sonde::server {

// Install with ServerBuilder::experimental().SetInterceptorCreators.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
NewRpcMetricsInterceptorFactory();

}  // namespace sonde::server

#endif  // SONDE_SERVER_RPC_METRICS_H_
