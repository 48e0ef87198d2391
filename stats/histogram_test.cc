#include "stats/histogram.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "stats/cpu_stats.h"
#include "stats/statistics.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace sonde {
namespace {

using ::sonde::testing::StatusIs;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr float kInfF = std::numeric_limits<float>::infinity();

std::vector<HistogramSpecHD> Specs() {
  return {DefaultExponentialSpec(),
          ExponentialSpec(-126, 127, 4),
          ExponentialSpec(-126, 127, 0),
          ExponentialSpec(-3, 5, 0),
          ExponentialSpec(0, 1, 3),
          ExponentialSpec(-24, 16, 4),
          FixedSpec(-4, 6, 100),
          FixedSpec(-1, 1, 3),
          FixedSpec(0.1, 0.7, 7),
          FixedSpec(1e-3, 1e30, 16384)};
}

// Values worth binning for `spec`: its edges and their neighbours, zeros,
// denormals, powers of two and the floats just below them, extremes and
// random bit patterns.
std::vector<double> Probes(const HistogramSpecHD& spec) {
  std::vector<double> v = {0.0,
                           -0.0,
                           1e-45,
                           -1e-45,
                           1e-40,
                           1e-38,
                           -1e-38,
                           4.9e-324,
                           1.0,
                           -1.0,
                           std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::lowest()};
  for (double e : BinEdges(spec)) {
    if (!std::isfinite(e)) continue;
    for (double x : {e, std::nextafter(e, kInf), std::nextafter(e, -kInf)})
      v.push_back(x);
    const float f = static_cast<float>(e);
    for (float x : {f, std::nextafter(f, kInfF), std::nextafter(f, -kInfF)})
      v.push_back(x);
  }
  for (int e = -150; e <= 128; ++e) {
    const double p = std::ldexp(1.0, e);
    for (double x :
         {p, std::nextafter(p, 0.0),
          static_cast<double>(std::nextafter(static_cast<float>(p), 0.0f))}) {
      v.push_back(x);
      v.push_back(-x);
    }
  }
  std::mt19937 rng(5);
  for (int i = 0; i < 20000; ++i) {
    const uint32_t bits = rng();
    float f;
    std::memcpy(&f, &bits, 4);
    if (std::isfinite(f)) v.push_back(f);
  }
  return v;
}

// Checks edges[bin] <= v < edges[bin + 1] with the documented conventions:
// exponential bins of negative values are (lower, upper] (they hold a
// range of |x| that is [lower, upper) in magnitude), the exponential centre
// is open on both sides, and a fixed x == hi is in the last bin. For fixed
// bins, `slack` allows for the rounding of the float (or double) formula
// next to an edge.
void ExpectWithinEdges(const HistogramSpecHD& spec,
                       const std::vector<double>& edges, double v, uint32_t bin,
                       double slack) {
  ASSERT_LT(bin + 1, edges.size()) << "value " << v;
  const double lower = edges[bin], upper = edges[bin + 1];
  if (spec.kind == kHistogramExponential) {
    const uint32_t centre = (HistogramBinCount(spec) - 3) / 2 + 1;
    if (bin == centre) {
      EXPECT_TRUE(lower < v && v < upper)
          << v << " not in centre (" << lower << ", " << upper << ")";
    } else if (bin < centre) {
      EXPECT_TRUE(lower < v && v <= upper) << v << " not in bin " << bin << " ("
                                           << lower << ", " << upper << "]";
    } else {
      EXPECT_TRUE(lower <= v && v < upper) << v << " not in bin " << bin << " ["
                                           << lower << ", " << upper << ")";
    }
    return;
  }
  if (v == spec.hi && bin == spec.bins) return;  // x == hi: the last bin
  const bool outer = bin == 0 || bin == spec.bins + 1;
  const double s = outer ? 0 : slack;
  EXPECT_TRUE(lower - s <= v && v < upper + s)
      << v << " not in bin " << bin << " [" << lower << ", " << upper
      << ") with slack " << s;
}

TEST(HistogramBins, EveryValueFallsBetweenTheEdgesOfItsBin) {
  for (const HistogramSpecHD& spec : Specs()) {
    SCOPED_TRACE(::testing::Message()
                 << "kind " << spec.kind << " lo " << spec.lo << " hi "
                 << spec.hi << " bins " << spec.bins << " exps "
                 << spec.min_exponent << ".." << spec.max_exponent);
    const HistogramParams p = MakeHistogramParams(spec);
    const std::vector<double> edges = BinEdges(spec);
    ASSERT_EQ(edges.size(), HistogramBinCount(spec) + 1);
    for (size_t i = 1; i < edges.size(); ++i)
      ASSERT_LT(edges[i - 1], edges[i]) << i;
    const double scale = std::fabs(spec.lo) + std::fabs(spec.hi);
    for (double v : Probes(spec)) {
      // As a double, with the double formula.
      ExpectWithinEdges(
          spec, edges, v, HistogramBinF64(p, v),
          4 * std::numeric_limits<double>::epsilon() * (scale + std::fabs(v)));
      // As a float, with the float formula.
      const float f = static_cast<float>(v);
      if (std::isfinite(f)) {
        ExpectWithinEdges(
            spec, edges, f, HistogramBinF32(p, f),
            4 * std::numeric_limits<float>::epsilon() * (scale + std::fabs(f)));
      }
    }
  }
}

TEST(HistogramBins, NonFiniteValuesAreCountedApart) {
  for (const HistogramSpecHD& spec : Specs()) {
    const HistogramParams p = MakeHistogramParams(spec);
    EXPECT_EQ(HistogramBinF32(p, std::nanf("")), kBinNan);
    EXPECT_EQ(HistogramBinF32(p, kInfF), kBinPosInf);
    EXPECT_EQ(HistogramBinF32(p, -kInfF), kBinNegInf);
    EXPECT_EQ(HistogramBinF64(p, std::nan("")), kBinNan);
    EXPECT_EQ(HistogramBinF64(p, kInf), kBinPosInf);
    EXPECT_EQ(HistogramBinF64(p, -kInf), kBinNegInf);
  }
}

TEST(HistogramBins, DocumentedEdgeCases) {
  const HistogramParams fixed = MakeHistogramParams(FixedSpec(-1, 1, 4));
  EXPECT_EQ(HistogramBinF64(fixed, -1.5), 0u);
  EXPECT_EQ(HistogramBinF64(fixed, -1.0), 1u);  // lo is in the first bin
  EXPECT_EQ(HistogramBinF64(fixed, 1.0), 4u);   // hi too, in the last
  EXPECT_EQ(HistogramBinF64(fixed, 1.0000001), 5u);
  EXPECT_EQ(HistogramBinF32(fixed, 0.0f), 3u);
  EXPECT_EQ(HistogramBinF32(fixed, -0.0f), 3u);

  const HistogramSpecHD spec =
      ExponentialSpec(-2, 2, 1);  // per_sign 8, centre 9, 19 counters
  const HistogramParams e = MakeHistogramParams(spec);
  EXPECT_EQ(HistogramBinF64(e, 0.0), 9u);
  EXPECT_EQ(HistogramBinF64(e, -0.0), 9u);
  EXPECT_EQ(HistogramBinF64(e, 0.2499), 9u);  // |x| < 2^-2
  EXPECT_EQ(HistogramBinF64(e, 0.25), 10u);   // 2^-2: first positive bin
  EXPECT_EQ(HistogramBinF64(e, -0.25), 8u);   // and its mirror
  EXPECT_EQ(HistogramBinF64(e, 0.375), 11u);  // 1.5 * 2^-2: second sub-bin
  EXPECT_EQ(HistogramBinF64(e, 3.999), 17u);  // just below 2^2
  EXPECT_EQ(HistogramBinF64(e, 4.0), 18u);    // 2^max: the last counter
  EXPECT_EQ(HistogramBinF64(e, -4.0), 0u);    // -2^max: the first
  EXPECT_EQ(HistogramBinF32(e, 1e-45f), 9u);  // a float denormal
}

// The same value held as F16, BF16, F32 or F64 lands in the same
// exponential bin, because the bin is read off the exponent and the top
// mantissa bits.
TEST(HistogramBins, ExponentialBinDoesNotDependOnTheRepresentation) {
  for (const HistogramSpecHD& spec :
       {DefaultExponentialSpec(), ExponentialSpec(-126, 127, 4), ExponentialSpec(-24, 16, 4),
        ExponentialSpec(-14, 15, 2)}) {
    const HistogramParams p = MakeHistogramParams(spec);
    for (uint32_t i = 0; i < 65536; ++i) {
      const uint16_t h = static_cast<uint16_t>(i);
      for (const float f : {HalfToFloat(h), BFloat16ToFloat(h)}) {
        ASSERT_EQ(ExpBinF32(p, f), ExpBinF64(p, static_cast<double>(f)))
            << "pattern 0x" << std::hex << i << " value " << f;
      }
    }
    std::mt19937 rng(3);
    for (int i = 0; i < 200000; ++i) {
      const uint32_t bits = rng();
      float f;
      std::memcpy(&f, &bits, 4);
      if (std::isnan(f)) continue;
      ASSERT_EQ(ExpBinF32(p, f), ExpBinF64(p, static_cast<double>(f))) << f;
    }
    // Whole histograms of the same values in the four types.
    std::vector<uint16_t> halves;
    std::vector<float> floats;
    std::vector<double> doubles;
    std::vector<uint16_t> bf;
    for (uint32_t i = 0; i < 65536; ++i) {
      const uint16_t h = static_cast<uint16_t>(i);
      halves.push_back(h);
      floats.push_back(HalfToFloat(h));
      doubles.push_back(HalfToFloat(h));
    }
    for (float f :
         floats) {  // every half is exactly a bfloat16 when its mantissa fits
      uint32_t b;
      std::memcpy(&b, &f, 4);
      if ((b & 0xFFFFu) == 0) bf.push_back(static_cast<uint16_t>(b >> 16));
    }
    auto histogram = [&](const void* data, v1::DType dtype, size_t n) {
      HistogramCounts h = HistogramCounts::Empty(spec);
      EXPECT_THAT(CpuAccumulate(nullptr, &h, data, dtype, n),
                  ::sonde::testing::IsOk());
      return h;
    };
    const HistogramCounts from_half =
        histogram(halves.data(), v1::DTYPE_F16, halves.size());
    const HistogramCounts from_float =
        histogram(floats.data(), v1::DTYPE_F32, floats.size());
    const HistogramCounts from_double =
        histogram(doubles.data(), v1::DTYPE_F64, doubles.size());
    EXPECT_EQ(from_half.counts, from_float.counts);
    EXPECT_EQ(from_half.counts, from_double.counts);
    EXPECT_EQ(from_half.nan_count, from_double.nan_count);
    std::vector<float> bf_floats;
    for (uint16_t b : bf) bf_floats.push_back(BFloat16ToFloat(b));
    EXPECT_EQ(
        histogram(bf.data(), v1::DTYPE_BF16, bf.size()).counts,
        histogram(bf_floats.data(), v1::DTYPE_F32, bf_floats.size()).counts);
  }
}

// ---- counting and merging
// ------------------------------------------------------

std::vector<float> Data(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  const float specials[] = {std::nanf(""), kInfF,  -kInfF, 0.0f,
                            -0.0f,         1e-42f, 6.0f,   -4.0f};
  for (size_t i = 0; i < n / 50; ++i) v[rng() % n] = specials[rng() % 8];
  return v;
}

TEST(Histogram, HistogramsOfSplitDataMergeExactlyToTheWhole) {
  const std::vector<float> v = Data(50000, 1);
  std::mt19937 rng(2);
  for (const HistogramSpecHD& spec : Specs()) {
    HistogramCounts whole = HistogramCounts::Empty(spec);
    AccumulateHistogramScalar(whole, v.data(), v1::DTYPE_F32, v.size());
    for (int trial = 0; trial < 5; ++trial) {
      std::vector<size_t> cuts = {0, v.size()};
      for (int i = 0; i < 4; ++i) cuts.push_back(rng() % (v.size() + 1));
      std::sort(cuts.begin(), cuts.end());
      HistogramCounts merged = HistogramCounts::Empty(spec);
      for (size_t c = 0; c + 1 < cuts.size(); ++c) {
        HistogramCounts piece = HistogramCounts::Empty(spec);
        SONDE_ASSERT_OK(CpuAccumulate(nullptr, &piece, v.data() + cuts[c],
                                      v1::DTYPE_F32, cuts[c + 1] - cuts[c]));
        SONDE_ASSERT_OK(MergeInto(merged, piece));
      }
      EXPECT_EQ(merged.counts, whole.counts);
      EXPECT_EQ(merged.nan_count, whole.nan_count);
      EXPECT_EQ(merged.pos_inf_count, whole.pos_inf_count);
      EXPECT_EQ(merged.neg_inf_count, whole.neg_inf_count);
    }
  }
}

TEST(Histogram, CountersSumToTheFiniteCountAndValidateAgainstTheStatistics) {
  const std::vector<float> v = Data(30001, 4);
  for (const HistogramSpecHD& spec : Specs()) {
    StatsAccumulator acc;
    HistogramCounts h = HistogramCounts::Empty(spec);
    SONDE_ASSERT_OK(CpuAccumulate(&acc, &h, v.data(), v1::DTYPE_F32, v.size()));
    EXPECT_EQ(h.finite_total(), acc.finite_count);
    EXPECT_EQ(h.nan_count, acc.nan_count);
    const v1::Statistics stats = ToProto(acc);
    v1::Histogram proto = ToProto(h);
    SONDE_EXPECT_OK(ValidateHistogram(proto, &stats));
    auto back = FromProto(proto);
    SONDE_ASSERT_OK(back);
    EXPECT_EQ(back->counts, h.counts);

    proto.set_counts(1, proto.counts(1) + 1);
    EXPECT_THAT(
        ValidateHistogram(proto, &stats),
        StatusIs(absl::StatusCode::kInvalidArgument, "counters add up to"));
    SONDE_EXPECT_OK(
        ValidateHistogram(proto, nullptr));  // consistent on its own
    proto.set_counts(1, proto.counts(1) - 1);
    proto.set_nan_count(proto.nan_count() + 1);
    EXPECT_THAT(
        ValidateHistogram(proto, &stats),
        StatusIs(absl::StatusCode::kInvalidArgument, "NaN/Inf counts differ"));
  }
}

TEST(Histogram, MergeRefusesDifferentBins) {
  HistogramCounts a = HistogramCounts::Empty(FixedSpec(0, 1, 4));
  EXPECT_THAT(
      MergeInto(a, HistogramCounts::Empty(FixedSpec(0, 2, 4))),
      StatusIs(absl::StatusCode::kFailedPrecondition, "different bins"));
  EXPECT_THAT(
      MergeInto(a, HistogramCounts::Empty(DefaultExponentialSpec())),
      StatusIs(absl::StatusCode::kFailedPrecondition, "different bins"));
}

// ---- validation
// ----------------------------------------------------------------

v1::HistogramSpec FixedProto(double lo, double hi, uint32_t bins) {
  v1::HistogramSpec p;
  p.set_kind(v1::HistogramSpec::KIND_FIXED);
  p.set_lo(lo);
  p.set_hi(hi);
  p.set_bins(bins);
  return p;
}

v1::HistogramSpec ExpProto(int32_t min_e, int32_t max_e, uint32_t sub_bits) {
  v1::HistogramSpec p;
  p.set_kind(v1::HistogramSpec::KIND_EXPONENTIAL);
  p.set_min_exponent(min_e);
  p.set_max_exponent(max_e);
  p.set_sub_bits(sub_bits);
  return p;
}

TEST(HistogramSpec, RejectsBadSpecsSayingWhatIsWrong) {
  struct Case {
    v1::HistogramSpec spec;
    const char* message;
  };
  v1::HistogramSpec unknown;
  unknown.set_kind(static_cast<v1::HistogramSpec::Kind>(7));
  const Case cases[] = {
      {v1::HistogramSpec(), "unknown kind 0"},
      {unknown, "unknown kind 7"},
      {FixedProto(1, 1, 4), "finite lo < hi, got [1, 1]"},
      {FixedProto(2, 1, 4), "finite lo < hi"},
      {FixedProto(std::nan(""), 1, 4), "finite lo < hi"},
      {FixedProto(0, kInf, 4), "finite lo < hi"},
      {FixedProto(1, 1 + 1e-12, 4), "not distinct in float precision"},
      {FixedProto(0, 1e39, 4),
       "not distinct in float precision"},  // hi overflows float
      {FixedProto(0, 1, 0), "bins must be in 1..16384, got 0"},
      {FixedProto(0, 1, 16385), "got 16385"},
      {FixedProto(-3e38, 3e38, 4), "too wide or too narrow for float"},
      {FixedProto(0, 1e-40, 16), "too wide or too narrow for float"},
      {ExpProto(-127, 0, 2),
       "-126 <= min_exponent < max_exponent <= 127, got -127 and 0"},
      {ExpProto(0, 128, 2), "got 0 and 128"},
      {ExpProto(3, 3, 2), "got 3 and 3"},
      {ExpProto(-3, 3, 5), "sub_bits must be at most 4, got 5"},
      {ExpProto(-126, 127, 4), ""},  // the widest allowed
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec.ShortDebugString());
    if (c.message[0] == '\0') {
      SONDE_EXPECT_OK(SpecFromProto(c.spec));
    } else {
      EXPECT_THAT(SpecFromProto(c.spec),
                  StatusIs(absl::StatusCode::kInvalidArgument, c.message));
    }
  }
}

TEST(HistogramSpec, RoundTripsThroughTheProto) {
  for (const HistogramSpecHD& spec : Specs()) {
    auto back = SpecFromProto(SpecToProto(spec));
    SONDE_ASSERT_OK(back);
    EXPECT_TRUE(SameSpec(*back, spec));
  }
}

TEST(Histogram, FromProtoChecksTheNumberOfCounters) {
  v1::Histogram p;
  *p.mutable_spec() = FixedProto(0, 1, 4);
  for (int i = 0; i < 5; ++i) p.add_counts(0);
  EXPECT_THAT(FromProto(p), StatusIs(absl::StatusCode::kInvalidArgument,
                                     "spec needs 6 counters, got 5"));
  p.add_counts(0);
  SONDE_EXPECT_OK(FromProto(p));
  *p.mutable_spec() = FixedProto(1, 0, 4);
  EXPECT_THAT(ValidateHistogram(p, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, "lo < hi"));
}

}  // namespace
}  // namespace sonde
