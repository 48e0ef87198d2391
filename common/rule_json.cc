#include "common/rule_json.h"

#include <vector>

#include "absl/time/time.h"
#include "common/dtype.h"
#include "common/names.h"

namespace sonde {

nlohmann::json RuleResultJson(const v1::RuleResult& r) {
  return {
      {"job", r.job()},
      {"rule", r.rule()},
      {"rule_type", r.rule_type()},
      {"status", std::string(RuleStatusName(r.status()))},
      {"step", r.step()},
      {"mode", std::string(ModeName(r.mode()))},
      {"mode_step", r.mode_step()},
      {"worker", r.worker()},
      {"tensors", std::vector<std::string>(r.tensors().begin(), r.tensors().end())},
      {"message", r.message()},
      {"suggestion", r.suggestion()},
      {"observed", r.observed()},
      {"threshold", r.threshold()},
      {"steps_evaluated", r.steps_evaluated()},
      {"datapoints", r.datapoints()},
      {"times_triggered", r.times_triggered()},
      {"actions_taken", std::vector<std::string>(r.actions_taken().begin(), r.actions_taken().end())},
      {"time", absl::FormatTime(absl::RFC3339_full, absl::FromUnixMicros(r.updated_unix_micros()),
                                absl::UTCTimeZone())},
  };
}

std::string DumpJson(const nlohmann::json& doc, int indent) {
  return doc.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace sonde
