// Conversions between float and the two 16-bit float formats, usable on the
// host and the device (no dependence on cuda_fp16.h), so that a kernel and
// the CPU read and write F16/BF16 identically. Narrowing rounds to nearest,
// ties to even; NaN stays NaN; overflow goes to infinity.
#ifndef SONDE_MATH_FLOAT16_MATH_H_
#define SONDE_MATH_FLOAT16_MATH_H_

#include <cstdint>
#include <cstring>

#include "math/stats_math.h"

namespace sonde {

SONDE_HD inline float SondeBf16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

SONDE_HD inline float SondeHalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1fu) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal half (mant * 2^-24): normalise into a float.
    exp = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

SONDE_HD inline uint16_t SondeFloatToBf16(float f) {
  uint32_t bits;
  memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
  }
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

SONDE_HD inline uint16_t SondeFloatToHalf(float f) {
  uint32_t bits;
  memcpy(&bits, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: Inf
  const int32_t exp = static_cast<int32_t>(abs >> 23) - 127;
  if (exp >= -14) {
    // Normal half: keep 10 mantissa bits, round the 13 dropped ones.
    const uint32_t rebased = abs - (112u << 23);
    const uint32_t rounding = 0xfffu + ((rebased >> 13) & 1u);
    return sign | static_cast<uint16_t>((rebased + rounding) >> 13);
  }
  if (exp < -25) return sign;  // below half the smallest subnormal: zero
  // Subnormal half: value = m * 2^-24 with m = round(1.mant * 2^(exp + 24)).
  const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t shift = static_cast<uint32_t>(-exp - 1);  // 14..24
  const uint32_t kept = mant >> shift;
  const uint32_t rest = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  const uint32_t rounded = kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
  return sign | static_cast<uint16_t>(rounded);
}

}  // namespace sonde

#endif  // SONDE_MATH_FLOAT16_MATH_H_
