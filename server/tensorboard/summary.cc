#include "server/tensorboard/summary.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "stats/statistics.h"

namespace sonde::server::tensorboard {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Counters of the record, by name.
std::optional<double> Counter(const v1::Statistics& s, absl::string_view name) {
  if (name == "count") return static_cast<double>(s.count());
  if (name == "finite_count") return static_cast<double>(s.finite_count());
  if (name == "nan_count") return static_cast<double>(s.nan_count());
  if (name == "pos_inf_count") return static_cast<double>(s.pos_inf_count());
  if (name == "neg_inf_count") return static_cast<double>(s.neg_inf_count());
  if (name == "zero_count") return static_cast<double>(s.zero_count());
  if (name == "sum_squares") return s.sum_squares();
  return std::nullopt;
}

// The statistics of the union of `records` (all of one tensor).
v1::Statistics Merged(const std::vector<const v1::TensorRecord*>& records) {
  v1::Statistics merged = records[0]->statistics();
  for (size_t i = 1; i < records.size(); ++i) {
    merged = MergeStatistics(merged, records[i]->statistics());
  }
  return merged;
}

// The histogram of the union of `records`; nullopt if one has none.
absl::StatusOr<std::optional<v1::Histogram>> MergedHistogram(
    const std::vector<const v1::TensorRecord*>& records) {
  for (const v1::TensorRecord* r : records) {
    if (!r->has_histogram()) return std::nullopt;
  }
  if (records.size() == 1) return records[0]->histogram();
  SONDE_ASSIGN_OR_RETURN(HistogramCounts merged, FromProto(records[0]->histogram()));
  for (size_t i = 1; i < records.size(); ++i) {
    SONDE_ASSIGN_OR_RETURN(HistogramCounts h, FromProto(records[i]->histogram()));
    SONDE_RETURN_IF_ERROR(MergeInto(merged, h));
  }
  return ToProto(merged);
}

absl::Status AddOneTensor(const std::string& name,
                          const std::vector<const v1::TensorRecord*>& records,
                          const std::vector<std::string>& statistics,
                          tfevents::Summary& summary) {
  for (const v1::TensorRecord* r : records) {
    if (!r->has_statistics()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' of worker ",
                                                     r->worker(), " has no statistics"));
    }
  }
  const bool scalar = std::all_of(records.begin(), records.end(), [](const auto* r) {
    return r->statistics().count() == 1;
  });
  const v1::Statistics stats = Merged(records);
  if (stats.count() == 0) return absl::OkStatus();  // an empty tensor: nothing to show
  if (scalar) {
    tfevents::Summary::Value* v = summary.add_value();
    v->set_tag(name);
    v->set_simple_value(static_cast<float>(ScalarValue(stats)));
    return absl::OkStatus();
  }
  for (const std::string& statistic : statistics) {
    absl::StatusOr<double> value = StatisticValue(stats, statistic);
    if (!value.ok()) return value.status();
    tfevents::Summary::Value* v = summary.add_value();
    v->set_tag(absl::StrCat(name, "/", statistic));
    v->set_simple_value(static_cast<float>(*value));
  }
  auto histogram = MergedHistogram(records);
  if (!histogram.ok()) {
    return absl::Status(histogram.status().code(),
                        absl::StrCat("histogram of '", name, "': ", histogram.status().message()));
  }
  if (!histogram->has_value()) return absl::OkStatus();
  auto histo = ToHistogramProto(**histogram, stats);
  if (!histo.ok()) {
    return absl::Status(histo.status().code(),
                        absl::StrCat("histogram of '", name, "': ", histo.status().message()));
  }
  if (!histo->has_value()) return absl::OkStatus();
  tfevents::Summary::Value* v = summary.add_value();
  v->set_tag(name);
  *v->mutable_histo() = std::move(**histo);
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> DefaultStatistics() { return {"mean", "std", "l2"}; }

absl::Status ValidateStatisticNames(const std::vector<std::string>& names) {
  std::set<std::string> seen;
  const v1::Statistics probe;
  for (const std::string& name : names) {
    if (!StatisticValue(probe, name).ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown statistic '", name,
          "'; known: min, max, mean, std, variance, sum, l1, l2, their abs_ forms, count, "
          "finite_count, nan_count, pos_inf_count, neg_inf_count, zero_count, sum_squares"));
    }
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat("statistic '", name, "' is named twice"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<double> StatisticValue(const v1::Statistics& s, absl::string_view name) {
  if (std::optional<double> counter = Counter(s, name)) return *counter;
  const bool abs = absl::StartsWith(name, "abs_");
  const absl::string_view base = abs ? name.substr(4) : name;
  SONDE_ASSIGN_OR_RETURN(double value, ReductionValue(s, base, abs));
  const bool over_non_nan = base == "min" || base == "max";
  if (over_non_nan ? s.count() == s.nan_count() : s.finite_count() == 0) return kNaN;
  return value;
}

double ScalarValue(const v1::Statistics& s) {
  if (s.nan_count() > 0) return kNaN;
  if (s.pos_inf_count() > 0 && s.neg_inf_count() > 0) return kNaN;
  if (s.pos_inf_count() > 0) return std::numeric_limits<double>::infinity();
  if (s.neg_inf_count() > 0) return -std::numeric_limits<double>::infinity();
  if (s.finite_count() == 0) return kNaN;
  return s.sum() / static_cast<double>(s.finite_count());
}

absl::StatusOr<std::optional<tfevents::HistogramProto>> ToHistogramProto(
    const v1::Histogram& histogram, const v1::Statistics& stats) {
  SONDE_ASSIGN_OR_RETURN(HistogramCounts h, FromProto(histogram));
  const std::vector<double> edges = BinEdges(h.spec);
  if (edges.size() != h.counts.size() + 1) {
    return absl::InvalidArgumentError(absl::StrCat("histogram has ", h.counts.size(),
                                                   " counters for ", edges.size(), " edges"));
  }
  size_t first = h.counts.size();
  size_t last = 0;
  double num = 0;
  for (size_t i = 0; i < h.counts.size(); ++i) {
    if (h.counts[i] == 0) continue;
    first = std::min(first, i);
    last = i;
    num += static_cast<double>(h.counts[i]);
  }
  if (first == h.counts.size()) return std::nullopt;
  tfevents::HistogramProto out;
  bool previous_empty = false;
  for (size_t i = first; i <= last; ++i) {
    const double limit = std::isinf(edges[i + 1]) ? DBL_MAX : edges[i + 1];
    const bool empty = h.counts[i] == 0;
    if (empty && previous_empty) {
      out.set_bucket_limit(out.bucket_limit_size() - 1, limit);  // widen the empty run
    } else {
      out.add_bucket_limit(limit);
      out.add_bucket(static_cast<double>(h.counts[i]));
    }
    previous_empty = empty;
  }
  // The outermost edges of the non-empty counters are infinite only for the
  // counters beyond the spec's range; then their inner edge is the bound.
  const double low_edge = std::isinf(edges[first]) ? edges[first + 1] : edges[first];
  const double high_edge = std::isinf(edges[last + 1]) ? edges[last] : edges[last + 1];
  out.set_min(std::isfinite(stats.min()) ? stats.min() : low_edge);
  out.set_max(std::isfinite(stats.max()) ? stats.max() : high_edge);
  out.set_num(num);
  out.set_sum(stats.sum());
  out.set_sum_squares(stats.sum_squares());
  return out;
}

absl::Status AddTensorValues(const std::vector<const v1::TensorRecord*>& records,
                             const std::vector<std::string>& statistics,
                             tfevents::Summary& summary) {
  std::map<std::string, std::vector<const v1::TensorRecord*>> by_name;
  for (const v1::TensorRecord* r : records) by_name[r->tensor_name()].push_back(r);
  absl::Status first_problem;
  for (const auto& [name, group] : by_name) {
    absl::Status s = AddOneTensor(name, group, statistics, summary);
    if (!s.ok() && first_problem.ok()) first_problem = s;
  }
  return first_problem;
}

}  // namespace sonde::server::tensorboard
