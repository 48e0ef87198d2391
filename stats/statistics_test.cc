#include "stats/statistics.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace sonde {
namespace {

using ::sonde::testing::StatusIs;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// A deliberately naive two-pass reference, written from the definitions in
// proto/tensor.proto.
v1::Statistics Reference(const std::vector<double>& xs) {
  v1::Statistics s;
  double sum = 0, l1 = 0, sq = 0;
  std::vector<double> finite;
  bool any = false;
  double mn = 0, mx = 0, amn = 0, amx = 0;
  for (double x : xs) {
    s.set_count(s.count() + 1);
    if (std::isnan(x)) {
      s.set_nan_count(s.nan_count() + 1);
      continue;
    }
    if (!any) {
      mn = mx = x;
      amn = amx = std::fabs(x);
      any = true;
    }
    mn = std::min(mn, x);
    mx = std::max(mx, x);
    amn = std::min(amn, std::fabs(x));
    amx = std::max(amx, std::fabs(x));
    if (x == 0) s.set_zero_count(s.zero_count() + 1);
    if (std::isinf(x)) {
      if (x > 0) s.set_pos_inf_count(s.pos_inf_count() + 1);
      else s.set_neg_inf_count(s.neg_inf_count() + 1);
      continue;
    }
    finite.push_back(x);
    sum += x;
    l1 += std::fabs(x);
    sq += x * x;
  }
  s.set_finite_count(finite.size());
  s.set_min(mn);
  s.set_max(mx);
  s.set_abs_min(amn);
  s.set_abs_max(amx);
  s.set_sum(sum);
  s.set_l1(l1);
  s.set_sum_squares(sq);
  s.set_l2(std::sqrt(sq));
  if (!finite.empty()) {
    const double mean = sum / finite.size();
    double m2 = 0;
    for (double x : finite) m2 += (x - mean) * (x - mean);
    s.set_mean(mean);
    s.set_m2(m2);
    s.set_variance(m2 / finite.size());
    s.set_std(std::sqrt(m2 / finite.size()));
  }
  return s;
}

void ExpectNear(const v1::Statistics& got, const v1::Statistics& want, double rel) {
  EXPECT_EQ(got.count(), want.count());
  EXPECT_EQ(got.finite_count(), want.finite_count());
  EXPECT_EQ(got.nan_count(), want.nan_count());
  EXPECT_EQ(got.pos_inf_count(), want.pos_inf_count());
  EXPECT_EQ(got.neg_inf_count(), want.neg_inf_count());
  EXPECT_EQ(got.zero_count(), want.zero_count());
  EXPECT_EQ(got.min(), want.min());
  EXPECT_EQ(got.max(), want.max());
  EXPECT_EQ(got.abs_min(), want.abs_min());
  EXPECT_EQ(got.abs_max(), want.abs_max());
  auto near = [rel](double a, double b) {
    return std::fabs(a - b) <= rel * std::max(1.0, std::max(std::fabs(a), std::fabs(b)));
  };
  EXPECT_PRED2(near, got.sum(), want.sum());
  EXPECT_PRED2(near, got.l1(), want.l1());
  EXPECT_PRED2(near, got.sum_squares(), want.sum_squares());
  EXPECT_PRED2(near, got.mean(), want.mean());
  EXPECT_PRED2(near, got.m2(), want.m2());
  EXPECT_PRED2(near, got.variance(), want.variance());
  EXPECT_PRED2(near, got.l2(), want.l2());
}

TEST(Statistics, EmptyTensorHasZeroCountsAndNoNaNs) {
  auto s = ComputeStatistics("", v1::DTYPE_F32);
  SONDE_ASSERT_OK(s);
  EXPECT_EQ(s->count(), 0u);
  EXPECT_EQ(s->mean(), 0.0);
  EXPECT_EQ(s->l2(), 0.0);
  EXPECT_FALSE(std::isnan(s->variance()));
}

TEST(Statistics, SingleElement) {
  auto s = ComputeStatistics(Bytes(std::vector<float>{-3.5f}), v1::DTYPE_F32);
  SONDE_ASSERT_OK(s);
  ExpectNear(*s, Reference({-3.5}), 0);
  EXPECT_EQ(s->abs_min(), 3.5);
  EXPECT_EQ(s->variance(), 0.0);
}

TEST(Statistics, MatchesReferenceOnRandomFloatsOfManySizes) {
  std::mt19937 rng(42);
  std::normal_distribution<float> dist(0.5f, 3.0f);
  for (size_t n : {2, 3, 17, 1000, 100001}) {
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    v[n / 2] = 0.0f;
    std::vector<double> d(v.begin(), v.end());
    auto s = ComputeStatistics(Bytes(v), v1::DTYPE_F32);
    SONDE_ASSERT_OK(s);
    SCOPED_TRACE(n);
    ExpectNear(*s, Reference(d), 1e-9);
  }
}

TEST(Statistics, NaNAndInfAreCountedApartAndDoNotPoisonTheRest) {
  std::vector<double> v = {1.0, kNaN, -kInf, 2.0, kInf, kInf, 0.0, -0.0, 3.0};
  auto s = ComputeStatistics(Bytes(v), v1::DTYPE_F64);
  SONDE_ASSERT_OK(s);
  ExpectNear(*s, Reference(v), 1e-12);
  EXPECT_EQ(s->nan_count(), 1u);
  EXPECT_EQ(s->pos_inf_count(), 2u);
  EXPECT_EQ(s->neg_inf_count(), 1u);
  EXPECT_EQ(s->zero_count(), 2u);
  EXPECT_EQ(s->finite_count(), 5u);
  EXPECT_EQ(s->min(), -kInf);
  EXPECT_EQ(s->max(), kInf);
  EXPECT_DOUBLE_EQ(s->mean(), 6.0 / 5);
}

TEST(Statistics, BlocksWithAndWithoutNonFiniteValuesAgreeWithTheReference) {
  // 5000 elements span five blocks; one NaN and one -Inf send two of them
  // down the per-element path, the rest down the block path.
  std::mt19937 rng(11);
  std::normal_distribution<double> dist(1e6, 3.0);  // large mean, small spread
  std::vector<double> v(5000);
  for (auto& x : v) x = dist(rng);
  v[1500] = kNaN;
  v[3333] = -kInf;
  v[4000] = 0.0;
  auto s = ComputeStatistics(Bytes(v), v1::DTYPE_F64);
  SONDE_ASSERT_OK(s);
  ExpectNear(*s, Reference(v), 1e-9);
  EXPECT_NEAR(s->std(), 0.0 + Reference(v).std(), 1e-6);  // no cancellation
  for (size_t n : {1023, 1024, 1025, 2048}) {
    std::vector<double> w(v.begin(), v.begin() + n);
    SCOPED_TRACE(n);
    ExpectNear(*ComputeStatistics(Bytes(w), v1::DTYPE_F64), Reference(w), 1e-9);
  }
}

TEST(Statistics, AllNaNHasNoMinMax) {
  std::vector<float> v(4, std::numeric_limits<float>::quiet_NaN());
  auto s = ComputeStatistics(Bytes(v), v1::DTYPE_F32);
  SONDE_ASSERT_OK(s);
  EXPECT_EQ(s->nan_count(), 4u);
  EXPECT_EQ(s->finite_count(), 0u);
  EXPECT_EQ(s->min(), 0.0);
  EXPECT_EQ(s->max(), 0.0);
  SONDE_EXPECT_OK(ValidateStatistics(*s));
}

TEST(Statistics, AllEqualValuesHaveZeroVariance) {
  std::vector<float> v(1001, 0.1f);
  auto s = ComputeStatistics(Bytes(v), v1::DTYPE_F32);
  SONDE_ASSERT_OK(s);
  EXPECT_EQ(s->min(), s->max());
  EXPECT_NEAR(s->variance(), 0.0, 1e-18);
}

TEST(Statistics, ExtremeMagnitudesAndDenormals) {
  std::vector<float> v = {std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::lowest(),
                          std::numeric_limits<float>::denorm_min(), 1e-38f};
  std::vector<double> d(v.begin(), v.end());
  auto s = ComputeStatistics(Bytes(v), v1::DTYPE_F32);
  SONDE_ASSERT_OK(s);
  ExpectNear(*s, Reference(d), 1e-12);
  EXPECT_EQ(s->abs_min(), static_cast<double>(std::numeric_limits<float>::denorm_min()));
  EXPECT_FALSE(std::isinf(s->sum_squares()));  // accumulated in double
}

TEST(Statistics, HalfBFloatAndIntegerTypes) {
  std::vector<uint16_t> half = {0x3c00, 0xc000, 0x7c00};  // 1, -2, +inf
  auto h = ComputeStatistics(Bytes(half), v1::DTYPE_F16);
  SONDE_ASSERT_OK(h);
  EXPECT_EQ(h->pos_inf_count(), 1u);
  EXPECT_EQ(h->sum(), -1.0);

  std::vector<uint16_t> bf = {0x3f80, 0x4000};  // 1, 2
  auto b = ComputeStatistics(Bytes(bf), v1::DTYPE_BF16);
  SONDE_ASSERT_OK(b);
  EXPECT_EQ(b->mean(), 1.5);

  std::vector<int32_t> ints = {-5, 0, 10};
  auto i = ComputeStatistics(Bytes(ints), v1::DTYPE_I32);
  SONDE_ASSERT_OK(i);
  ExpectNear(*i, Reference({-5, 0, 10}), 1e-12);

  std::vector<uint8_t> bools = {1, 0, 7, 0};
  auto bo = ComputeStatistics(Bytes(bools), v1::DTYPE_BOOL);
  SONDE_ASSERT_OK(bo);
  EXPECT_EQ(bo->sum(), 2.0);
  EXPECT_EQ(bo->zero_count(), 2u);
}

TEST(Statistics, RejectsPartialElements) {
  EXPECT_THAT(ComputeStatistics("abcde", v1::DTYPE_F32),
              StatusIs(absl::StatusCode::kInvalidArgument, "5 bytes"));
  EXPECT_THAT(ComputeStatistics("ab", v1::DTYPE_UNSPECIFIED),
              StatusIs(absl::StatusCode::kInvalidArgument, "dtype"));
}

TEST(Statistics, MergeOfRandomSplitsEqualsWhole) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> dist(-100, 100);
  std::vector<double> v(5000);
  for (auto& x : v) x = dist(rng);
  v[10] = kNaN;
  v[20] = kInf;
  v[30] = 0;
  const v1::Statistics whole = *ComputeStatistics(Bytes(v), v1::DTYPE_F64);
  for (int trial = 0; trial < 20; ++trial) {
    std::uniform_int_distribution<size_t> cut(0, v.size());
    size_t a = cut(rng), b = cut(rng);
    if (a > b) std::swap(a, b);
    const std::string bytes = Bytes(v);
    auto s1 = *ComputeStatistics(bytes.substr(0, a * 8), v1::DTYPE_F64);
    auto s2 = *ComputeStatistics(bytes.substr(a * 8, (b - a) * 8), v1::DTYPE_F64);
    auto s3 = *ComputeStatistics(bytes.substr(b * 8), v1::DTYPE_F64);
    const v1::Statistics merged = MergeStatistics(MergeStatistics(s1, s2), s3);
    SCOPED_TRACE(::testing::Message() << "cuts " << a << "," << b);
    ExpectNear(merged, whole, 1e-9);
  }
}

TEST(Statistics, MergeWithEmptyIsIdentity) {
  std::vector<float> v = {1, 2, 3};
  auto s = *ComputeStatistics(Bytes(v), v1::DTYPE_F32);
  ExpectNear(MergeStatistics(s, v1::Statistics()), s, 0);
  ExpectNear(MergeStatistics(v1::Statistics(), s), s, 0);
}

TEST(Statistics, ValidateCatchesInconsistentRecords) {
  v1::Statistics s;
  s.set_count(3);
  s.set_finite_count(1);
  EXPECT_THAT(ValidateStatistics(s), StatusIs(absl::StatusCode::kInvalidArgument, "count"));
  s.set_finite_count(3);
  s.set_min(5);
  s.set_max(1);
  EXPECT_THAT(ValidateStatistics(s), StatusIs(absl::StatusCode::kInvalidArgument, "min"));
}

TEST(Statistics, ReductionValuesFollowSmdebugNames) {
  std::vector<double> v = {-3, 1, 2};
  auto s = *ComputeStatistics(Bytes(v), v1::DTYPE_F64);
  EXPECT_EQ(*ReductionValue(s, "min", false), -3);
  EXPECT_EQ(*ReductionValue(s, "max", true), 3);
  EXPECT_EQ(*ReductionValue(s, "min", true), 1);
  EXPECT_EQ(*ReductionValue(s, "mean", true), 2);
  EXPECT_DOUBLE_EQ(*ReductionValue(s, "l2", false), std::sqrt(14.0));
  EXPECT_THAT(ReductionValue(s, "median", false),
              StatusIs(absl::StatusCode::kNotFound, "median"));
}

}  // namespace
}  // namespace sonde
