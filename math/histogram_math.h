// Histogram bins whose edges never depend on the data, so that histograms
// of chunks, steps and workers merge exactly by adding counts. Shared by
// the CPU path and the CUDA kernels: every function is usable on the host
// and the device, and maps the same value to the same bin on both.
//
// Two layouts, both with the same framing of `BinCount(spec)` counters:
//
//   Fixed:       [x < lo] [bin 0] ... [bin bins-1] [x > hi]
//                Bin i covers [lo + i*w, lo + (i+1)*w), w = (hi - lo) / bins,
//                computed as floor((x - lo) * (bins / (hi - lo))) in the
//                element's precision (float for F32/F16/BF16, double for
//                F64), clamped so that x == hi lands in the last bin.
//   Exponential: sign-aware, log2-spaced with 2^sub_bits linear sub-bins
//                per octave, for |x| in [2^min_exponent, 2^max_exponent):
//                [x <= -2^max] [negative octaves, largest |x| first]
//                [|x| < 2^min, zero included] [positive octaves] [x >= 2^max]
//                The bin of x is read off its IEEE bits (exponent and the
//                top sub_bits mantissa bits), so it is exact and identical
//                for a value held as F16, BF16, F32 or F64.
//
// NaN, +Inf and -Inf are never in the counters; they are counted apart, so
// the counters always sum to the number of finite elements.
#ifndef SONDE_MATH_HISTOGRAM_MATH_H_
#define SONDE_MATH_HISTOGRAM_MATH_H_

#include <cstdint>
#include <cstring>

#include "math/stats_math.h"

namespace sonde {

enum HistogramKind : int32_t {
  kHistogramNone = 0,
  kHistogramFixed = 1,
  kHistogramExponential = 2,
};

// Limits that keep float and double bit paths equivalent and the record
// small on the wire.
inline constexpr int32_t kHistogramMinExponent = -126;
inline constexpr int32_t kHistogramMaxExponent = 127;
inline constexpr uint32_t kHistogramMaxSubBits = 4;
inline constexpr uint32_t kHistogramMaxBins = 16384;

struct HistogramSpecHD {
  int32_t kind = kHistogramNone;
  // Fixed.
  double lo = 0;
  double hi = 0;
  uint32_t bins = 0;
  // Exponential.
  int32_t min_exponent = 0;
  int32_t max_exponent = 0;
  uint32_t sub_bits = 0;
};

// Specs by their parameters (checked later by ValidateSpec).
inline HistogramSpecHD FixedSpec(double lo, double hi, uint32_t bins) {
  HistogramSpecHD s;
  s.kind = kHistogramFixed;
  s.lo = lo;
  s.hi = hi;
  s.bins = bins;
  return s;
}

inline HistogramSpecHD ExponentialSpec(int32_t min_exponent, int32_t max_exponent,
                                       uint32_t sub_bits) {
  HistogramSpecHD s;
  s.kind = kHistogramExponential;
  s.min_exponent = min_exponent;
  s.max_exponent = max_exponent;
  s.sub_bits = sub_bits;
  return s;
}

// The default exponential layout: 2^-32 .. 2^32 with 4 bins per octave
// (neighbouring edges at most 25% apart), 515 counters.
inline HistogramSpecHD DefaultExponentialSpec() { return ExponentialSpec(-32, 32, 2); }

SONDE_HD inline uint32_t HistogramBinCount(const HistogramSpecHD& s) {
  if (s.kind == kHistogramFixed) return s.bins + 2;
  if (s.kind == kHistogramExponential) {
    const uint32_t per_sign =
        static_cast<uint32_t>(s.max_exponent - s.min_exponent) << s.sub_bits;
    return 2 * per_sign + 3;
  }
  return 0;
}

// What a histogram needs precomputed once per spec (not per element).
struct HistogramParams {
  int32_t kind = kHistogramNone;
  uint32_t count = 0;  // counters
  // Fixed.
  double lo = 0;
  double hi = 0;
  double scale = 0;  // bins / (hi - lo)
  float lo_f = 0;
  float hi_f = 0;
  float scale_f = 0;
  uint32_t bins = 0;
  // Exponential.
  int32_t min_exponent = 0;
  int32_t max_exponent = 0;
  uint32_t sub_bits = 0;
  uint32_t per_sign = 0;
};

SONDE_HD inline HistogramParams MakeHistogramParams(const HistogramSpecHD& s) {
  HistogramParams p;
  p.kind = s.kind;
  p.count = HistogramBinCount(s);
  p.lo = s.lo;
  p.hi = s.hi;
  p.bins = s.bins;
  if (s.kind == kHistogramFixed && s.hi > s.lo) {
    p.scale = static_cast<double>(s.bins) / (s.hi - s.lo);
  }
  p.lo_f = static_cast<float>(s.lo);
  p.hi_f = static_cast<float>(s.hi);
  p.scale_f = static_cast<float>(p.scale);
  p.min_exponent = s.min_exponent;
  p.max_exponent = s.max_exponent;
  p.sub_bits = s.sub_bits;
  p.per_sign = static_cast<uint32_t>(s.max_exponent - s.min_exponent) << s.sub_bits;
  return p;
}

// The three places a value can go besides a counter.
inline constexpr uint32_t kBinNan = 0xFFFFFFFFu;
inline constexpr uint32_t kBinPosInf = 0xFFFFFFFEu;
inline constexpr uint32_t kBinNegInf = 0xFFFFFFFDu;

// Exponential bin from an unbiased exponent, the top sub_bits mantissa bits
// and the sign of a finite value (|x| = 1.m * 2^exponent; exponent below
// the range means the centre bin).
SONDE_HD inline uint32_t ExpBinFromParts(const HistogramParams& p, bool negative,
                                         int32_t exponent, uint32_t top_bits) {
  const uint32_t centre = p.per_sign + 1;
  if (exponent < p.min_exponent) return centre;
  if (exponent >= p.max_exponent) return negative ? 0u : 2 * p.per_sign + 2;
  const uint32_t k =
      (static_cast<uint32_t>(exponent - p.min_exponent) << p.sub_bits) | top_bits;
  return negative ? p.per_sign - k : centre + 1 + k;
}

SONDE_HD inline uint32_t ExpBinF32(const HistogramParams& p, float x) {
  uint32_t bits;
  memcpy(&bits, &x, 4);
  const uint32_t biased = (bits >> 23) & 0xFFu;
  if (biased == 0xFFu) {
    if (bits & 0x7FFFFFu) return kBinNan;
    return (bits >> 31) ? kBinNegInf : kBinPosInf;
  }
  // Zero and denormals have biased exponent 0, below any allowed minimum.
  const int32_t exponent = static_cast<int32_t>(biased) - 127;
  const uint32_t top = p.sub_bits == 0 ? 0u : (bits & 0x7FFFFFu) >> (23 - p.sub_bits);
  return ExpBinFromParts(p, (bits >> 31) != 0, exponent, top);
}

SONDE_HD inline uint32_t ExpBinF64(const HistogramParams& p, double x) {
  uint64_t bits;
  memcpy(&bits, &x, 8);
  const uint32_t biased = static_cast<uint32_t>((bits >> 52) & 0x7FFu);
  if (biased == 0x7FFu) {
    if (bits & 0xFFFFFFFFFFFFFull) return kBinNan;
    return (bits >> 63) ? kBinNegInf : kBinPosInf;
  }
  const int32_t exponent = biased == 0 ? -1023 - 52 : static_cast<int32_t>(biased) - 1023;
  const uint32_t top =
      p.sub_bits == 0 ? 0u
                      : static_cast<uint32_t>((bits & 0xFFFFFFFFFFFFFull) >> (52 - p.sub_bits));
  return ExpBinFromParts(p, (bits >> 63) != 0, exponent, top);
}

SONDE_HD inline uint32_t FixedBinF32(const HistogramParams& p, float x) {
  if (x != x) return kBinNan;
  if (x - x != x - x) return x > 0 ? kBinPosInf : kBinNegInf;
  if (x < p.lo_f) return 0;
  if (x > p.hi_f) return p.bins + 1;
  const float t = (x - p.lo_f) * p.scale_f;
  uint32_t i = static_cast<uint32_t>(t);  // t >= 0: truncation is floor
  if (i >= p.bins) i = p.bins - 1;
  return i + 1;
}

SONDE_HD inline uint32_t FixedBinF64(const HistogramParams& p, double x) {
  if (x != x) return kBinNan;
  if (x - x != x - x) return x > 0 ? kBinPosInf : kBinNegInf;
  if (x < p.lo) return 0;
  if (x > p.hi) return p.bins + 1;
  const double t = (x - p.lo) * p.scale;
  uint32_t i = static_cast<uint32_t>(t);
  if (i >= p.bins) i = p.bins - 1;
  return i + 1;
}

// The bin of an element already widened to float (F32, F16, BF16) or kept
// as double (F64).
SONDE_HD inline uint32_t HistogramBinF32(const HistogramParams& p, float x) {
  return p.kind == kHistogramFixed ? FixedBinF32(p, x) : ExpBinF32(p, x);
}
SONDE_HD inline uint32_t HistogramBinF64(const HistogramParams& p, double x) {
  return p.kind == kHistogramFixed ? FixedBinF64(p, x) : ExpBinF64(p, x);
}

}  // namespace sonde

#endif  // SONDE_MATH_HISTOGRAM_MATH_H_
