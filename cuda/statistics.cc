#include "cuda/statistics.h"

#include <cmath>
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"

namespace sonde {
namespace {

// Elements are processed in blocks that stay in L1: a tight loop without
// divisions gathers sums and extremes, a second pass over the same block
// gives its M2 exactly around the block mean, and blocks merge with Chan's
// formula. A block holding a NaN or an infinity takes the per-element path,
// so the two paths define the same record.
constexpr int kBlock = 1024;

void AccumulateBlock(StatsAccumulator& acc, const double* x, int n) {
  bool finite = true;
  for (int i = 0; i < n; ++i) finite &= (x[i] - x[i] == 0);
  if (!finite) {
    for (int i = 0; i < n; ++i) StatsAdd(acc, x[i]);
    return;
  }
  if (n == 0) return;
  double sum = 0, l1 = 0, sq = 0;
  double mn = x[0], mx = x[0], amn = std::fabs(x[0]), amx = amn;
  uint64_t zeros = 0;
  for (int i = 0; i < n; ++i) {
    const double v = x[i];
    const double a = std::fabs(v);
    sum += v;
    l1 += a;
    sq += v * v;
    mn = v < mn ? v : mn;
    mx = v > mx ? v : mx;
    amn = a < amn ? a : amn;
    amx = a > amx ? a : amx;
    zeros += v == 0;
  }
  const double mean = sum / n;
  double m2 = 0;
  for (int i = 0; i < n; ++i) {
    const double d = x[i] - mean;
    m2 += d * d;
  }
  StatsAccumulator block;
  block.count = block.finite_count = static_cast<uint64_t>(n);
  block.zero_count = zeros;
  block.min = mn;
  block.max = mx;
  block.abs_min = amn;
  block.abs_max = amx;
  block.sum = sum;
  block.l1 = l1;
  block.sum_squares = sq;
  block.mean = mean;
  block.m2 = m2;
  StatsMerge(acc, block);
}

template <typename Load>
void AccumulateBlocks(StatsAccumulator& acc, uint64_t count, Load load) {
  double buf[kBlock];
  for (uint64_t start = 0; start < count; start += kBlock) {
    const int n = static_cast<int>(std::min<uint64_t>(kBlock, count - start));
    for (int i = 0; i < n; ++i) buf[i] = load(start + i);
    AccumulateBlock(acc, buf, n);
  }
}

template <typename T>
void AccumulateTyped(StatsAccumulator& acc, const char* p, uint64_t count) {
  AccumulateBlocks(acc, count, [p](uint64_t i) {
    T v;
    std::memcpy(&v, p + i * sizeof(T), sizeof(T));
    return static_cast<double>(v);
  });
}

template <float (*Convert)(uint16_t)>
void Accumulate16(StatsAccumulator& acc, const char* p, uint64_t count) {
  AccumulateBlocks(acc, count, [p](uint64_t i) {
    uint16_t v;
    std::memcpy(&v, p + i * 2, 2);
    return static_cast<double>(Convert(v));
  });
}

}  // namespace

void AccumulateStatistics(StatsAccumulator& acc, const void* data,
                          v1::DType dtype, uint64_t count) {
  const char* p = static_cast<const char*>(data);
  switch (dtype) {
    case v1::DTYPE_F32: AccumulateTyped<float>(acc, p, count); break;
    case v1::DTYPE_F64: AccumulateTyped<double>(acc, p, count); break;
    case v1::DTYPE_F16: Accumulate16<HalfToFloat>(acc, p, count); break;
    case v1::DTYPE_BF16: Accumulate16<BFloat16ToFloat>(acc, p, count); break;
    case v1::DTYPE_I8: AccumulateTyped<int8_t>(acc, p, count); break;
    case v1::DTYPE_I16: AccumulateTyped<int16_t>(acc, p, count); break;
    case v1::DTYPE_I32: AccumulateTyped<int32_t>(acc, p, count); break;
    case v1::DTYPE_I64: AccumulateTyped<int64_t>(acc, p, count); break;
    case v1::DTYPE_U8: AccumulateTyped<uint8_t>(acc, p, count); break;
    case v1::DTYPE_BOOL:
      AccumulateBlocks(acc, count, [p](uint64_t i) { return p[i] != 0 ? 1.0 : 0.0; });
      break;
    default:
      break;
  }
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
