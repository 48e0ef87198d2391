// Human and JSON renderings of query results, shared by the `sonde` CLI and
// the demo's rule summary. Thread-safe; no state.
#ifndef SONDE_CLIENT_FORMAT_H_
#define SONDE_CLIENT_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/profile.pb.h"
#include "proto/query.pb.h"
#include "common/names.h"
#include "proto/rule.pb.h"

namespace sonde {

// "Running", "Finished", "Stopped", "Disconnected".
absl::string_view JobStatusName(v1::JobStatus status);

// A left-aligned text table with a header row.
std::string Table(const std::vector<std::string>& header,
                  const std::vector<std::vector<std::string>>& rows);

// JSON arrays: rules as [{rule, rule_type, status, step, mode, mode_step,
// tensors, message, observed, threshold, steps_evaluated, actions_taken}],
// jobs as [{job, status, workers, world_size, last_step, last_step_by_mode,
// start_unix_micros, end_unix_micros}].
std::string RulesJson(const std::vector<v1::RuleResult>& results);
std::string JobsJson(const std::vector<v1::JobInfo>& jobs);

// The rule summary of a job, like SageMaker's rule_job_summary().
std::string RuleSummary(const std::string& job, const std::vector<v1::RuleResult>& results);

// Profiler data. Event kinds are spelled "step", "data_wait", "forward",
// "backward", "span", "init" (KIND_UNSPECIFIED: "unspecified"); parsing
// ignores case and refuses anything else, naming the accepted spellings.
absl::string_view EventKindName(v1::TraceEvent::Kind kind);
absl::StatusOr<v1::TraceEvent::Kind> ParseEventKind(absl::string_view name);

// Unix microseconds as RFC3339 in UTC with microseconds,
// "2024-05-01T12:00:00.250000Z".
std::string FormatUnixMicros(int64_t unix_micros);
// A time given by a user: unix microseconds (digits only) or RFC3339 with a
// zone ("2024-05-01T12:00:00Z", "2024-05-01T14:00:00.5+02:00").
// InvalidArgument quoting the text otherwise.
absl::StatusOr<int64_t> ParseUnixMicros(absl::string_view text);

// Metric names per worker: a WORKER/METRIC table, or JSON
// [{worker, names: [...]}].
std::string MetricNamesTable(const std::vector<v1::WorkerMetrics>& workers);
std::string MetricNamesJson(const std::vector<v1::WorkerMetrics>& workers);
// Metric series: a table with one row per point (TIME (UTC), WORKER,
// METRIC, VALUE) in the collector's order (by worker, then name, then
// time), or JSON {series: [{worker, metric, unix_micros: [...],
// values: [...]}], truncated}. Values print in their shortest exact form.
std::string MetricsTable(const std::vector<v1::MetricSeries>& series);
std::string MetricsJson(const std::vector<v1::MetricSeries>& series, bool truncated);
// Framework events: a table (START (UTC), WORKER, KIND, NAME, MODE, STEP,
// MODE STEP, DURATION (ms)) in the collector's order (by worker, kind,
// name, then start), or JSON {events: [{worker, kind, name, mode, step,
// mode_step, start_unix_micros, end_unix_micros, duration_micros}],
// truncated}.
std::string EventsTable(const std::vector<v1::WorkerEvent>& events);
std::string EventsJson(const std::vector<v1::WorkerEvent>& events, bool truncated);

}  // namespace sonde

#endif  // SONDE_CLIENT_FORMAT_H_
