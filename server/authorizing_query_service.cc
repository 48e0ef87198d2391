#include "server/authorizing_query_service.h"

#include <string>
#include <utility>

#include "common/grpc_status.h"

namespace sonde::server {

grpc::Status AuthorizingQueryService::ListJobs(grpc::ServerContext* context,
                                               const v1::ListJobsRequest* request,
                                               v1::ListJobsResponse* response) {
  auto grant = AuthorizeCall(*tokens_, *context, "/sonde.v1.Query/ListJobs", *request);
  if (!grant.ok()) return ToGrpcStatus(grant.status());
  v1::ListJobsResponse all;
  grpc::Status s = inner_->ListJobs(context, request, &all);
  if (!s.ok()) return s;
  for (v1::JobInfo& job : *all.mutable_jobs()) {
    if (TokenTable::Check(**grant, job.job(), Right::kRead).ok()) {
      *response->add_jobs() = std::move(job);
    }
  }
  return grpc::Status::OK;
}

grpc::Status AuthorizingQueryService::GetJob(grpc::ServerContext* context,
                                             const v1::GetJobRequest* request,
                                             v1::JobInfo* response) {
  return Guarded(context, "/sonde.v1.Query/GetJob", *request,
                 [&] { return inner_->GetJob(context, request, response); });
}

grpc::Status AuthorizingQueryService::ListTensors(grpc::ServerContext* context,
                                                  const v1::ListTensorsRequest* request,
                                                  v1::ListTensorsResponse* response) {
  return Guarded(context, "/sonde.v1.Query/ListTensors", *request,
                 [&] { return inner_->ListTensors(context, request, response); });
}

grpc::Status AuthorizingQueryService::ListMetrics(grpc::ServerContext* context,
                                                  const v1::ListMetricsRequest* request,
                                                  v1::ListMetricsResponse* response) {
  return Guarded(context, "/sonde.v1.Query/ListMetrics", *request,
                 [&] { return inner_->ListMetrics(context, request, response); });
}

grpc::Status AuthorizingQueryService::ReadMetrics(grpc::ServerContext* context,
                                                  const v1::ReadMetricsRequest* request,
                                                  v1::ReadMetricsResponse* response) {
  return Guarded(context, "/sonde.v1.Query/ReadMetrics", *request,
                 [&] { return inner_->ReadMetrics(context, request, response); });
}

grpc::Status AuthorizingQueryService::ReadEvents(grpc::ServerContext* context,
                                                  const v1::ReadEventsRequest* request,
                                                  v1::ReadEventsResponse* response) {
  return Guarded(context, "/sonde.v1.Query/ReadEvents", *request,
                 [&] { return inner_->ReadEvents(context, request, response); });
}

grpc::Status AuthorizingQueryService::GetReport(grpc::ServerContext* context,
                                                 const v1::GetReportRequest* request,
                                                 v1::GetReportResponse* response) {
  return Guarded(context, "/sonde.v1.Query/GetReport", *request,
                 [&] { return inner_->GetReport(context, request, response); });
}

grpc::Status AuthorizingQueryService::ListSteps(grpc::ServerContext* context,
                                                const v1::ListStepsRequest* request,
                                                v1::ListStepsResponse* response) {
  return Guarded(context, "/sonde.v1.Query/ListSteps", *request,
                 [&] { return inner_->ListSteps(context, request, response); });
}

grpc::Status AuthorizingQueryService::ReadTensor(grpc::ServerContext* context,
                                                 const v1::ReadTensorRequest* request,
                                                 grpc::ServerWriter<v1::TensorChunk>* writer) {
  return Guarded(context, "/sonde.v1.Query/ReadTensor", *request,
                 [&] { return inner_->ReadTensor(context, request, writer); });
}

grpc::Status AuthorizingQueryService::ReadSeries(grpc::ServerContext* context,
                                                 const v1::ReadSeriesRequest* request,
                                                 v1::ReadSeriesResponse* response) {
  return Guarded(context, "/sonde.v1.Query/ReadSeries", *request,
                 [&] { return inner_->ReadSeries(context, request, response); });
}

grpc::Status AuthorizingQueryService::GetRuleResults(grpc::ServerContext* context,
                                                     const v1::GetRuleResultsRequest* request,
                                                     v1::GetRuleResultsResponse* response) {
  return Guarded(context, "/sonde.v1.Query/GetRuleResults", *request,
                 [&] { return inner_->GetRuleResults(context, request, response); });
}

grpc::ServerWriteReactor<v1::RuleResult>* AuthorizingQueryService::WatchRuleResults(
    grpc::CallbackServerContext* context, const v1::GetRuleResultsRequest* request) {
  return GuardedWatch<v1::RuleResult>(context, "/sonde.v1.Query/WatchRuleResults", *request,
                           [&] { return inner_->WatchRuleResults(context, request); });
}

grpc::Status AuthorizingQueryService::ListRuleCatalog(grpc::ServerContext* context,
                                                      const v1::ListRuleCatalogRequest* request,
                                                      v1::ListRuleCatalogResponse* response) {
  return Guarded(context, "/sonde.v1.Query/ListRuleCatalog", *request,
                 [&] { return inner_->ListRuleCatalog(context, request, response); });
}

grpc::ServerWriteReactor<v1::CompletedStep>* AuthorizingQueryService::WatchSteps(
    grpc::CallbackServerContext* context, const v1::WatchStepsRequest* request) {
  return GuardedWatch<v1::CompletedStep>(context, "/sonde.v1.Query/WatchSteps", *request,
                           [&] { return inner_->WatchSteps(context, request); });
}

grpc::Status AuthorizingQueryService::PostRuleResult(grpc::ServerContext* context,
                                                     const v1::PostRuleResultRequest* request,
                                                     v1::PostRuleResultResponse* response) {
  return Guarded(context, "/sonde.v1.Query/PostRuleResult", *request,
                 [&] { return inner_->PostRuleResult(context, request, response); });
}

grpc::Status AuthorizingQueryService::EnableRules(grpc::ServerContext* context,
                                                  const v1::EnableRulesRequest* request,
                                                  v1::EnableRulesResponse* response) {
  return Guarded(context, "/sonde.v1.Query/EnableRules", *request,
                 [&] { return inner_->EnableRules(context, request, response); });
}

grpc::Status AuthorizingQueryService::DeleteJob(grpc::ServerContext* context,
                                                const v1::DeleteJobRequest* request,
                                                v1::DeleteJobResponse* response) {
  return Guarded(context, "/sonde.v1.Query/DeleteJob", *request,
                 [&] { return inner_->DeleteJob(context, request, response); });
}

}  // namespace sonde::server
