#include "client/device_capture.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace sonde {

absl::StatusOr<std::unique_ptr<DeviceCapture>> DeviceCapture::Create(
    const DeviceStatsOptions& options) {
  absl::StatusOr<std::unique_ptr<DeviceStats>> engine = DeviceStats::Create(options);
  if (!engine.ok()) return engine.status();
  return std::unique_ptr<DeviceCapture>(new DeviceCapture(std::move(*engine)));
}

absl::StatusOr<std::vector<std::shared_ptr<PendingDeviceTensor>>> DeviceCapture::Enqueue(
    absl::Span<const Request> requests, void* stream) {
  std::vector<DeviceTensorRef> refs;
  std::vector<std::shared_ptr<PendingDeviceTensor>> pending;
  for (const Request& r : requests) {
    refs.push_back(r.ref);
    auto p = std::make_shared<PendingDeviceTensor>();
    p->want_histogram = r.ref.histogram;
    pending.push_back(std::move(p));
  }
  absl::MutexLock lock(&mu_);
  absl::StatusOr<uint64_t> ticket = engine_->EnqueueStats(refs, stream);
  if (!ticket.ok()) return ticket.status();
  stats_waiters_[*ticket] = pending;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (!requests[i].copy) continue;
    absl::StatusOr<uint64_t> copy =
        engine_->EnqueueCopy(requests[i].ref, requests[i].transfer_dtype, stream);
    if (!copy.ok()) {
      ++copies_dropped_;
      continue;
    }
    pending[i]->want_copy = true;
    copy_waiters_[*copy] = pending[i];
  }
  return pending;
}

void DeviceCapture::Pump() {
  for (DeviceCompletion& c : engine_->Collect()) {
    auto s = stats_waiters_.find(c.ticket);
    if (s != stats_waiters_.end()) {
      for (size_t i = 0; i < s->second.size(); ++i) {
        PendingDeviceTensor& p = *s->second[i];
        p.status.Update(c.status);
        if (c.status.ok() && i < c.stats.size()) {
          p.stats = c.stats[i];
          if (p.want_histogram) p.histogram = std::move(c.histograms[i]);
        }
        p.stats_done = true;
      }
      stats_waiters_.erase(s);
      continue;
    }
    auto k = copy_waiters_.find(c.ticket);
    if (k != copy_waiters_.end()) {
      PendingDeviceTensor& p = *k->second;
      p.status.Update(c.status);
      p.bytes = std::move(c.bytes);
      p.bytes_dtype = c.copy_dtype;
      p.copy_done = true;
      copy_waiters_.erase(k);
    }
  }
}

absl::Status DeviceCapture::Await(const std::shared_ptr<PendingDeviceTensor>& pending,
                                  absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      Pump();
      if (pending->stats_done && (!pending->want_copy || pending->copy_done)) {
        return pending->status;
      }
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "device results not ready after ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Microseconds(200));
  }
}

uint64_t DeviceCapture::copies_dropped() const {
  absl::MutexLock lock(&mu_);
  return copies_dropped_;
}

}  // namespace sonde
