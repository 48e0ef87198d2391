// The math one CUDA thread and one block of the statistics kernel do, as
// host/device functions so that the CPU can replay the kernel's exact order
// of operations (tests/kernel emulation) and the kernel stays a thin loop.
//
// A thread folds elements into a ChunkPartial: counts, extremes in the
// element's precision (NaN never enters them), and double sums shifted by
// the chunk's shift K: s1 = sum(x-K), s2 = sum((x-K)^2), l1, sum_squares.
// Partials of one chunk combine by addition; FinishChunk turns the chunk's
// partial into a StatsAccumulator (m2 = s2 - s1^2/n, exact around K).
#ifndef SONDE_MATH_CHUNK_MATH_H_
#define SONDE_MATH_CHUNK_MATH_H_

#include <cmath>
#include <cstdint>

#include "math/stats_math.h"

namespace sonde {

template <typename Acc>
SONDE_HD inline bool ChunkIsFinite(Acc x) {
  return x - x == x - x;  // false for NaN and +-Inf
}

// The shift of a chunk: its first element when finite, else 0.
template <typename Acc>
SONDE_HD inline double ChunkShift(Acc first) {
  return ChunkIsFinite(first) ? static_cast<double>(first) : 0.0;
}

// Trivially constructible (the kernel keeps these in shared memory): call
// Reset before use.
template <typename Acc>
struct ChunkPartial {
  uint32_t nan, pos_inf, neg_inf, zero;
  Acc mn, mx, amn, amx;
  double s1, s2, l1, sq;

  SONDE_HD void Reset() {
    nan = pos_inf = neg_inf = zero = 0;
    const Acc inf = static_cast<Acc>(INFINITY);
    mn = inf;
    mx = -inf;
    amn = inf;
    amx = 0;
    s1 = s2 = l1 = sq = 0;
  }

  SONDE_HD void Add(Acc v, double shift) {
    if (v != v) {
      ++nan;
      return;
    }
    const Acc a = v < 0 ? -v : v;
    mn = v < mn ? v : mn;
    mx = v > mx ? v : mx;
    amn = a < amn ? a : amn;
    amx = a > amx ? a : amx;
    if (!ChunkIsFinite(v)) {
      if (v > 0) {
        ++pos_inf;
      } else {
        ++neg_inf;
      }
      return;
    }
    zero += v == 0 ? 1u : 0u;
    const double dv = static_cast<double>(v);
    const double d = dv - shift;
    s1 += d;
    s2 = fma(d, d, s2);
    l1 += static_cast<double>(a);
    sq = fma(dv, dv, sq);
  }

  SONDE_HD void Merge(const ChunkPartial& o) {
    nan += o.nan;
    pos_inf += o.pos_inf;
    neg_inf += o.neg_inf;
    zero += o.zero;
    mn = o.mn < mn ? o.mn : mn;
    mx = o.mx > mx ? o.mx : mx;
    amn = o.amn < amn ? o.amn : amn;
    amx = o.amx > amx ? o.amx : amx;
    s1 += o.s1;
    s2 += o.s2;
    l1 += o.l1;
    sq += o.sq;
  }
};

template <typename Acc>
SONDE_HD inline StatsAccumulator FinishChunk(const ChunkPartial<Acc>& b, uint64_t count,
                                             double shift) {
  StatsAccumulator r;
  r.count = count;
  r.nan_count = b.nan;
  r.pos_inf_count = b.pos_inf;
  r.neg_inf_count = b.neg_inf;
  r.zero_count = b.zero;
  r.finite_count = count - b.nan - b.pos_inf - b.neg_inf;
  if (r.count > r.nan_count) {
    r.min = static_cast<double>(b.mn);
    r.max = static_cast<double>(b.mx);
    r.abs_min = static_cast<double>(b.amn);
    r.abs_max = static_cast<double>(b.amx);
  }
  if (r.finite_count > 0) {
    const double n = static_cast<double>(r.finite_count);
    r.sum = b.s1 + n * shift;
    r.mean = shift + b.s1 / n;
    const double m2 = b.s2 - b.s1 * b.s1 / n;
    r.m2 = m2 > 0 ? m2 : 0;
    r.l1 = b.l1;
    r.sum_squares = b.sq;
  }
  return r;
}

}  // namespace sonde

#endif  // SONDE_MATH_CHUNK_MATH_H_
