// The client's side of the device path: turns the device tensors the
// training thread saves into work on a DeviceStats engine, and brings the
// results to the sender thread, whatever the model's size.
//
//   training thread   Enqueue: one statistics batch per slot's worth of
//                     tensors (two kernel launches each) and a device
//                     snapshot per tensor whose values are wanted; returns
//                     without waiting for the device, except where the
//                     backpressure policy says to wait for device work
//                     (a free batch slot, snapshot memory) for at most
//                     max_block.
//   pump thread       collects finished work, and downloads snapshots to
//                     host memory through the engine's pinned ring, oldest
//                     first, while the sender's memory budget has room (the
//                     tensor the sender waits for always goes). Under the
//                     policy kSpill, once snapshot memory is half full or a
//                     save waits for it, it also downloads the newest
//                     snapshots past the budget, so that device memory
//                     comes back.
//   writer thread     (kSpill only) writes those to a local file
//                     (ValueSpill), so nobody else waits for the disk.
//   sender thread     Await: blocks until a tensor's results are in (and
//                     reads spilled values back from disk).
//
// Nothing is lost silently: a tensor whose statistics cannot be taken is
// reported back to the caller as dropped; a tensor whose values cannot be
// kept keeps its statistics and says why in `values_status`.
// Thread-safe. Lock order: DeviceCapture, then the sender's (reserve_host).
// Internal to client/.
#ifndef SONDE_CLIENT_DEVICE_CAPTURE_H_
#define SONDE_CLIENT_DEVICE_CAPTURE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/backpressure.h"
#include "client/spill_budget.h"
#include "client/value_pool.h"
#include "client/value_spill.h"
#include "cuda/device_stats.h"

namespace sonde {

// One saved device tensor's results, written by the pump thread under the
// capture's lock and final once Await has returned.
struct PendingDeviceTensor {
  // Fixed at enqueue.
  bool want_histogram = false;
  bool want_values = false;
  v1::DType values_dtype = v1::DTYPE_UNSPECIFIED;  // of the bytes that arrive
  uint64_t values_bytes = 0;
  // Results.
  bool stats_done = false;
  bool values_done = false;
  absl::Status status;         // statistics failed: the tensor is lost
  absl::Status values_status;  // values lost (statistics kept), and why
  StatsAccumulator stats;
  HistogramCounts histogram;
  // The values (values_bytes of them), once values_ok(). Not zeroed when
  // allocated: the download writes every byte. From the capture's pool,
  // back to it when freed.
  ValuePool::Buffer values;
  // Bytes charged to the sender's memory budget for `bytes` (the sender
  // gives them back when it has taken the values).
  uint64_t host_reserved = 0;
  bool abandoned = false;  // DeviceCapture::Abandon
  // Spilled (policy kSpill, host budget full): downloading to be written to
  // disk, then on disk in `spilled` until Await reads the values back.
  bool spilling = false;
  bool values_on_disk = false;
  ValueSpill::Record spilled;

  bool values_ok() const { return want_values && values_done && values_status.ok(); }
};

struct DeviceCaptureOptions {
  DeviceStatsOptions engine;
  // Engine factory; default DeviceStats::Create. Tests pass an emulated one.
  std::function<absl::StatusOr<std::unique_ptr<DeviceStats>>(const DeviceStatsOptions&)> factory;
  // What happens when batch slots or snapshot memory are all in use:
  // kDrop gives up at once; kBlock and kSpill wait up to max_block for the
  // device to finish work, then give up (counted). kSpill first moves
  // values the host budget has no room for to a file in spill_dir (empty:
  // $TMPDIR, else /tmp), within spill_budget, once snapshot memory is half
  // full or a save waits for it.
  BackpressurePolicy policy = BackpressurePolicy::kSpill;
  absl::Duration max_block = absl::Seconds(1);
  std::string spill_dir;
  uint64_t max_spill_bytes = uint64_t{4} << 30;
  // Shared with the sender's spill file (the hook's max_spill_bytes). Null:
  // a budget of its own of max_spill_bytes.
  std::shared_ptr<SpillBudget> spill_budget;
  // Charges `bytes` of downloaded values to the sender's memory budget:
  // true if charged. `force`: charge even past the budget (the sender is
  // waiting for this tensor). Unset: always charged. release_host gives
  // back the charge of a tensor the sender will never take.
  std::function<bool(uint64_t bytes, bool force)> reserve_host;
  std::function<void(uint64_t bytes)> release_host;
  // Called (under the capture's lock) for each tensor whose values were
  // written to the spill file.
  std::function<void(uint64_t bytes)> spilled;
  // How often the pump looks at the device while work is in flight.
  absl::Duration poll = absl::Microseconds(50);
  // Freed values' host buffers kept for the next downloads (ValuePool):
  // memory already faulted in, so a download is not held to the speed of
  // page faults. The hook gives its max_queue_bytes.
  uint64_t value_pool_bytes = 256 << 20;
};

class DeviceCapture {
 public:
  struct Request {
    DeviceTensorRef ref;
    bool values = false;                               // values wanted, not only statistics
    v1::DType transfer_dtype = v1::DTYPE_UNSPECIFIED;  // F16/BF16 halves F32's transfer
  };

  // What Enqueue did: one entry per request, null where the tensor is
  // dropped (its statistics could not be enqueued; `dropped` counts them
  // and `status` says why).
  struct Enqueued {
    std::vector<std::shared_ptr<PendingDeviceTensor>> pending;
    uint32_t dropped = 0;
    absl::Status status;
  };

  // Unavailable (with the reason) where there is no usable device.
  static absl::StatusOr<std::unique_ptr<DeviceCapture>> Create(DeviceCaptureOptions options);
  ~DeviceCapture();  // stops the pump; the device work in flight is finished first

  // `ready(indices, pending)` hands over requests whose pending is final on
  // the host side (after its statistics batch for a tensor without values,
  // after its snapshot or the loss of its values otherwise), in batches:
  // before Enqueue waits for room, and at its end. It is called under the
  // capture's lock and may take the sender's. Queue them to the sender
  // then: while Enqueue waits for snapshot memory, the sender must be able
  // to wait for, and so download, what came before.
  using Ready = std::function<void(const std::vector<size_t>& indices,
                                   const std::vector<std::shared_ptr<PendingDeviceTensor>>& pending)>;
  Enqueued Enqueue(absl::Span<const Request> requests, void* stream, const Ready& ready = nullptr);

  // With engine.defer_producer_wait: makes `stream` wait (on the device)
  // for the reads of every statistics batch enqueued so far. Enqueue does
  // this first for its own stream. If the engine cannot order the stream,
  // the host waits for the device instead (correct, not overlapped) and
  // the error is returned. OK and nothing done without deferral.
  absl::Status Fence(void* stream);
  // Fence for every stream with unfenced reads (the first error, if any).
  absl::Status FenceAll();

  // Waits until `pending` is complete (statistics in, and values in or
  // lost), up to `timeout`; the pump downloads it ahead of others.
  // The pending's status; DeadlineExceeded after `timeout`.
  absl::Status Await(const std::shared_ptr<PendingDeviceTensor>& pending, absl::Duration timeout);

  // The tensor will not be sent (the sender could not queue it): its
  // snapshot is freed, or its download's charge given back when it lands.
  void Abandon(const std::shared_ptr<PendingDeviceTensor>& pending);

  struct Counters {
    uint64_t batches = 0;          // statistics batches enqueued
    uint64_t tensors_dropped = 0;  // statistics not enqueued
    uint64_t values_dropped = 0;   // values lost, statistics kept
    uint64_t waits = 0;            // enqueues that waited for the device
    absl::Duration waited;         // their total time
    uint64_t snapshot_bytes_peak = 0;
    uint64_t bytes_downloaded = 0;
    uint64_t values_spilled = 0;   // tensors whose values went to the local file
    uint64_t bytes_spilled = 0;
    // Where the training thread's time in Enqueue goes: all of it (waits
    // for the lock and for room included), the engine's enqueue calls
    // (their CUDA calls), and handing tensors to the sender.
    absl::Duration enqueue_time;
    absl::Duration engine_time;
    absl::Duration handover_time;
    uint64_t value_buffers_reused = 0;  // downloads into a kept buffer (ValuePool)
  };
  Counters counters() const;
  int last_batch_launches() const { return engine_->LastBatchLaunches(); }
  uint64_t snapshot_capacity() const { return engine_->snapshot_capacity(); }

 private:
  DeviceCapture(DeviceCaptureOptions options, std::unique_ptr<DeviceStats> engine,
                std::unique_ptr<ValueSpill> spill);
  void Pump();
  // One round of the pump: collect, deliver, grant downloads. True while
  // work is in flight.
  bool PumpOnce() ABSL_LOCKS_EXCLUDED(mu_);
  void GrantDownloadsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // kSpill: downloads the newest snapshots past the host budget, to be
  // written to disk, while snapshot memory is under pressure.
  void GrantSpillsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The writer thread: writes downloaded values to the spill file, without
  // the lock (the disk may be slow: neither training nor the pump waits).
  void WriteSpills() ABSL_LOCKS_EXCLUDED(mu_);
  // Reads a spilled tensor's values back into memory; releases the lock
  // meanwhile.
  void ReadBackLocked(PendingDeviceTensor& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FenceLocked(void* stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A snapshot was discarded: its memory is free for the next ones.
  void SnapshotMemoryFreedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Work on the device (batches, downloads), and snapshots waiting for the
  // host budget.
  bool DeviceBusyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !stats_waiters_.empty() || !downloading_.empty();
  }
  bool InFlightLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return DeviceBusyLocked() || !snapshots_.empty() || spill_writes_ > 0;
  }
  // Retries `attempt` while it fails with ResourceExhausted and the policy
  // lets the caller wait for device work, until `deadline`.
  // `before_wait` runs once, before the first wait.
  template <typename T, typename F, typename G>
  absl::StatusOr<T> WithRoom(F attempt, absl::Time deadline, bool* stalled, G before_wait)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LoseValuesLocked(PendingDeviceTensor& p, absl::Status why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AbandonLocked(const std::shared_ptr<PendingDeviceTensor>& pending)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const DeviceCaptureOptions options_;
  const std::unique_ptr<DeviceStats> engine_;
  // The policy is kSpill and the file could be made; null otherwise.
  const std::unique_ptr<ValueSpill> spill_;
  const std::shared_ptr<ValuePool> values_pool_;

  mutable absl::Mutex mu_;
  // Statistics tickets and the tensors of their batch, in order.
  std::map<uint64_t, std::vector<std::shared_ptr<PendingDeviceTensor>>> stats_waiters_
      ABSL_GUARDED_BY(mu_);
  // Snapshots taken and not yet downloading, oldest first.
  std::deque<std::pair<uint64_t, std::shared_ptr<PendingDeviceTensor>>> snapshots_
      ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::shared_ptr<PendingDeviceTensor>> downloading_ ABSL_GUARDED_BY(mu_);
  // Producer streams with statistics batches whose reads they have not been
  // made to wait for (defer_producer_wait).
  std::vector<void*> unfenced_ ABSL_GUARDED_BY(mu_);
  // Tensors the sender waits for: their downloads go first, past the budget.
  std::vector<PendingDeviceTensor*> awaited_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // A wait for a batch slot (snapshot memory) timed out: until the pump
  // frees one, enqueues give up at once instead of waiting again, so a
  // backlog costs training one max_block, not one per step.
  bool stats_stalled_ ABSL_GUARDED_BY(mu_) = false;
  bool snapshots_stalled_ ABSL_GUARDED_BY(mu_) = false;
  // Bumped when device room may have come back (a completion collected, a
  // snapshot discarded, the pump ending): what WithRoom waits for.
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // Snapshot bytes that saves are waiting for now (the pump spills until
  // they fit).
  uint64_t snapshot_wanted_ ABSL_GUARDED_BY(mu_) = 0;
  // Bytes of spilled values from their download's grant until they are
  // written (what kSpillInFlight caps), of those still on the device, and
  // of those in to_write_ or being written. Pendings between the end of
  // their download and their record (to_write_ and the one being written).
  uint64_t spill_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t spill_downloading_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t spill_queued_ ABSL_GUARDED_BY(mu_) = 0;
  int spill_writes_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<std::shared_ptr<PendingDeviceTensor>> to_write_ ABSL_GUARDED_BY(mu_);
  bool writer_stop_ ABSL_GUARDED_BY(mu_) = false;
  // A write failed (the disk is full): values wait on the device for good.
  bool spill_broken_ ABSL_GUARDED_BY(mu_) = false;
  Counters counters_ ABSL_GUARDED_BY(mu_);
  std::thread pump_;
  std::thread writer_;  // with spill_ only
};

}  // namespace sonde

#endif  // SONDE_CLIENT_DEVICE_CAPTURE_H_
