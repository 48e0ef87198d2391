#include "server/cluster/query_front.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
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
  return NodeFor(address).stub.get();
}

QueryFront::Node& QueryFront::NodeFor(const std::string& address) {
  absl::MutexLock lock(&mu_);
  Node& node = nodes_[address];
  if (node.stub == nullptr) {
    node.channel = grpc::CreateChannel(
        address, options_.node_credentials != nullptr ? options_.node_credentials
                                                      : grpc::InsecureChannelCredentials());
    node.stub = v1::Query::NewStub(node.channel);
  }
  return node;
}

namespace {

// The partition number after `prefix` in `key`, and what follows it.
bool PartitionOfKey(const std::string& key, size_t prefix, int* partition, std::string* rest) {
  const size_t slash = key.find('/', prefix);
  const std::string number =
      key.substr(prefix, slash == std::string::npos ? std::string::npos : slash - prefix);
  if (!absl::SimpleAtoi(number, partition)) return false;
  if (rest != nullptr) *rest = slash == std::string::npos ? "" : key.substr(slash + 1);
  return true;
}

}  // namespace

absl::StatusOr<QueryFront::Readers> QueryFront::ReadersOfAll() {
  absl::StatusOr<std::vector<KeyValue>> owners = etcd_->List(options_.prefix + "/owners/");
  absl::StatusOr<std::vector<KeyValue>> nodes = etcd_->List(options_.prefix + "/nodes/");
  absl::StatusOr<std::vector<KeyValue>> copies = etcd_->List(options_.prefix + "/caught_up/");
  if (!owners.ok()) return owners.status();
  if (!nodes.ok()) return nodes.status();
  if (!copies.ok()) return copies.status();
  Readers readers;
  const size_t nodes_skip = options_.prefix.size() + std::string("/nodes/").size();
  for (const KeyValue& kv : *nodes) readers.address[kv.key.substr(nodes_skip)] = kv.value;
  const size_t owners_skip = options_.prefix.size() + std::string("/owners/").size();
  for (const KeyValue& kv : *owners) {
    int p = -1;
    if (!PartitionOfKey(kv.key, owners_skip, &p, nullptr)) continue;
    if (readers.address.count(kv.value) > 0) readers.of[p].insert(readers.of[p].begin(), kv.value);
  }
  const size_t copies_skip = options_.prefix.size() + std::string("/caught_up/").size();
  for (const KeyValue& kv : *copies) {
    int p = -1;
    std::string node;
    if (!PartitionOfKey(kv.key, copies_skip, &p, &node)) continue;
    std::vector<std::string>& of = readers.of[p];
    if (readers.address.count(node) > 0 && std::find(of.begin(), of.end(), node) == of.end()) {
      of.push_back(node);
    }
  }
  return readers;
}

absl::StatusOr<std::vector<QueryFront::Node*>> QueryFront::ReadersOf(const std::string& job,
                                                                     bool owner_only) {
  absl::StatusOr<int> partition = directory_.PartitionOf(job, /*record=*/false);
  if (!partition.ok()) return partition.status();
  SONDE_ASSIGN_OR_RETURN(Readers readers, ReadersOfAll());
  SONDE_ASSIGN_OR_RETURN(std::optional<KeyValue> owner,
                         etcd_->Get(absl::StrCat(options_.prefix, "/owners/", *partition)));
  std::vector<Node*> nodes;
  for (const std::string& node : readers.of[*partition]) {
    const bool is_owner = owner.has_value() && owner->value == node;
    if (owner_only && !is_owner) continue;
    nodes.push_back(&NodeFor(readers.address[node]));
  }
  if (nodes.empty()) {
    return absl::UnavailableError(absl::StrCat(
        "job '", job, "': partition ", *partition,
        " has no owner and no caught-up copy just now (a failover); retry"));
  }
  return nodes;
}

// The last one always; another only once connected within a short
// while, so a host gone without a word does not take the whole deadline
// from the next.
bool QueryFront::Reachable(Node& node, bool last) {
  if (last) return true;
  return node.channel->WaitForConnected(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
}

template <typename Call>
grpc::Status QueryFront::OnReaders(grpc::ServerContext* context, const std::string& job,
                                   bool owner_only, Call call) {
  absl::StatusOr<std::vector<Node*>> nodes = ReadersOf(job, owner_only);
  if (!nodes.ok()) return ToGrpcStatus(nodes.status());
  grpc::Status s;
  for (size_t i = 0; i < nodes->size(); ++i) {
    // The owner first; a caught-up copy while the owner cannot be reached.
    Node& node = *(*nodes)[i];
    if (!Reachable(node, i + 1 == nodes->size())) continue;
    std::unique_ptr<grpc::ClientContext> onward = Onward(context);
    bool answered = false;  // something reached the caller: no other node
    s = call(*node.stub, onward.get(), &answered);
    if (answered || s.error_code() != grpc::StatusCode::UNAVAILABLE || context->IsCancelled()) {
      return s;
    }
  }
  return s;
}

template <typename Request, typename Response, typename Method>
grpc::Status QueryFront::Unary(grpc::ServerContext* context, const std::string& job,
                               const Request& request, Response* response, Method method,
                               bool owner_only) {
  return OnReaders(context, job, owner_only,
                   [&](v1::Query::Stub& stub, grpc::ClientContext* onward, bool*) {
                     return (stub.*method)(onward, request, response);
                   });
}

template <typename Request, typename Item, typename Method>
grpc::Status QueryFront::Streamed(grpc::ServerContext* context, const std::string& job,
                                  const Request& request, grpc::ServerWriter<Item>* writer,
                                  Method method) {
  return OnReaders(
      context, job, /*owner_only=*/false,
      [&](v1::Query::Stub& stub, grpc::ClientContext* onward, bool* answered) {
        std::unique_ptr<grpc::ClientReader<Item>> reader = (stub.*method)(onward, request);
        Item item;
        while (reader->Read(&item)) {
          *answered = true;
          if (!writer->Write(item)) {  // the caller went away
            onward->TryCancel();
            break;
          }
        }
        return reader->Finish();
      });
}

grpc::Status QueryFront::ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                                  v1::ListJobsResponse* response) {
  // Each job from one node: its partition's owner, or while the owner
  // cannot be reached a caught-up copy. Other nodes may hold old copies.
  absl::StatusOr<Readers> readers = ReadersOfAll();
  absl::StatusOr<std::map<std::string, int>> recorded = directory_.All();
  if (!readers.ok()) return ToGrpcStatus(readers.status());
  if (!recorded.ok()) return ToGrpcStatus(recorded.status());
  std::set<std::string> unreachable;
  std::map<std::string, v1::ListJobsResponse> listed;  // by node
  auto answerer = [&](int p) -> std::string {
    for (const std::string& node : readers->of[p]) {
      if (unreachable.count(node) == 0) return node;
    }
    return "";
  };
  while (true) {
    bool failed = false;
    for (int p = 0; p < options_.partitions; ++p) {
      const std::string node = answerer(p);
      if (node.empty() || listed.count(node) > 0) continue;
      std::unique_ptr<grpc::ClientContext> onward = Onward(context);
      v1::ListJobsResponse part;
      grpc::Status s = StubFor(readers->address[node])->ListJobs(onward.get(), *request, &part);
      if (s.error_code() == grpc::StatusCode::UNAVAILABLE && !context->IsCancelled()) {
        unreachable.insert(node);
        failed = true;
        continue;
      }
      if (!s.ok()) {
        return grpc::Status(s.error_code(), absl::StrCat("node '", node, "' (",
                                                         readers->address[node],
                                                         "): ", s.error_message()));
      }
      listed[node] = std::move(part);
    }
    if (!failed) break;  // every partition's answerer has answered (or there is none)
  }
  for (auto& [node, part] : listed) {
    for (v1::JobInfo& job : *part.mutable_jobs()) {
      auto at = recorded->find(job.job());
      const int p = at != recorded->end() ? at->second : JobPartition(job.job(), options_.partitions);
      if (answerer(p) == node) *response->add_jobs() = std::move(job);
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
    return Unary(c, r->result().job(), *r, out, &v1::Query::Stub::PostRuleResult,
                 /*owner_only=*/true);
  }
  v1::LogEntry entry;
  *entry.mutable_post_rule_result() = *r;
  return Logged(c, "/sonde.v1.Query/PostRuleResult", r->result().job(), *r, std::move(entry),
                out);
}
grpc::Status QueryFront::EnableRules(grpc::ServerContext* c, const v1::EnableRulesRequest* r,
                                     v1::EnableRulesResponse* out) {
  if (options_.gateway == nullptr) {
    return Unary(c, r->job(), *r, out, &v1::Query::Stub::EnableRules, /*owner_only=*/true);
  }
  v1::LogEntry entry;
  *entry.mutable_enable_rules() = *r;
  return Logged(c, "/sonde.v1.Query/EnableRules", r->job(), *r, std::move(entry), out);
}
grpc::Status QueryFront::DeleteJob(grpc::ServerContext* c, const v1::DeleteJobRequest* r,
                                   v1::DeleteJobResponse* out) {
  if (options_.gateway == nullptr) {
    return Unary(c, r->job(), *r, out, &v1::Query::Stub::DeleteJob, /*owner_only=*/true);
  }
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
