#include "stats/histogram.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"

namespace sonde {

HistogramCounts HistogramCounts::Empty(const HistogramSpecHD& spec) {
  HistogramCounts h;
  h.spec = spec;
  h.counts.assign(HistogramBinCount(spec), 0);
  return h;
}

uint64_t HistogramCounts::finite_total() const {
  uint64_t total = 0;
  for (uint64_t c : counts) total += c;
  return total;
}

absl::Status ValidateSpec(const HistogramSpecHD& s) {
  switch (s.kind) {
    case kHistogramFixed:
      if (!std::isfinite(s.lo) || !std::isfinite(s.hi) || !(s.lo < s.hi)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "histogram: fixed range needs finite lo < hi, got [", s.lo, ", ", s.hi, "]"));
      }
      if (!std::isfinite(static_cast<float>(s.lo)) || !std::isfinite(static_cast<float>(s.hi)) ||
          !(static_cast<float>(s.lo) < static_cast<float>(s.hi))) {
        return absl::InvalidArgumentError(absl::StrCat(
            "histogram: fixed range [", s.lo, ", ", s.hi, "] is not distinct in float precision"));
      }
      if (s.bins == 0 || s.bins > kHistogramMaxBins) {
        return absl::InvalidArgumentError(absl::StrCat(
            "histogram: bins must be in 1..", kHistogramMaxBins, ", got ", s.bins));
      }
      // FixedBinF32 computes (x - lo) * (bins / (hi - lo)) in float: both
      // factors must be finite there, or the bin of an in-range value would
      // come from converting inf or NaN to an integer.
      if (!std::isfinite(static_cast<float>(s.hi) - static_cast<float>(s.lo)) ||
          !std::isfinite(static_cast<float>(s.bins / (s.hi - s.lo)))) {
        return absl::InvalidArgumentError(absl::StrCat(
            "histogram: fixed range [", s.lo, ", ", s.hi, "] with ", s.bins,
            " bins is too wide or too narrow for float arithmetic"));
      }
      return absl::OkStatus();
    case kHistogramExponential:
      if (s.min_exponent < kHistogramMinExponent || s.max_exponent > kHistogramMaxExponent ||
          s.min_exponent >= s.max_exponent) {
        return absl::InvalidArgumentError(absl::StrCat(
            "histogram: exponents need ", kHistogramMinExponent, " <= min_exponent < max_exponent <= ",
            kHistogramMaxExponent, ", got ", s.min_exponent, " and ", s.max_exponent));
      }
      if (s.sub_bits > kHistogramMaxSubBits) {
        return absl::InvalidArgumentError(absl::StrCat(
            "histogram: sub_bits must be at most ", kHistogramMaxSubBits, ", got ", s.sub_bits));
      }
      if (HistogramBinCount(s) > kHistogramMaxBins + 2) {
        return absl::InvalidArgumentError(absl::StrCat(
            "histogram: ", HistogramBinCount(s), " counters exceed the limit of ",
            kHistogramMaxBins + 2, "; narrow the exponent range or use fewer sub_bits"));
      }
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(absl::StrCat("histogram: unknown kind ", s.kind));
  }
}

absl::StatusOr<HistogramSpecHD> SpecFromProto(const v1::HistogramSpec& p) {
  HistogramSpecHD s;
  s.kind = static_cast<int32_t>(p.kind());
  if (s.kind == kHistogramFixed) {
    s.lo = p.lo();
    s.hi = p.hi();
    s.bins = p.bins();
  } else if (s.kind == kHistogramExponential) {
    s.min_exponent = p.min_exponent();
    s.max_exponent = p.max_exponent();
    s.sub_bits = p.sub_bits();
  }
  absl::Status status = ValidateSpec(s);
  if (!status.ok()) return status;
  return s;
}

v1::HistogramSpec SpecToProto(const HistogramSpecHD& s) {
  v1::HistogramSpec p;
  p.set_kind(static_cast<v1::HistogramSpec::Kind>(s.kind));
  if (s.kind == kHistogramFixed) {
    p.set_lo(s.lo);
    p.set_hi(s.hi);
    p.set_bins(s.bins);
  } else if (s.kind == kHistogramExponential) {
    p.set_min_exponent(s.min_exponent);
    p.set_max_exponent(s.max_exponent);
    p.set_sub_bits(s.sub_bits);
  }
  return p;
}

bool SameSpec(const HistogramSpecHD& a, const HistogramSpecHD& b) {
  if (a.kind != b.kind) return false;
  if (a.kind == kHistogramFixed) return a.lo == b.lo && a.hi == b.hi && a.bins == b.bins;
  if (a.kind == kHistogramExponential) {
    return a.min_exponent == b.min_exponent && a.max_exponent == b.max_exponent &&
           a.sub_bits == b.sub_bits;
  }
  return true;
}

v1::Histogram ToProto(const HistogramCounts& h) {
  v1::Histogram p;
  *p.mutable_spec() = SpecToProto(h.spec);
  p.mutable_counts()->Add(h.counts.begin(), h.counts.end());
  p.set_nan_count(h.nan_count);
  p.set_pos_inf_count(h.pos_inf_count);
  p.set_neg_inf_count(h.neg_inf_count);
  return p;
}

absl::StatusOr<HistogramCounts> FromProto(const v1::Histogram& p) {
  absl::StatusOr<HistogramSpecHD> spec = SpecFromProto(p.spec());
  if (!spec.ok()) return spec.status();
  const uint32_t want = HistogramBinCount(*spec);
  if (static_cast<uint32_t>(p.counts_size()) != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "histogram: spec needs ", want, " counters, got ", p.counts_size()));
  }
  HistogramCounts h;
  h.spec = *spec;
  h.counts.assign(p.counts().begin(), p.counts().end());
  h.nan_count = p.nan_count();
  h.pos_inf_count = p.pos_inf_count();
  h.neg_inf_count = p.neg_inf_count();
  return h;
}

absl::Status ValidateHistogram(const v1::Histogram& p, const v1::Statistics* stats) {
  absl::StatusOr<HistogramCounts> h = FromProto(p);
  if (!h.ok()) return h.status();
  uint64_t total = 0;
  for (uint64_t c : h->counts) {
    if (total + c < total) return absl::InvalidArgumentError("histogram: counters overflow");
    total += c;
  }
  if (stats != nullptr) {
    if (total != stats->finite_count()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "histogram: counters add up to ", total, " but the tensor has ",
          stats->finite_count(), " finite elements"));
    }
    if (h->nan_count != stats->nan_count() || h->pos_inf_count != stats->pos_inf_count() ||
        h->neg_inf_count != stats->neg_inf_count()) {
      return absl::InvalidArgumentError(
          "histogram: NaN/Inf counts differ from the tensor's statistics");
    }
  }
  return absl::OkStatus();
}

absl::Status MergeInto(HistogramCounts& a, const HistogramCounts& b) {
  if (!SameSpec(a.spec, b.spec) || a.counts.size() != b.counts.size()) {
    return absl::FailedPreconditionError("histograms with different bins do not merge");
  }
  for (size_t i = 0; i < a.counts.size(); ++i) a.counts[i] += b.counts[i];
  a.nan_count += b.nan_count;
  a.pos_inf_count += b.pos_inf_count;
  a.neg_inf_count += b.neg_inf_count;
  return absl::OkStatus();
}

std::vector<double> BinEdges(const HistogramSpecHD& s) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<double> edges;
  const uint32_t n = HistogramBinCount(s);
  if (n == 0) return edges;
  edges.reserve(n + 1);
  if (s.kind == kHistogramFixed) {
    edges.push_back(-kInf);
    const double w = (s.hi - s.lo) / s.bins;
    for (uint32_t i = 0; i < s.bins; ++i) edges.push_back(s.lo + w * i);
    edges.push_back(s.hi);
    edges.push_back(kInf);
    return edges;
  }
  const uint32_t sub = 1u << s.sub_bits;
  const uint32_t per_sign = static_cast<uint32_t>(s.max_exponent - s.min_exponent) * sub;
  // Magnitude of the lower edge of positive sub-bin k.
  auto magnitude = [&](uint32_t k) {
    const int e = s.min_exponent + static_cast<int>(k / sub);
    return std::ldexp(1.0 + static_cast<double>(k % sub) / sub, e);
  };
  edges.push_back(-kInf);
  edges.push_back(-std::ldexp(1.0, s.max_exponent));
  // Negative counter i (1..per_sign) holds k = per_sign - i; its lower edge
  // is minus the upper magnitude of sub-bin k, i.e. -magnitude(k + 1).
  for (uint32_t i = 2; i <= per_sign; ++i) edges.push_back(-magnitude(per_sign - i + 1));
  edges.push_back(-std::ldexp(1.0, s.min_exponent));  // centre's lower edge
  for (uint32_t k = 0; k < per_sign; ++k) edges.push_back(magnitude(k));
  edges.push_back(std::ldexp(1.0, s.max_exponent));
  edges.push_back(kInf);
  return edges;
}

void AccumulateHistogramScalar(HistogramCounts& h, const void* data, v1::DType dtype,
                               uint64_t count) {
  const HistogramParams p = MakeHistogramParams(h.spec);
  if (p.count == 0) return;
  const char* bytes = static_cast<const char*>(data);
  for (uint64_t i = 0; i < count; ++i) {
    switch (dtype) {
      case v1::DTYPE_F32: {
        float v;
        std::memcpy(&v, bytes + 4 * i, 4);
        h.Add(HistogramBinF32(p, v));
        break;
      }
      case v1::DTYPE_F16:
      case v1::DTYPE_BF16: {
        uint16_t v;
        std::memcpy(&v, bytes + 2 * i, 2);
        h.Add(HistogramBinF32(p, dtype == v1::DTYPE_F16 ? HalfToFloat(v) : BFloat16ToFloat(v)));
        break;
      }
      default:
        h.Add(HistogramBinF64(p, ElementAsDouble(bytes, dtype, i)));
        break;
    }
  }
}

}  // namespace sonde
