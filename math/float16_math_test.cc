#include "math/float16_math.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace sonde {
namespace {

// The formats' definitions, written with ldexp: value = (-1)^s * 2^(e-bias)
// * 1.m for normal numbers, 2^(1-bias) * 0.m for subnormals.
double HalfByDefinition(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  if (e == 0x1f) return m ? std::nan("") : sign * std::numeric_limits<double>::infinity();
  if (e == 0) return sign * std::ldexp(m / 1024.0, -14);
  return sign * std::ldexp(1.0 + m / 1024.0, e - 15);
}

double BFloatByDefinition(uint16_t b) {
  const int sign = (b >> 15) ? -1 : 1;
  const int e = (b >> 7) & 0xff;
  const int m = b & 0x7f;
  if (e == 0xff) return m ? std::nan("") : sign * std::numeric_limits<double>::infinity();
  if (e == 0) return sign * std::ldexp(m / 128.0, -126);
  return sign * std::ldexp(1.0 + m / 128.0, e - 127);
}

TEST(Float16MathTest, WideningFollowsTheDefinitionsForEveryValue) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const uint16_t v = static_cast<uint16_t>(h);
    const double want_h = HalfByDefinition(v);
    const double want_b = BFloatByDefinition(v);
    if (std::isnan(want_h)) {
      EXPECT_TRUE(std::isnan(SondeHalfToFloat(v))) << h;
    } else {
      EXPECT_EQ(SondeHalfToFloat(v), want_h) << h;
      EXPECT_EQ(std::signbit(SondeHalfToFloat(v)), (h >> 15) != 0) << h;
    }
    if (std::isnan(want_b)) {
      EXPECT_TRUE(std::isnan(SondeBf16ToFloat(v))) << h;
    } else {
      EXPECT_EQ(SondeBf16ToFloat(v), want_b) << h;
    }
  }
}

TEST(Float16MathTest, RoundTripsEveryHalfAndBFloat) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float f = SondeHalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(SondeHalfToFloat(SondeFloatToHalf(f))));
      continue;
    }
    EXPECT_EQ(SondeFloatToHalf(f), h) << h;
    const float g = SondeBf16ToFloat(static_cast<uint16_t>(h));
    if (!std::isnan(g)) {
      EXPECT_EQ(SondeFloatToBf16(g), h) << h;
    }
  }
}

// Narrowing picks the nearest representable value, ties to even.
template <uint16_t (*Narrow)(float), float (*Widen)(uint16_t)>
void CheckNearest(float f) {
  const uint16_t got = Narrow(f);
  const double err = std::fabs(static_cast<double>(Widen(got)) - f);
  for (int d : {-1, 1}) {
    const uint16_t other = static_cast<uint16_t>(got + d);
    const float w = Widen(other);
    if (std::isnan(w) || ((other ^ got) & 0x8000)) continue;
    const double other_err = std::fabs(static_cast<double>(w) - f);
    ASSERT_LE(err, other_err) << f;
    if (err == other_err) {
      ASSERT_EQ(got & 1, 0) << "tie not to even for " << f;
    }
  }
}

TEST(Float16MathTest, NarrowingRoundsToNearestEven) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    uint32_t b = bits(rng);
    float f;
    std::memcpy(&f, &b, 4);
    if (!std::isfinite(f)) continue;
    if (std::fabs(f) < 65504.0f) CheckNearest<SondeFloatToHalf, SondeHalfToFloat>(f);
    if (std::fabs(f) < 3.3e38f) CheckNearest<SondeFloatToBf16, SondeBf16ToFloat>(f);
  }
  EXPECT_EQ(SondeFloatToHalf(65520.0f), 0x7c00);  // halfway to 2^16 rounds up to Inf
  EXPECT_EQ(SondeFloatToHalf(-1e10f), 0xfc00);
  EXPECT_EQ(SondeFloatToHalf(std::ldexp(1.0f, -25)), 0);          // tie to even zero
  EXPECT_EQ(SondeFloatToHalf(std::ldexp(1.5f, -25)), 1);          // above the tie
  EXPECT_TRUE(std::isnan(SondeBf16ToFloat(SondeFloatToBf16(std::numeric_limits<float>::quiet_NaN()))));
}

}  // namespace
}  // namespace sonde
