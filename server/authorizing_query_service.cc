#include "server/authorizing_query_service.h"

#include <string>
#include <utility>

#include "common/grpc_status.h"
#include "glog/logging.h"

namespace sonde::server {

absl::Status AuthorizingQueryService::Allow(const grpc::ServerContext& context,
                                            const std::string& job, Right right) const {
  auto grant = AuthenticateCall(*tokens_, context);
  if (!grant.ok()) return grant.status();
  absl::Status allowed = TokenTable::Check(**grant, job, right);
  if (!allowed.ok()) {
    LOG(WARNING) << "refused a call from " << context.peer() << " (token fingerprint "
                 << (*grant)->fingerprint << "): " << allowed.message();
  }
  return allowed;
}

grpc::Status AuthorizingQueryService::ListJobs(grpc::ServerContext* context,
                                               const v1::ListJobsRequest* request,
                                               v1::ListJobsResponse* response) {
  auto grant = AuthenticateCall(*tokens_, *context);
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
  absl::Status allowed = Allow(*context, request->job(), Right::kRead);
  if (!allowed.ok()) return ToGrpcStatus(allowed);
  return inner_->GetJob(context, request, response);
}

grpc::Status AuthorizingQueryService::ListTensors(grpc::ServerContext* context,
                                                  const v1::ListTensorsRequest* request,
                                                  v1::ListTensorsResponse* response) {
  absl::Status allowed = Allow(*context, request->job(), Right::kRead);
  if (!allowed.ok()) return ToGrpcStatus(allowed);
  return inner_->ListTensors(context, request, response);
}

grpc::Status AuthorizingQueryService::ListMetrics(grpc::ServerContext* context,
                                                  const v1::ListMetricsRequest* request,
                                                  v1::ListMetricsResponse* response) {
  absl::Status allowed = Allow(*context, request->job(), Right::kRead);
  if (!allowed.ok()) return ToGrpcStatus(allowed);
  return inner_->ListMetrics(context, request, response);
}

grpc::Status AuthorizingQueryService::ReadMetrics(grpc::ServerContext* context,
                                                  const v1::ReadMetricsRequest* request,
                                                  v1::ReadMetricsResponse* response) {
  absl::Status allowed = Allow(*context, request->job(), Right::kRead);
  if (!allowed.ok()) return ToGrpcStatus(allowed);
  return inner_->ReadMetrics(context, request, response);
}

grpc::Status AuthorizingQueryService::ReadEvents(grpc::ServerContext* context,
                                                  const v1::ReadEventsRequest* request,
                                                  v1::ReadEventsResponse* response) {
  absl::Status allowed = Allow(*context, request->job(), Right::kRead);
  if (!allowed.ok()) return ToGrpcStatus(allowed);
  return inner_->ReadEvents(context, request, response);
}

grpc::Status AuthorizingQueryService::GetReport(grpc::ServerContext* context,
                                                 const v1::GetReportRequest* request,
                                                 v1::GetReportResponse* response) {
  absl::Status allowed = Allow(*context, request->job(), Right::kRead);
  if (!allowed.ok()) return ToGrpcStatus(allowed);
  return inner_->GetReport(context, request, response);
}

grpc::Status AuthorizingQueryService::ListSteps(grpc::ServerContext* context,
                                                const v1::ListStepsRequest* request,
                                                v1::ListStepsResponse* response) {
  absl::Status allowed = Allow(*context, request->job(), Right::kRead);
  if (!allowed.ok()) return ToGrpcStatus(allowed);
  return inner_->ListSteps(context, request, response);
}

grpc::Status AuthorizingQueryService::ReadTensor(grpc::ServerContext* context,
                                                 const v1::ReadTensorRequest* request,
                                                 grpc::ServerWriter<v1::TensorChunk>* writer) {
  absl::Status allowed = Allow(*context, request->job(), Right::kRead);
  if (!allowed.ok()) return ToGrpcStatus(allowed);
  return inner_->ReadTensor(context, request, writer);
}

grpc::Status AuthorizingQueryService::ReadSeries(grpc::ServerContext* context,
                                                 const v1::ReadSeriesRequest* request,
                                                 v1::ReadSeriesResponse* response) {
  absl::Status allowed = Allow(*context, request->job(), Right::kRead);
  if (!allowed.ok()) return ToGrpcStatus(allowed);
  return inner_->ReadSeries(context, request, response);
}

grpc::Status AuthorizingQueryService::GetRuleResults(grpc::ServerContext* context,
                                                     const v1::GetRuleResultsRequest* request,
                                                     v1::GetRuleResultsResponse* response) {
  absl::Status allowed = Allow(*context, request->job(), Right::kRead);
  if (!allowed.ok()) return ToGrpcStatus(allowed);
  return inner_->GetRuleResults(context, request, response);
}

grpc::Status AuthorizingQueryService::WatchRuleResults(
    grpc::ServerContext* context, const v1::GetRuleResultsRequest* request,
    grpc::ServerWriter<v1::RuleResult>* writer) {
  absl::Status allowed = Allow(*context, request->job(), Right::kRead);
  if (!allowed.ok()) return ToGrpcStatus(allowed);
  return inner_->WatchRuleResults(context, request, writer);
}

grpc::Status AuthorizingQueryService::ListRuleCatalog(grpc::ServerContext* context,
                                                      const v1::ListRuleCatalogRequest* request,
                                                      v1::ListRuleCatalogResponse* response) {
  // Not about any job: any known token may read the catalogue.
  auto grant = AuthenticateCall(*tokens_, *context);
  if (!grant.ok()) return ToGrpcStatus(grant.status());
  return inner_->ListRuleCatalog(context, request, response);
}

grpc::Status AuthorizingQueryService::WatchSteps(grpc::ServerContext* context,
                                                 const v1::WatchStepsRequest* request,
                                                 grpc::ServerWriter<v1::CompletedStep>* writer) {
  absl::Status allowed = Allow(*context, request->job(), Right::kRead);
  if (!allowed.ok()) return ToGrpcStatus(allowed);
  return inner_->WatchSteps(context, request, writer);
}

grpc::Status AuthorizingQueryService::PostRuleResult(grpc::ServerContext* context,
                                                     const v1::PostRuleResultRequest* request,
                                                     v1::PostRuleResultResponse* response) {
  absl::Status allowed = Allow(*context, request->result().job(), Right::kWrite);
  if (!allowed.ok()) return ToGrpcStatus(allowed);
  return inner_->PostRuleResult(context, request, response);
}

grpc::Status AuthorizingQueryService::EnableRules(grpc::ServerContext* context,
                                                  const v1::EnableRulesRequest* request,
                                                  v1::EnableRulesResponse* response) {
  absl::Status allowed = Allow(*context, request->job(), Right::kWrite);
  if (!allowed.ok()) return ToGrpcStatus(allowed);
  return inner_->EnableRules(context, request, response);
}

grpc::Status AuthorizingQueryService::DeleteJob(grpc::ServerContext* context,
                                                const v1::DeleteJobRequest* request,
                                                v1::DeleteJobResponse* response) {
  absl::Status allowed = Allow(*context, request->job(), Right::kAdmin);
  if (!allowed.ok()) return ToGrpcStatus(allowed);
  return inner_->DeleteJob(context, request, response);
}

}  // namespace sonde::server
