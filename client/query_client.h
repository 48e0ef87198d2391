// A C++ client of the Query service, returning absl::Status: what the CLI,
// the demo and tests use to read jobs, tensors, series, rule results,
// profiler data (metrics and framework events) and the HTML report.
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

// One answer of ReadMetrics. The collector answers in one message, so it
// stops at a limit (the request's max_points, else 200000 points) and then
// sets `truncated`: the series come by worker, then name, each in time
// order, and the last one may be cut; ask again with a narrower time range,
// fewer names or one worker for the rest.
struct MetricsRead {
  std::vector<v1::MetricSeries> series;
  bool truncated = false;  // more points match than were returned
};

// One answer of ReadEvents: events by worker, kind, name, then start time;
// `truncated` as for MetricsRead (limit: max_events, else 100000).
struct EventsRead {
  std::vector<v1::WorkerEvent> events;
  bool truncated = false;  // more events match than were returned
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
  // Calls `fn` for every completed step of the job from `from_step` on
  // (stored ones first, then each as the rules get it), until the job ends,
  // `fn` returns false, or `timeout` passes (DeadlineExceeded). A reader
  // that falls behind gets ResourceExhausted naming the step to go on from
  // (server/watch_calls.h).
  absl::Status WatchSteps(const std::string& job, int64_t from_step,
                          const std::function<bool(const v1::CompletedStep&)>& fn,
                          absl::Duration timeout);
  // Follows the job's rule results until none is InProgress (every rule has
  // a verdict) and returns them; DeadlineExceeded after `timeout`.
  absl::StatusOr<std::vector<v1::RuleResult>> WaitForRuleVerdicts(const std::string& job,
                                                                 absl::Duration timeout);

  // Profiler data (docs/profiler.md, "Storage and queries"). Times are unix
  // microseconds; a range is [start, end), end 0 meaning no end.
  //
  // The metric names each worker sent, by worker, names sorted; only
  // `worker`'s when it is >= 0 (filtered here: the RPC lists every worker).
  absl::StatusOr<std::vector<v1::WorkerMetrics>> ListMetrics(const std::string& job,
                                                             int32_t worker = -1);
  // Series of the metrics named in `names` or where `regex` (RE2 syntax,
  // matched by the collector) finds a match; both empty: every metric.
  // `worker` -1: every worker. `max_points` 0: the collector's limit.
  absl::StatusOr<MetricsRead> ReadMetrics(const std::string& job,
                                          const std::vector<std::string>& names,
                                          const std::string& regex = "", int32_t worker = -1,
                                          int64_t start_unix_micros = 0,
                                          int64_t end_unix_micros = 0, uint32_t max_points = 0);
  // Framework events of `kind` (KIND_UNSPECIFIED: every kind) and `name`
  // (empty: every name) that start in [start, end). `max_events` 0: the
  // collector's limit.
  absl::StatusOr<EventsRead> ReadEvents(
      const std::string& job, v1::TraceEvent::Kind kind = v1::TraceEvent::KIND_UNSPECIFIED,
      const std::string& name = "", int32_t worker = -1, int64_t start_unix_micros = 0,
      int64_t end_unix_micros = 0, uint32_t max_events = 0);
  // The job's report: one self-contained HTML page (server/report/). A
  // large job's report can take longer than the default 30 s timeout to
  // render: connect with a longer one for it.
  absl::StatusOr<std::string> GetReport(const std::string& job);

 private:
  // Steps or points asked for per call by ListSteps and ReadSeries, which
  // read on until the collector says nothing more follows.
  static constexpr uint32_t kPageSize = 100000;

  QueryClient(std::unique_ptr<v1::Query::Stub> stub, absl::Duration timeout)
      : stub_(std::move(stub)), timeout_(timeout) {}
  void SetDeadline(class grpc::ClientContext& ctx) const;

  std::unique_ptr<v1::Query::Stub> stub_;
  absl::Duration timeout_;
};

}  // namespace sonde

#endif  // SONDE_CLIENT_QUERY_CLIENT_H_
