// The Query service behind bearer-token checks: every call is authenticated
// against a TokenTable and authorized by the access table (server/access.h:
// the method's right on the job its request names) before the QueryService
// underneath sees it; ListJobs answers only the jobs the token may read.
// Each method here only names itself: what it needs is the table's.
// Registered instead of the QueryService when the collector has
// --auth_tokens. Thread-safe.
#ifndef SONDE_SERVER_AUTHORIZING_QUERY_SERVICE_H_
#define SONDE_SERVER_AUTHORIZING_QUERY_SERVICE_H_

#include "grpcpp/server_context.h"
#include "proto/query.grpc.pb.h"
#include "common/grpc_status.h"
#include "server/access.h"
#include "server/auth.h"
#include "server/query_service.h"
#include "server/watch_calls.h"

namespace sonde::server {

class AuthorizingQueryService final : public QueryServiceBase {
 public:
  // Neither is owned; both outlive this.
  AuthorizingQueryService(const TokenTable* tokens, QueryService* inner)
      : tokens_(tokens), inner_(inner) {}

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
  grpc::Status GetReport(grpc::ServerContext*, const v1::GetReportRequest*,
                         v1::GetReportResponse*) override;
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

 private:
  // Runs `call` if the access table (server/access.h) lets the call's
  // token make `method` with `request`; the refusal otherwise.
  template <typename Request, typename Call>
  grpc::Status Guarded(grpc::ServerContext* context, absl::string_view method,
                       const Request& request, Call call) const {
    absl::StatusOr<const TokenGrant*> grant = AuthorizeCall(*tokens_, *context, method, request);
    if (!grant.ok()) return ToGrpcStatus(grant.status());
    return call();
  }
  // The same for the watches (callback API): the inner reactor, or one
  // that ends the call with the refusal.
  template <typename T, typename Request, typename Call>
  grpc::ServerWriteReactor<T>* GuardedWatch(grpc::CallbackServerContext* context,
                                            absl::string_view method, const Request& request,
                                            Call call) const {
    absl::StatusOr<const TokenGrant*> grant = AuthorizeCall(*tokens_, *context, method, request);
    if (!grant.ok()) return new RefusedWrite<T>(ToGrpcStatus(grant.status()));
    return call();
  }

  const TokenTable* const tokens_;
  QueryService* const inner_;
};

}  // namespace sonde::server

#endif  // SONDE_SERVER_AUTHORIZING_QUERY_SERVICE_H_
