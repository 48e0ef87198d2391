// The conformance cases the device path must pass against the CPU path,
// shared by the GPU tests and the gpu_check tool: sizes around every block
// and chunk boundary, every float dtype, NaN/Inf/denormals/-0, all-equal
// data, extreme magnitudes and large offsets.
#ifndef SONDE_CUDA_CONFORMANCE_H_
#define SONDE_CUDA_CONFORMANCE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "stats/histogram.h"
#include "math/stats_math.h"
#include "proto/tensor.pb.h"

namespace sonde {

struct ConformanceCase {
  std::string name;
  v1::DType dtype;
  uint64_t count;
  std::string bytes;  // little-endian elements
};

// Deterministic (fixed seeds): the same cases on every machine.
std::vector<ConformanceCase> ConformanceCases();

// Compares a device result with the CPU reference: counts, extremes and
// histogram counters exactly; sums, l1, sum_squares within
// 1e-6 (F32/F16/BF16) or 1e-12 (F64) of the matching sum of magnitudes;
// m2 within that fraction of m2 plus n * range^2 (the size of the shifted
// sums it comes from). InternalError naming the first difference.
absl::Status CompareRecords(const StatsAccumulator& device, const StatsAccumulator& cpu,
                            v1::DType dtype);
absl::Status CompareHistograms(const HistogramCounts& device, const HistogramCounts& cpu);

}  // namespace sonde

#endif  // SONDE_CUDA_CONFORMANCE_H_
