// Internal to //cuda:cpu_stats: the block kernels behind CpuAccumulate, one
// table per instruction set (portable C++, AVX2+FMA). A kernel sees one
// block of at most kCpuStatsBlock elements that stays in L1/L2 and either
// returns the block's statistics record (merged by the caller with
// StatsMerge) or adds the block's elements to a HistogramLanes.
//
// The AVX2 table lives in a translation unit compiled with -mavx2 -mfma. It
// must call no inline function from a header (StatsAdd, StatsMerge, the bin
// functions, std:: templates): the linker keeps one copy of each inline
// function for the whole program, and that copy could be the AVX2 one,
// which would then run on CPUs without AVX2. So the AVX2 kernels only fill
// plain structs, and whatever per-element scalar work remains (the last
// < 8 elements of a tensor) is done by the caller in portable code.
// Stateless; thread-safe.
#ifndef SONDE_STATS_CPU_STATS_KERNELS_H_
#define SONDE_STATS_CPU_STATS_KERNELS_H_

#include <cstdint>

#include "math/histogram_math.h"
#include "math/stats_math.h"

namespace sonde {
namespace cpu_stats_internal {

// Elements per block: 32 KiB of F32, so a block read by the statistics loop
// is still in L1/L2 when the histogram loop reads it again.
inline constexpr uint32_t kCpuStatsBlock = 8192;

// Histogram counters split into kHistogramLanes interleaved copies: element
// i of a block increments counter `bin * kHistogramLanes + i % 8`, so runs of
// equal bins (common: most values of a tensor sit in a few octaves) touch
// different words and the increments do not wait on each other's stores.
// One extra bin (`params.count`, the sink) takes NaN and infinities, which
// are counted apart in nan/pos_inf/neg_inf.
inline constexpr uint32_t kHistogramLanes = 8;

struct HistogramLanes {
  HistogramParams params;
  uint32_t* counters = nullptr;  // (params.count + 1) * kHistogramLanes
  uint64_t nan = 0;
  uint64_t pos_inf = 0;
  uint64_t neg_inf = 0;
};

// Kernels take `n` <= kCpuStatsBlock and a multiple of 8 (the caller does
// the last few elements of a tensor with the scalar functions). Data need
// not be aligned.
struct CpuBlockKernels {
  const char* name;
  // The statistics record of n elements (a fresh record, not merged).
  // `shift` is a finite value near the elements that sums are accumulated
  // around (the running mean), or NaN for the block's own mean.
  void (*stats_f32)(const float* x, uint32_t n, double shift,
                    StatsAccumulator* out);
  void (*stats_f64)(const double* x, uint32_t n, double shift,
                    StatsAccumulator* out);
  // Adds n elements to `h`. `all_finite` is a promise from the caller (who
  // knows it from the block's statistics); pass false when unknown.
  void (*hist_f32)(const float* x, uint32_t n, bool all_finite,
                   HistogramLanes* h);
  void (*hist_f64)(const double* x, uint32_t n, bool all_finite,
                   HistogramLanes* h);
  // Whether n elements are all finite (used when there are no statistics).
  bool (*all_finite_f32)(const float* x, uint32_t n);
  bool (*all_finite_f64)(const double* x, uint32_t n);
  // Exact widening of n 16-bit floats.
  void (*f16_to_f32)(const uint16_t* x, uint32_t n, float* out);
  void (*bf16_to_f32)(const uint16_t* x, uint32_t n, float* out);
};

// Defined in cpu_stats_avx2.cc; call only where the CPU has AVX2 and FMA.
const CpuBlockKernels& Avx2Kernels();

}  // namespace cpu_stats_internal
}  // namespace sonde

#endif  // SONDE_STATS_CPU_STATS_KERNELS_H_
