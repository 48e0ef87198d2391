// Human and JSON renderings of query results, shared by the `sonde` CLI and
// the demo's rule summary. Thread-safe; no state.
#ifndef SONDE_CLIENT_FORMAT_H_
#define SONDE_CLIENT_FORMAT_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
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

}  // namespace sonde

#endif  // SONDE_CLIENT_FORMAT_H_
