#include "server/cluster/query_front.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "grpcpp/grpcpp.h"
#include "proto/cluster.pb.h"
#include "server/access.h"
#include "server/cluster/membership.h"

namespace sonde::cluster {

namespace {

// A client context for the hop to a node: the caller's deadline and
// cancellation, and its authorization header.
std::unique_ptr<grpc::ClientContext> Onward(grpc::ServerContext* context) {
  std::unique_ptr<grpc::ClientContext> out = grpc::ClientContext::FromServerContext(*context);
  auto auth = context->client_metadata().find("authorization");
  if (auth != context->client_metadata().end()) {
    out->AddMetadata("authorization", std::string(auth->second.data(), auth->second.size()));
  }
  return out;
}

}  // namespace

QueryFront::QueryFront(Etcd* etcd, Options options)
    : etcd_(etcd),
      directory_(etcd, options.prefix, options.partitions),
      options_(std::move(options)) {}

v1::Query::Stub* QueryFront::StubFor(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& stub = stubs_[address];
  if (stub == nullptr) {
    stub = v1::Query::NewStub(grpc::CreateChannel(
        address, options_.node_credentials != nullptr ? options_.node_credentials
                                                      : grpc::InsecureChannelCredentials()));
  }
  return stub.get();
}

absl::StatusOr<v1::Query::Stub*> QueryFront::OwnerOf(const std::string& job) {
  absl::StatusOr<int> partition = directory_.PartitionOf(job, /*record=*/false);
  if (!partition.ok()) return partition.status();
  const int p = *partition;
  absl::StatusOr<std::optional<KeyValue>> owner =
      etcd_->Get(absl::StrCat(options_.prefix, "/owners/", p));
  if (!owner.ok()) return owner.status();
  if (!owner->has_value()) {
    return absl::UnavailableError(absl::StrCat("job '", job, "': partition ", p,
                                               " has no owner just now (a failover); retry"));
  }
  absl::StatusOr<std::optional<KeyValue>> node =
      etcd_->Get(absl::StrCat(options_.prefix, "/nodes/", (*owner)->value));
  if (!node.ok()) return node.status();
  if (!node->has_value()) {
    return absl::UnavailableError(absl::StrCat("job '", job, "': the owner of partition ", p,
                                               ", '", (*owner)->value, "', has just left"));
  }
  return StubFor((*node)->value);
}

template <typename Request, typename Response, typename Method>
grpc::Status QueryFront::Unary(grpc::ServerContext* context, const std::string& job,
                               const Request& request, Response* response, Method method) {
  absl::StatusOr<v1::Query::Stub*> stub = OwnerOf(job);
  if (!stub.ok()) return ToGrpcStatus(stub.status());
  std::unique_ptr<grpc::ClientContext> onward = Onward(context);
  return ((*stub)->*method)(onward.get(), request, response);
}

template <typename Request, typename Item, typename Method>
grpc::Status QueryFront::Streamed(grpc::ServerContext* context, const std::string& job,
                                  const Request& request, grpc::ServerWriter<Item>* writer,
                                  Method method) {
  absl::StatusOr<v1::Query::Stub*> stub = OwnerOf(job);
  if (!stub.ok()) return ToGrpcStatus(stub.status());
  std::unique_ptr<grpc::ClientContext> onward = Onward(context);
  std::unique_ptr<grpc::ClientReader<Item>> reader = ((*stub)->*method)(onward.get(), request);
  Item item;
  while (reader->Read(&item)) {
    if (!writer->Write(item)) {  // the caller went away
      onward->TryCancel();
      break;
    }
  }
  return reader->Finish();
}

grpc::Status QueryFront::ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                                  v1::ListJobsResponse* response) {
  // Each job from its partition's owner: other nodes may hold old copies.
  absl::StatusOr<std::vector<KeyValue>> owners = etcd_->List(options_.prefix + "/owners/");
  absl::StatusOr<std::vector<KeyValue>> nodes = etcd_->List(options_.prefix + "/nodes/");
  absl::StatusOr<std::map<std::string, int>> recorded = directory_.All();
  if (!owners.ok()) return ToGrpcStatus(owners.status());
  if (!nodes.ok()) return ToGrpcStatus(nodes.status());
  if (!recorded.ok()) return ToGrpcStatus(recorded.status());
  std::map<int, std::string> owner_of;  // partition -> node name
  const size_t owners_skip = options_.prefix.size() + std::string("/owners/").size();
  for (const KeyValue& kv : *owners) {
    owner_of[std::atoi(kv.key.substr(owners_skip).c_str())] = kv.value;
  }
  const size_t nodes_skip = options_.prefix.size() + std::string("/nodes/").size();
  for (const KeyValue& kv : *nodes) {
    const std::string name = kv.key.substr(nodes_skip);
    bool owns_any = false;
    for (const auto& [p, n] : owner_of) owns_any = owns_any || n == name;
    if (!owns_any) continue;
    std::unique_ptr<grpc::ClientContext> onward = Onward(context);
    v1::ListJobsResponse part;
    grpc::Status s = StubFor(kv.value)->ListJobs(onward.get(), *request, &part);
    if (!s.ok()) {
      return grpc::Status(s.error_code(),
                          absl::StrCat("node '", name, "' (", kv.value, "): ", s.error_message()));
    }
    for (v1::JobInfo& job : *part.mutable_jobs()) {
      auto at = recorded->find(job.job());
      auto owner = owner_of.find(at != recorded->end() ? at->second
                                                      : JobPartition(job.job(), options_.partitions));
      if (owner != owner_of.end() && owner->second == name) *response->add_jobs() = std::move(job);
    }
  }
  return grpc::Status::OK;
}

grpc::Status QueryFront::ListRuleCatalog(grpc::ServerContext* context,
                                         const v1::ListRuleCatalogRequest* request,
                                         v1::ListRuleCatalogResponse* response) {
  // Every node runs the same rules: any live one answers.
  absl::StatusOr<std::vector<KeyValue>> nodes = etcd_->List(options_.prefix + "/nodes/");
  if (!nodes.ok()) return ToGrpcStatus(nodes.status());
  if (nodes->empty()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no live node");
  std::unique_ptr<grpc::ClientContext> onward = Onward(context);
  return StubFor(nodes->front().value)->ListRuleCatalog(onward.get(), *request, response);
}

grpc::Status QueryFront::GetJob(grpc::ServerContext* c, const v1::GetJobRequest* r,
                                v1::JobInfo* out) {
  return Unary(c, r->job(), *r, out, &v1::Query::Stub::GetJob);
}
grpc::Status QueryFront::ListTensors(grpc::ServerContext* c, const v1::ListTensorsRequest* r,
                                     v1::ListTensorsResponse* out) {
  return Unary(c, r->job(), *r, out, &v1::Query::Stub::ListTensors);
}
grpc::Status QueryFront::ListSteps(grpc::ServerContext* c, const v1::ListStepsRequest* r,
                                   v1::ListStepsResponse* out) {
  return Unary(c, r->job(), *r, out, &v1::Query::Stub::ListSteps);
}
grpc::Status QueryFront::ReadTensor(grpc::ServerContext* c, const v1::ReadTensorRequest* r,
                                    grpc::ServerWriter<v1::TensorChunk>* w) {
  return Streamed(c, r->job(), *r, w, &v1::Query::Stub::ReadTensor);
}
grpc::Status QueryFront::ReadSeries(grpc::ServerContext* c, const v1::ReadSeriesRequest* r,
                                    v1::ReadSeriesResponse* out) {
  return Unary(c, r->job(), *r, out, &v1::Query::Stub::ReadSeries);
}
grpc::Status QueryFront::GetRuleResults(grpc::ServerContext* c,
                                        const v1::GetRuleResultsRequest* r,
                                        v1::GetRuleResultsResponse* out) {
  return Unary(c, r->job(), *r, out, &v1::Query::Stub::GetRuleResults);
}
grpc::Status QueryFront::WatchRuleResults(grpc::ServerContext* c,
                                          const v1::GetRuleResultsRequest* r,
                                          grpc::ServerWriter<v1::RuleResult>* w) {
  return Streamed(c, r->job(), *r, w, &v1::Query::Stub::WatchRuleResults);
}
grpc::Status QueryFront::WatchSteps(grpc::ServerContext* c, const v1::WatchStepsRequest* r,
                                    grpc::ServerWriter<v1::CompletedStep>* w) {
  return Streamed(c, r->job(), *r, w, &v1::Query::Stub::WatchSteps);
}
template <typename Request, typename Response>
grpc::Status QueryFront::Logged(grpc::ServerContext* context, const char* method,
                                const std::string& job, const Request& request,
                                v1::LogEntry entry, Response* response) {
  if (options_.tokens != nullptr) {
    absl::StatusOr<const server::TokenGrant*> grant =
        server::AuthorizeCall(*options_.tokens, *context, method, request);
    if (!grant.ok()) return ToGrpcStatus(grant.status());
  }
  absl::StatusOr<v1::EntryOutcome> answer = options_.gateway->LogControl(job, std::move(entry));
  if (!answer.ok()) return ToGrpcStatus(answer.status());
  if (answer->code() != 0) {
    return grpc::Status(static_cast<grpc::StatusCode>(answer->code()), answer->message());
  }
  if (!response->ParseFromString(answer->response())) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "the node's answer does not parse");
  }
  return grpc::Status::OK;
}

grpc::Status QueryFront::PostRuleResult(grpc::ServerContext* c,
                                        const v1::PostRuleResultRequest* r,
                                        v1::PostRuleResultResponse* out) {
  if (options_.gateway == nullptr) {
    return Unary(c, r->result().job(), *r, out, &v1::Query::Stub::PostRuleResult);
  }
  v1::LogEntry entry;
  *entry.mutable_post_rule_result() = *r;
  return Logged(c, "/sonde.v1.Query/PostRuleResult", r->result().job(), *r, std::move(entry),
                out);
}
grpc::Status QueryFront::EnableRules(grpc::ServerContext* c, const v1::EnableRulesRequest* r,
                                     v1::EnableRulesResponse* out) {
  if (options_.gateway == nullptr) {
    return Unary(c, r->job(), *r, out, &v1::Query::Stub::EnableRules);
  }
  v1::LogEntry entry;
  *entry.mutable_enable_rules() = *r;
  return Logged(c, "/sonde.v1.Query/EnableRules", r->job(), *r, std::move(entry), out);
}
grpc::Status QueryFront::DeleteJob(grpc::ServerContext* c, const v1::DeleteJobRequest* r,
                                   v1::DeleteJobResponse* out) {
  if (options_.gateway == nullptr) return Unary(c, r->job(), *r, out, &v1::Query::Stub::DeleteJob);
  v1::LogEntry entry;
  *entry.mutable_delete_job() = *r;
  return Logged(c, "/sonde.v1.Query/DeleteJob", r->job(), *r, std::move(entry), out);
}
grpc::Status QueryFront::ListMetrics(grpc::ServerContext* c, const v1::ListMetricsRequest* r,
                                     v1::ListMetricsResponse* out) {
  return Unary(c, r->job(), *r, out, &v1::Query::Stub::ListMetrics);
}
grpc::Status QueryFront::ReadMetrics(grpc::ServerContext* c, const v1::ReadMetricsRequest* r,
                                     v1::ReadMetricsResponse* out) {
  return Unary(c, r->job(), *r, out, &v1::Query::Stub::ReadMetrics);
}
grpc::Status QueryFront::ReadEvents(grpc::ServerContext* c, const v1::ReadEventsRequest* r,
                                    v1::ReadEventsResponse* out) {
  return Unary(c, r->job(), *r, out, &v1::Query::Stub::ReadEvents);
}
grpc::Status QueryFront::GetReport(grpc::ServerContext* c, const v1::GetReportRequest* r,
                                   v1::GetReportResponse* out) {
  return Unary(c, r->job(), *r, out, &v1::Query::Stub::GetReport);
}

}  // namespace sonde::cluster
