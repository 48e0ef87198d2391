// The cluster's Query front end (docs/cluster.md): the same Query API as
// sonde-collector, so the CLI, the C++ and Python clients and grpcurl work
// unchanged against a cluster. A call about one job goes to the node that
// owns the job's partition now (found in etcd); ListJobs asks every live
// node and keeps each job's record from its partition's owner (a node
// that owned a partition earlier may still hold an old copy).
//
// The caller's authorization header and deadline go along: nodes check
// tokens as sonde-collector does.
#ifndef SONDE_SERVER_CLUSTER_QUERY_FRONT_H_
#define SONDE_SERVER_CLUSTER_QUERY_FRONT_H_

#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/security/credentials.h"
#include "proto/query.grpc.pb.h"
#include "server/auth.h"
#include "server/cluster/etcd.h"
#include "server/cluster/job_directory.h"
#include "server/cluster/gateway.h"

namespace sonde::cluster {

class QueryFront final : public v1::Query::Service {
 public:
  struct Options {
    std::string prefix;  // the cluster's etcd prefix, e.g. "/sonde/default"
    int partitions = 16;
    // Credentials for the hop to the nodes (insecure when null).
    std::shared_ptr<grpc::ChannelCredentials> node_credentials;
    // With a gateway, EnableRules, PostRuleResult and DeleteJob are logged
    // to the job's partition (Gateway::LogControl), so every node that
    // applies it makes them, and they survive failovers; `tokens` (null: none) then
    // authorizes them here, as a node would. Without, they go to the owner.
    Gateway* gateway = nullptr;
    const server::TokenTable* tokens = nullptr;
  };
  QueryFront(Etcd* etcd, Options options);

  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                      v1::JobInfo* response) override;
  grpc::Status ListTensors(grpc::ServerContext* context, const v1::ListTensorsRequest* request,
                           v1::ListTensorsResponse* response) override;
  grpc::Status ListSteps(grpc::ServerContext* context, const v1::ListStepsRequest* request,
                         v1::ListStepsResponse* response) override;
  grpc::Status ReadTensor(grpc::ServerContext* context, const v1::ReadTensorRequest* request,
                          grpc::ServerWriter<v1::TensorChunk>* writer) override;
  grpc::Status ReadSeries(grpc::ServerContext* context, const v1::ReadSeriesRequest* request,
                          v1::ReadSeriesResponse* response) override;
  grpc::Status GetRuleResults(grpc::ServerContext* context,
                              const v1::GetRuleResultsRequest* request,
                              v1::GetRuleResultsResponse* response) override;
  grpc::Status WatchRuleResults(grpc::ServerContext* context,
                                const v1::GetRuleResultsRequest* request,
                                grpc::ServerWriter<v1::RuleResult>* writer) override;
  grpc::Status ListRuleCatalog(grpc::ServerContext* context,
                               const v1::ListRuleCatalogRequest* request,
                               v1::ListRuleCatalogResponse* response) override;
  grpc::Status WatchSteps(grpc::ServerContext* context, const v1::WatchStepsRequest* request,
                          grpc::ServerWriter<v1::CompletedStep>* writer) override;
  grpc::Status PostRuleResult(grpc::ServerContext* context,
                              const v1::PostRuleResultRequest* request,
                              v1::PostRuleResultResponse* response) override;
  grpc::Status EnableRules(grpc::ServerContext* context, const v1::EnableRulesRequest* request,
                           v1::EnableRulesResponse* response) override;
  grpc::Status DeleteJob(grpc::ServerContext* context, const v1::DeleteJobRequest* request,
                         v1::DeleteJobResponse* response) override;
  grpc::Status ListMetrics(grpc::ServerContext* context, const v1::ListMetricsRequest* request,
                           v1::ListMetricsResponse* response) override;
  grpc::Status ReadMetrics(grpc::ServerContext* context, const v1::ReadMetricsRequest* request,
                           v1::ReadMetricsResponse* response) override;
  grpc::Status ReadEvents(grpc::ServerContext* context, const v1::ReadEventsRequest* request,
                          v1::ReadEventsResponse* response) override;
  grpc::Status GetReport(grpc::ServerContext* context, const v1::GetReportRequest* request,
                         v1::GetReportResponse* response) override;

 private:
  // The stub of the node owning `job`'s partition now; UNAVAILABLE while
  // the partition has no owner (a failover in progress).
  // Who can answer reads, per partition: its owner first (if live), then
  // the live nodes whose copy has caught up (docs/cluster.md); and each
  // live node's address.
  struct Readers {
    std::map<int, std::vector<std::string>> of;
    std::map<std::string, std::string> address;
  };
  absl::StatusOr<Readers> ReadersOfAll();
  // A node's channel and stub, kept per address.
  struct Node {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Query::Stub> stub;
  };
  Node& NodeFor(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);
  // `job`'s readers, in that order (its owner alone if `owner_only`: a
  // write must never land on a copy); UNAVAILABLE when none.
  absl::StatusOr<std::vector<Node*>> ReadersOf(const std::string& job, bool owner_only);
  v1::Query::Stub* StubFor(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);

  // Whether to try `node` with the caller's deadline (query_front.cc).
  static bool Reachable(Node& node, bool last);
  // Runs `call(stub, onward_context, &answered)` on `job`'s readers in turn
  // until one answers other than UNAVAILABLE, or has sent the caller
  // something (it sets `answered`).
  template <typename Call>
  grpc::Status OnReaders(grpc::ServerContext* context, const std::string& job, bool owner_only,
                         Call call);
  template <typename Request, typename Response, typename Method>
  grpc::Status Unary(grpc::ServerContext* context, const std::string& job,
                     const Request& request, Response* response, Method method,
                     bool owner_only = false);
  template <typename Request, typename Item, typename Method>
  grpc::Status Streamed(grpc::ServerContext* context, const std::string& job,
                        const Request& request, grpc::ServerWriter<Item>* writer, Method method);

  // Logs a control entry through the gateway and turns the owner's answer
  // into the call's status and response.
  template <typename Request, typename Response>
  grpc::Status Logged(grpc::ServerContext* context, const char* method, const std::string& job,
                      const Request& request, v1::LogEntry entry, Response* response);

  Etcd* const etcd_;
  JobDirectory directory_;
  const Options options_;
  absl::Mutex mu_;
  std::map<std::string, Node> nodes_ ABSL_GUARDED_BY(mu_);  // by address; never removed
};

}  // namespace sonde::cluster

#endif  // SONDE_SERVER_CLUSTER_QUERY_FRONT_H_
