// AVX2+FMA block kernels for CpuAccumulate. Compiled with -mavx2 -mfma and
// called only after a run-time CPU check, so this file calls no inline
// function from a header and constructs no header type with member
// initializers (see cpu_stats_kernels.h): everything below is intrinsics,
// plain arithmetic and functions with internal linkage.
//
// Statistics of an F32 block, per 8 elements:
//   min/max      _mm256_min_ps(x, acc) returns acc when x is NaN, so NaNs
//                are skipped for free and infinities count, as in StatsAdd.
//   abs min      integer min of the bits with the sign cleared (the order
//                of non-negative floats); abs max = max(-min, max).
//   sums         in double, around a shift K: s1 = sum(x - K),
//                s2 = sum((x - K)^2) (with FMA), l1 = sum|x|; then
//                mean = K + s1/n, m2 = s2 - s1^2/n, sum = s1 + nK and
//                sum(x^2) = s2 + K (2 s1 + nK) for the block,
//                merged into the running record with Chan's formula by the
//                caller. K is the running mean of the blocks before (the
//                block's own mean, from one more pass, for the first), so
//                s2 - s1^2/n cancels at most about as much as the merge term
//                n_a n_b / n (mean_a - mean_b)^2 that is part of m2 anyway:
//                m2 and sum stay accurate for data far from zero and for a
//                block that starts with an outlier.
// A NaN or an infinity makes the sums non-finite: such a block is redone by
// the masked kernel,
// which counts them and keeps them out of the sums; a block whose smallest
// |x| is zero gets a second, cheap pass that counts zeros. Both are rare in
// real tensors, and the block is still in L1/L2 when they run.
//
// Histograms: the bin of 8 elements at a time from the float bits
// (exponential) or with the same float arithmetic as FixedBinF32 (fixed),
// then scalar increments of interleaved counters (see HistogramLanes).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "stats/cpu_stats_kernels.h"

namespace sonde {
namespace cpu_stats_internal {
namespace {

constexpr uint32_t kF32Inf = 0x7F800000u;

// How far ahead of the loads the statistics loops prefetch: the hardware
// prefetchers alone leave the memory system idle at times when two cores
// stream at once.
constexpr int kPrefetchBytes = 4096;

// ---- horizontal reductions ------------------------------------------------

float HMinPs(__m256 v) {
  __m128 a = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_min_ps(a, _mm_movehl_ps(a, a));
  a = _mm_min_ss(a, _mm_shuffle_ps(a, a, 1));
  return _mm_cvtss_f32(a);
}

float HMaxPs(__m256 v) {
  __m128 a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_max_ps(a, _mm_movehl_ps(a, a));
  a = _mm_max_ss(a, _mm_shuffle_ps(a, a, 1));
  return _mm_cvtss_f32(a);
}

double HMinPd(__m256d v) {
  __m128d a =
      _mm_min_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  a = _mm_min_sd(a, _mm_unpackhi_pd(a, a));
  return _mm_cvtsd_f64(a);
}

double HMaxPd(__m256d v) {
  __m128d a =
      _mm_max_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  a = _mm_max_sd(a, _mm_unpackhi_pd(a, a));
  return _mm_cvtsd_f64(a);
}

double HSumPd(__m256d v) {
  __m128d a =
      _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  a = _mm_add_sd(a, _mm_unpackhi_pd(a, a));
  return _mm_cvtsd_f64(a);
}

uint32_t HMinEpi32(__m256i v) {
  __m128i a =
      _mm_min_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  a = _mm_min_epi32(a, _mm_shuffle_epi32(a, 0x4E));
  a = _mm_min_epi32(a, _mm_shuffle_epi32(a, 0xB1));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(a));
}

uint32_t HMaxEpi32(__m256i v) {
  __m128i a =
      _mm_max_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  a = _mm_max_epi32(a, _mm_shuffle_epi32(a, 0x4E));
  a = _mm_max_epi32(a, _mm_shuffle_epi32(a, 0xB1));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(a));
}

uint64_t HSumEpi32(__m256i v) {
  __m128i a =
      _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  a = _mm_add_epi32(a, _mm_shuffle_epi32(a, 0x4E));
  a = _mm_add_epi32(a, _mm_shuffle_epi32(a, 0xB1));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(a));
}

float BitsToFloat(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// ---- the record of a block -------------------------------------------------

// Writes every field of `out` (no constructor runs here; see the top).
void WriteRecord(StatsAccumulator* out, uint64_t n, uint64_t nan,
                 uint64_t pos_inf, uint64_t neg_inf, uint64_t zeros, double mn,
                 double mx, double amn, double amx, double k, double s1,
                 double s2, double l1) {
  const uint64_t finite = n - nan - pos_inf - neg_inf;
  out->count = n;
  out->finite_count = finite;
  out->nan_count = nan;
  out->pos_inf_count = pos_inf;
  out->neg_inf_count = neg_inf;
  out->zero_count = zeros;
  const bool any = n > nan;
  out->min = any ? mn : 0.0;
  out->max = any ? mx : 0.0;
  out->abs_min = any ? amn : 0.0;
  out->abs_max = any ? amx : 0.0;
  if (finite > 0) {
    const double fn = static_cast<double>(finite);
    out->sum = s1 + fn * k;
    out->l1 = l1;
    // sum(x^2) = sum((x - K)^2) + K (2 sum(x - K) + n K): no cancellation
    // worth the name, as K is near the mean (see the top).
    out->sum_squares = s2 + k * (2 * s1 + fn * k);
    out->mean = k + s1 / fn;
    const double m2 = s2 - s1 * (s1 / fn);
    out->m2 = m2 > 0 ? m2 : 0.0;
  } else {
    out->sum = out->l1 = out->sum_squares = out->mean = out->m2 = 0.0;
  }
}

// ---- F32 statistics
// ----------------------------------------------------------

// Four double accumulators of one half (4 lanes) of the vector.
struct SumsPd {
  __m256d s1, s2, l1;
};

inline void ZeroSums(SumsPd* s) { s->s1 = s->s2 = s->l1 = _mm256_setzero_pd(); }

// d = x - K, already masked for non-finite x.
inline void AddShifted(SumsPd* s, __m256d x, __m256d d, __m256d abs_mask) {
  s->s1 = _mm256_add_pd(s->s1, d);
  s->s2 = _mm256_fmadd_pd(d, d, s->s2);
  s->l1 = _mm256_add_pd(s->l1, _mm256_and_pd(x, abs_mask));
}

inline void FoldSums(const SumsPd& a, const SumsPd& b, double* s1, double* s2,
                     double* l1) {
  *s1 = HSumPd(_mm256_add_pd(a.s1, b.s1));
  *s2 = HSumPd(_mm256_add_pd(a.s2, b.s2));
  *l1 = HSumPd(_mm256_add_pd(a.l1, b.l1));
}

uint64_t CountZerosF32(const float* x, uint32_t n) {
  __m256i zeros = _mm256_setzero_si256();
  const __m256 zero = _mm256_setzero_ps();
  for (uint32_t i = 0; i < n; i += 8) {
    const __m256 eq = _mm256_cmp_ps(_mm256_loadu_ps(x + i), zero, _CMP_EQ_OQ);
    zeros = _mm256_sub_epi32(zeros, _mm256_castps_si256(eq));
  }
  return HSumEpi32(zeros);
}

// The mean of the finite elements of a block (0 if none): the shift of the
// first block of a range, where there is no running mean yet.
double FiniteMeanF32(const float* x, uint32_t n) {
  const __m256 inf = _mm256_set1_ps(BitsToFloat(kF32Inf));
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  __m256i finite = _mm256_setzero_si256();
  for (uint32_t i = 0; i < n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 fin =
        _mm256_cmp_ps(_mm256_and_ps(v, abs_mask), inf, _CMP_LT_OQ);
    const __m256 vs = _mm256_and_ps(v, fin);
    finite = _mm256_sub_epi32(finite, _mm256_castps_si256(fin));
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(vs)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(vs, 1)));
  }
  const uint64_t count = HSumEpi32(finite);
  if (count == 0) return 0.0;
  const double mean =
      HSumPd(_mm256_add_pd(lo, hi)) / static_cast<double>(count);
  return mean - mean == 0 ? mean : 0.0;
}

// A block with NaNs or infinities: everything masked.
void StatsF32Masked(const float* x, uint32_t n, double shift,
                    StatsAccumulator* out) {
  const __m256 inf = _mm256_set1_ps(BitsToFloat(kF32Inf));
  const __m256 ninf = _mm256_set1_ps(-BitsToFloat(kF32Inf));
  const __m256 zero = _mm256_setzero_ps();
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256d abs_mask_pd =
      _mm256_castsi256_pd(_mm256_set1_epi64x(0x7FFFFFFFFFFFFFFFll));
  const __m256d k = _mm256_set1_pd(shift);
  __m256 vmin = inf, vmax = ninf, amin = inf, amax = zero;
  __m256i c_nan = _mm256_setzero_si256(), c_pinf = c_nan, c_ninf = c_nan,
          c_zero = c_nan;
  SumsPd lo, hi;
  ZeroSums(&lo);
  ZeroSums(&hi);
  for (uint32_t i = 0; i < n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 a = _mm256_and_ps(v, abs_mask);
    const __m256 fin = _mm256_cmp_ps(a, inf, _CMP_LT_OQ);
    vmin = _mm256_min_ps(v, vmin);
    vmax = _mm256_max_ps(v, vmax);
    amin = _mm256_min_ps(a, amin);
    amax = _mm256_max_ps(a, amax);
    c_nan = _mm256_sub_epi32(
        c_nan, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
    c_pinf = _mm256_sub_epi32(
        c_pinf, _mm256_castps_si256(_mm256_cmp_ps(v, inf, _CMP_EQ_OQ)));
    c_ninf = _mm256_sub_epi32(
        c_ninf, _mm256_castps_si256(_mm256_cmp_ps(v, ninf, _CMP_EQ_OQ)));
    c_zero = _mm256_sub_epi32(
        c_zero, _mm256_castps_si256(_mm256_cmp_ps(v, zero, _CMP_EQ_OQ)));
    const __m256 vs = _mm256_and_ps(v, fin);  // non-finite -> 0
    const __m256i fin_i = _mm256_castps_si256(fin);
    const __m256d fin_lo = _mm256_castsi256_pd(
        _mm256_cvtepi32_epi64(_mm256_castsi256_si128(fin_i)));
    const __m256d fin_hi = _mm256_castsi256_pd(
        _mm256_cvtepi32_epi64(_mm256_extracti128_si256(fin_i, 1)));
    const __m256d xl = _mm256_cvtps_pd(_mm256_castps256_ps128(vs));
    const __m256d xh = _mm256_cvtps_pd(_mm256_extractf128_ps(vs, 1));
    AddShifted(&lo, xl, _mm256_and_pd(_mm256_sub_pd(xl, k), fin_lo),
               abs_mask_pd);
    AddShifted(&hi, xh, _mm256_and_pd(_mm256_sub_pd(xh, k), fin_hi),
               abs_mask_pd);
  }
  double s1, s2, l1;
  FoldSums(lo, hi, &s1, &s2, &l1);
  WriteRecord(out, n, HSumEpi32(c_nan), HSumEpi32(c_pinf), HSumEpi32(c_ninf),
              HSumEpi32(c_zero), HMinPs(vmin), HMaxPs(vmax), HMinPs(amin),
              HMaxPs(amax), shift, s1, s2, l1);
}

void StatsF32(const float* x, uint32_t n, double shift, StatsAccumulator* out) {
  if (n == 0) {
    WriteRecord(out, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    return;
  }
  if (!(shift - shift == 0)) shift = FiniteMeanF32(x, n);
  const __m256d k = _mm256_set1_pd(shift);
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256d abs_mask_pd =
      _mm256_castsi256_pd(_mm256_set1_epi64x(0x7FFFFFFFFFFFFFFFll));
  __m256 vmin = _mm256_set1_ps(BitsToFloat(kF32Inf));
  __m256 vmax = _mm256_set1_ps(-BitsToFloat(kF32Inf));
  __m256i imin = abs_mask;
  SumsPd lo, hi;
  ZeroSums(&lo);
  ZeroSums(&hi);
  for (uint32_t i = 0; i < n; i += 8) {
    _mm_prefetch(reinterpret_cast<const char*>(x + i) + kPrefetchBytes,
                 _MM_HINT_T0);
    const __m256 v = _mm256_loadu_ps(x + i);
    vmin = _mm256_min_ps(v, vmin);
    vmax = _mm256_max_ps(v, vmax);
    imin = _mm256_min_epi32(_mm256_and_si256(_mm256_castps_si256(v), abs_mask),
                            imin);
    const __m256d xl = _mm256_cvtps_pd(_mm_loadu_ps(x + i));
    const __m256d xh = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
    AddShifted(&lo, xl, _mm256_sub_pd(xl, k), abs_mask_pd);
    AddShifted(&hi, xh, _mm256_sub_pd(xh, k), abs_mask_pd);
  }
  double s1, s2, l1;
  FoldSums(lo, hi, &s1, &s2, &l1);
  // A NaN or an infinity makes the sums NaN or infinite (finite floats
  // cannot: their squares stay far below the double range).
  if (!(s1 - s1 == 0 && s2 - s2 == 0 && l1 - l1 == 0)) {
    StatsF32Masked(x, n, shift, out);
    return;
  }
  const uint32_t abs_min_bits = HMinEpi32(imin);
  const uint64_t zeros = abs_min_bits == 0 ? CountZerosF32(x, n) : 0;
  const float mn = HMinPs(vmin), mx = HMaxPs(vmax);
  WriteRecord(out, n, 0, 0, 0, zeros, mn, mx, BitsToFloat(abs_min_bits),
              -mn > mx ? -mn : mx, shift, s1, s2, l1);
}

bool AllFiniteF32(const float* x, uint32_t n) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  __m256i imax = _mm256_setzero_si256();
  for (uint32_t i = 0; i < n; i += 8) {
    _mm_prefetch(reinterpret_cast<const char*>(x + i) + kPrefetchBytes,
                 _MM_HINT_T0);
    const __m256i v =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    imax = _mm256_max_epi32(_mm256_and_si256(v, abs_mask), imax);
  }
  return HMaxEpi32(imax) < kF32Inf;
}

// ---- F64 statistics
// ----------------------------------------------------------

uint64_t CountZerosF64(const double* x, uint32_t n) {
  uint64_t zeros = 0;
  const __m256d zero = _mm256_setzero_pd();
  for (uint32_t i = 0; i < n; i += 4) {
    const __m256d eq = _mm256_cmp_pd(_mm256_loadu_pd(x + i), zero, _CMP_EQ_OQ);
    zeros += static_cast<uint64_t>(__builtin_popcount(_mm256_movemask_pd(eq)));
  }
  return zeros;
}

double FiniteMeanF64(const double* x, uint32_t n) {
  const __m256d inf = _mm256_set1_pd(static_cast<double>(BitsToFloat(kF32Inf)));
  const __m256d abs_mask =
      _mm256_castsi256_pd(_mm256_set1_epi64x(0x7FFFFFFFFFFFFFFFll));
  __m256d sum = _mm256_setzero_pd();
  uint64_t count = 0;
  for (uint32_t i = 0; i < n; i += 4) {
    const __m256d v = _mm256_loadu_pd(x + i);
    const __m256d fin =
        _mm256_cmp_pd(_mm256_and_pd(v, abs_mask), inf, _CMP_LT_OQ);
    count += static_cast<uint64_t>(__builtin_popcount(_mm256_movemask_pd(fin)));
    sum = _mm256_add_pd(sum, _mm256_and_pd(v, fin));
  }
  if (count == 0) return 0.0;
  const double mean = HSumPd(sum) / static_cast<double>(count);
  return mean - mean == 0 ? mean : 0.0;
}

void StatsF64Masked(const double* x, uint32_t n, double shift,
                    StatsAccumulator* out) {
  const double kd = shift;
  const __m256d inf = _mm256_set1_pd(static_cast<double>(BitsToFloat(kF32Inf)));
  const __m256d ninf = _mm256_sub_pd(_mm256_setzero_pd(), inf);
  const __m256d zero = _mm256_setzero_pd();
  const __m256d abs_mask =
      _mm256_castsi256_pd(_mm256_set1_epi64x(0x7FFFFFFFFFFFFFFFll));
  const __m256d k = _mm256_set1_pd(kd);
  __m256d vmin = inf, vmax = ninf, amin = inf, amax = zero;
  uint64_t c_nan = 0, c_pinf = 0, c_ninf = 0, c_zero = 0;
  SumsPd s;
  ZeroSums(&s);
  for (uint32_t i = 0; i < n; i += 4) {
    const __m256d v = _mm256_loadu_pd(x + i);
    const __m256d a = _mm256_and_pd(v, abs_mask);
    const __m256d fin = _mm256_cmp_pd(a, inf, _CMP_LT_OQ);
    vmin = _mm256_min_pd(v, vmin);
    vmax = _mm256_max_pd(v, vmax);
    amin = _mm256_min_pd(a, amin);
    amax = _mm256_max_pd(a, amax);
    c_nan += __builtin_popcount(
        _mm256_movemask_pd(_mm256_cmp_pd(v, v, _CMP_UNORD_Q)));
    c_pinf += __builtin_popcount(
        _mm256_movemask_pd(_mm256_cmp_pd(v, inf, _CMP_EQ_OQ)));
    c_ninf += __builtin_popcount(
        _mm256_movemask_pd(_mm256_cmp_pd(v, ninf, _CMP_EQ_OQ)));
    c_zero += __builtin_popcount(
        _mm256_movemask_pd(_mm256_cmp_pd(v, zero, _CMP_EQ_OQ)));
    AddShifted(&s, _mm256_and_pd(v, fin),
               _mm256_and_pd(_mm256_sub_pd(v, k), fin), abs_mask);
  }
  WriteRecord(out, n, c_nan, c_pinf, c_ninf, c_zero, HMinPd(vmin), HMaxPd(vmax),
              HMinPd(amin), HMaxPd(amax), kd, HSumPd(s.s1), HSumPd(s.s2),
              HSumPd(s.l1));
}

void StatsF64(const double* x, uint32_t n, double shift,
              StatsAccumulator* out) {
  if (n == 0) {
    WriteRecord(out, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    return;
  }
  if (!(shift - shift == 0)) shift = FiniteMeanF64(x, n);
  const double kd = shift;
  const __m256d k = _mm256_set1_pd(kd);
  const __m256d inf = _mm256_set1_pd(static_cast<double>(BitsToFloat(kF32Inf)));
  const __m256d abs_mask =
      _mm256_castsi256_pd(_mm256_set1_epi64x(0x7FFFFFFFFFFFFFFFll));
  __m256d vmin = inf, vmax = _mm256_sub_pd(_mm256_setzero_pd(), inf);
  __m256d amin = inf, amax = _mm256_setzero_pd(), bad = _mm256_setzero_pd();
  SumsPd s0, s1v;
  ZeroSums(&s0);
  ZeroSums(&s1v);
  for (uint32_t i = 0; i < n; i += 8) {
    const __m256d v0 = _mm256_loadu_pd(x + i);
    const __m256d v1 = _mm256_loadu_pd(x + i + 4);
    vmin = _mm256_min_pd(_mm256_min_pd(v0, v1), vmin);
    vmax = _mm256_max_pd(_mm256_max_pd(v0, v1), vmax);
    const __m256d a0 = _mm256_and_pd(v0, abs_mask);
    const __m256d a1 = _mm256_and_pd(v1, abs_mask);
    amin = _mm256_min_pd(_mm256_min_pd(a0, a1), amin);
    amax = _mm256_max_pd(_mm256_max_pd(a0, a1), amax);
    // Not less than +inf: an infinity or (unordered) a NaN.
    bad = _mm256_or_pd(bad, _mm256_cmp_pd(a0, inf, _CMP_NLT_UQ));
    bad = _mm256_or_pd(bad, _mm256_cmp_pd(a1, inf, _CMP_NLT_UQ));
    AddShifted(&s0, v0, _mm256_sub_pd(v0, k), abs_mask);
    AddShifted(&s1v, v1, _mm256_sub_pd(v1, k), abs_mask);
  }
  if (_mm256_movemask_pd(bad) != 0) {
    StatsF64Masked(x, n, shift, out);
    return;
  }
  const double abs_min = HMinPd(amin);
  const uint64_t zeros = abs_min == 0 ? CountZerosF64(x, n) : 0;
  double s1, s2, l1;
  FoldSums(s0, s1v, &s1, &s2, &l1);
  WriteRecord(out, n, 0, 0, 0, zeros, HMinPd(vmin), HMaxPd(vmax), abs_min,
              HMaxPd(amax), kd, s1, s2, l1);
}

bool AllFiniteF64(const double* x, uint32_t n) {
  const __m256d inf = _mm256_set1_pd(static_cast<double>(BitsToFloat(kF32Inf)));
  const __m256d abs_mask =
      _mm256_castsi256_pd(_mm256_set1_epi64x(0x7FFFFFFFFFFFFFFFll));
  __m256d bad = _mm256_setzero_pd();
  for (uint32_t i = 0; i < n; i += 4) {
    const __m256d a = _mm256_and_pd(_mm256_loadu_pd(x + i), abs_mask);
    bad = _mm256_or_pd(bad, _mm256_cmp_pd(a, inf, _CMP_NLT_UQ));
  }
  return _mm256_movemask_pd(bad) == 0;
}

// ---- histograms
// --------------------------------------------------------------

constexpr int kLaneShift = kHistogramLanes == 8   ? 3
                           : kHistogramLanes == 4 ? 2
                                                  : 1;
static_assert(1u << kLaneShift == kHistogramLanes, "lanes must be 2, 4 or 8");

// Per-spec constants of the 8-lane bin computation.
struct BinConsts {
  // Exponential.
  __m128i shift;   // 23 - sub_bits (F32) or 52 - sub_bits (F64)
  __m256i base;    // (min_exponent + bias) << sub_bits
  __m256i base64;  // same, 64-bit lanes (F64)
  __m256i per_sign;
  __m256i centre;
  __m256i above_centre;  // centre + 1
  // Fixed.
  __m256 lo_f, hi_f, scale_f, last_f, below_f, above_f;
  __m256d lo, hi, scale, last, below, above;
  // Both.
  __m256i sink;
  __m256i lane;
};

void MakeConsts(const HistogramParams& p, bool f64, BinConsts* c) {
  const int32_t bias = f64 ? 1023 : 127;
  c->shift = _mm_cvtsi32_si128(static_cast<int>((f64 ? 52 : 23) - p.sub_bits));
  const int32_t base = (p.min_exponent + bias) * (1 << p.sub_bits);
  c->base = _mm256_set1_epi32(base);
  c->base64 = _mm256_set1_epi64x(base);
  c->per_sign = _mm256_set1_epi32(static_cast<int32_t>(p.per_sign));
  c->centre = _mm256_set1_epi32(static_cast<int32_t>(p.per_sign + 1));
  c->above_centre = _mm256_set1_epi32(static_cast<int32_t>(p.per_sign + 2));
  const uint32_t bins = p.bins == 0 ? 1 : p.bins;
  c->lo_f = _mm256_set1_ps(p.lo_f);
  c->hi_f = _mm256_set1_ps(p.hi_f);
  c->scale_f = _mm256_set1_ps(p.scale_f);
  c->last_f = _mm256_set1_ps(static_cast<float>(bins - 1));
  c->below_f = _mm256_set1_ps(-1.0f);
  c->above_f = _mm256_set1_ps(static_cast<float>(bins));
  c->lo = _mm256_set1_pd(p.lo);
  c->hi = _mm256_set1_pd(p.hi);
  c->scale = _mm256_set1_pd(p.scale);
  c->last = _mm256_set1_pd(static_cast<double>(bins - 1));
  c->below = _mm256_set1_pd(-1.0);
  c->above = _mm256_set1_pd(static_cast<double>(bins));
  c->sink = _mm256_set1_epi32(static_cast<int32_t>(p.count));
  c->lane = _mm256_and_si256(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                             _mm256_set1_epi32(kHistogramLanes - 1));
}

// Exponential bins from the biased-exponent-and-top-mantissa field `u`
// (already minus `base`) and the sign in the top bit of `sign`: see
// ExpBinFromParts. u < 0 is below the range (centre); u >= per_sign above.
inline __m256i ExpBins(const BinConsts& c, __m256i u, __m256i sign) {
  const __m256i uc = _mm256_min_epi32(u, c.per_sign);
  const __m256i pos = _mm256_add_epi32(uc, c.above_centre);
  const __m256i neg = _mm256_sub_epi32(c.per_sign, uc);
  __m256i b = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(pos),
                                                   _mm256_castsi256_ps(neg),
                                                   _mm256_castsi256_ps(sign)));
  return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(b),
                                              _mm256_castsi256_ps(c.centre),
                                              _mm256_castsi256_ps(u)));
}

// FixedBinF32 for 8 finite elements: floor(min(t, bins - 1)) equals
// min((uint32)t, bins - 1) for the t >= 0 of in-range elements.
inline __m256i FixedBinsF32(const BinConsts& c, __m256 v) {
  __m256 t = _mm256_mul_ps(_mm256_sub_ps(v, c.lo_f), c.scale_f);
  t = _mm256_min_ps(t, c.last_f);
  t = _mm256_blendv_ps(t, c.below_f, _mm256_cmp_ps(v, c.lo_f, _CMP_LT_OQ));
  t = _mm256_blendv_ps(t, c.above_f, _mm256_cmp_ps(v, c.hi_f, _CMP_GT_OQ));
  return _mm256_add_epi32(_mm256_cvttps_epi32(t), _mm256_set1_epi32(1));
}

inline __m128i FixedBinsF64(const BinConsts& c, __m256d v) {
  __m256d t = _mm256_mul_pd(_mm256_sub_pd(v, c.lo), c.scale);
  t = _mm256_min_pd(t, c.last);
  t = _mm256_blendv_pd(t, c.below, _mm256_cmp_pd(v, c.lo, _CMP_LT_OQ));
  t = _mm256_blendv_pd(t, c.above, _mm256_cmp_pd(v, c.hi, _CMP_GT_OQ));
  return _mm_add_epi32(_mm256_cvttpd_epi32(t), _mm_set1_epi32(1));
}

// Increments the 8 counters `bin * kHistogramLanes + lane`. The indices
// leave the vector as four 64-bit halves (vmovq/vpextrq): fewer transfers
// than eight vpextrd, and no 32-byte store reloaded as 4-byte loads, which
// the store-forwarding logic handles badly.
inline void Increment(const BinConsts& c, __m256i bins, uint32_t* counters) {
  const __m256i idx =
      _mm256_add_epi32(_mm256_slli_epi32(bins, kLaneShift), c.lane);
  const __m128i lo = _mm256_castsi256_si128(idx);
  const __m128i hi = _mm256_extracti128_si256(idx, 1);
  const uint64_t t0 = static_cast<uint64_t>(_mm_cvtsi128_si64(lo));
  const uint64_t t1 = static_cast<uint64_t>(_mm_extract_epi64(lo, 1));
  const uint64_t t2 = static_cast<uint64_t>(_mm_cvtsi128_si64(hi));
  const uint64_t t3 = static_cast<uint64_t>(_mm_extract_epi64(hi, 1));
  ++counters[static_cast<uint32_t>(t0)];
  ++counters[t0 >> 32];
  ++counters[static_cast<uint32_t>(t1)];
  ++counters[t1 >> 32];
  ++counters[static_cast<uint32_t>(t2)];
  ++counters[t2 >> 32];
  ++counters[static_cast<uint32_t>(t3)];
  ++counters[t3 >> 32];
}

// For blocks with NaNs or infinities: sends them to the sink and counts
// them. `a` holds |x| as bits (F32 layout), `sign` the sign bits.
inline __m256i SinkNonFiniteF32(const BinConsts& c, __m256i bins, __m256i a,
                                __m256i sign, HistogramLanes* h) {
  const __m256i inf = _mm256_set1_epi32(static_cast<int32_t>(kF32Inf));
  const __m256i fin = _mm256_cmpgt_epi32(inf, a);
  const __m256i is_inf = _mm256_cmpeq_epi32(a, inf);
  const int nan_bits =
      _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(a, inf)));
  const int inf_bits = _mm256_movemask_ps(_mm256_castsi256_ps(is_inf));
  const int neg_bits = _mm256_movemask_ps(_mm256_castsi256_ps(sign));
  h->nan += static_cast<uint64_t>(__builtin_popcount(nan_bits));
  h->pos_inf += static_cast<uint64_t>(__builtin_popcount(inf_bits & ~neg_bits));
  h->neg_inf += static_cast<uint64_t>(__builtin_popcount(inf_bits & neg_bits));
  return _mm256_blendv_epi8(c.sink, bins, fin);
}

template <bool kExponential, bool kAllFinite>
void HistF32Impl(const float* x, uint32_t n, HistogramLanes* h) {
  BinConsts c;
  MakeConsts(h->params, /*f64=*/false, &c);
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  uint32_t* counters = h->counters;
  for (uint32_t i = 0; i < n; i += 8) {
    const __m256i bits =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    const __m256i a = _mm256_and_si256(bits, abs_mask);
    __m256i b;
    if (kExponential) {
      b = ExpBins(c, _mm256_sub_epi32(_mm256_srl_epi32(a, c.shift), c.base),
                  bits);
    } else {
      b = FixedBinsF32(c, _mm256_castsi256_ps(bits));
    }
    if (!kAllFinite) b = SinkNonFiniteF32(c, b, a, bits, h);
    Increment(c, b, counters);
  }
}

void HistF32(const float* x, uint32_t n, bool all_finite, HistogramLanes* h) {
  if (h->params.kind == kHistogramExponential) {
    all_finite ? HistF32Impl<true, true>(x, n, h)
               : HistF32Impl<true, false>(x, n, h);
  } else {
    all_finite ? HistF32Impl<false, true>(x, n, h)
               : HistF32Impl<false, false>(x, n, h);
  }
}

// Narrows the low (or high) 32 bits of four 64-bit lanes of two vectors into
// one vector of 8 32-bit lanes, in element order.
inline __m256i NarrowLow(__m256i a, __m256i b) {
  const __m256i idx = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  const __m256i pa = _mm256_permutevar8x32_epi32(a, idx);
  const __m256i pb = _mm256_permutevar8x32_epi32(b, idx);
  return _mm256_permute2x128_si256(pa, pb, 0x20);
}

inline __m256i NarrowHigh(__m256i a, __m256i b) {
  const __m256i idx = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  const __m256i pa = _mm256_permutevar8x32_epi32(a, idx);
  const __m256i pb = _mm256_permutevar8x32_epi32(b, idx);
  return _mm256_permute2x128_si256(pa, pb, 0x31);
}

template <bool kExponential, bool kAllFinite>
void HistF64Impl(const double* x, uint32_t n, HistogramLanes* h) {
  BinConsts c;
  MakeConsts(h->params, /*f64=*/true, &c);
  const __m256i abs_mask = _mm256_set1_epi64x(0x7FFFFFFFFFFFFFFFll);
  const __m256i inf64 = _mm256_set1_epi64x(0x7FF0000000000000ll);
  uint32_t* counters = h->counters;
  for (uint32_t i = 0; i < n; i += 8) {
    const __m256i b0 =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    const __m256i b1 =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 4));
    const __m256i sign = NarrowHigh(b0, b1);
    const __m256i a0 = _mm256_and_si256(b0, abs_mask);
    const __m256i a1 = _mm256_and_si256(b1, abs_mask);
    __m256i b;
    if (kExponential) {
      const __m256i u0 =
          _mm256_sub_epi64(_mm256_srl_epi64(a0, c.shift), c.base64);
      const __m256i u1 =
          _mm256_sub_epi64(_mm256_srl_epi64(a1, c.shift), c.base64);
      b = ExpBins(c, NarrowLow(u0, u1), sign);
    } else {
      b = _mm256_set_m128i(FixedBinsF64(c, _mm256_castsi256_pd(b1)),
                           FixedBinsF64(c, _mm256_castsi256_pd(b0)));
    }
    if (!kAllFinite) {
      // 64-bit compares of |x| with the bits of +inf, narrowed to 32 bits.
      const __m256i nan = NarrowLow(_mm256_cmpgt_epi64(a0, inf64),
                                    _mm256_cmpgt_epi64(a1, inf64));
      const __m256i inf = NarrowLow(_mm256_cmpeq_epi64(a0, inf64),
                                    _mm256_cmpeq_epi64(a1, inf64));
      const int nan_bits = _mm256_movemask_ps(_mm256_castsi256_ps(nan));
      const int inf_bits = _mm256_movemask_ps(_mm256_castsi256_ps(inf));
      const int neg_bits = _mm256_movemask_ps(_mm256_castsi256_ps(sign));
      h->nan += static_cast<uint64_t>(__builtin_popcount(nan_bits));
      h->pos_inf +=
          static_cast<uint64_t>(__builtin_popcount(inf_bits & ~neg_bits));
      h->neg_inf +=
          static_cast<uint64_t>(__builtin_popcount(inf_bits & neg_bits));
      b = _mm256_blendv_epi8(b, c.sink, _mm256_or_si256(nan, inf));
    }
    Increment(c, b, counters);
  }
}

void HistF64(const double* x, uint32_t n, bool all_finite, HistogramLanes* h) {
  if (h->params.kind == kHistogramExponential) {
    all_finite ? HistF64Impl<true, true>(x, n, h)
               : HistF64Impl<true, false>(x, n, h);
  } else {
    all_finite ? HistF64Impl<false, true>(x, n, h)
               : HistF64Impl<false, false>(x, n, h);
  }
}

// ---- 16-bit floats
// -------------------------------------------------------------

void F16ToF32(const uint16_t* x, uint32_t n, float* out) {
  const __m256i sign_mask = _mm256_set1_epi32(0x8000);
  const __m256i em_mask = _mm256_set1_epi32(0x7FFF);
  const __m256i max_finite = _mm256_set1_epi32(0x7BFF);
  const __m256i inf = _mm256_set1_epi32(static_cast<int32_t>(kF32Inf));
  // 2^112: moves a half's exponent (bias 15) to a float's (bias 127);
  // exact for normal and subnormal halves alike.
  const __m256 rebias = _mm256_set1_ps(BitsToFloat(0x77800000u));
  for (uint32_t i = 0; i < n; i += 8) {
    const __m256i h = _mm256_cvtepu16_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(h, sign_mask), 16);
    const __m256i em = _mm256_and_si256(h, em_mask);
    const __m256i shifted = _mm256_slli_epi32(em, 13);
    const __m256 scaled = _mm256_mul_ps(_mm256_castsi256_ps(shifted), rebias);
    const __m256i special = _mm256_cmpgt_epi32(em, max_finite);  // Inf or NaN
    const __m256i bits = _mm256_blendv_epi8(
        _mm256_castps_si256(scaled), _mm256_or_si256(shifted, inf), special);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm256_or_si256(bits, sign));
  }
}

void BF16ToF32(const uint16_t* x, uint32_t n, float* out) {
  for (uint32_t i = 0; i < n; i += 8) {
    const __m256i h = _mm256_cvtepu16_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm256_slli_epi32(h, 16));
  }
}

}  // namespace

const CpuBlockKernels& Avx2Kernels() {
  static const CpuBlockKernels kernels = {
      "avx2",       StatsF32,     StatsF64, HistF32,   HistF64,
      AllFiniteF32, AllFiniteF64, F16ToF32, BF16ToF32,
  };
  return kernels;
}

}  // namespace cpu_stats_internal
}  // namespace sonde
