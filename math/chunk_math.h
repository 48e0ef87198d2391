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

// Loops the kernel must unroll (arrays in registers, not local memory).
#if defined(__CUDACC__)
#define SONDE_UNROLL _Pragma("unroll")
#else
#define SONDE_UNROLL
#endif

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

// How a block's threads walk its chunk. The kernel and its CPU replay
// (cuda/kernel_emulation_test.cc) both run FoldChunkThread, so the replay
// keeps the kernel's order of operations (not its bits: nvcc may contract
// other multiply-adds, and the sign of a zero extreme may differ).
//
// From the chunk's first 16-byte boundary on, thread t of kChunkThreads
// issues kVectorLoads 16-byte loads before using any (vectors t, t + 256,
// t + 512, t + 768 of the iteration: every load of a warp is one coalesced
// 512-byte line), then folds those elements in groups of up to kGroup
// (AddGroup). Elements before that boundary (a tensor view at an offset)
// and after the last whole iteration are folded one at a time (thread t
// takes t, t + 256, ...).
inline constexpr int kChunkThreads = 256;
inline constexpr int kVectorLoads = 4;
inline constexpr int kGroup = 16;
// Threads of the merge kernel's block (one block per tensor): thread i
// merges the tensor's chunk records i, i + kMergeThreads, ..., then a tree.
inline constexpr int kMergeThreads = 256;

// Float groups within these bounds are folded in float: no element's square
// or sum can overflow, and the error of a square that underflows is at most
// 2^-30 of the group's largest square. Other groups take the per-element
// double path.
inline constexpr float kGroupFloatMax = 1152921504606846976.0f;  // 2^60
inline constexpr float kGroupFloatMin = 8.67361737988403547e-19f;  // 2^-60

// Double elements: always one at a time in double (F64 keeps 1e-12).
// Both forms return whether the group was folded in float.
template <int G>
SONDE_HD inline bool AddGroup(ChunkPartial<double>& s, const double (&x)[G], double shift) {
  SONDE_UNROLL
  for (int i = 0; i < G; ++i) s.Add(x[i], shift);
  return false;
}

// Sum of f(x[i]) over a group: kGroupLanes interleaved running sums (element
// i goes to lane i % 4, in order), then (l0 + l1) + (l2 + l3). The error is
// at most G/4 + 2 roundings of the sum of magnitudes.
inline constexpr int kGroupLanes = 4;

// Float elements (F32, and F16/BF16 widened to float). A group that is all
// finite and within [kGroupFloatMin, kGroupFloatMax] (or all zero; or all
// equal) is folded in float: the group's mean m, then the corrected
// two-pass c = sum(x - m), q = sum((x - m)^2), which gives the group's own
// mean and m2 accurately whatever its offset; its shifted sums are then
// added in double (s1 += n (mean - K), s2 += m2 + n (mean - K)^2), with l1 and
// the sum of squares. That costs about 10 float operations an element and
// 12 double operations a group, where the per-element path costs 7 double
// operations an element. Other groups (NaN, Inf, huge or tiny values) take
// the per-element path, so counts and extremes stay exact and nothing
// overflows.
template <int G>
SONDE_HD inline bool AddGroup(ChunkPartial<float>& s, const float (&x)[G], double shift) {
  static_assert(G % kGroupLanes == 0, "groups are whole lanes");
  float mn = x[0];
  float mx = x[0];
  float amn = fabsf(x[0]);
  float lane_sum[kGroupLanes];
  float lane_abs[kGroupLanes];
  float lane_sq[kGroupLanes];
  SONDE_UNROLL
  for (int k = 0; k < kGroupLanes; ++k) {
    lane_sum[k] = x[k];
    lane_abs[k] = fabsf(x[k]);
    lane_sq[k] = x[k] * x[k];
  }
  SONDE_UNROLL
  for (int i = 0; i < G; ++i) {
    mn = fminf(mn, x[i]);
    mx = fmaxf(mx, x[i]);
    amn = fminf(amn, fabsf(x[i]));
    if (i >= kGroupLanes) {
      const int k = i % kGroupLanes;
      lane_sum[k] += x[i];
      lane_abs[k] += fabsf(x[i]);
      lane_sq[k] = fmaf(x[i], x[i], lane_sq[k]);
    }
  }
  const float sum = (lane_sum[0] + lane_sum[1]) + (lane_sum[2] + lane_sum[3]);
  const float amx = fmaxf(fabsf(mn), fabsf(mx));
  const float spread = mx - mn;
  const bool fast = sum - sum == 0.0f && amx <= kGroupFloatMax &&
                    (amx >= kGroupFloatMin || amx == 0.0f) &&
                    (spread >= kGroupFloatMin || spread == 0.0f);
  if (!fast) {
    SONDE_UNROLL
    for (int i = 0; i < G; ++i) s.Add(x[i], shift);
    return false;
  }
  s.mn = fminf(s.mn, mn);
  s.mx = fmaxf(s.mx, mx);
  s.amn = fminf(s.amn, amn);
  s.amx = fmaxf(s.amx, amx);
  if (amn == 0.0f) {
    SONDE_UNROLL
    for (int i = 0; i < G; ++i) s.zero += x[i] == 0.0f ? 1u : 0u;
  }
  const float m = sum * (1.0f / G);
  float lane_c[kGroupLanes];
  float lane_q[kGroupLanes];
  SONDE_UNROLL
  for (int k = 0; k < kGroupLanes; ++k) {
    const float d = x[k] - m;
    lane_c[k] = d;
    lane_q[k] = d * d;
  }
  SONDE_UNROLL
  for (int i = kGroupLanes; i < G; ++i) {
    const int k = i % kGroupLanes;
    const float d = x[i] - m;
    lane_c[k] += d;
    lane_q[k] = fmaf(d, d, lane_q[k]);
  }
  const double c = static_cast<double>((lane_c[0] + lane_c[1]) + (lane_c[2] + lane_c[3]));
  const double q = static_cast<double>((lane_q[0] + lane_q[1]) + (lane_q[2] + lane_q[3]));
  const double inv_n = 1.0 / G;  // a power of two when G is: exact
  const double n = G;
  const double t = fma(c, inv_n, static_cast<double>(m)) - shift;  // group mean - K
  const double m2 = fma(-c * inv_n, c, q);
  s.s1 = fma(n, t, s.s1);
  s.s2 += m2 > 0 ? m2 : 0.0;
  s.s2 = fma(n * t, t, s.s2);
  s.l1 += static_cast<double>((lane_abs[0] + lane_abs[1]) + (lane_abs[2] + lane_abs[3]));
  s.sq += static_cast<double>((lane_sq[0] + lane_sq[1]) + (lane_sq[2] + lane_sq[3]));
  return true;
}

// Leading elements of a chunk at `address` read one at a time before its
// first 16-byte boundary: 0 when it starts on one; `count` (all of them)
// when the address is not even a multiple of the element size.
SONDE_HD inline uint64_t ChunkHead(uint64_t address, uint64_t element_size, uint64_t count) {
  const uint64_t misalign = address & 15u;
  if (misalign == 0) return 0;
  if (misalign % element_size != 0) return count;
  const uint64_t head = (16 - misalign) / element_size;
  return head < count ? head : count;
}

// One thread's walk of a chunk of `count` elements (see kChunkThreads):
// whole iterations of 16-byte loads from the chunk's first `head` elements
// (ChunkHead) on, then what is left after them one at a time, then the
// head one at a time.
// `src` reads the chunk: Raw LoadVector(v) (the v-th 16 bytes), Acc
// Unpack(const Raw&, int k) (the k-th element of a vector), Acc Load(i)
// (the i-th element), Source At(i) (the same from element i on). `each`
// sees every element before it is folded (the kernel's histogram).
// V: elements per 16 bytes. A chunk has fewer than 2^32 elements
// (multi_tensor.h: 2,048 chunks a tensor at most, so a larger chunk needs a
// tensor of 2^43 elements).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <typename Acc, int V, typename Source, typename Each>
SONDE_HD inline void FoldChunkThread(ChunkPartial<Acc>& s, const Source& src, uint32_t count,
                                     uint32_t thread, uint32_t head, double shift, Each& each) {
  constexpr uint32_t kPerThread = V * kVectorLoads;
  constexpr uint32_t kG = kPerThread < kGroup ? kPerThread : kGroup;
  static_assert(kPerThread % kG == 0, "whole groups per iteration");
  constexpr uint32_t kPerIteration = kPerThread * kChunkThreads;
  if (head > count) head = count;
  const Source body = src.At(head);
  const uint32_t rest = count - head;
  const uint32_t iterations = rest / kPerIteration;
  for (uint32_t it = 0; it < iterations; ++it) {
    typename Source::Raw raw[kVectorLoads];
    const uint32_t first = it * kVectorLoads * kChunkThreads + thread;
    SONDE_UNROLL
    for (uint32_t j = 0; j < kVectorLoads; ++j) raw[j] = body.LoadVector(first + j * kChunkThreads);
    SONDE_UNROLL
    for (uint32_t g = 0; g < kPerThread / kG; ++g) {
      Acc x[kG];
      SONDE_UNROLL
      for (uint32_t i = 0; i < kG; ++i) {
        const uint32_t e = g * kG + i;
        x[i] = body.Unpack(raw[e / V], e % V);
        each(x[i]);
      }
      AddGroup(s, x, shift);
    }
  }
  // What is left after the vectors, then the head: one loop over both, the
  // head's elements numbered after the rest's, so that nothing of the head
  // but its length is live during the vector loop.
  const uint32_t done = iterations * kPerIteration;
  for (uint32_t i = done + thread; i < count; i += kChunkThreads) {
    const Acc v = i < rest ? body.Load(i) : src.Load(i - rest);
    each(v);
    s.Add(v, shift);
  }
}

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
