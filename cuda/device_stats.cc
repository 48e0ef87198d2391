// What every device engine shares: option checks, the pinned size of a
// statistics batch, and the snapshot conversions.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "cuda/device_stats.h"
#include "math/histogram_math.h"
#include "cuda/multi_tensor.h"

namespace sonde {
namespace {

uint64_t AlignUp(uint64_t n) { return (n + 255) & ~uint64_t{255}; }

}  // namespace

absl::Status ValidateDeviceStatsOptions(const DeviceStatsOptions& o) {
  // A chunk's elements are counted in 32 bits inside the kernel.
  if (o.chunk_elements == 0 || o.chunk_elements > kMaxChunkElements) {
    return absl::InvalidArgumentError(absl::StrCat("chunk_elements is ", o.chunk_elements,
                                                   "; it must be in 1..", kMaxChunkElements));
  }
  if (o.batch_slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat("batch_slots is ", o.batch_slots,
                                                   "; at least 1 is needed"));
  }
  if (o.slot_bytes < 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("slot_bytes is ", o.slot_bytes, "; at least 4096 is needed"));
  }
  if (o.ring_buffers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("ring_buffers is ", o.ring_buffers,
                                                   "; at least 1 is needed"));
  }
  if (o.ring_buffer_bytes < 4096) {
    return absl::InvalidArgumentError(absl::StrCat("ring_buffer_bytes is ", o.ring_buffer_bytes,
                                                   "; at least 4096 is needed"));
  }
  if (o.histogram.kind != kHistogramNone) {
    absl::Status spec = ValidateSpec(o.histogram);
    if (!spec.ok()) return spec;
  }
  return absl::OkStatus();
}

uint64_t StatsChunks(uint64_t count, const DeviceStatsOptions& options) {
  const uint64_t per = TensorChunkElements(count, options.chunk_elements);
  return (count + per - 1) / per;
}

uint64_t StatsBatchBytes(uint64_t tensors, uint64_t chunks, uint64_t histograms,
                         const DeviceStatsOptions& options) {
  const uint64_t counters = histograms * MakeHistogramParams(options.histogram).count;
  // The layout both engines use: [tensors][chunks][records][counters].
  return AlignUp(tensors * sizeof(KernelTensor)) + AlignUp(chunks * sizeof(KernelChunk)) +
         AlignUp(tensors * sizeof(StatsAccumulator)) + AlignUp(counters * sizeof(uint64_t));
}

uint64_t StatsBatchBytes(absl::Span<const DeviceTensorRef> tensors,
                         const DeviceStatsOptions& options) {
  uint64_t chunks = 0;
  uint64_t histograms = 0;
  for (const DeviceTensorRef& t : tensors) {
    chunks += StatsChunks(t.count, options);
    histograms += t.histogram ? 1 : 0;
  }
  return StatsBatchBytes(tensors.size(), chunks, histograms, options);
}

size_t SnapshotElementSize(v1::DType dtype, v1::DType transfer) {
  if (transfer == v1::DTYPE_UNSPECIFIED || transfer == dtype) return DTypeSize(dtype);
  const bool from = dtype == v1::DTYPE_F32 || dtype == v1::DTYPE_F64;
  const bool to = transfer == v1::DTYPE_F32 || transfer == v1::DTYPE_F16 ||
                  transfer == v1::DTYPE_BF16;
  return from && to ? DTypeSize(transfer) : 0;
}

}  // namespace sonde
