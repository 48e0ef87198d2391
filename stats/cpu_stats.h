// The CPU path of Sonde's statistics record and histograms, close to memory
// bandwidth: one pass over the tensor in L1/L2-sized blocks, vectorized with
// AVX2+FMA where the CPU has them (chosen at run time) and portable C++
// otherwise, and split over a small internal worker pool for large tensors.
//
// What it computes is defined by the scalar reference: StatsAdd
// (stats_math.h) and AccumulateHistogramScalar (histogram.h). Counts,
// min/max/abs_min/abs_max and every histogram counter are exactly the
// reference's (up to the sign of a zero min/max). Sums (sum, l1,
// sum_squares), mean and m2 are accumulated in double in a different order,
// so they agree with exact arithmetic to rounding: each is within
// kCpuStatsRelTolerance * (n + 1) of the magnitude it is a sum of, with n
// the element count: l1 for sum, l1 / n for mean, l1, sum_squares, and
// m2 + kCpuStatsRelTolerance * sum_squares for m2 (the rounding of the mean
// itself). That is about 9 n * 2^-53, above the worst case of any summation
// order; real data see far less (cpu_stats_test.cc). m2 is single-pass but
// shifted (see cpu_stats_avx2.cc), so it stays accurate for data far from
// zero, where StatsAdd's Welford update drifts more than this path does.
// For a given CpuStatsOptions::threads, results are deterministic.
//
// Thread-safe: any number of callers may run at once (they share the pool,
// and each caller also works on its own call, so none waits on the others).
#ifndef SONDE_STATS_CPU_STATS_H_
#define SONDE_STATS_CPU_STATS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "stats/histogram.h"
#include "math/stats_math.h"
#include "proto/tensor.pb.h"

namespace sonde {

struct CpuStatsOptions {
  // Number of contiguous parts a large tensor is split into, each processed
  // on its own thread (the caller's thread takes one part). 0 = the default,
  // min(std::thread::hardware_concurrency(), 8). Results depend on this
  // value only, not on how the threads happen to be scheduled.
  int threads = 0;
  // Tensors of fewer bytes than this run on the calling thread alone.
  // Default 8 MiB: below that the hand-off costs more than it saves.
  uint64_t parallel_min_bytes = uint64_t{8} << 20;
  // Use the portable code even where AVX2+FMA is available (tests and
  // comparisons). Default false.
  bool force_portable = false;
};

// Adds `count` elements of `dtype` at `data` (host memory, little-endian, no
// alignment required) to `stats` and `histogram`; either may be null.
// Floating types take the vectorized path; integers and bool are converted
// to double first. InvalidArgument for an unknown dtype or a histogram whose
// spec fails ValidateSpec or whose counters do not match its spec; nothing
// is changed then.
absl::Status CpuAccumulate(StatsAccumulator* stats, HistogramCounts* histogram,
                           const void* data, v1::DType dtype, uint64_t count,
                           const CpuStatsOptions& options = CpuStatsOptions());

// "avx2" where this CPU runs the AVX2+FMA kernels, "portable" otherwise.
const char* CpuStatsImplementation();

// The relative rounding tolerance per element described above.
inline constexpr double kCpuStatsRelTolerance = 1e-15;

}  // namespace sonde

#endif  // SONDE_STATS_CPU_STATS_H_
