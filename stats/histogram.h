// Histograms with data-independent bins (see histogram_math.h for the bin
// rules): specs and counts, their wire records, validation and exact merge.
// Thread-compatible values; no shared state.
#ifndef SONDE_STATS_HISTOGRAM_H_
#define SONDE_STATS_HISTOGRAM_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "math/histogram_math.h"
#include "proto/tensor.pb.h"

namespace sonde {

// Counters of one histogram, laid out as histogram_math.h describes.
struct HistogramCounts {
  HistogramSpecHD spec;
  std::vector<uint64_t> counts;  // HistogramBinCount(spec) counters
  uint64_t nan_count = 0;
  uint64_t pos_inf_count = 0;
  uint64_t neg_inf_count = 0;

  // Zeroed counters for `spec`.
  static HistogramCounts Empty(const HistogramSpecHD& spec);

  // Counts one element given the bin histogram_math.h chose for it.
  void Add(uint32_t bin) {
    if (bin == kBinNan) {
      ++nan_count;
    } else if (bin == kBinPosInf) {
      ++pos_inf_count;
    } else if (bin == kBinNegInf) {
      ++neg_inf_count;
    } else {
      ++counts[bin];
    }
  }

  uint64_t finite_total() const;
};

// Checks a spec against the limits in histogram_math.h; InvalidArgument
// saying which field is wrong otherwise.
absl::Status ValidateSpec(const HistogramSpecHD& spec);
absl::StatusOr<HistogramSpecHD> SpecFromProto(const v1::HistogramSpec& spec);
v1::HistogramSpec SpecToProto(const HistogramSpecHD& spec);
bool SameSpec(const HistogramSpecHD& a, const HistogramSpecHD& b);

v1::Histogram ToProto(const HistogramCounts& h);
// Validates the spec and the number of counters.
absl::StatusOr<HistogramCounts> FromProto(const v1::Histogram& h);

// Checks a histogram from the network: a valid spec, the right number of
// counters and, given the tensor's statistics, counters that add up to its
// finite count and NaN/Inf counts equal to the record's.
absl::Status ValidateHistogram(const v1::Histogram& h, const v1::Statistics* stats);

// `b` folded into `a`. FailedPrecondition if the specs differ.
absl::Status MergeInto(HistogramCounts& a, const HistogramCounts& b);

// The lower edge of every counter (size HistogramBinCount(spec) + 1, the
// last entry being the upper edge of the last counter). The outer counters
// reach to -inf / +inf; the exponential centre counter spans (-2^min, 2^min).
std::vector<double> BinEdges(const HistogramSpecHD& spec);

// The scalar reference: counts `count` elements of `dtype` (floating types;
// integers and bool are converted to double first) at `data`.
void AccumulateHistogramScalar(HistogramCounts& h, const void* data, v1::DType dtype,
                               uint64_t count);

}  // namespace sonde

#endif  // SONDE_STATS_HISTOGRAM_H_
