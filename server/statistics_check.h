// Whether statistics a client sent agree with the values it sent beside
// them. Clients compute statistics (on the GPU, or on the CPU before
// converting values to F16/BF16), so the collector does not take them on
// trust: where values arrive, it recomputes and compares, and keeps the
// client's only when they agree (issue 16: a client could store max = 1e30
// next to values that are all 1.0).
#ifndef SONDE_SERVER_STATISTICS_CHECK_H_
#define SONDE_SERVER_STATISTICS_CHECK_H_

#include "absl/status/status.h"
#include "proto/tensor.pb.h"

namespace sonde::server {

// OK when `client` can be the statistics of the values whose statistics,
// recomputed from the stored bytes of dtype `values_dtype`, are `computed`;
// otherwise InvalidArgument naming the first field that cannot.
// For F32/F64 and integer values: counts and extremes exactly, sums and m2
// within summation-order rounding. For F16/BF16 values, which a client may
// have converted from F32 after taking the statistics: the element and NaN
// counts exactly, extremes and sums within the rounding of the conversion,
// and the other counts not at all (conversion moves values to 0 and Inf).
absl::Status CheckClientStatistics(const v1::Statistics& client, const v1::Statistics& computed,
                                   v1::DType values_dtype);

}  // namespace sonde::server

#endif  // SONDE_SERVER_STATISTICS_CHECK_H_
