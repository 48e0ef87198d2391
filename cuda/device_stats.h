// Statistics, histograms and values of tensors in CUDA device memory,
// taken on the device without ever blocking the caller.
//
// The training thread calls EnqueueStats / EnqueueSnapshot with the stream
// that produced the tensors. The work is ordered after that stream's work
// through an event and runs on the engine's own stream; the producer's
// stream is then made to wait (on the device, never on the host) only for
// the reads of its tensors, which run at device speed: the statistics
// kernels (a whole batch in two launches), or a device-to-device snapshot
// of the values (converted to F16/BF16 on the way when asked). Snapshots
// live in the engine's snapshot memory until Download streams them to host
// memory, piece by piece, through a ring of pinned buffers on a copy stream
// of their own, so a tensor of any size travels and training never waits
// for PCIe. Another thread (the client's pump) calls Collect to finish work
// and to keep the ring moving.
//
// Every binary links this: where the build has no CUDA toolkit, or the
// machine has no driver or device, Probe and Create return Unavailable with
// the reason, and callers use the CPU path. EmulatedDeviceStats
// (emulated_device_stats.h) implements the same interface in host memory
// for tests of everything above the engine.
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
#include "stats/histogram.h"
#include "math/stats_math.h"
#include "proto/tensor.pb.h"

namespace sonde {

struct DeviceTensorRef {
  const void* data = nullptr;  // device memory, contiguous
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;  // F32, F16, BF16 or F64
  uint64_t count = 0;          // elements
  bool histogram = false;      // also fill a histogram with the engine's spec
};

// The largest DeviceStatsOptions::chunk_elements.
inline constexpr uint64_t kMaxChunkElements = uint64_t{1} << 30;

struct DeviceStatsOptions {
  int device = 0;
  // Elements per block of the statistics kernel, at most kMaxChunkElements
  // (a tensor with more than 2,048 chunks gets larger ones: multi_tensor.h).
  uint64_t chunk_elements = uint64_t{1} << 15;  // kDefaultChunkElements (multi_tensor.h)
  // Statistics batches in flight, and the pinned memory of each (its tables
  // go up, its records and histogram counters come back). A batch that does
  // not fit one slot is refused; StatsBatchBytes says what a batch needs,
  // so callers split.
  int batch_slots = 8;
  uint64_t slot_bytes = uint64_t{4} << 20;
  // Device memory for snapshots of values waiting to be downloaded.
  // 0: an eighth of the device's free memory when the engine is created,
  // at most 4 GiB.
  uint64_t snapshot_bytes = 0;
  // Snapshots in the tensor's own dtype are taken by a copy kernel (on the
  // SMs, 16-byte words) rather than cudaMemcpyAsync, which a copy engine
  // may run, possibly behind the download pieces that engines carry to the
  // host while training waits for the snapshot. gpu_check times both, with
  // and without downloads in flight; off until a GPU has said which wins.
  bool snapshot_copy_kernel = false;
  // The pinned ring that downloads travel through, piece by piece.
  int ring_buffers = 8;
  uint64_t ring_buffer_bytes = uint64_t{4} << 20;
  HistogramSpecHD histogram = DefaultExponentialSpec();
  // Histogram counts added once per distinct bin of a warp's elements
  // instead of once per element (fewer conflicting atomics, a warp match
  // per element); gpu_check times both. Results are the same.
  bool warp_aggregated_histograms = false;
  // The producer's stream waits for a statistics batch's reads not right
  // after it (the default) but at the next FenceProducer, so the kernels
  // overlap the training work in between. The caller must fence before the
  // producer writes (or frees) a tensor of the batch. Snapshots are not
  // deferred: the producer always waits for them right away.
  bool defer_producer_wait = false;
};

// InvalidArgument naming the first option out of range.
absl::Status ValidateDeviceStatsOptions(const DeviceStatsOptions& options);

// Pinned bytes a statistics batch of these tensors needs in one slot; the
// second form counts a batch of `tensors` tensors with `chunks` chunks of
// options.chunk_elements, `histograms` of which want a histogram.
uint64_t StatsBatchBytes(absl::Span<const DeviceTensorRef> tensors,
                         const DeviceStatsOptions& options);
uint64_t StatsBatchBytes(uint64_t tensors, uint64_t chunks, uint64_t histograms,
                         const DeviceStatsOptions& options);
// Chunks of one tensor of `count` elements (as the kernels cut it).
uint64_t StatsChunks(uint64_t count, const DeviceStatsOptions& options);

// Bytes of one element of `dtype` after a snapshot converts it to
// `transfer` (UNSPECIFIED: unchanged); 0 where the engine cannot convert.
// Snapshots convert F32 and F64 to F32, F16 or BF16; other dtypes travel
// unchanged.
size_t SnapshotElementSize(v1::DType dtype, v1::DType transfer);

struct DeviceCompletion {
  enum Kind { kStats, kValues };
  Kind kind = kStats;
  uint64_t ticket = 0;
  absl::Status status;                    // the device's error, if any
  // kStats: one record per tensor, in the order given, and a histogram for
  // each tensor that asked (empty counters elsewhere).
  std::vector<StatsAccumulator> stats;
  std::vector<HistogramCounts> histograms;
  // kValues: the download's destination holds the snapshot's bytes.
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

  // Takes a snapshot of the tensor's values into snapshot memory, converted
  // to `transfer_dtype` when it differs (see SnapshotElementSize), ordered
  // after `producer_stream`, which then waits for the snapshot only.
  // ResourceExhausted when snapshot memory cannot hold it now (Collect frees
  // what downloads finish); InvalidArgument for a conversion the engine
  // does not make. The snapshot stays until Download or Discard.
  virtual absl::StatusOr<uint64_t> EnqueueSnapshot(const DeviceTensorRef& tensor,
                                                   v1::DType transfer_dtype,
                                                   void* producer_stream) = 0;

  // Streams snapshot `ticket` into `destination` (host memory of
  // SnapshotBytes(ticket) bytes that stays valid and untouched until the
  // ticket's kValues completion), through the pinned ring. Collect copies
  // finished pieces out and starts the next ones; the kValues completion
  // comes once every byte is in `destination`, and the snapshot's memory is
  // then free. Downloads run in the order they were asked for. NotFound for
  // a ticket that is not a waiting snapshot.
  virtual absl::Status Download(uint64_t ticket, char* destination) = 0;
  // Frees a snapshot that will not be downloaded.
  virtual void Discard(uint64_t ticket) = 0;
  // Bytes of a waiting snapshot (0 if unknown).
  virtual uint64_t SnapshotBytes(uint64_t ticket) const = 0;

  // Makes `producer_stream` wait (on the device; the host does not block)
  // for the reads of every statistics batch enqueued so far. Needed only
  // with defer_producer_wait, and then before the producer overwrites a
  // tensor it passed; harmless otherwise. FailedPrecondition while the
  // stream is being captured into a CUDA graph (nothing done).
  virtual absl::Status FenceProducer(void* producer_stream) = 0;

  // Finished work, in ticket order; never blocks on the device. Also copies
  // finished download pieces out of the ring and starts the next ones.
  virtual std::vector<DeviceCompletion> Collect() = 0;

  // Blocks until the statistics and snapshots enqueued so far have finished
  // on the device (tests, shutdown). Downloads progress only with Collect.
  virtual absl::Status Drain() = 0;

  // Snapshot memory: its size, and the bytes held by waiting snapshots.
  virtual uint64_t snapshot_capacity() const = 0;
  virtual uint64_t snapshot_bytes_used() const = 0;

  // Kernel launches of the last statistics batch.
  virtual int LastBatchLaunches() const = 0;
  virtual std::string DeviceName() const = 0;
};

}  // namespace sonde

#endif  // SONDE_CUDA_DEVICE_STATS_H_
