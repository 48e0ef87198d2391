#include "client/format.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"
#include "common/names.h"
#include "common/rule_json.h"
#include "nlohmann/json.hpp"

namespace sonde {

absl::string_view JobStatusName(v1::JobStatus status) {
  switch (status) {
    case v1::JOB_STATUS_RUNNING: return "Running";
    case v1::JOB_STATUS_FINISHED: return "Finished";
    case v1::JOB_STATUS_STOPPED: return "Stopped";
    case v1::JOB_STATUS_DISCONNECTED: return "Disconnected";
    case v1::JOB_STATUS_PENDING: return "Pending";
    default: return "Unknown";
  }
}

std::string Table(const std::vector<std::string>& header,
                  const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(header.size());
  for (size_t i = 0; i < header.size(); ++i) width[i] = header[i].size();
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size() && i < width.size(); ++i) {
      width[i] = std::max(width[i], row[i].size());
    }
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (size_t i = 0; i < cells.size(); ++i) {
      absl::StrAppend(&out, cells[i]);
      if (i + 1 < cells.size()) out.append(width[i] - cells[i].size() + 2, ' ');
    }
    return out + "\n";
  };
  std::string out = line(header);
  for (const auto& row : rows) out += line(row);
  return out;
}

std::string RulesJson(const std::vector<v1::RuleResult>& results) {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& r : results) arr.push_back(RuleResultJson(r));
  return DumpJson(arr, 2);
}

std::string JobsJson(const std::vector<v1::JobInfo>& jobs) {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& j : jobs) {
    nlohmann::json by_mode = nlohmann::json::object();
    for (const auto& m : j.modes()) by_mode[std::string(ModeName(m.mode()))] = m.last_step();
    arr.push_back({{"job", j.job()},
                   {"status", std::string(JobStatusName(j.status()))},
                   {"workers", std::vector<int32_t>(j.workers().begin(), j.workers().end())},
                   {"world_size", j.world_size()},
                   {"last_step", j.last_step()},
                   {"last_step_by_mode", by_mode},
                   {"end_reason", j.end_reason()},
                   {"start_unix_micros", j.start_unix_micros()},
                   {"end_unix_micros", j.end_unix_micros()}});
  }
  return DumpJson(arr, 2);
}

std::string RuleSummary(const std::string& job, const std::vector<v1::RuleResult>& results) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& r : results) {
    std::string details = r.message();
    if (r.times_triggered() > 1) {
      absl::StrAppend(&details, " (triggered ", r.times_triggered(), " times)");
    }
    rows.push_back({r.rule(), std::string(RuleStatusName(r.status())),
                    r.step() >= 0 ? absl::StrCat(r.step()) : "-", details});
  }
  return absl::StrCat("Rule summary for job '", job, "':\n",
                      Table({"RULE", "STATUS", "STEP", "DETAILS"}, rows));
}

}  // namespace sonde
