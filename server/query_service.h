// The gRPC edge of queries: validates each request, calls the Store or the
// JobRegistry, converts the status once. Unary and ReadTensor calls run on
// the synchronous server's threads (a bounded pool separate from ingest);
// the watches are callback reactors that hold no thread. Thread-safe.
#ifndef SONDE_SERVER_QUERY_SERVICE_H_
#define SONDE_SERVER_QUERY_SERVICE_H_

#include <atomic>
#include <string>

#include "absl/status/statusor.h"
#include "proto/query.grpc.pb.h"
#include "rules/rule_factory.h"
#include "server/job_registry.h"
#include "server/watch_calls.h"
#include "storage/store.h"

namespace sonde::server {

// The job's report page with the rule catalogue of `rule_factory` (null: no
// catalogue): what Query.GetReport returns and the HTTP endpoint's /report
// serves, so both answer alike. InvalidArgument for an empty name, NotFound
// only for an unknown job (something missing under a known job is Internal),
// storage errors as the Store returns them.
absl::StatusOr<std::string> RenderReportPage(storage::Store& store,
                                             const rules::RuleFactory* rule_factory,
                                             const std::string& job);

// The Query service: the watches are served with gRPC's callback API
// (server/watch_calls.h: pushed as they happen, no thread per watch), the
// rest on the synchronous server's pool.
using QueryServiceBase = v1::Query::WithCallbackMethod_WatchRuleResults<
    v1::Query::WithCallbackMethod_WatchSteps<v1::Query::Service>>;

class QueryService final : public QueryServiceBase {
 public:
  QueryService(storage::Store* store, JobRegistry* registry,
               const rules::RuleFactory* rule_factory, WatchOptions watch_options = {})
      : store_(store),
        registry_(registry),
        rule_factory_(rule_factory),
        watch_options_(watch_options) {}

  // Ends every open watch (collector shutting down).
  void Close() { registry_->CloseWatches(); }

  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*,
                        v1::ListJobsResponse*) override;
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest*, v1::JobInfo*) override;
  grpc::Status ListTensors(grpc::ServerContext*, const v1::ListTensorsRequest*,
                           v1::ListTensorsResponse*) override;
  grpc::Status ListMetrics(grpc::ServerContext*, const v1::ListMetricsRequest*,
                           v1::ListMetricsResponse*) override;
  grpc::Status ReadMetrics(grpc::ServerContext*, const v1::ReadMetricsRequest*,
                           v1::ReadMetricsResponse*) override;
  grpc::Status ReadEvents(grpc::ServerContext*, const v1::ReadEventsRequest*,
                          v1::ReadEventsResponse*) override;
  grpc::Status ListSteps(grpc::ServerContext*, const v1::ListStepsRequest*,
                         v1::ListStepsResponse*) override;
  grpc::Status ReadTensor(grpc::ServerContext*, const v1::ReadTensorRequest*,
                          grpc::ServerWriter<v1::TensorChunk>*) override;
  grpc::Status ReadSeries(grpc::ServerContext*, const v1::ReadSeriesRequest*,
                          v1::ReadSeriesResponse*) override;
  grpc::Status GetRuleResults(grpc::ServerContext*, const v1::GetRuleResultsRequest*,
                              v1::GetRuleResultsResponse*) override;
  grpc::ServerWriteReactor<v1::RuleResult>* WatchRuleResults(
      grpc::CallbackServerContext*, const v1::GetRuleResultsRequest*) override;
  grpc::Status ListRuleCatalog(grpc::ServerContext*, const v1::ListRuleCatalogRequest*,
                               v1::ListRuleCatalogResponse*) override;
  grpc::ServerWriteReactor<v1::CompletedStep>* WatchSteps(
      grpc::CallbackServerContext*, const v1::WatchStepsRequest*) override;
  grpc::Status PostRuleResult(grpc::ServerContext*, const v1::PostRuleResultRequest*,
                              v1::PostRuleResultResponse*) override;
  grpc::Status EnableRules(grpc::ServerContext*, const v1::EnableRulesRequest*,
                           v1::EnableRulesResponse*) override;
  grpc::Status DeleteJob(grpc::ServerContext*, const v1::DeleteJobRequest*,
                         v1::DeleteJobResponse*) override;
  grpc::Status GetReport(grpc::ServerContext*, const v1::GetReportRequest*,
                         v1::GetReportResponse*) override;

 private:
  storage::Store* const store_;
  JobRegistry* const registry_;
  const rules::RuleFactory* const rule_factory_;
  const WatchOptions watch_options_;
};

}  // namespace sonde::server

#endif  // SONDE_SERVER_QUERY_SERVICE_H_
