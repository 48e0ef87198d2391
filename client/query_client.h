// A C++ client of the Query service, returning absl::Status: what the CLI,
// the demo and tests use to read jobs, tensors, series and rule results.
// Tensors read back are reassembled and checked (CRC, sizes) exactly as on
// ingest. Thread-safe (gRPC stubs are).
#ifndef SONDE_CLIENT_QUERY_CLIENT_H_
#define SONDE_CLIENT_QUERY_CLIENT_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/channel.h"
#include "proto/query.grpc.pb.h"

namespace sonde {

struct TensorValue {
  v1::TensorChunk header;  // name, step, mode, dtype, shape, statistics
  std::string bytes;       // raw little-endian values
};

class QueryClient {
 public:
  // `timeout` bounds each unary call. Does not connect until the first call.
  static std::unique_ptr<QueryClient> Connect(const std::string& address,
                                              absl::Duration timeout = absl::Seconds(30));
  // The same over TLS and/or with a bearer token (common/channel.h). Errors
  // of MakeChannel (unreadable PEM files, inconsistent options).
  static absl::StatusOr<std::unique_ptr<QueryClient>> Connect(
      const std::string& address, const ChannelSecurity& security,
      absl::Duration timeout = absl::Seconds(30));

  absl::StatusOr<std::vector<v1::JobInfo>> ListJobs();
  absl::StatusOr<v1::JobInfo> GetJob(const std::string& job);
  absl::StatusOr<std::vector<v1::TensorInfo>> ListTensors(const std::string& job,
                                                          const std::string& collection = "",
                                                          const std::string& regex = "");
  absl::StatusOr<std::vector<v1::StepInfo>> ListSteps(const std::string& job,
                                                      v1::Mode mode = v1::MODE_UNSPECIFIED);
  // `step` is a mode step for TRAIN/EVAL/PREDICT, a global step otherwise.
  absl::StatusOr<TensorValue> ReadTensor(const std::string& job, const std::string& tensor,
                                         int64_t step, v1::Mode mode = v1::MODE_UNSPECIFIED,
                                         int32_t worker = 0);
  absl::StatusOr<std::vector<v1::SeriesPoint>> ReadSeries(const std::string& job,
                                                          const std::string& tensor,
                                                          v1::Mode mode = v1::MODE_UNSPECIFIED,
                                                          int64_t start_step = 0,
                                                          int64_t end_step = 0,
                                                          int32_t worker = -1);
  absl::StatusOr<std::vector<v1::RuleResult>> RuleResults(const std::string& job);
  absl::StatusOr<std::vector<v1::RuleCatalogEntry>> RuleCatalog();
  // Registers rules for a job before it starts; returns all its rules.
  absl::StatusOr<std::vector<v1::RuleSpec>> EnableRules(const std::string& job,
                                                        const std::vector<v1::RuleSpec>& rules);
  // Deletes a job and everything stored for it (see Query.DeleteJob):
  // FailedPrecondition while it is live, NotFound for an unknown job.
  absl::StatusOr<v1::DeleteJobResponse> DeleteJob(const std::string& job);
  // Calls `fn` for the current results, then for every change, until the
  // job ends, `fn` returns false, or `timeout` passes.
  absl::Status WatchRuleResults(const std::string& job,
                                const std::function<bool(const v1::RuleResult&)>& fn,
                                absl::Duration timeout);
  // Follows the job's rule results until none is InProgress (every rule has
  // a verdict) and returns them; DeadlineExceeded after `timeout`.
  absl::StatusOr<std::vector<v1::RuleResult>> WaitForRuleVerdicts(const std::string& job,
                                                                 absl::Duration timeout);

 private:
  QueryClient(std::unique_ptr<v1::Query::Stub> stub, absl::Duration timeout)
      : stub_(std::move(stub)), timeout_(timeout) {}
  void SetDeadline(class grpc::ClientContext& ctx) const;

  std::unique_ptr<v1::Query::Stub> stub_;
  absl::Duration timeout_;
};

}  // namespace sonde

#endif  // SONDE_CLIENT_QUERY_CLIENT_H_
