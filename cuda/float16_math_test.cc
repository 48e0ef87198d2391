#include "cuda/float16_math.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "common/dtype.h"
#include "gtest/gtest.h"

namespace sonde {
namespace {

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

TEST(Float16MathTest, WideningMatchesTheCodecForEveryValue) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float a = SondeHalfToFloat(static_cast<uint16_t>(h));
    const float b = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(b)) {
      EXPECT_TRUE(std::isnan(a)) << h;
    } else {
      EXPECT_EQ(Bits(a), Bits(b)) << h;
    }
    EXPECT_EQ(Bits(SondeBf16ToFloat(static_cast<uint16_t>(h))),
              Bits(BFloat16ToFloat(static_cast<uint16_t>(h))));
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
    if (!std::isnan(g)) EXPECT_EQ(SondeFloatToBf16(g), h) << h;
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
    if (err == other_err) ASSERT_EQ(got & 1, 0) << "tie not to even for " << f;
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
