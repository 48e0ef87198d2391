#include "common/dtype.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "gtest/gtest.h"
#include "math/float16_math.h"
#include "tests/testing/status_matchers.h"

namespace sonde {
namespace {

using ::sonde::testing::StatusIs;

TEST(DType, SizesMatchElementWidths) {
  EXPECT_EQ(DTypeSize(v1::DTYPE_F32), 4u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_F16), 2u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_BF16), 2u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_F64), 8u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_I8), 1u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_I64), 8u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_BOOL), 1u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_UNSPECIFIED), 0u);
  EXPECT_EQ(DTypeSize(static_cast<v1::DType>(99)), 0u);
}

TEST(DType, ParsesNumpyAndShortNames) {
  EXPECT_EQ(*ParseDType("float32"), v1::DTYPE_F32);
  EXPECT_EQ(*ParseDType("F16"), v1::DTYPE_F16);
  EXPECT_EQ(*ParseDType("bf16"), v1::DTYPE_BF16);
  EXPECT_EQ(*ParseDType("int64"), v1::DTYPE_I64);
  EXPECT_THAT(ParseDType("complex64"),
              StatusIs(absl::StatusCode::kInvalidArgument, "complex64"));
}

TEST(DType, TensorBytesChecksShapes) {
  EXPECT_EQ(*TensorBytes(v1::DTYPE_F32, {}), 4u);  // scalar
  EXPECT_EQ(*TensorBytes(v1::DTYPE_F32, {2, 3}), 24u);
  EXPECT_EQ(*TensorBytes(v1::DTYPE_F64, {0, 5}), 0u);
  EXPECT_THAT(TensorBytes(v1::DTYPE_F32, {2, -1}),
              StatusIs(absl::StatusCode::kInvalidArgument, "negative"));
  EXPECT_THAT(TensorBytes(v1::DTYPE_F32, {int64_t{1} << 40, int64_t{1} << 40}),
              StatusIs(absl::StatusCode::kInvalidArgument, "overflows"));
  EXPECT_THAT(TensorBytes(v1::DTYPE_UNSPECIFIED, {1}),
              StatusIs(absl::StatusCode::kInvalidArgument, "dtype"));
}

TEST(DType, HalfConversionIsExact) {
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xc000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(HalfToFloat(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7e00)));
  EXPECT_TRUE(std::signbit(HalfToFloat(0x8000)));
}

// The host codec is the device path's conversion (math/float16_math.h),
// bit for bit, for every half and bfloat16.
TEST(DType, TheHostCodecIsTheDeviceMathForEveryValue) {
  auto bits = [](float f) {
    uint32_t b;
    std::memcpy(&b, &f, sizeof(b));
    return b;
  };
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const uint16_t v = static_cast<uint16_t>(h);
    EXPECT_EQ(bits(HalfToFloat(v)), bits(SondeHalfToFloat(v))) << h;
    EXPECT_EQ(bits(BFloat16ToFloat(v)), bits(SondeBf16ToFloat(v))) << h;
  }
}

TEST(DType, BFloat16ConversionIsExact) {
  EXPECT_EQ(BFloat16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(BFloat16ToFloat(0xc2f7), -123.5f);
  EXPECT_EQ(BFloat16ToFloat(0xff80), -std::numeric_limits<float>::infinity());
}

TEST(DType, DecodeAsDoubleReadsEveryType) {
  const float f[] = {1.5f, -2.0f};
  EXPECT_EQ(*DecodeAsDouble(absl::string_view(reinterpret_cast<const char*>(f), 8), v1::DTYPE_F32),
            (std::vector<double>{1.5, -2.0}));
  const int64_t i[] = {-7};
  EXPECT_EQ(*DecodeAsDouble(absl::string_view(reinterpret_cast<const char*>(i), 8), v1::DTYPE_I64),
            (std::vector<double>{-7}));
  const uint16_t h[] = {0x3c00};
  EXPECT_EQ(*DecodeAsDouble(absl::string_view(reinterpret_cast<const char*>(h), 2), v1::DTYPE_F16),
            (std::vector<double>{1.0}));
  EXPECT_THAT(DecodeAsDouble("abc", v1::DTYPE_F32),
              StatusIs(absl::StatusCode::kInvalidArgument, "3 bytes"));
}

TEST(Mode, NamesRoundTrip) {
  for (auto m : {v1::MODE_TRAIN, v1::MODE_EVAL, v1::MODE_PREDICT, v1::MODE_GLOBAL}) {
    EXPECT_EQ(*ParseMode(ModeName(m)), m);
  }
  EXPECT_EQ(*ParseMode("train"), v1::MODE_TRAIN);
  EXPECT_THAT(ParseMode("test"), StatusIs(absl::StatusCode::kInvalidArgument, "test"));
}

}  // namespace
}  // namespace sonde
