// The Query service's two watches as gRPC callback reactors: each is a
// WatchSink of the job's registry (server/watchers.h) that writes what it
// hears as it hears it. No thread waits on an open watch; an idle one
// costs its reactor's memory.
//
// Slow readers are bounded:
//   * WatchRuleResults keeps, per rule, only the newest result not yet
//     written: a reader that falls behind skips superseded verdicts of a
//     rule, never a rule, and what it holds is bounded by the job's rules.
//   * WatchSteps holds at most `max_queued_steps` delivered steps not yet
//     written. Past that the call ends with RESOURCE_EXHAUSTED naming the
//     step to resume from (WatchStepsRequest.from_step); nothing is skipped
//     silently.
// Both end with OK when the job is no longer active (its results and steps
// all written), and with OK when the collector shuts down.
#ifndef SONDE_SERVER_WATCH_CALLS_H_
#define SONDE_SERVER_WATCH_CALLS_H_

#include <cstddef>

#include "grpcpp/grpcpp.h"
#include "proto/query.pb.h"
#include "server/job_registry.h"
#include "server/watch_options.h"
#include "storage/store.h"

namespace sonde::server {

// Each returns a reactor that owns itself (deleted when the call is done).
grpc::ServerWriteReactor<v1::RuleResult>* NewRuleResultsWatch(JobRegistry* registry,
                                                               const std::string& job);
grpc::ServerWriteReactor<v1::CompletedStep>* NewStepsWatch(JobRegistry* registry,
                                                            storage::Store* store,
                                                            const v1::WatchStepsRequest& request,
                                                            const WatchOptions& options);

// A reactor that ends the call at once with `status` (a refusal).
template <typename T>
class RefusedWrite final : public grpc::ServerWriteReactor<T> {
 public:
  explicit RefusedWrite(grpc::Status status) { this->Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

}  // namespace sonde::server

#endif  // SONDE_SERVER_WATCH_CALLS_H_
