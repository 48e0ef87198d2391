// A DeviceStats engine in host memory, for testing everything above the
// engine (the hook's capture pipeline, the sender, the collector) on
// machines without a GPU, CI's included.
//
// It keeps the real engine's contract: "device" pointers are host memory
// read at enqueue time (as the real engine reads them before the producer
// stream may go on); statistics batches hold one of `batch_slots` slots
// until collected; snapshots hold snapshot memory (`snapshot_bytes`,
// default 256 MiB here) until their download has landed; downloads run one
// after another, in the order asked, through `ring_buffers` pieces of
// `ring_buffer_bytes`. On top of that a test controls time and failure:
// latencies per batch and per piece, a pause that holds every completion
// (a device busy with other work), and injected errors.
//
// Statistics come from the CPU path (CpuAccumulate), conversions from
// float16_math.h: the same values the GPU's conformance cases check.
// Thread-safe.
#ifndef SONDE_CUDA_EMULATED_DEVICE_STATS_H_
#define SONDE_CUDA_EMULATED_DEVICE_STATS_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cuda/device_stats.h"

namespace sonde {

struct EmulatedDeviceOptions {
  // From enqueue until a statistics batch is done.
  absl::Duration stats_latency = absl::ZeroDuration();
  // Per ring piece of a download (a 4 MiB piece over PCIe: ~75 us).
  absl::Duration piece_latency = absl::ZeroDuration();
  std::string name = "emulated device";
};

class EmulatedDeviceStats final : public DeviceStats {
 public:
  // `options.snapshot_bytes` 0 means 256 MiB.
  static absl::StatusOr<std::unique_ptr<EmulatedDeviceStats>> Create(
      const DeviceStatsOptions& options, const EmulatedDeviceOptions& emulated = {});

  absl::StatusOr<uint64_t> EnqueueStats(absl::Span<const DeviceTensorRef> tensors,
                                        void* producer_stream) override;
  absl::StatusOr<uint64_t> EnqueueSnapshot(const DeviceTensorRef& tensor,
                                           v1::DType transfer_dtype,
                                           void* producer_stream) override;
  absl::Status Download(uint64_t ticket, char* destination) override;
  void Discard(uint64_t ticket) override;
  uint64_t SnapshotBytes(uint64_t ticket) const override;
  std::vector<DeviceCompletion> Collect() override;
  absl::Status Drain() override;
  absl::Status FenceProducer(void* producer_stream) override;
  uint64_t snapshot_capacity() const override;
  uint64_t snapshot_bytes_used() const override;
  int LastBatchLaunches() const override;
  std::string DeviceName() const override { return name_; }

  // Fences asked for (FenceProducer), and statistics batches enqueued from
  // `producer_stream` with its wait deferred that no fence of that stream
  // has covered yet. (Host memory is read at enqueue, so deferral changes
  // nothing else here.)
  uint64_t fences() const;
  uint64_t unfenced_batches(void* producer_stream) const;

  // Test controls.
  // While paused nothing completes (time still passes: what became due
  // completes at Resume).
  void Pause();
  void Resume();
  void SetLatencies(absl::Duration stats, absl::Duration piece);
  // The next statistics batch, and the next download, complete with this
  // error.
  void FailNextStats(absl::Status status);
  void FailNextDownload(absl::Status status);
  // The next statistics batch completes without its histograms (an engine
  // that returns fewer than asked, as a faulty one might).
  void DropNextHistograms();

  struct Counters {
    uint64_t batches = 0;          // statistics batches accepted
    uint64_t batches_refused = 0;  // every slot in flight, or too big
    uint64_t tensors = 0;          // in accepted batches
    uint64_t snapshots = 0;
    uint64_t snapshots_refused = 0;
    uint64_t downloads = 0;        // completed
    uint64_t pieces = 0;
    uint64_t peak_snapshot_bytes = 0;
    uint64_t peak_slots_in_flight = 0;
  };
  Counters counters() const;

 private:
  EmulatedDeviceStats(const DeviceStatsOptions& options, const EmulatedDeviceOptions& emulated)
      : options_(options), name_(emulated.name), emulated_(emulated) {}

  struct StatsJob {
    uint64_t ticket = 0;
    absl::Time due;
    DeviceCompletion result;
  };
  struct Snapshot {
    std::string bytes;           // the "device" copy
    bool downloading = false;
    char* destination = nullptr;
    absl::Time due;              // when the download has landed
  };

  const DeviceStatsOptions options_;
  const std::string name_;
  EmulatedDeviceOptions emulated_ ABSL_GUARDED_BY(mu_);
  mutable absl::Mutex mu_;
  std::deque<StatsJob> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Snapshot> snapshots_ ABSL_GUARDED_BY(mu_);
  absl::Time download_clock_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t capacity_ = 0;
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t fences_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<void*, uint64_t> unfenced_ ABSL_GUARDED_BY(mu_);
  uint64_t last_ticket_ ABSL_GUARDED_BY(mu_) = 0;
  int last_launches_ ABSL_GUARDED_BY(mu_) = 0;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status fail_stats_ ABSL_GUARDED_BY(mu_);
  absl::Status fail_download_ ABSL_GUARDED_BY(mu_);
  bool drop_histograms_ ABSL_GUARDED_BY(mu_) = false;
  Counters counters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sonde

#endif  // SONDE_CUDA_EMULATED_DEVICE_STATS_H_
