// The per-job report: one self-contained HTML page (inline CSS, inline SVG
// plots, no scripts or external resources) summarising a job as SageMaker
// Debugger's profiler report does — job summary, the rules summary tables
// (profiler rules and tensor rules: rule, description, recommendation, times
// triggered, data points, parameters), step-duration statistics and
// histograms per mode, the slowest steps, data-wait share, and system
// utilisation and memory over time per worker.
//
// Reads only the Store; every string from the data is HTML-escaped. Charts
// are downsampled so a long job still gives a small file. Thread-safe as the
// Store is.
#ifndef SONDE_SERVER_REPORT_REPORT_H_
#define SONDE_SERVER_REPORT_REPORT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/rule.pb.h"
#include "storage/store.h"

namespace sonde::report {

struct ReportOptions {
  // Slowest steps listed in "Outlier steps". Default 10.
  int top_outliers = 10;
  // Points drawn per chart, over all its series. Default 2000.
  size_t max_points_per_chart = 2000;
  // Bins of each step-duration histogram. Default 30.
  int histogram_bins = 30;
  // What one report reads into memory, so a long job's report cannot
  // exhaust the collector: metric points over all series (each (worker,
  // metric) series gets an equal share), and profiler events (an equal
  // share per worker and kind). Each series is read from the job's start;
  // when a share is used up the report says which data it covers. Defaults
  // 8,000,000 points (about 130 MB) and 2,000,000 events.
  size_t max_metric_points = 8'000'000;
  size_t max_events = 2'000'000;
};

// The report of `job`. `catalogue` gives each rule type's description,
// parameters with defaults and advice (ListRuleCatalog's entries); rules
// missing from it are still listed. NotFound for an unknown job,
// InvalidArgument for an empty name; storage errors as the Store returns
// them.
absl::StatusOr<std::string> RenderJobReport(storage::Store& store, const std::string& job,
                                            const std::vector<v1::RuleCatalogEntry>& catalogue,
                                            const ReportOptions& options = ReportOptions());
// The same for a job already looked up (Store::GetJob).
absl::StatusOr<std::string> RenderJobReport(storage::Store& store, const v1::JobInfo& job,
                                            const std::vector<v1::RuleCatalogEntry>& catalogue,
                                            const ReportOptions& options = ReportOptions());

// Step-duration statistics as the report shows them: percentiles
// interpolate linearly between the nearest ranks (numpy's default), stddev
// is the population one (ddof 0). All zero for no values.
struct DurationStats {
  int64_t count = 0;
  double mean = 0, p50 = 0, p95 = 0, max = 0, stddev = 0;
};
DurationStats ComputeDurationStats(std::vector<double> seconds);

// Whether a rule type judges profiler data (SageMaker's profiler rules), so
// its row goes in the profiler table rather than the tensor-rule one.
bool IsProfilerRuleType(const std::string& rule_type);

}  // namespace sonde::report

#endif  // SONDE_SERVER_REPORT_REPORT_H_
