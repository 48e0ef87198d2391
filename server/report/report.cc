#include "server/report/report.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <iterator>
#include <map>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "common/names.h"
#include "common/status_macros.h"
#include "rules/profiler/profiler_rules.h"
#include "rules/profiler/windows.h"
#include "server/report/svg.h"

namespace sonde::report {
namespace {

constexpr const char* kStyle = R"css(
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:24px auto;max-width:1100px;color:#222;padding:0 16px}
h1{font-size:24px;margin-bottom:4px}h2{font-size:19px;border-bottom:1px solid #ccc;padding-bottom:4px;margin-top:32px}
h3{font-size:15px;margin:18px 0 6px}
table{border-collapse:collapse;margin:8px 0;font-size:13px;width:100%}
th,td{border:1px solid #d0d0d0;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f0f3f7}td.n{text-align:right;font-variant-numeric:tabular-nums}
tr.hit td{background:#fff1f0}.st-hit{color:#b00020;font-weight:600}.st-ok{color:#1b7a2e}
.muted{color:#666}.note{color:#555;font-size:13px}nav a{margin-right:12px;font-size:13px}
dl.summary{display:grid;grid-template-columns:max-content auto;gap:2px 16px;font-size:14px}
dl.summary dt{font-weight:600}dl.summary dd{margin:0}
svg.chart{display:block;margin:8px 0;background:#fff}
svg .grid{stroke:#e6e6e6}svg .tick{stroke:#888}svg .axes{fill:none;stroke:#888}
svg .line{fill:none;stroke-width:1.3}svg .bar{fill:#4c78a8}
svg text{font-size:11px;fill:#444}svg .ct{font-size:13px;font-weight:600;fill:#222}
svg .al{font-size:11px;fill:#666}svg .lg{font-size:11px}
code{font-size:12px;background:#f5f5f5;padding:0 3px}
)css";

// Lower case, as the report's prose and tables use them.
std::string ModeText(v1::Mode mode) { return absl::AsciiStrToLower(ModeName(mode)); }

// The report's own wording ("stopped by a rule"); the CLI's JobStatusName
// (client/format.h) is terser and lives on the client side.
std::string JobStatusText(v1::JobStatus s) {
  switch (s) {
    case v1::JOB_STATUS_RUNNING: return "running";
    case v1::JOB_STATUS_FINISHED: return "finished";
    case v1::JOB_STATUS_STOPPED: return "stopped by a rule";
    case v1::JOB_STATUS_DISCONNECTED: return "disconnected";
    case v1::JOB_STATUS_PENDING: return "pending";
    default: return "unknown";
  }
}

// SageMaker's spelling (common/names.h), in words: "IssuesFound" ->
// "issues found"; "no result yet" for a rule without a result.
std::string RuleStatusText(const v1::RuleResult* result) {
  if (result == nullptr) return "no result yet";
  std::string out;
  for (char c : RuleStatusName(result->status())) {
    if (absl::ascii_isupper(static_cast<unsigned char>(c)) && !out.empty()) out.push_back(' ');
    out.push_back(absl::ascii_tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

std::string Fixed(double v, int digits = 4) { return absl::StrFormat("%.*f", digits, v); }

std::string Time(int64_t micros) {
  if (micros <= 0) return "—";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixMicros(micros),
                          absl::UTCTimeZone());
}

std::string Td(const std::string& escaped, bool numeric = false) {
  return absl::StrCat(numeric ? "<td class=\"n\">" : "<td>", escaped, "</td>");
}

struct StepSample {
  v1::Mode mode;
  int64_t step, mode_step;
  int32_t worker;
  double seconds;
};

double Seconds(const v1::TraceEvent& e) {
  return static_cast<double>(e.end_unix_micros() - e.start_unix_micros()) / 1e6;
}

// ---- sections ----

void JobSummary(const v1::JobInfo& job, const std::vector<StepSample>& steps,
                const std::string& step_source, std::string& out) {
  absl::StrAppend(&out, "<h2 id=\"summary\">Job summary</h2><dl class=\"summary\">");
  auto row = [&](const std::string& k, const std::string& escaped_v) {
    absl::StrAppend(&out, "<dt>", k, "</dt><dd>", escaped_v, "</dd>");
  };
  row("Job", EscapeHtml(job.job()));
  const std::string status = JobStatusText(job.status());
  row("Status", EscapeHtml(status) + (job.end_reason().empty() || job.end_reason() == status
                                          ? ""
                                          : " — " + EscapeHtml(job.end_reason())));
  std::vector<std::string> workers;
  for (int32_t w : job.workers()) workers.push_back(absl::StrCat(w));
  row("Workers", absl::StrCat(job.workers_size(), " of world size ", job.world_size(),
                              workers.empty() ? "" : " (" + absl::StrJoin(workers, ", ") + ")"));
  row("Last global step", absl::StrCat(job.last_step()));
  std::vector<std::string> modes;
  for (const v1::ModeSteps& m : job.modes()) {
    modes.push_back(absl::StrCat(ModeText(m.mode()), ": ", m.step_count(), " (steps ",
                                 m.first_step(), "–", m.last_step(), ")"));
  }
  row("Steps stored", modes.empty() ? "none" : absl::StrJoin(modes, "; "));
  row("Step timings", absl::StrCat(steps.size(), " from ", step_source));
  row("Start", Time(job.start_unix_micros()));
  row("End", job.end_unix_micros() > 0 ? Time(job.end_unix_micros()) : "— (not ended)");
  if (job.start_unix_micros() > 0 && job.end_unix_micros() >= job.start_unix_micros()) {
    row("Duration", absl::FormatDuration(absl::Microseconds(job.end_unix_micros() -
                                                            job.start_unix_micros())));
  }
  if (job.tensors_dropped() > 0 || job.steps_dropped() > 0 || job.values_dropped() > 0) {
    row("Dropped by clients", absl::StrCat(job.tensors_dropped(), " tensors, ",
                                           job.values_dropped(), " tensors' values, ",
                                           job.steps_dropped(), " steps"));
  }
  absl::StrAppend(&out, "</dl>");
}

struct RuleRow {
  std::string name, rule_type;
  const v1::RuleSpec* spec = nullptr;
  const v1::RuleResult* result = nullptr;
};

std::string Parameters(const RuleRow& r, const v1::RuleCatalogEntry* entry) {
  std::map<std::string, std::string> given;
  if (r.spec != nullptr) given.insert(r.spec->parameters().begin(), r.spec->parameters().end());
  std::vector<std::string> parts;
  if (entry != nullptr) {
    for (const v1::RuleParameterInfo& p : entry->parameters()) {
      auto it = given.find(p.name());
      if (it != given.end()) {
        parts.push_back(absl::StrCat("<b>", EscapeHtml(p.name()), "=", EscapeHtml(it->second),
                                     "</b>"));
        given.erase(it);
      } else {
        parts.push_back(EscapeHtml(absl::StrCat(p.name(), "=", p.default_value())));
      }
    }
  }
  for (const auto& [k, v] : given) {
    parts.push_back(absl::StrCat("<b>", EscapeHtml(k), "=", EscapeHtml(v), "</b>"));
  }
  return parts.empty() ? "<span class=\"muted\">none</span>" : absl::StrJoin(parts, "<br>");
}

void RulesTable(const std::string& id, const std::string& title, bool profiler,
                std::vector<RuleRow> rows,
                const absl::flat_hash_map<std::string, const v1::RuleCatalogEntry*>& catalogue,
                std::string& out) {
  absl::StrAppend(&out, "<h2 id=\"", id, "\">", title, "</h2>");
  if (rows.empty()) {
    absl::StrAppend(&out, "<p class=\"muted\">No ", profiler ? "profiler" : "tensor",
                    " rules ran for this job.</p>");
    return;
  }
  auto triggered = [](const RuleRow& r) {
    return r.result != nullptr && r.result->status() == v1::RULE_STATUS_ISSUES_FOUND ? 1 : 0;
  };
  // Verdicts stored before RuleResult counted triggers say 0 with issues.
  auto times = [&](const RuleRow& r) -> int64_t {
    if (r.result == nullptr) return 0;
    return std::max<int64_t>(r.result->times_triggered(), triggered(r));
  };
  std::stable_sort(rows.begin(), rows.end(), [&](const RuleRow& a, const RuleRow& b) {
    if (triggered(a) != triggered(b)) return triggered(a) > triggered(b);
    return a.name < b.name;
  });
  int hits = 0;
  for (const RuleRow& r : rows) hits += triggered(r);
  absl::StrAppend(&out, "<p>", rows.size(), " rule", rows.size() == 1 ? "" : "s", " ran; ",
                  hits, " found issues. Rules that found issues come first.</p>");
  absl::StrAppend(&out, "<table class=\"rules\" id=\"", id,
                  "-table\"><thead><tr><th>Rule</th><th>Description</th>"
                  "<th>Recommendation</th><th>Number of times rule triggered</th>"
                  "<th>Number of datapoints</th><th>Rule parameters</th><th>Status</th>"
                  "<th>Last verdict</th></tr></thead><tbody>");
  for (const RuleRow& r : rows) {
    auto it = catalogue.find(r.rule_type);
    const v1::RuleCatalogEntry* entry = it == catalogue.end() ? nullptr : it->second;
    const v1::RuleResult* res = r.result;
    std::string name = EscapeHtml(r.name);
    if (r.rule_type != r.name) absl::StrAppend(&name, " <span class=\"muted\">(", EscapeHtml(r.rule_type), ")</span>");
    std::string advice = res != nullptr && !res->suggestion().empty() ? res->suggestion()
                         : entry != nullptr                           ? entry->suggestion()
                                                                      : "";
    const int64_t points =
        res == nullptr ? 0 : profiler ? res->datapoints() : res->steps_evaluated();
    std::string verdict = "<span class=\"muted\">—</span>";
    if (res != nullptr) {
      verdict = EscapeHtml(res->message());
      if (res->status() == v1::RULE_STATUS_ISSUES_FOUND) {
        absl::StrAppend(&verdict, "<br><span class=\"muted\">step ", res->step(), ", observed ",
                        EscapeHtml(absl::StrFormat("%g", res->observed())), ", threshold ",
                        EscapeHtml(absl::StrFormat("%g", res->threshold())), "</span>");
      }
    }
    const std::string status = RuleStatusText(res);
    absl::StrAppend(&out, triggered(r) ? "<tr class=\"hit\">" : "<tr>", Td(name),
                    Td(entry == nullptr ? "<span class=\"muted\">not in the catalogue</span>"
                                        : EscapeHtml(entry->description())),
                    Td(EscapeHtml(advice)), Td(absl::StrCat(times(r)), true),
                    Td(absl::StrCat(points), true), Td(Parameters(r, entry)),
                    absl::StrCat("<td class=\"", triggered(r) ? "st-hit" : "st-ok", "\">",
                                 EscapeHtml(status), "</td>"),
                    Td(verdict), "</tr>");
  }
  absl::StrAppend(&out, "</tbody></table>");
  absl::StrAppend(&out, "<p class=\"note\">",
                  profiler ? "Data points: the metric snapshots and events the rule judged."
                           : "Data points: the steps the rule evaluated.",
                  profiler ? " Times triggered: the batches of profiler data after which the "
                             "rule found an issue (profiler rules keep judging after the first)."
                           : " Times triggered: tensor rules stop at their first issue.",
                  " Parameters in bold were set for this job; the rest are defaults.</p>");
}

void StepStatistics(const std::vector<StepSample>& steps, const ReportOptions& options,
                    std::string& out) {
  absl::StrAppend(&out, "<h2 id=\"steps\">Step durations</h2>");
  if (steps.empty()) {
    absl::StrAppend(&out, "<p class=\"muted\">No step timings stored for this job.</p>");
    return;
  }
  std::map<v1::Mode, std::vector<double>> by_mode;
  for (const StepSample& s : steps) by_mode[s.mode].push_back(s.seconds);
  absl::StrAppend(&out,
                  "<table class=\"stats\" id=\"step-stats\"><thead><tr><th>Mode</th><th>Steps</th>"
                  "<th>Mean (s)</th><th>p50 (s)</th><th>p95 (s)</th><th>Max (s)</th>"
                  "<th>Std dev (s)</th></tr></thead><tbody>");
  for (const auto& [mode, values] : by_mode) {
    const DurationStats st = ComputeDurationStats(values);
    absl::StrAppend(&out, "<tr>", Td(ModeText(mode)), Td(absl::StrCat(st.count), true),
                    Td(Fixed(st.mean), true), Td(Fixed(st.p50), true), Td(Fixed(st.p95), true),
                    Td(Fixed(st.max), true), Td(Fixed(st.stddev), true), "</tr>");
  }
  absl::StrAppend(&out, "</tbody></table><p class=\"note\">One sample per worker and step; "
                        "percentiles interpolate between ranks, std dev is the population "
                        "one.</p>");
  for (const auto& [mode, values] : by_mode) {
    ChartOptions o;
    o.title = absl::StrCat("Step duration histogram, ", ModeText(mode), " (", values.size(),
                           " steps)");
    o.x_label = "step duration (s)";
    o.y_label = "steps";
    o.height = 220;
    absl::StrAppend(&out, Histogram(values, options.histogram_bins, o));
  }

  // The slowest steps against the median of their mode.
  std::map<v1::Mode, double> median;
  for (const auto& [mode, values] : by_mode) median[mode] = ComputeDurationStats(values).p50;
  std::vector<StepSample> slow = steps;
  const size_t n = std::min<size_t>(slow.size(), std::max(options.top_outliers, 0));
  std::partial_sort(slow.begin(), slow.begin() + n, slow.end(),
                    [](const StepSample& a, const StepSample& b) {
                      if (a.seconds != b.seconds) return a.seconds > b.seconds;
                      return a.step < b.step;
                    });
  absl::StrAppend(&out, "<h3 id=\"outliers\">Top ", n, " slowest steps</h3>",
                  "<table class=\"outliers\" id=\"outlier-table\"><thead><tr><th>Step</th>"
                  "<th>Mode</th><th>Mode step</th><th>Worker</th><th>Duration (s)</th>"
                  "<th>Mode median (s)</th><th>× median</th></tr></thead><tbody>");
  for (size_t i = 0; i < n; ++i) {
    const StepSample& s = slow[i];
    const double m = median[s.mode];
    absl::StrAppend(&out, "<tr>", Td(absl::StrCat(s.step), true), Td(ModeText(s.mode)),
                    Td(absl::StrCat(s.mode_step), true), Td(absl::StrCat(s.worker), true),
                    Td(Fixed(s.seconds), true), Td(Fixed(m), true),
                    Td(m > 0 ? Fixed(s.seconds / m, 2) : "—", true), "</tr>");
  }
  absl::StrAppend(&out, "</tbody></table>");
}

void DataWaits(const std::vector<v1::WorkerEvent>& events, const ReportOptions& options,
               std::string& out) {
  struct Totals {
    double step = 0, wait = 0, forward = 0, backward = 0;
    int64_t waits = 0;
  };
  std::map<int32_t, Totals> by_worker;
  std::map<int32_t, std::map<int64_t, double>> wait_per_step;
  for (const v1::WorkerEvent& w : events) {
    Totals& t = by_worker[w.worker()];
    const v1::TraceEvent& e = w.event();
    switch (e.kind()) {
      case v1::TraceEvent::KIND_STEP: t.step += Seconds(e); break;
      case v1::TraceEvent::KIND_DATA_WAIT:
        t.wait += Seconds(e);
        ++t.waits;
        if (e.step() >= 0) wait_per_step[w.worker()][e.step()] += Seconds(e);
        break;
      case v1::TraceEvent::KIND_FORWARD: t.forward += Seconds(e); break;
      case v1::TraceEvent::KIND_BACKWARD: t.backward += Seconds(e); break;
      default: break;
    }
  }
  bool any_wait = false;
  for (const auto& [w, t] : by_worker) any_wait = any_wait || t.waits > 0;
  if (!any_wait) return;
  absl::StrAppend(&out, "<h2 id=\"datawait\">Data loading</h2>",
                  "<table class=\"stats\" id=\"wait-table\"><thead><tr><th>Worker</th>"
                  "<th>Data waits</th><th>Waiting (s)</th><th>Step time (s)</th>"
                  "<th>Share of step time</th><th>Forward (s)</th><th>Backward (s)</th>"
                  "</tr></thead><tbody>");
  auto share = [](double part, double whole) {
    return whole > 0 ? absl::StrFormat("%.1f%%", 100 * part / whole) : std::string("—");
  };
  for (const auto& [w, t] : by_worker) {
    absl::StrAppend(&out, "<tr>", Td(absl::StrCat(w), true), Td(absl::StrCat(t.waits), true),
                    Td(Fixed(t.wait, 3), true), Td(Fixed(t.step, 3), true),
                    Td(share(t.wait, t.step), true), Td(Fixed(t.forward, 3), true),
                    Td(Fixed(t.backward, 3), true), "</tr>");
  }
  absl::StrAppend(&out, "</tbody></table>");
  std::vector<ChartSeries> series;
  for (const auto& [w, per_step] : wait_per_step) {
    ChartSeries s;
    s.label = absl::StrCat("worker ", w);
    for (const auto& [step, seconds] : per_step) {
      s.x.push_back(static_cast<double>(step));
      s.y.push_back(seconds * 1000);
    }
    series.push_back(std::move(s));
  }
  ChartOptions o;
  o.title = "Data wait per step";
  o.x_label = "global step";
  o.y_label = "wait (ms)";
  o.max_points = options.max_points_per_chart;
  absl::StrAppend(&out, LineChart(series, o));
}

bool IsGpu(const std::string& name, absl::string_view suffix) {
  return absl::StartsWith(name, "gpu.") && absl::EndsWith(name, suffix);
}

void SystemUsage(const std::vector<v1::MetricSeries>& metrics, int64_t origin,
                 const ReportOptions& options, std::string& out) {
  absl::StrAppend(&out, "<h2 id=\"system\">System utilisation</h2>");
  if (metrics.empty()) {
    absl::StrAppend(&out, "<p class=\"muted\">No system metrics stored for this job (the "
                          "profiler was off).</p>");
    return;
  }
  struct Chart {
    std::string title, y_label;
    double scale;
    std::function<bool(const std::string&)> keep;
  };
  const std::vector<Chart> charts = {
      {"CPU utilisation", "percent", 1,
       [](const std::string& n) { return n == "cpu.util_percent" || n == "cpu.iowait_percent"; }},
      {"GPU utilisation", "percent", 1,
       [](const std::string& n) { return IsGpu(n, ".util_percent"); }},
      {"Memory", "GiB", 1.0 / (1 << 30),
       [](const std::string& n) {
         return n == "memory.used_bytes" || n == "process.rss_bytes" ||
                IsGpu(n, ".memory_used_bytes");
       }},
      {"Network", "MB/s", 1e-6, [](const std::string& n) {
         return n == "network.rx_bytes_per_s" || n == "network.tx_bytes_per_s";
       }}};
  for (const Chart& c : charts) {
    std::vector<ChartSeries> series;
    for (const v1::MetricSeries& m : metrics) {
      if (!c.keep(m.name())) continue;
      ChartSeries s;
      s.label = absl::StrCat("w", m.worker(), " ", m.name());
      const int n = std::min(m.unix_micros_size(), m.values_size());
      s.x.reserve(n);
      s.y.reserve(n);
      for (int i = 0; i < n; ++i) {
        const double y = m.values(i) * c.scale;
        if (!std::isfinite(y)) continue;  // no NaN in SVG coordinates
        s.x.push_back(static_cast<double>(m.unix_micros(i) - origin) / 1e6);
        s.y.push_back(y);
      }
      series.push_back(std::move(s));
    }
    if (series.empty()) continue;
    ChartOptions o;
    o.title = c.title;
    o.x_label = "seconds since the job started";
    o.y_label = c.y_label;
    o.max_points = options.max_points_per_chart;
    if (c.y_label == "percent") o.y_max = 100;
    absl::StrAppend(&out, LineChart(series, o));
  }
  // Every metric in numbers, so nothing is only in a picture.
  absl::StrAppend(&out, "<h3>Metrics</h3><table class=\"stats\" id=\"metric-table\"><thead><tr>"
                        "<th>Worker</th><th>Metric</th><th>Samples</th><th>Mean</th>"
                        "<th>p95</th><th>Max</th></tr></thead><tbody>");
  for (const v1::MetricSeries& m : metrics) {
    const DurationStats st =
        ComputeDurationStats(std::vector<double>(m.values().begin(), m.values().end()));
    absl::StrAppend(&out, "<tr>", Td(absl::StrCat(m.worker()), true), Td(EscapeHtml(m.name())),
                    Td(absl::StrCat(st.count), true),
                    Td(EscapeHtml(absl::StrFormat("%.6g", st.mean)), true),
                    Td(EscapeHtml(absl::StrFormat("%.6g", st.p95)), true),
                    Td(EscapeHtml(absl::StrFormat("%.6g", st.max)), true), "</tr>");
  }
  absl::StrAppend(&out, "</tbody></table>");
}

}  // namespace

bool IsProfilerRuleType(const std::string& rule_type) {
  // The types rules/profiler registers. The catalogue has no kind field, so
  // the split goes by type; a result with data points also counts.
  static const auto* const kTypes = [] {
    auto* types = new absl::flat_hash_set<std::string>();
    for (const auto& [info, maker] : rules::profiler::ProfilerRuleTypes()) {
      types->insert(info.rule_type);
    }
    return types;
  }();
  return kTypes->contains(rule_type);
}

DurationStats ComputeDurationStats(std::vector<double> v) {
  DurationStats st;
  // NaN or an infinity would poison every statistic (and NaN breaks the
  // strict weak ordering std::sort needs): they are left out.
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }),
          v.end());
  if (v.empty()) return st;
  st.count = static_cast<int64_t>(v.size());
  const rules::profiler::MeanStddev m = rules::profiler::ComputeMeanStddev(v);
  st.mean = m.mean;
  st.stddev = m.stddev;
  const std::vector<double> q = rules::profiler::Quantiles(std::move(v), {0.5, 0.95, 1});
  st.p50 = q[0];
  st.p95 = q[1];
  st.max = q[2];
  return st;
}

absl::StatusOr<std::string> RenderJobReport(storage::Store& store, const std::string& job_name,
                                            const std::vector<v1::RuleCatalogEntry>& catalogue,
                                            const ReportOptions& options) {
  if (job_name.empty()) return absl::InvalidArgumentError("no job given");
  SONDE_ASSIGN_OR_RETURN(v1::JobInfo job, store.GetJob(job_name));
  return RenderJobReport(store, job, catalogue, options);
}

absl::StatusOr<std::string> RenderJobReport(storage::Store& store, const v1::JobInfo& job,
                                            const std::vector<v1::RuleCatalogEntry>& catalogue,
                                            const ReportOptions& options) {
  const uint64_t id = job.job_id();
  SONDE_ASSIGN_OR_RETURN(std::vector<v1::RuleResult> results, store.RuleResults(id));
  // Bounded reads (ReportOptions): equal shares, so a cut drops the end of
  // every series alike, never whole workers or metrics.
  int64_t metrics_cut_at = 0;  // earliest last time read among the series cut
  SONDE_ASSIGN_OR_RETURN(auto listed, store.ListMetrics(id));
  size_t series_count = 0;
  for (const auto& [worker, names] : listed) series_count += names.size();
  std::vector<v1::MetricSeries> metrics;
  for (const auto& [worker, names] : listed) {
    for (const std::string& name : names) {
      bool cut = false;
      SONDE_ASSIGN_OR_RETURN(
          std::vector<v1::MetricSeries> read,
          store.ReadMetrics(id, {name}, nullptr, worker, 0, 0,
                            std::max<size_t>(1, options.max_metric_points / series_count), &cut));
      for (v1::MetricSeries& m : read) {
        if (cut && m.unix_micros_size() > 0) {
          const int64_t last = m.unix_micros(m.unix_micros_size() - 1);
          if (metrics_cut_at == 0 || last < metrics_cut_at) metrics_cut_at = last;
        }
        metrics.push_back(std::move(m));
      }
    }
  }
  // The kinds the report shows (spans and initialisation are not in it).
  constexpr v1::TraceEvent::Kind kEventKinds[] = {
      v1::TraceEvent::KIND_STEP, v1::TraceEvent::KIND_DATA_WAIT, v1::TraceEvent::KIND_FORWARD,
      v1::TraceEvent::KIND_BACKWARD};
  std::set<int32_t> workers(job.workers().begin(), job.workers().end());
  for (const auto& [worker, names] : listed) workers.insert(worker);
  std::vector<int32_t> event_workers(workers.begin(), workers.end());
  if (event_workers.empty()) event_workers.push_back(-1);  // every worker
  const size_t event_share = std::max<size_t>(
      1, options.max_events / (event_workers.size() * std::size(kEventKinds)));
  int64_t events_cut_at = 0;
  std::vector<v1::WorkerEvent> events;
  for (int32_t worker : event_workers) {
    for (v1::TraceEvent::Kind kind : kEventKinds) {
      bool cut = false;
      SONDE_ASSIGN_OR_RETURN(std::vector<v1::WorkerEvent> read,
                             store.ReadEvents(id, kind, "", worker, 0, 0, event_share, &cut));
      if (cut && !read.empty()) {
        int64_t last = 0;  // sorted by name, then start: the latest start read
        for (const v1::WorkerEvent& e : read) last = std::max(last, e.event().start_unix_micros());
        if (events_cut_at == 0 || last < events_cut_at) events_cut_at = last;
      }
      for (v1::WorkerEvent& e : read) events.push_back(std::move(e));
    }
  }
  if (events_cut_at > 0) {
    // Every kind and worker over the same time, so waits and steps compare.
    events.erase(std::remove_if(events.begin(), events.end(),
                                [&](const v1::WorkerEvent& e) {
                                  return e.event().start_unix_micros() > events_cut_at;
                                }),
                 events.end());
  }

  // Step timings: the profiler's step events when there are any, else the
  // durations stored with the tensor steps (longest worker per step).
  std::vector<StepSample> steps;
  std::string step_source = "profiler step events";
  for (const v1::WorkerEvent& w : events) {
    const v1::TraceEvent& e = w.event();
    if (e.kind() != v1::TraceEvent::KIND_STEP) continue;
    steps.push_back({e.mode(), e.step(), e.mode_step(), w.worker(), Seconds(e)});
  }
  if (steps.empty()) {
    step_source = "stored steps (longest worker)";
    SONDE_ASSIGN_OR_RETURN(std::vector<v1::StepInfo> stored,
                           store.ListSteps(id, v1::MODE_UNSPECIFIED));
    for (const v1::StepInfo& s : stored) {
      if (!std::isfinite(s.duration_seconds()) || s.duration_seconds() <= 0) continue;
      steps.push_back({s.mode(), s.step(), s.mode_step(),
                       s.workers().empty() ? 0 : s.workers(0), s.duration_seconds()});
    }
  }

  // Rules: every one enabled for the job, and every one with a result.
  absl::flat_hash_map<std::string, const v1::RuleCatalogEntry*> by_type;
  for (const v1::RuleCatalogEntry& e : catalogue) by_type[e.rule_type()] = &e;
  std::map<std::string, RuleRow> rows;
  for (const v1::RuleSpec& spec : job.rules()) {
    const std::string name = spec.name().empty() ? spec.rule_type() : spec.name();
    RuleRow& r = rows[name];
    r.name = name;
    r.rule_type = spec.rule_type();
    r.spec = &spec;
  }
  for (const v1::RuleResult& res : results) {
    RuleRow& r = rows[res.rule()];
    r.name = res.rule();
    if (r.rule_type.empty()) r.rule_type = res.rule_type().empty() ? res.rule() : res.rule_type();
    r.result = &res;
  }
  std::vector<RuleRow> profiler_rows, tensor_rows;
  for (auto& [name, r] : rows) {
    const bool profiler = IsProfilerRuleType(r.rule_type) ||
                          (r.result != nullptr && r.result->datapoints() > 0);
    (profiler ? profiler_rows : tensor_rows).push_back(r);
  }

  int64_t origin = job.start_unix_micros();
  for (const v1::MetricSeries& m : metrics) {
    if (m.unix_micros_size() > 0 && (origin <= 0 || m.unix_micros(0) < origin)) {
      origin = m.unix_micros(0);
    }
  }

  std::string out = absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
      "<title>Sonde report: ",
      EscapeHtml(job.job()), "</title><style>", kStyle, "</style></head><body>",
      "<h1>Sonde report: <span id=\"job-name\">", EscapeHtml(job.job()), "</span></h1>",
      "<p class=\"muted\">Generated ", Time(absl::ToUnixMicros(absl::Now())),
      " from the collector's store.</p>",
      "<nav><a href=\"#summary\">Summary</a><a href=\"#profiler-rules\">Profiler rules</a>"
      "<a href=\"#steps\">Step durations</a><a href=\"#outliers\">Slowest steps</a>"
      "<a href=\"#system\">System utilisation</a><a href=\"#tensor-rules\">Tensor rules</a>"
      "</nav>");
  JobSummary(job, steps, step_source, out);
  if (metrics_cut_at > 0 || events_cut_at > 0) {
    absl::StrAppend(
        &out, "<p class=\"note\" id=\"cut\">This job has more profiler data than one report "
              "reads (",
        options.max_metric_points, " metric points, ", options.max_events, " events). ",
        metrics_cut_at > 0 ? absl::StrCat("System metrics are shown up to ",
                                          Time(metrics_cut_at), ". ")
                           : std::string(),
        events_cut_at > 0 ? absl::StrCat("Framework events (step timings, data waits) are "
                                         "shown up to ", Time(events_cut_at), ". ")
                          : std::string(),
        "Query ReadMetrics and ReadEvents by time range for the rest.</p>");
  }
  RulesTable("profiler-rules", "Profiler rules summary", true, profiler_rows, by_type, out);
  StepStatistics(steps, options, out);
  DataWaits(events, options, out);
  SystemUsage(metrics, origin, options, out);
  RulesTable("tensor-rules", "Tensor rules summary", false, tensor_rows, by_type, out);
  absl::StrAppend(&out, "</body></html>\n");
  return out;
}

}  // namespace sonde::report
