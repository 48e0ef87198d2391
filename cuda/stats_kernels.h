// Launchers of Sonde's CUDA kernels, callable from host C++ compiled by any
// compiler (the kernels themselves are built by nvcc). Every launcher only
// enqueues work on `stream` and returns the launch's cudaError_t as an int
// (0 on success); none synchronizes.
#ifndef SONDE_CUDA_STATS_KERNELS_H_
#define SONDE_CUDA_STATS_KERNELS_H_

#include <cstdint>

#include "math/histogram_math.h"
#include "cuda/multi_tensor.h"
#include "math/stats_math.h"

namespace sonde {

// How the statistics kernel adds histogram counts: an atomic per element, or
// one per distinct bin of a warp's elements (DeviceStatsOptions::
// warp_aggregated_histograms; gpu_check times both).
enum HistogramMode : int {
  kHistogramAtomics = 0,
  kHistogramWarpAggregated = 1,
};

// Statistics (and histograms where a tensor asks) of every tensor of a batch
// in two launches: one block per chunk writes the chunk's partial record to
// `partials[chunk]` and adds its counts into `counters` (zeroed by the
// caller); then one block per tensor merges its chunks' partial records in
// chunk order into `out[tensor]`. All pointers are device memory.
// `histogram_mode` says how histogram counts are added (HistogramMode).
int LaunchStatsBatch(const KernelTensor* tensors, uint32_t tensor_count,
                     const KernelChunk* chunks, uint32_t chunk_count,
                     const HistogramParams& histogram, int histogram_mode,
                     StatsAccumulator* partials, unsigned long long* counters,
                     StatsAccumulator* out, void* stream);

// Copies `bytes` bytes from `src` to `dst` (device memory, not
// overlapping) with a kernel, one launch: 16-byte words where both are
// 16-byte aligned, else the widest of 4-, 2- or 1-byte words both allow.
int LaunchCopy(const void* src, void* dst, uint64_t bytes, void* stream);

// Converts `count` elements of `src` (F32 or F64) to `dst_dtype` (F32, F16
// or BF16; rounding to nearest even) into `dst`, one launch.
int LaunchConvert(const void* src, int32_t src_dtype, void* dst, int32_t dst_dtype,
                  uint64_t count, void* stream);

// What the device compiled the statistics kernel to (for reports): registers
// a thread, blocks of its size resident per SM, threads per block. Returns
// the cudaError_t of the queries.
struct StatsKernelInfo {
  int registers = 0;
  int blocks_per_sm = 0;
  int threads = 0;
};
int QueryStatsKernel(StatsKernelInfo* info);

// Kernel launches LaunchStatsBatch makes for one batch (for reports).
inline constexpr int kLaunchesPerBatch = 2;

}  // namespace sonde

#endif  // SONDE_CUDA_STATS_KERNELS_H_
