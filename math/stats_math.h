// The per-element math of Sonde's statistics record, shared by the CPU path
// and CUDA kernels: every function is usable on the host and the device.
// A StatsAccumulator is a plain value; merging two accumulators of disjoint
// parts of a tensor gives the accumulator of the union (Chan et al.'s
// parallel variance for m2). Not thread-safe: one accumulator per thread.
#ifndef SONDE_MATH_STATS_MATH_H_
#define SONDE_MATH_STATS_MATH_H_

#include <cstdint>

#if defined(__CUDACC__)
#define SONDE_HD __host__ __device__
#else
#define SONDE_HD
#endif

namespace sonde {

struct StatsAccumulator {
  uint64_t count = 0;
  uint64_t finite_count = 0;
  uint64_t nan_count = 0;
  uint64_t pos_inf_count = 0;
  uint64_t neg_inf_count = 0;
  uint64_t zero_count = 0;
  // Over non-NaN elements; valid when count > nan_count.
  double min = 0;
  double max = 0;
  double abs_min = 0;
  double abs_max = 0;
  // Over finite elements.
  double sum = 0;
  double l1 = 0;
  double sum_squares = 0;
  double mean = 0;  // running mean of finite elements (for m2)
  double m2 = 0;
};

SONDE_HD inline bool SondeIsNan(double x) { return x != x; }
SONDE_HD inline bool SondeIsInf(double x) {
  return !SondeIsNan(x) && (x - x) != (x - x);
}

// Adds one element.
SONDE_HD inline void StatsAdd(StatsAccumulator& a, double x) {
  ++a.count;
  if (SondeIsNan(x)) {
    ++a.nan_count;
    return;
  }
  const double ax = x < 0 ? -x : x;
  const bool first = (a.count - a.nan_count) == 1;
  if (first) {
    a.min = a.max = x;
    a.abs_min = a.abs_max = ax;
  } else {
    if (x < a.min) a.min = x;
    if (x > a.max) a.max = x;
    if (ax < a.abs_min) a.abs_min = ax;
    if (ax > a.abs_max) a.abs_max = ax;
  }
  if (x == 0) ++a.zero_count;
  if (SondeIsInf(x)) {
    if (x > 0) {
      ++a.pos_inf_count;
    } else {
      ++a.neg_inf_count;
    }
    return;
  }
  ++a.finite_count;
  a.sum += x;
  a.l1 += ax;
  a.sum_squares += x * x;
  const double delta = x - a.mean;
  a.mean += delta / static_cast<double>(a.finite_count);
  a.m2 += delta * (x - a.mean);
}

// Folds `b` into `a`; the result describes the union of both parts.
SONDE_HD inline void StatsMerge(StatsAccumulator& a, const StatsAccumulator& b) {
  const uint64_t a_valid = a.count - a.nan_count;
  const uint64_t b_valid = b.count - b.nan_count;
  if (b_valid > 0) {
    if (a_valid == 0) {
      a.min = b.min;
      a.max = b.max;
      a.abs_min = b.abs_min;
      a.abs_max = b.abs_max;
    } else {
      if (b.min < a.min) a.min = b.min;
      if (b.max > a.max) a.max = b.max;
      if (b.abs_min < a.abs_min) a.abs_min = b.abs_min;
      if (b.abs_max > a.abs_max) a.abs_max = b.abs_max;
    }
  }
  if (b.finite_count > 0) {
    if (a.finite_count == 0) {
      a.mean = b.mean;
      a.m2 = b.m2;
    } else {
      const double na = static_cast<double>(a.finite_count);
      const double nb = static_cast<double>(b.finite_count);
      const double n = na + nb;
      const double delta = b.mean - a.mean;
      a.mean = a.mean + delta * (nb / n);
      a.m2 = a.m2 + b.m2 + delta * delta * (na * nb / n);
    }
  }
  a.count += b.count;
  a.finite_count += b.finite_count;
  a.nan_count += b.nan_count;
  a.pos_inf_count += b.pos_inf_count;
  a.neg_inf_count += b.neg_inf_count;
  a.zero_count += b.zero_count;
  a.sum += b.sum;
  a.l1 += b.l1;
  a.sum_squares += b.sum_squares;
}

}  // namespace sonde

#endif  // SONDE_MATH_STATS_MATH_H_
