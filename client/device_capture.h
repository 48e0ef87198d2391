// The client's side of the device path: turns device tensors the training
// thread saves into queued work on a DeviceStats engine, and lets the
// sender thread wait for each tensor's results. The training thread never
// waits here; the sender thread does.
// Thread-safe. Internal to client/.
#ifndef SONDE_CLIENT_DEVICE_CAPTURE_H_
#define SONDE_CLIENT_DEVICE_CAPTURE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cuda/device_stats.h"

namespace sonde {

// One saved device tensor's results, filled in when the device is done.
struct PendingDeviceTensor {
  bool want_copy = false;
  bool want_histogram = false;
  bool stats_done = false;
  bool copy_done = false;
  absl::Status status;
  StatsAccumulator stats;
  HistogramCounts histogram;
  std::string bytes;
  v1::DType bytes_dtype = v1::DTYPE_UNSPECIFIED;
};

class DeviceCapture {
 public:
  struct Request {
    DeviceTensorRef ref;
    bool copy = false;                           // values wanted, not only statistics
    v1::DType transfer_dtype = v1::DTYPE_UNSPECIFIED;  // F16/BF16 to halve the transfer
  };

  // Unavailable (with the reason) where there is no usable device.
  static absl::StatusOr<std::unique_ptr<DeviceCapture>> Create(const DeviceStatsOptions& options);

  // One statistics batch for all requests (two kernel launches) plus one
  // copy per request that wants values. A copy that finds no free staging
  // buffer is dropped and counted: the tensor's statistics still go out.
  absl::StatusOr<std::vector<std::shared_ptr<PendingDeviceTensor>>> Enqueue(
      absl::Span<const Request> requests, void* stream);

  // Waits (polling the device) until `pending` is complete, up to `timeout`.
  absl::Status Await(const std::shared_ptr<PendingDeviceTensor>& pending, absl::Duration timeout);

  uint64_t copies_dropped() const;
  int last_batch_launches() const { return engine_->LastBatchLaunches(); }

 private:
  explicit DeviceCapture(std::unique_ptr<DeviceStats> engine) : engine_(std::move(engine)) {}
  void Pump() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<DeviceStats> engine_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, std::vector<std::shared_ptr<PendingDeviceTensor>>> stats_waiters_
      ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::shared_ptr<PendingDeviceTensor>> copy_waiters_ ABSL_GUARDED_BY(mu_);
  uint64_t copies_dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace sonde

#endif  // SONDE_CLIENT_DEVICE_CAPTURE_H_
