// Statistics, histograms and copies of tensors in CUDA device memory,
// computed on the device without ever blocking the caller.
//
// The training thread calls EnqueueStats / EnqueueCopy with the stream that
// produced the tensors. The work is ordered after that stream's work through
// an event, runs on the engine's own stream (statistics of a whole batch in
// two kernel launches), lands in pinned host memory, and the producer's
// stream is made to wait for the reads to finish, so training cannot
// overwrite a tensor while it is being read. No call on the training thread
// synchronizes with the device. Another thread (the client's sender) calls
// Collect to pick up finished work.
//
// Every binary links this: where the build has no CUDA toolkit, or the
// machine has no driver or device, Probe and Create return Unavailable with
// the reason, and callers use the CPU path.
//
// Thread-safe.
#ifndef SONDE_CUDA_DEVICE_STATS_H_
#define SONDE_CUDA_DEVICE_STATS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cuda/histogram.h"
#include "cuda/stats_math.h"
#include "proto/tensor.pb.h"

namespace sonde {

struct DeviceTensorRef {
  const void* data = nullptr;  // device memory, contiguous
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;  // F32, F16, BF16 or F64
  uint64_t count = 0;          // elements
  bool histogram = false;      // also fill a histogram with the engine's spec
};

struct DeviceStatsOptions {
  int device = 0;
  uint64_t chunk_elements = uint64_t{1} << 16;  // elements per block
  int batch_slots = 4;                  // statistics batches in flight
  uint64_t slot_bytes = 4u << 20;       // pinned staging per batch
  int staging_buffers = 8;              // pinned buffers for tensor copies
  uint64_t staging_bytes = 4u << 20;    // bytes per copy buffer
  HistogramSpecHD histogram = DefaultExponentialSpec();
};

struct DeviceCompletion {
  uint64_t ticket = 0;
  absl::Status status;                    // the device's error, if any
  // Statistics work: one record per tensor, in the order given, and a
  // histogram for each tensor that asked (nullopt elsewhere).
  std::vector<StatsAccumulator> stats;
  std::vector<HistogramCounts> histograms;  // empty counters where not asked
  // Copy work: the tensor's bytes in `copy_dtype`.
  std::string bytes;
  v1::DType copy_dtype = v1::DTYPE_UNSPECIFIED;
};

class DeviceStats {
 public:
  // OK when a device with this ordinal can run the kernels; otherwise
  // Unavailable saying why (no CUDA in this build, no driver, no device).
  static absl::Status Probe(int device);

  static absl::StatusOr<std::unique_ptr<DeviceStats>> Create(const DeviceStatsOptions& options);

  virtual ~DeviceStats() = default;

  // Enqueues statistics of all `tensors` (at most two kernel launches).
  // `producer_stream` is a cudaStream_t (nullptr: the legacy default
  // stream). ResourceExhausted when every batch slot is in flight or the
  // batch does not fit a slot; InvalidArgument for unsupported dtypes.
  virtual absl::StatusOr<uint64_t> EnqueueStats(absl::Span<const DeviceTensorRef> tensors,
                                                void* producer_stream) = 0;

  // Enqueues an asynchronous copy of the tensor to pinned host memory,
  // converted on the device to `transfer_dtype` first when it differs (F32
  // or F64 to F32, F16 or BF16). ResourceExhausted when the free staging
  // buffers cannot hold it.
  virtual absl::StatusOr<uint64_t> EnqueueCopy(const DeviceTensorRef& tensor,
                                               v1::DType transfer_dtype,
                                               void* producer_stream) = 0;

  // Finished work, in ticket order; never blocks.
  virtual std::vector<DeviceCompletion> Collect() = 0;

  // Blocks until everything enqueued has finished (tests, shutdown).
  virtual absl::Status Drain() = 0;

  // Kernel launches of the last statistics batch.
  virtual int LastBatchLaunches() const = 0;
  virtual std::string DeviceName() const = 0;
};

}  // namespace sonde

#endif  // SONDE_CUDA_DEVICE_STATS_H_
