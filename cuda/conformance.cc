#include "cuda/conformance.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "math/float16_math.h"

namespace sonde {
namespace {

std::string Encode(const std::vector<double>& values, v1::DType dtype) {
  std::string out;
  for (double v : values) {
    switch (dtype) {
      case v1::DTYPE_F32: {
        const float f = static_cast<float>(v);
        out.append(reinterpret_cast<const char*>(&f), 4);
        break;
      }
      case v1::DTYPE_F64:
        out.append(reinterpret_cast<const char*>(&v), 8);
        break;
      case v1::DTYPE_F16:
      case v1::DTYPE_BF16: {
        const float f = static_cast<float>(v);
        const uint16_t h = dtype == v1::DTYPE_F16 ? SondeFloatToHalf(f) : SondeFloatToBf16(f);
        out.append(reinterpret_cast<const char*>(&h), 2);
        break;
      }
      default:
        break;
    }
  }
  return out;
}

const char* Short(v1::DType d) {
  switch (d) {
    case v1::DTYPE_F32: return "f32";
    case v1::DTYPE_F16: return "f16";
    case v1::DTYPE_BF16: return "bf16";
    case v1::DTYPE_F64: return "f64";
    default: return "?";
  }
}

bool Near(double a, double b, double tolerance) {
  if (a == b) return true;  // also equal infinities
  return std::fabs(a - b) <= tolerance;
}

}  // namespace

std::vector<ConformanceCase> ConformanceCases() {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
  struct Pattern {
    std::string name;
    std::vector<double> values;
  };
  std::vector<Pattern> patterns;
  std::mt19937_64 rng(20261122);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (uint64_t n : {0ull, 1ull, 7ull, 255ull, 256ull, 257ull, 1023ull, 65535ull, 65536ull,
                     65537ull, 1000003ull}) {
    Pattern p{absl::StrCat("normal_", n), {}};
    for (uint64_t i = 0; i < n; ++i) p.values.push_back(normal(rng));
    patterns.push_back(std::move(p));
  }
  {
    Pattern p{"nonfinite_sprinkled", {}};
    for (int i = 0; i < 200003; ++i) {
      const int r = static_cast<int>(rng() % 1000);
      p.values.push_back(r == 0 ? kNan : r == 1 ? kInf : r == 2 ? -kInf : r == 3 ? -0.0 : normal(rng));
    }
    patterns.push_back(std::move(p));
  }
  patterns.push_back({"all_nan", std::vector<double>(1000, kNan)});
  patterns.push_back({"all_inf", std::vector<double>(999, kInf)});
  patterns.push_back({"all_equal", std::vector<double>(131071, 0.3)});
  patterns.push_back({"all_zero", std::vector<double>(70000, 0.0)});
  {
    Pattern p{"denormals", {}};
    for (int i = 0; i < 5000; ++i) p.values.push_back((i % 2 ? -1 : 1) * 1e-40 * (1 + i % 7));
    patterns.push_back(std::move(p));
  }
  {
    Pattern p{"extreme", {}};
    for (int i = 0; i < 5000; ++i) p.values.push_back((i % 3 ? -3e38 : 3e38) * (0.5 + (i % 5) / 10.0));
    patterns.push_back(std::move(p));
  }
  {
    Pattern p{"large_offset", {}};
    for (int i = 0; i < 300001; ++i) p.values.push_back(1e4 + 1e-2 * normal(rng));
    patterns.push_back(std::move(p));
  }
  {
    // Rare spikes (some the first element of a chunk: an outlier shift) in
    // ordinary data: groups with a spike over 2^60 go element by element.
    Pattern p{"spikes", {}};
    for (int i = 0; i < 140001; ++i) {
      const double v = normal(rng);
      p.values.push_back(i % 16384 == 0 ? 3e9 : i % 997 == 0 ? v * 1e20 : i % 331 == 0 ? v * 1e8 : v);
    }
    patterns.push_back(std::move(p));
  }
  {
    // Magnitudes from 1e-30 to 1e30 side by side: some groups fold in
    // float with squares that underflow next to large ones, others not.
    Pattern p{"wide_range", {}};
    std::uniform_int_distribution<int> exponent(-30, 30);
    for (int i = 0; i < 100003; ++i) p.values.push_back(normal(rng) * std::pow(10.0, exponent(rng)));
    patterns.push_back(std::move(p));
  }
  {
    // Tiny data whose squares underflow float: every group element by element.
    Pattern p{"tiny", {}};
    for (int i = 0; i < 20000; ++i) p.values.push_back(1e-25 * normal(rng));
    patterns.push_back(std::move(p));
  }
  std::vector<ConformanceCase> cases;
  for (const Pattern& p : patterns) {
    for (v1::DType d : {v1::DTYPE_F32, v1::DTYPE_F16, v1::DTYPE_BF16, v1::DTYPE_F64}) {
      cases.push_back({absl::StrCat(p.name, "_", Short(d)), d, p.values.size(), Encode(p.values, d)});
    }
  }
  return cases;
}

absl::Status CompareRecords(const StatsAccumulator& g, const StatsAccumulator& c, v1::DType dtype) {
  auto differ = [&](absl::string_view field, double a, double b) {
    return absl::InternalError(absl::StrCat(field, ": device ", a, " vs cpu ", b));
  };
  if (g.count != c.count) return differ("count", g.count, c.count);
  if (g.finite_count != c.finite_count) return differ("finite_count", g.finite_count, c.finite_count);
  if (g.nan_count != c.nan_count) return differ("nan_count", g.nan_count, c.nan_count);
  if (g.pos_inf_count != c.pos_inf_count) return differ("pos_inf_count", g.pos_inf_count, c.pos_inf_count);
  if (g.neg_inf_count != c.neg_inf_count) return differ("neg_inf_count", g.neg_inf_count, c.neg_inf_count);
  if (g.zero_count != c.zero_count) return differ("zero_count", g.zero_count, c.zero_count);
  if (c.count > c.nan_count) {
    if (g.min != c.min) return differ("min", g.min, c.min);
    if (g.max != c.max) return differ("max", g.max, c.max);
    if (g.abs_min != c.abs_min) return differ("abs_min", g.abs_min, c.abs_min);
    if (g.abs_max != c.abs_max) return differ("abs_max", g.abs_max, c.abs_max);
  }
  if (c.finite_count == 0) return absl::OkStatus();
  const double rel = dtype == v1::DTYPE_F64 ? 1e-12 : 1e-6;
  const double tiny = std::numeric_limits<double>::min();
  if (!Near(g.sum, c.sum, rel * c.l1 + tiny)) return differ("sum", g.sum, c.sum);
  if (!Near(g.l1, c.l1, rel * c.l1 + tiny)) return differ("l1", g.l1, c.l1);
  if (!Near(g.sum_squares, c.sum_squares, rel * c.sum_squares + tiny)) {
    return differ("sum_squares", g.sum_squares, c.sum_squares);
  }
  const double n = static_cast<double>(c.finite_count);
  // The finite range bounds |x - shift| for any shift inside the data.
  const double range = std::isfinite(c.max - c.min) ? c.max - c.min : c.abs_max * 2;
  // Plus n * (rel * |x|max)^2: the m2 that rounding the mean alone leaves
  // in data with no spread at all.
  const double m2_tolerance =
      10 * rel * (c.m2 + n * range * range) + n * (rel * c.abs_max) * (rel * c.abs_max) + tiny;
  if (std::isfinite(m2_tolerance) && !Near(g.m2, c.m2, m2_tolerance)) return differ("m2", g.m2, c.m2);
  if (!Near(g.mean, c.mean, rel * (c.l1 / n) + rel * range + tiny)) return differ("mean", g.mean, c.mean);
  return absl::OkStatus();
}

absl::Status CompareHistograms(const HistogramCounts& g, const HistogramCounts& c) {
  if (!SameSpec(g.spec, c.spec) || g.counts.size() != c.counts.size()) {
    return absl::InternalError("histograms have different specs");
  }
  for (size_t i = 0; i < c.counts.size(); ++i) {
    if (g.counts[i] != c.counts[i]) {
      return absl::InternalError(
          absl::StrCat("histogram counter ", i, ": device ", g.counts[i], " vs cpu ", c.counts[i]));
    }
  }
  if (g.nan_count != c.nan_count || g.pos_inf_count != c.pos_inf_count ||
      g.neg_inf_count != c.neg_inf_count) {
    return absl::InternalError("histogram NaN/Inf counts differ");
  }
  return absl::OkStatus();
}

}  // namespace sonde
