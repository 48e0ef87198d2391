#include "client/format.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
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

namespace {

constexpr v1::TraceEvent::Kind kEventKinds[] = {
    v1::TraceEvent::KIND_STEP,     v1::TraceEvent::KIND_DATA_WAIT, v1::TraceEvent::KIND_FORWARD,
    v1::TraceEvent::KIND_BACKWARD, v1::TraceEvent::KIND_SPAN,      v1::TraceEvent::KIND_INIT};

// Whole numbers (byte counts) print whole; others with the fewest
// significant digits that read back as the same double, so 0.1 prints as 0.1.
std::string ShortestDouble(double v) {
  if (std::trunc(v) == v && std::fabs(v) < 9007199254740992.0) {  // 2^53: exact
    return absl::StrFormat("%.0f", v);
  }
  for (int precision = 6; precision < 17; ++precision) {
    std::string s = absl::StrFormat("%.*g", precision, v);
    if (std::strtod(s.c_str(), nullptr) == v) return s;
  }
  return absl::StrFormat("%.17g", v);
}

}  // namespace

absl::string_view EventKindName(v1::TraceEvent::Kind kind) {
  switch (kind) {
    case v1::TraceEvent::KIND_STEP: return "step";
    case v1::TraceEvent::KIND_DATA_WAIT: return "data_wait";
    case v1::TraceEvent::KIND_FORWARD: return "forward";
    case v1::TraceEvent::KIND_BACKWARD: return "backward";
    case v1::TraceEvent::KIND_SPAN: return "span";
    case v1::TraceEvent::KIND_INIT: return "init";
    default: return "unspecified";
  }
}

absl::StatusOr<v1::TraceEvent::Kind> ParseEventKind(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  for (v1::TraceEvent::Kind kind : kEventKinds) {
    if (lower == EventKindName(kind)) return kind;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown event kind '", name,
                   "': use step, data_wait, forward, backward, span or init"));
}

std::string FormatUnixMicros(int64_t unix_micros) {
  return absl::FormatTime("%Y-%m-%d%ET%H:%M:%E6SZ", absl::FromUnixMicros(unix_micros),
                          absl::UTCTimeZone());
}

absl::StatusOr<int64_t> ParseUnixMicros(absl::string_view text) {
  const std::string t(absl::StripAsciiWhitespace(text));
  const bool digits = !t.empty() && std::all_of(t.begin(), t.end(), [](char c) {
    return absl::ascii_isdigit(c);
  });
  if (digits) {
    int64_t micros;
    if (absl::SimpleAtoi(t, &micros)) return micros;
    return absl::InvalidArgumentError(
        absl::StrCat("time '", text, "' is too large for unix microseconds"));
  }
  absl::Time when;
  std::string err;
  if (!absl::ParseTime(absl::RFC3339_full, t, &when, &err)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "time '", text,
        "' is neither unix microseconds nor RFC3339 with a zone, e.g. 2024-05-01T12:00:00Z (",
        err, ")"));
  }
  return absl::ToUnixMicros(when);
}

std::string MetricNamesTable(const std::vector<v1::WorkerMetrics>& workers) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& w : workers) {
    for (const auto& name : w.names()) rows.push_back({absl::StrCat(w.worker()), name});
  }
  return Table({"WORKER", "METRIC"}, rows);
}

std::string MetricNamesJson(const std::vector<v1::WorkerMetrics>& workers) {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& w : workers) {
    arr.push_back({{"worker", w.worker()},
                   {"names", std::vector<std::string>(w.names().begin(), w.names().end())}});
  }
  return DumpJson(arr, 2);
}

std::string MetricsTable(const std::vector<v1::MetricSeries>& series) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& s : series) {
    const int n = std::min(s.unix_micros_size(), s.values_size());
    for (int i = 0; i < n; ++i) {
      rows.push_back({FormatUnixMicros(s.unix_micros(i)), absl::StrCat(s.worker()), s.name(),
                      ShortestDouble(s.values(i))});
    }
  }
  return Table({"TIME (UTC)", "WORKER", "METRIC", "VALUE"}, rows);
}

std::string MetricsJson(const std::vector<v1::MetricSeries>& series, bool truncated) {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& s : series) {
    arr.push_back({{"worker", s.worker()},
                   {"metric", s.name()},
                   {"unix_micros",
                    std::vector<int64_t>(s.unix_micros().begin(), s.unix_micros().end())},
                   {"values", std::vector<double>(s.values().begin(), s.values().end())}});
  }
  return DumpJson(nlohmann::json{{"series", arr}, {"truncated", truncated}}, 2);
}

std::string EventsTable(const std::vector<v1::WorkerEvent>& events) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& we : events) {
    const v1::TraceEvent& e = we.event();
    const bool in_step = e.step() >= 0;
    rows.push_back({FormatUnixMicros(e.start_unix_micros()), absl::StrCat(we.worker()),
                    std::string(EventKindName(e.kind())), e.name().empty() ? "-" : e.name(),
                    e.mode() == v1::MODE_UNSPECIFIED ? "-" : std::string(ModeName(e.mode())),
                    in_step ? absl::StrCat(e.step()) : "-",
                    in_step ? absl::StrCat(e.mode_step()) : "-",
                    absl::StrFormat("%.3f", (e.end_unix_micros() - e.start_unix_micros()) / 1e3)});
  }
  return Table({"START (UTC)", "WORKER", "KIND", "NAME", "MODE", "STEP", "MODE STEP",
                "DURATION (ms)"},
               rows);
}

std::string EventsJson(const std::vector<v1::WorkerEvent>& events, bool truncated) {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& we : events) {
    const v1::TraceEvent& e = we.event();
    arr.push_back({{"worker", we.worker()},
                   {"kind", std::string(EventKindName(e.kind()))},
                   {"name", e.name()},
                   {"mode", std::string(ModeName(e.mode()))},
                   {"step", e.step()},
                   {"mode_step", e.mode_step()},
                   {"start_unix_micros", e.start_unix_micros()},
                   {"end_unix_micros", e.end_unix_micros()},
                   {"duration_micros", e.end_unix_micros() - e.start_unix_micros()}});
  }
  return DumpJson(nlohmann::json{{"events", arr}, {"truncated", truncated}}, 2);
}

}  // namespace sonde
