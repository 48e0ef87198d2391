#include "stats/statistics.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "stats/cpu_stats.h"

namespace sonde {

void AccumulateStatistics(StatsAccumulator& acc, const void* data,
                          v1::DType dtype, uint64_t count) {
  // Unknown dtypes add nothing, as documented; the only error CpuAccumulate
  // can return without a histogram.
  CpuAccumulate(&acc, nullptr, data, dtype, count).IgnoreError();
}

absl::StatusOr<v1::Statistics> ComputeStatistics(absl::string_view bytes,
                                                 v1::DType dtype) {
  const size_t size = DTypeSize(dtype);
  if (size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported dtype ", static_cast<int>(dtype)));
  }
  if (bytes.size() % size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(bytes.size(), " bytes is not a whole number of ",
                     DTypeName(dtype), " elements"));
  }
  StatsAccumulator acc;
  AccumulateStatistics(acc, bytes.data(), dtype, bytes.size() / size);
  return ToProto(acc);
}

v1::Statistics ToProto(const StatsAccumulator& acc) {
  v1::Statistics s;
  s.set_count(acc.count);
  s.set_finite_count(acc.finite_count);
  s.set_nan_count(acc.nan_count);
  s.set_pos_inf_count(acc.pos_inf_count);
  s.set_neg_inf_count(acc.neg_inf_count);
  s.set_zero_count(acc.zero_count);
  if (acc.count > acc.nan_count) {
    s.set_min(acc.min);
    s.set_max(acc.max);
    s.set_abs_min(acc.abs_min);
    s.set_abs_max(acc.abs_max);
  }
  s.set_sum(acc.sum);
  s.set_l1(acc.l1);
  s.set_sum_squares(acc.sum_squares);
  s.set_m2(acc.m2);
  if (acc.finite_count > 0) {
    const double n = static_cast<double>(acc.finite_count);
    s.set_mean(acc.mean);
    const double var = acc.m2 > 0 ? acc.m2 / n : 0.0;
    s.set_variance(var);
    s.set_std(std::sqrt(var));
  }
  s.set_l2(std::sqrt(acc.sum_squares));
  return s;
}

StatsAccumulator FromProto(const v1::Statistics& s) {
  StatsAccumulator a;
  a.count = s.count();
  a.finite_count = s.finite_count();
  a.nan_count = s.nan_count();
  a.pos_inf_count = s.pos_inf_count();
  a.neg_inf_count = s.neg_inf_count();
  a.zero_count = s.zero_count();
  a.min = s.min();
  a.max = s.max();
  a.abs_min = s.abs_min();
  a.abs_max = s.abs_max();
  a.sum = s.sum();
  a.l1 = s.l1();
  a.sum_squares = s.sum_squares();
  a.mean = s.finite_count() > 0 ? s.mean() : 0.0;
  a.m2 = s.m2();
  return a;
}

v1::Statistics MergeStatistics(const v1::Statistics& a,
                               const v1::Statistics& b) {
  StatsAccumulator acc = FromProto(a);
  StatsMerge(acc, FromProto(b));
  return ToProto(acc);
}

absl::Status ValidateStatistics(const v1::Statistics& s) {
  const uint64_t nonfinite = s.nan_count() + s.pos_inf_count() + s.neg_inf_count();
  if (nonfinite < s.nan_count() || s.finite_count() + nonfinite != s.count()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "statistics: finite_count ", s.finite_count(), " + nan ", s.nan_count(),
        " + inf ", s.pos_inf_count() + s.neg_inf_count(), " != count ",
        s.count()));
  }
  if (s.zero_count() > s.finite_count()) {
    return absl::InvalidArgumentError(
        absl::StrCat("statistics: zero_count ", s.zero_count(),
                     " exceeds finite_count ", s.finite_count()));
  }
  if (s.count() > s.nan_count() &&
      (!(s.min() <= s.max()) || !(s.abs_min() <= s.abs_max()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("statistics: min ", s.min(), " > max ", s.max()));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> ReductionValue(const v1::Statistics& s,
                                      absl::string_view name, bool abs) {
  const double n = static_cast<double>(s.finite_count());
  if (abs) {
    if (name == "min") return s.abs_min();
    if (name == "max") return s.abs_max();
    if (name == "mean") return n > 0 ? s.l1() / n : 0.0;
    if (name == "sum" || name == "l1") return s.l1();
    if (name == "l2") return s.l2();
    if (name == "variance" || name == "std") {
      // Var(|x|) = E[x^2] - E[|x|]^2.
      if (n == 0) return 0.0;
      const double m = s.l1() / n;
      const double var = std::max(0.0, s.sum_squares() / n - m * m);
      return name == "std" ? std::sqrt(var) : var;
    }
  } else {
    if (name == "min") return s.min();
    if (name == "max") return s.max();
    if (name == "mean") return s.mean();
    if (name == "sum") return s.sum();
    if (name == "variance") return s.variance();
    if (name == "std") return s.std();
    if (name == "l1") return s.l1();
    if (name == "l2") return s.l2();
  }
  return absl::NotFoundError(absl::StrCat("reduction '", abs ? "abs_" : "", name,
                                          "' is not available"));
}

}  // namespace sonde
