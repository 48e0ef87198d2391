// Statistics of tensors on the CPU: the sonde.v1.Statistics record (see
// proto/tensor.proto for the definitions, stats_math.h for the per-element
// reference) computed by the fast path of cpu_stats.h, and the record's
// conversions, merge and checks. Thread-safe; no state of its own.
#ifndef SONDE_STATS_STATISTICS_H_
#define SONDE_STATS_STATISTICS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "math/stats_math.h"
#include "proto/tensor.pb.h"

namespace sonde {

// Accumulates `count` elements of `dtype` starting at `data` (host memory,
// no alignment required). Integer and bool elements are converted to double.
void AccumulateStatistics(StatsAccumulator& acc, const void* data,
                          v1::DType dtype, uint64_t count);

// Statistics of a whole tensor given as raw little-endian bytes. Fails with
// InvalidArgument if the byte count is not a multiple of the element size.
absl::StatusOr<v1::Statistics> ComputeStatistics(absl::string_view bytes,
                                                 v1::DType dtype);

// Conversions between the accumulator and the wire record (which also
// carries the derived mean/variance/std/l2).
v1::Statistics ToProto(const StatsAccumulator& acc);
StatsAccumulator FromProto(const v1::Statistics& stats);

// The record of the union of two disjoint parts.
v1::Statistics MergeStatistics(const v1::Statistics& a,
                               const v1::Statistics& b);

// Checks the invariants a record from the network must satisfy (counts add
// up, min <= max, ...); InvalidArgument naming the broken one otherwise.
absl::Status ValidateStatistics(const v1::Statistics& stats);

// smdebug's reduction names: min, max, mean, std, variance, sum, l1, l2
// (and "abs_" variants of min/max/mean/sum, computed from abs_min/abs_max/l1).
// NotFound for names the record cannot answer.
absl::StatusOr<double> ReductionValue(const v1::Statistics& stats,
                                      absl::string_view name, bool abs);

}  // namespace sonde

#endif  // SONDE_STATS_STATISTICS_H_
