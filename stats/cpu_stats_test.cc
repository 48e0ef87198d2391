#include "stats/cpu_stats.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/dtype.h"
#include "stats/cpu_stats_kernels.h"
#include "stats/histogram.h"
#include "stats/statistics.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace sonde {
namespace {

using ::sonde::testing::StatusIs;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr v1::DType kFloatTypes[] = {v1::DTYPE_F32, v1::DTYPE_F64,
                                     v1::DTYPE_F16, v1::DTYPE_BF16};

// ---- test data
// -----------------------------------------------------------------

// float -> half by truncation (test data only needs to be some half).
uint16_t ToHalf(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000u);
  if (std::isnan(f)) return sign | 0x7e00u;
  const int e = static_cast<int>((b >> 23) & 0xFFu) - 127 + 15;
  if (e >= 31) return sign | 0x7c00u;
  if (e <= 0) {  // subnormal half or zero
    const int shift = 14 - e;
    if (shift > 24) return sign;
    return sign | static_cast<uint16_t>(((b & 0x7FFFFFu) | 0x800000u) >> shift);
  }
  return sign | static_cast<uint16_t>(e << 10) |
         static_cast<uint16_t>((b >> 13) & 0x3FFu);
}

uint16_t ToBFloat16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return static_cast<uint16_t>(b >> 16);
}

// Raw bytes of `v` stored as `dtype` (narrowed as each type narrows).
std::string Encode(const std::vector<double>& v, v1::DType dtype) {
  std::string out;
  auto put = [&out](const auto& x) {
    out.append(reinterpret_cast<const char*>(&x), sizeof(x));
  };
  for (double d : v) {
    switch (dtype) {
      case v1::DTYPE_F32:
        put(static_cast<float>(d));
        break;
      case v1::DTYPE_F64:
        put(d);
        break;
      case v1::DTYPE_F16:
        put(ToHalf(static_cast<float>(d)));
        break;
      case v1::DTYPE_BF16:
        put(ToBFloat16(static_cast<float>(d)));
        break;
      default:
        ADD_FAILURE() << "no encoder for dtype " << dtype;
    }
  }
  return out;
}

// Data of one test case, as doubles (narrowed by Encode).
std::vector<double> Normal(size_t n, double mean, double stddev,
                           uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> dist(mean, stddev);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Sprinkles NaN, +-Inf, denormals, -0.0 and 0.0 over about 1% of `v`.
void Sprinkle(std::vector<double>& v, uint32_t seed) {
  std::mt19937 rng(seed);
  const double specials[] = {
      kNaN,   kInf,  -kInf,
      -0.0,   0.0,   std::numeric_limits<float>::denorm_min(),
      -1e-40, 1e-45, std::numeric_limits<double>::denorm_min()};
  std::uniform_int_distribution<size_t> pick(0, std::size(specials) - 1);
  std::uniform_int_distribution<size_t> where(0, v.empty() ? 0 : v.size() - 1);
  const size_t count = v.size() / 100 + (v.size() > 3 ? 3 : 0);
  for (size_t i = 0; i < count; ++i) v[where(rng)] = specials[pick(rng)];
}

// ---- the scalar reference and comparisons -----------------------------------

double ElementAsDouble(const std::string& bytes, v1::DType dtype, size_t i) {
  return sonde::ElementAsDouble(bytes.data(), dtype, i);
}

// Mean and m2 of the finite values of `v`, two passes in long double.
void ExactMeanAndM2(const std::vector<double>& v, StatsAccumulator& acc) {
  long double sum = 0;
  size_t n = 0;
  for (double x : v) {
    if (std::isfinite(x)) {
      sum += x;
      ++n;
    }
  }
  if (n == 0) return;
  const long double mean = sum / n;
  long double m2 = 0;
  for (double x : v) {
    if (std::isfinite(x)) m2 += (x - mean) * (x - mean);
  }
  acc.mean = static_cast<double>(mean);
  acc.m2 = static_cast<double>(m2);
}

// The reference: a loop of StatsAdd. Except for mean and m2: StatsAdd's
// Welford update drifts for data far from zero (by ~n * 2^-53 * |mean| *
// std, e.g. 2e-9 relative for mean 1e6, std 1e-2, n 1e5: less accurate than
// the fast path), so those come from an exact two-pass computation and the
// tolerance measures the fast path, not the reference.
StatsAccumulator ReferenceStats(const std::string& bytes, v1::DType dtype) {
  StatsAccumulator acc;
  const size_t n = bytes.size() / DTypeSize(dtype);
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = ElementAsDouble(bytes, dtype, i);
    StatsAdd(acc, v[i]);
  }
  ExactMeanAndM2(v, acc);
  return acc;
}

// The specs every case is histogrammed with.
std::vector<HistogramSpecHD> Specs() {
  return {DefaultExponentialSpec(), ExponentialSpec(-126, 127, 4), ExponentialSpec(-3, 5, 0),
          FixedSpec(-4, 6, 100), FixedSpec(0.25, 0.75, 7)};
}

// The documented tolerance (cpu_stats.h): within kCpuStatsRelTolerance *
// (n + 1) of the magnitude the quantity is a sum of. The reference and the
// fast path both accumulate in double, in different orders; their errors
// are bounded by about n * 2^-53 of that magnitude (and are far smaller for
// real data), so 1e-15 * (n + 1), nine times the bound, is safe.
bool Near(double got, double want, double magnitude, uint64_t n) {
  if (got == want) return true;
  return std::fabs(got - want) <=
         kCpuStatsRelTolerance * static_cast<double>(n + 1) * magnitude;
}

// Exact for counts and extremes (== treats -0.0 and 0.0 alike: which zero
// a min or max reports depends on the order of the elements), within the
// tolerance for the rest.
void ExpectSameRecord(const StatsAccumulator& got,
                      const StatsAccumulator& want) {
  EXPECT_EQ(got.count, want.count);
  EXPECT_EQ(got.finite_count, want.finite_count);
  EXPECT_EQ(got.nan_count, want.nan_count);
  EXPECT_EQ(got.pos_inf_count, want.pos_inf_count);
  EXPECT_EQ(got.neg_inf_count, want.neg_inf_count);
  EXPECT_EQ(got.zero_count, want.zero_count);
  if (want.count > want.nan_count) {
    EXPECT_EQ(got.min, want.min);
    EXPECT_EQ(got.max, want.max);
    EXPECT_EQ(got.abs_min, want.abs_min);
    EXPECT_EQ(got.abs_max, want.abs_max);
  }
  const uint64_t n = want.count;
  const double mean_abs =
      want.finite_count > 0 ? want.l1 / want.finite_count : 0;
  EXPECT_PRED4(Near, got.sum, want.sum, want.l1, n);
  EXPECT_PRED4(Near, got.l1, want.l1, want.l1, n);
  EXPECT_PRED4(Near, got.sum_squares, want.sum_squares, want.sum_squares, n);
  if (want.finite_count > 0) {
    EXPECT_PRED4(Near, got.mean, want.mean, mean_abs, n);
    // Plus the rounding of the mean itself, which a zero m2 cannot absorb.
    EXPECT_PRED4(Near, got.m2, want.m2,
                 want.m2 + kCpuStatsRelTolerance * want.sum_squares, n);
  }
}

void ExpectSameHistogram(const HistogramCounts& got,
                         const HistogramCounts& want) {
  EXPECT_TRUE(SameSpec(got.spec, want.spec));
  EXPECT_EQ(got.counts, want.counts);
  EXPECT_EQ(got.nan_count, want.nan_count);
  EXPECT_EQ(got.pos_inf_count, want.pos_inf_count);
  EXPECT_EQ(got.neg_inf_count, want.neg_inf_count);
}

struct Result {
  StatsAccumulator stats;
  std::vector<HistogramCounts> histograms;
};

Result RunAll(const std::string& bytes, v1::DType dtype,
              const CpuStatsOptions& options) {
  Result r;
  const uint64_t n = bytes.size() / DTypeSize(dtype);
  SONDE_EXPECT_OK(
      CpuAccumulate(&r.stats, nullptr, bytes.data(), dtype, n, options));
  for (const HistogramSpecHD& spec : Specs()) {
    r.histograms.push_back(HistogramCounts::Empty(spec));
    // Alone and together with statistics: the same counters.
    HistogramCounts& alone = r.histograms.back();
    SONDE_EXPECT_OK(
        CpuAccumulate(nullptr, &alone, bytes.data(), dtype, n, options));
    StatsAccumulator stats;
    HistogramCounts with_stats = HistogramCounts::Empty(spec);
    SONDE_EXPECT_OK(
        CpuAccumulate(&stats, &with_stats, bytes.data(), dtype, n, options));
    ExpectSameHistogram(with_stats, alone);
    ExpectSameRecord(stats, r.stats);
    EXPECT_EQ(with_stats.finite_total(), stats.finite_count);
  }
  return r;
}

CpuStatsOptions Portable() {
  CpuStatsOptions o;
  o.force_portable = true;
  return o;
}

CpuStatsOptions Threads(int threads, bool portable = false) {
  CpuStatsOptions o;
  o.threads = threads;
  o.parallel_min_bytes = 0;
  o.force_portable = portable;
  return o;
}

// Every implementation against the reference, and against each other.
void CheckAll(const std::vector<double>& values, v1::DType dtype) {
  const std::string bytes = Encode(values, dtype);
  SCOPED_TRACE(::testing::Message()
               << DTypeName(dtype) << " n=" << values.size());
  const StatsAccumulator want = ReferenceStats(bytes, dtype);
  std::vector<HistogramCounts> want_h;
  for (const HistogramSpecHD& spec : Specs()) {
    want_h.push_back(HistogramCounts::Empty(spec));
    AccumulateHistogramScalar(want_h.back(), bytes.data(), dtype,
                              values.size());
  }
  const Result fast = RunAll(bytes, dtype, CpuStatsOptions());
  const Result portable = RunAll(bytes, dtype, Portable());
  {
    SCOPED_TRACE("default vs reference");
    ExpectSameRecord(fast.stats, want);
    for (size_t i = 0; i < want_h.size(); ++i)
      ExpectSameHistogram(fast.histograms[i], want_h[i]);
  }
  {
    SCOPED_TRACE("portable vs reference");
    ExpectSameRecord(portable.stats, want);
    for (size_t i = 0; i < want_h.size(); ++i) {
      ExpectSameHistogram(portable.histograms[i], want_h[i]);
    }
  }
  {
    SCOPED_TRACE("default vs portable");
    ExpectSameRecord(fast.stats, portable.stats);
  }
}

// ---- statistics and histograms against the reference
// --------------------------

const size_t kSizes[] = {0,     1,     2,     7,     8,    9,    15,
                         16,    17,    31,    33,    255,  256,  257,
                         1000,  1001,  4095,  8191,  8192, 8193, 8200,
                         16383, 16384, 16385, 24581, 50001};

TEST(CpuStats, MatchesReferenceAcrossSizesAndTypes) {
  for (v1::DType dtype : kFloatTypes) {
    for (size_t n : kSizes)
      CheckAll(Normal(n, 0.5, 3.0, static_cast<uint32_t>(n)), dtype);
  }
}

TEST(CpuStats, MatchesReferenceWithNaNInfDenormalsAndSignedZeros) {
  for (v1::DType dtype : kFloatTypes) {
    for (size_t n : kSizes) {
      std::vector<double> v =
          Normal(n, -1.0, 10.0, static_cast<uint32_t>(n + 1));
      Sprinkle(v, static_cast<uint32_t>(n));
      CheckAll(v, dtype);
    }
  }
}

TEST(CpuStats, EverySpecialValueAloneAndInEveryLane) {
  const double specials[] = {kNaN,  kInf,   -kInf, 0.0,  -0.0,
                             1e-45, -1e-40, 3e38,  -3e38};
  for (v1::DType dtype : kFloatTypes) {
    for (double s : specials) {
      for (size_t lane = 0; lane < 8; ++lane) {
        std::vector<double> v = Normal(8213, 2.0, 1.0, 5);
        v[lane] = s;         // first vector of the first block
        v[8192 + lane] = s;  // the second block, and so its shift K
        v[8192 + 8 + lane] = s;
        CheckAll(v, dtype);
      }
      CheckAll(std::vector<double>(40, s), dtype);  // all special
    }
  }
}

TEST(CpuStats, LargeTensorMatchesReference) {
  std::vector<double> v = Normal(3'000'017, 0.1, 2.0, 99);
  Sprinkle(v, 3);
  CheckAll(v, v1::DTYPE_F32);
  CheckAll(std::vector<double>(v.begin(), v.begin() + 1'000'003),
           v1::DTYPE_BF16);
}

TEST(CpuStats, AllEqualValuesHaveZeroOrTinyVariance) {
  for (v1::DType dtype : kFloatTypes) {
    for (double x : {0.1, -7.0, 0.0, 1e30, 3e-39}) {
      for (size_t n : {9, 8192, 40000}) {
        const std::string bytes = Encode(std::vector<double>(n, x), dtype);
        StatsAccumulator s;
        SONDE_ASSERT_OK(CpuAccumulate(&s, nullptr, bytes.data(), dtype, n));
        const double stored = ElementAsDouble(bytes, dtype, 0);
        EXPECT_EQ(s.min, stored);
        EXPECT_EQ(s.max, stored);
        EXPECT_EQ(s.m2, 0.0) << DTypeName(dtype) << " " << x << " n=" << n;
        if (std::isfinite(stored)) {
          EXPECT_EQ(s.mean, stored);
        }
        CheckAll(std::vector<double>(n, x), dtype);
      }
    }
  }
}

TEST(CpuStats, ExtremeMagnitudes) {
  std::mt19937 rng(4);
  std::vector<double> v(20000);
  const double pool[] = {3e38,   -3e38,   3.4e38, 1e-38,
                         -1e-38, 1.2e-38, 1.0,    -2.0};
  std::uniform_int_distribution<size_t> pick(0, std::size(pool) - 1);
  for (auto& x : v) x = pool[pick(rng)];
  for (v1::DType dtype : {v1::DTYPE_F32, v1::DTYPE_F64, v1::DTYPE_BF16}) {
    CheckAll(v, dtype);
    StatsAccumulator s;
    const std::string bytes = Encode(v, dtype);
    SONDE_ASSERT_OK(CpuAccumulate(&s, nullptr, bytes.data(), dtype, v.size()));
    EXPECT_FALSE(std::isinf(s.sum_squares)) << "accumulated in double";
    EXPECT_EQ(s.pos_inf_count + s.neg_inf_count, 0u);
  }
}

TEST(CpuStats, LargeOffsetKeepsM2Accurate) {
  // mean 1e6, std 1e-2: a naive sum of squares would lose all of m2.
  for (v1::DType dtype : {v1::DTYPE_F64, v1::DTYPE_F32}) {
    for (size_t n : {1000, 100000}) {
      const std::vector<double> v = Normal(n, 1e6, 1e-2, 17);
      const std::string bytes = Encode(v, dtype);
      StatsAccumulator s;
      SONDE_ASSERT_OK(CpuAccumulate(&s, nullptr, bytes.data(), dtype, n));
      // A two-pass m2 of the stored values in long double.
      long double mean = 0;
      for (size_t i = 0; i < n; ++i) mean += ElementAsDouble(bytes, dtype, i);
      mean /= n;
      long double m2 = 0;
      for (size_t i = 0; i < n; ++i) {
        const long double d = ElementAsDouble(bytes, dtype, i) - mean;
        m2 += d * d;
      }
      SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " n=" << n);
      EXPECT_GT(m2, 0.0L);
      EXPECT_NEAR(s.m2, static_cast<double>(m2),
                  1e-9 * static_cast<double>(m2));
      EXPECT_NEAR(s.mean, static_cast<double>(mean), 1e-9);
      CheckAll(v, dtype);
    }
  }
  // F32 spacing at 1e4 is ~1e-3, so std 1e-2 survives the narrowing.
  CheckAll(Normal(30000, 1e4, 1e-2, 8), v1::DTYPE_F32);
}

TEST(CpuStats, IntegerAndBoolTypesMatchReference) {
  std::mt19937 rng(12);
  for (v1::DType dtype : {v1::DTYPE_I8, v1::DTYPE_I16, v1::DTYPE_I32,
                          v1::DTYPE_I64, v1::DTYPE_U8, v1::DTYPE_BOOL}) {
    const size_t size = DTypeSize(dtype);
    for (size_t n : {0, 5, 8, 8193, 20001}) {
      std::string bytes(n * size, '\0');
      for (auto& c : bytes) c = static_cast<char>(rng() % 7 == 0 ? 0 : rng());
      StatsAccumulator want;
      auto decoded = DecodeAsDouble(bytes, dtype);
      SONDE_ASSERT_OK(decoded);
      for (double d : *decoded) StatsAdd(want, d);
      ExactMeanAndM2(*decoded, want);
      for (const CpuStatsOptions& o :
           {CpuStatsOptions(), Portable(), Threads(3)}) {
        StatsAccumulator got;
        HistogramCounts h = HistogramCounts::Empty(FixedSpec(-100, 100, 16));
        HistogramCounts want_h = h;
        AccumulateHistogramScalar(want_h, bytes.data(), dtype, n);
        SONDE_ASSERT_OK(CpuAccumulate(&got, &h, bytes.data(), dtype, n, o));
        SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " n=" << n);
        ExpectSameRecord(got, want);
        ExpectSameHistogram(h, want_h);
      }
    }
  }
}

// ---- threads
// -------------------------------------------------------------------

TEST(CpuStats, MultithreadedEqualsSingleThreaded) {
  std::vector<double> v = Normal(100'003, 3.0, 5.0, 21);
  Sprinkle(v, 22);
  for (v1::DType dtype : kFloatTypes) {
    const std::string bytes = Encode(v, dtype);
    SCOPED_TRACE(DTypeName(dtype));
    for (bool portable : {false, true}) {
      const Result one = RunAll(bytes, dtype, Threads(1, portable));
      for (int threads : {2, 3, 4, 7, 64}) {
        SCOPED_TRACE(::testing::Message()
                     << threads << " threads, portable=" << portable);
        const Result many = RunAll(bytes, dtype, Threads(threads, portable));
        ExpectSameRecord(many.stats, one.stats);
        for (size_t i = 0; i < one.histograms.size(); ++i) {
          ExpectSameHistogram(many.histograms[i], one.histograms[i]);
        }
        // Deterministic for a given thread count: bit for bit.
        const Result again = RunAll(bytes, dtype, Threads(threads, portable));
        EXPECT_EQ(
            std::memcmp(&again.stats, &many.stats, sizeof(StatsAccumulator)),
            0);
      }
    }
  }
}

TEST(CpuStats, ConcurrentCallersShareThePool) {
  const std::string bytes = Encode(Normal(200'000, 0, 1, 3), v1::DTYPE_F32);
  StatsAccumulator want;
  SONDE_ASSERT_OK(CpuAccumulate(&want, nullptr, bytes.data(), v1::DTYPE_F32,
                                200'000, Threads(4)));
  std::vector<StatsAccumulator> got(6);
  std::vector<std::thread> callers;
  for (auto& g : got) {
    callers.emplace_back([&bytes, &g] {
      SONDE_EXPECT_OK(CpuAccumulate(&g, nullptr, bytes.data(), v1::DTYPE_F32,
                                    200'000, Threads(4)));
    });
  }
  for (auto& t : callers) t.join();
  for (const auto& g : got)
    EXPECT_EQ(std::memcmp(&g, &want, sizeof(StatsAccumulator)), 0);
}

// ---- the SONDE_HD merge
// --------------------------------------------------------

// Merging the records of the pieces of a tensor gives the record of the
// whole: exactly for counts and extremes, within the documented tolerance
// for sums and m2 (Chan's merge rounds like any other order of additions).
TEST(StatsMerge, PiecesMergeToTheWhole) {
  std::mt19937 rng(31);
  for (int trial = 0; trial < 60; ++trial) {
    const size_t n = 1 + rng() % 5000;
    std::vector<double> v = Normal(n, (trial % 3) * 1e3, 1.0 + trial, rng());
    if (trial % 2) Sprinkle(v, rng());
    StatsAccumulator whole;
    for (double x : v) StatsAdd(whole, x);
    // 1..6 pieces at random cut points (empty pieces allowed).
    std::vector<size_t> cuts = {0, n};
    const int pieces = 1 + static_cast<int>(rng() % 6);
    for (int i = 1; i < pieces; ++i) cuts.push_back(rng() % (n + 1));
    std::sort(cuts.begin(), cuts.end());
    StatsAccumulator merged;
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      StatsAccumulator piece;
      for (size_t i = cuts[c]; i < cuts[c + 1]; ++i) StatsAdd(piece, v[i]);
      StatsMerge(merged, piece);
    }
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " n=" << n);
    ExpectSameRecord(merged, whole);
  }
}

TEST(StatsMerge, EmptyPiecesAreIdentity) {
  StatsAccumulator a;
  for (double x : {1.0, kNaN, -2.0}) StatsAdd(a, x);
  StatsAccumulator b = a;
  StatsMerge(b, StatsAccumulator());
  EXPECT_EQ(std::memcmp(&a, &b, sizeof(a)), 0);
  StatsAccumulator c;
  StatsMerge(c, a);
  EXPECT_EQ(std::memcmp(&a, &c, sizeof(a)), 0);
}

// ---- bins of the vector kernels, element by element
// ---------------------------

std::vector<float> BinProbeValues(const HistogramSpecHD& spec) {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1e-45f,
                          -1e-45f,
                          1e-38f,
                          std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::lowest(),
                          1.0f,
                          -1.0f};
  for (double e : BinEdges(spec)) {
    const float f = static_cast<float>(e);
    v.push_back(f);
    v.push_back(std::nextafter(f, std::numeric_limits<float>::infinity()));
    v.push_back(std::nextafter(f, -std::numeric_limits<float>::infinity()));
  }
  for (int e = -149; e <= 127; ++e) {
    const float p = std::ldexp(1.0f, e);
    for (float x : {p, -p, std::nextafter(p, 0.0f), -std::nextafter(p, 0.0f)})
      v.push_back(x);
  }
  std::mt19937 rng(1);
  for (int i = 0; i < 20000; ++i) {
    const uint32_t bits = rng();
    float f;
    std::memcpy(&f, &bits, 4);
    v.push_back(f);
  }
  v.push_back(std::numeric_limits<float>::quiet_NaN());
  v.push_back(std::numeric_limits<float>::infinity());
  v.push_back(-std::numeric_limits<float>::infinity());
  return v;
}

// Runs `hist` on groups of 8 values and checks that lane j of each group
// incremented exactly the counter of the scalar bin of value j, and nothing
// else (every counter it should have incremented is reset after the check,
// so a stray increment is still there at the end).
template <typename T, typename HistFn, typename BinFn>
void CheckKernelBins(const HistogramSpecHD& spec, const std::vector<T>& values,
                     HistFn hist, BinFn scalar_bin) {
  using cpu_stats_internal::HistogramLanes;
  using cpu_stats_internal::kHistogramLanes;
  const HistogramParams p = MakeHistogramParams(spec);
  std::vector<T> padded = values;
  while (padded.size() % 8 != 0) padded.push_back(T(1));
  std::vector<uint32_t> counters((p.count + 1) * kHistogramLanes, 0);
  for (bool promise : {false, true}) {
    HistogramLanes lanes;
    lanes.params = p;
    lanes.counters = counters.data();
    uint64_t specials = 0;
    for (size_t g = 0; g < padded.size(); g += 8) {
      bool finite = true;
      for (size_t j = 0; j < 8; ++j) finite &= std::isfinite(padded[g + j]);
      if (promise && !finite) continue;
      hist(padded.data() + g, 8, promise, &lanes);
      for (size_t j = 0; j < 8; ++j) {
        const T x = padded[g + j];
        const uint32_t bin = scalar_bin(p, x);
        if (bin >= p.count) {
          ++specials;
          continue;
        }
        uint32_t& c = counters[bin * kHistogramLanes + j];
        EXPECT_EQ(c, 1u) << "value " << x << " (lane " << j
                         << ") should be in bin " << bin;
        c = 0;
      }
      ASSERT_EQ(lanes.nan + lanes.pos_inf + lanes.neg_inf, specials);
    }
    for (uint32_t i = 0; i < p.count * kHistogramLanes; ++i) {
      ASSERT_EQ(counters[i], 0u)
          << "stray increment of bin " << i / kHistogramLanes;
    }
    std::fill(counters.begin(), counters.end(), 0);  // the sink
  }
}

TEST(CpuStatsKernels, VectorBinsAreTheScalarBinsForEveryValue) {
  if (std::string(CpuStatsImplementation()) != "avx2")
    GTEST_SKIP() << "no AVX2 on this CPU";
  const auto& k = cpu_stats_internal::Avx2Kernels();
  for (const HistogramSpecHD& spec :
       {DefaultExponentialSpec(), ExponentialSpec(-126, 127, 4), ExponentialSpec(-126, 127, 0),
        ExponentialSpec(0, 1, 3), FixedSpec(-4, 6, 100), FixedSpec(-1, 1, 3),
        FixedSpec(1e-3, 1e30, 16384), FixedSpec(-3e38, -1e38, 10)}) {
    SCOPED_TRACE(::testing::Message()
                 << "kind " << spec.kind << " lo " << spec.lo);
    const std::vector<float> f = BinProbeValues(spec);
    CheckKernelBins(spec, f, k.hist_f32, HistogramBinF32);
    std::vector<double> d(f.begin(), f.end());
    for (double e : BinEdges(spec)) {
      d.push_back(e);
      d.push_back(std::nextafter(e, kInf));
      d.push_back(std::nextafter(e, -kInf));
    }
    for (double x :
         {1e-300, -1e-300, 4.9e-324, 1e300, -1e300, std::ldexp(1.0, -127),
          std::ldexp(1.0, 127), std::nextafter(std::ldexp(1.0, 127), 0.0)}) {
      d.push_back(x);
    }
    CheckKernelBins(spec, d, k.hist_f64, HistogramBinF64);
  }
}

TEST(CpuStatsKernels, SixteenBitConversionsAreExactForEveryPattern) {
  if (std::string(CpuStatsImplementation()) != "avx2")
    GTEST_SKIP() << "no AVX2 on this CPU";
  const auto& k = cpu_stats_internal::Avx2Kernels();
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> half(all.size()), bf(all.size());
  k.f16_to_f32(all.data(), static_cast<uint32_t>(all.size()), half.data());
  k.bf16_to_f32(all.data(), static_cast<uint32_t>(all.size()), bf.data());
  for (uint32_t i = 0; i < all.size(); ++i) {
    const float want_h = HalfToFloat(all[i]);
    const float want_b = BFloat16ToFloat(all[i]);
    ASSERT_EQ(std::memcmp(&half[i], &want_h, 4), 0)
        << "half 0x" << std::hex << i;
    ASSERT_EQ(std::memcmp(&bf[i], &want_b, 4), 0)
        << "bfloat16 0x" << std::hex << i;
  }
}

TEST(CpuStats, EverySixteenBitPatternMatchesReference) {
  for (v1::DType dtype : {v1::DTYPE_F16, v1::DTYPE_BF16}) {
    std::string bytes(65536 * 2, '\0');
    for (uint32_t i = 0; i < 65536; ++i) {
      const uint16_t h = static_cast<uint16_t>(i * 40503u);  // a permutation
      std::memcpy(&bytes[2 * i], &h, 2);
    }
    const StatsAccumulator want = ReferenceStats(bytes, dtype);
    for (const CpuStatsOptions& o :
         {CpuStatsOptions(), Portable(), Threads(2)}) {
      StatsAccumulator got;
      HistogramCounts h = HistogramCounts::Empty(ExponentialSpec(-126, 127, 4));
      HistogramCounts want_h = h;
      AccumulateHistogramScalar(want_h, bytes.data(), dtype, 65536);
      SONDE_ASSERT_OK(CpuAccumulate(&got, &h, bytes.data(), dtype, 65536, o));
      SCOPED_TRACE(DTypeName(dtype));
      ExpectSameRecord(got, want);
      ExpectSameHistogram(h, want_h);
    }
  }
}

// ---- API edges
// -----------------------------------------------------------------

TEST(CpuStats, UnalignedDataIsFine) {
  const std::vector<double> v = Normal(20003, 1, 1, 2);
  for (v1::DType dtype : kFloatTypes) {
    const std::string bytes = Encode(v, dtype);
    std::string shifted = "x" + bytes;
    StatsAccumulator a, b;
    SONDE_ASSERT_OK(CpuAccumulate(&a, nullptr, bytes.data(), dtype, v.size()));
    SONDE_ASSERT_OK(
        CpuAccumulate(&b, nullptr, shifted.data() + 1, dtype, v.size()));
    EXPECT_EQ(std::memcmp(&a, &b, sizeof(a)), 0) << DTypeName(dtype);
  }
}

TEST(CpuStats, RejectsBadArgumentsAndChangesNothing) {
  const float x[] = {1, 2, 3};
  StatsAccumulator s;
  EXPECT_THAT(CpuAccumulate(&s, nullptr, x, v1::DTYPE_UNSPECIFIED, 3),
              StatusIs(absl::StatusCode::kInvalidArgument, "dtype"));
  HistogramCounts bad = HistogramCounts::Empty(FixedSpec(1, 0, 4));
  EXPECT_THAT(CpuAccumulate(&s, &bad, x, v1::DTYPE_F32, 3),
              StatusIs(absl::StatusCode::kInvalidArgument, "lo < hi"));
  HistogramCounts short_counts = HistogramCounts::Empty(FixedSpec(0, 1, 4));
  short_counts.counts.pop_back();
  EXPECT_THAT(
      CpuAccumulate(&s, &short_counts, x, v1::DTYPE_F32, 3),
      StatusIs(absl::StatusCode::kInvalidArgument, "needs 6 counters, got 5"));
  EXPECT_EQ(s.count, 0u);
}

TEST(CpuStats, AccumulatesOntoWhatIsThere) {
  const std::vector<double> v = Normal(30000, 0, 1, 8);
  const std::string bytes = Encode(v, v1::DTYPE_F32);
  StatsAccumulator twice, want;
  HistogramCounts h = HistogramCounts::Empty(DefaultExponentialSpec());
  HistogramCounts want_h = h;
  for (int i = 0; i < 2; ++i) {
    SONDE_ASSERT_OK(
        CpuAccumulate(&twice, &h, bytes.data(), v1::DTYPE_F32, v.size()));
    AccumulateHistogramScalar(want_h, bytes.data(), v1::DTYPE_F32, v.size());
    StatsMerge(want, ReferenceStats(bytes, v1::DTYPE_F32));
  }
  ExpectSameRecord(twice, want);
  ExpectSameHistogram(h, want_h);
}

TEST(CpuStats, ImplementationIsNamed) {
  const std::string name = CpuStatsImplementation();
  EXPECT_TRUE(name == "avx2" || name == "portable") << name;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    EXPECT_EQ(name, "avx2");
  }
}

TEST(CpuStats, ComputeStatisticsUsesTheFastPathAndAgrees) {
  std::vector<double> v = Normal(100000, 2, 3, 6);
  Sprinkle(v, 6);
  const std::string bytes = Encode(v, v1::DTYPE_F32);
  auto proto = ComputeStatistics(bytes, v1::DTYPE_F32);
  SONDE_ASSERT_OK(proto);
  ExpectSameRecord(FromProto(*proto), ReferenceStats(bytes, v1::DTYPE_F32));
  SONDE_EXPECT_OK(ValidateStatistics(*proto));
}

}  // namespace
}  // namespace sonde
