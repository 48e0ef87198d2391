// The collector's check of client statistics against the values sent with
// them: what a truthful client sends always passes (F32 and F64 with GPU
// summation order, F32 statistics beside values converted to F16 or BF16),
// and the lies a client could tell are caught.
#include "server/statistics_check.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "math/float16_math.h"
#include "stats/statistics.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace sonde::server {
namespace {

using ::sonde::testing::StatusIs;

std::vector<float> Values(size_t n, float scale) {
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.5f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng) * scale;
  v[3] = 0;
  v[n / 2] = std::numeric_limits<float>::quiet_NaN();
  return v;
}

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

v1::Statistics Stats(const std::string& bytes, v1::DType dtype) {
  auto s = ComputeStatistics(bytes, dtype);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : v1::Statistics();
}

std::string Converted(const std::vector<float>& v, v1::DType to) {
  std::string out(v.size() * 2, '\0');
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t h = to == v1::DTYPE_F16 ? SondeFloatToHalf(v[i]) : SondeFloatToBf16(v[i]);
    std::memcpy(&out[2 * i], &h, 2);
  }
  return out;
}

TEST(StatisticsCheck, TruthfulStatisticsPass) {
  const std::vector<float> v = Values(100003, 3.0f);
  const v1::Statistics truth = Stats(Bytes(v), v1::DTYPE_F32);
  SONDE_EXPECT_OK(CheckClientStatistics(truth, truth, v1::DTYPE_F32));
  // Another summation order (the GPU's) moves the sums by rounding.
  v1::Statistics gpu = truth;
  gpu.set_sum(truth.sum() * (1 + 1e-9));
  gpu.set_sum_squares(truth.sum_squares() * (1 - 1e-9));
  gpu.set_m2(truth.m2() * (1 + 1e-9));
  SONDE_EXPECT_OK(CheckClientStatistics(gpu, truth, v1::DTYPE_F32));
  // F64 values.
  std::vector<double> d(v.begin(), v.end());
  const v1::Statistics d_truth = Stats(Bytes(d), v1::DTYPE_F64);
  SONDE_EXPECT_OK(CheckClientStatistics(d_truth, d_truth, v1::DTYPE_F64));
}

TEST(StatisticsCheck, F32StatisticsBesideValuesConvertedToHalfPrecisionPass) {
  for (v1::DType to : {v1::DTYPE_BF16, v1::DTYPE_F16}) {
    // Large values overflow F16 to Inf, tiny ones flush to zero: the
    // conversion changes those counts, and the check allows it.
    std::vector<float> v = Values(50000, 1000.0f);
    v[10] = 1e6f;
    v[11] = 1e-30f;
    const v1::Statistics client = Stats(Bytes(v), v1::DTYPE_F32);
    const v1::Statistics computed = Stats(Converted(v, to), to);
    SONDE_EXPECT_OK(CheckClientStatistics(client, computed, to)) << v1::DType_Name(to);
  }
}

TEST(StatisticsCheck, LiesAreCaughtWithTheFieldNamed) {
  const std::vector<float> ones(1000, 1.0f);
  const v1::Statistics truth = Stats(Bytes(ones), v1::DTYPE_F32);
  v1::Statistics lie = truth;
  lie.set_max(1e30);  // the report's example
  EXPECT_THAT(CheckClientStatistics(lie, truth, v1::DTYPE_F32),
              StatusIs(absl::StatusCode::kInvalidArgument, "max is 1e+30"));
  lie = truth;
  lie.set_nan_count(5);
  EXPECT_THAT(CheckClientStatistics(lie, truth, v1::DTYPE_F32),
              StatusIs(absl::StatusCode::kInvalidArgument, "nan_count"));
  lie = truth;
  lie.set_sum(2000);
  EXPECT_THAT(CheckClientStatistics(lie, truth, v1::DTYPE_F32),
              StatusIs(absl::StatusCode::kInvalidArgument, "sum"));
  lie = truth;
  lie.set_zero_count(3);
  EXPECT_THAT(CheckClientStatistics(lie, truth, v1::DTYPE_F32),
              StatusIs(absl::StatusCode::kInvalidArgument, "zero_count"));
  // Beside converted values too.
  const v1::Statistics bf16 = Stats(Converted(ones, v1::DTYPE_BF16), v1::DTYPE_BF16);
  lie = truth;
  lie.set_max(1e30);
  EXPECT_THAT(CheckClientStatistics(lie, bf16, v1::DTYPE_BF16),
              StatusIs(absl::StatusCode::kInvalidArgument, "max"));
  lie = truth;
  lie.set_l1(10);
  EXPECT_THAT(CheckClientStatistics(lie, bf16, v1::DTYPE_BF16),
              StatusIs(absl::StatusCode::kInvalidArgument, "l1"));
}

}  // namespace
}  // namespace sonde::server
