#include "client/device_capture.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"

namespace sonde {
namespace {

// After Close, how long the pump goes on finishing device work in flight.
constexpr absl::Duration kStopGrace = absl::Seconds(10);
// How often the pump looks again when only snapshots waiting for the host
// budget are left (the sender frees budget as the collector acknowledges).
constexpr absl::Duration kBudgetPoll = absl::Milliseconds(1);
// Most bytes of spilled values on their way to disk at once (one tensor
// may pass it): host memory held beyond the budget's while spilling.
constexpr uint64_t kSpillInFlight = 64 << 20;

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceCapture>> DeviceCapture::Create(
    DeviceCaptureOptions options) {
  absl::StatusOr<std::unique_ptr<DeviceStats>> engine =
      options.factory ? options.factory(options.engine) : DeviceStats::Create(options.engine);
  if (!engine.ok()) return engine.status();
  std::unique_ptr<ValueSpill> spill;
  if (options.policy == BackpressurePolicy::kSpill) {
    absl::StatusOr<std::unique_ptr<ValueSpill>> made =
        options.spill_budget != nullptr
            ? ValueSpill::Create(SpillDirOrTemp(options.spill_dir), options.spill_budget)
            : ValueSpill::Create(SpillDirOrTemp(options.spill_dir), options.max_spill_bytes);
    if (made.ok()) {
      spill = std::move(*made);
    } else {
      LOG(WARNING) << "sonde: " << made.status().message()
                   << "; device values wait on the device instead (logged once)";
    }
  }
  return std::unique_ptr<DeviceCapture>(
      new DeviceCapture(std::move(options), std::move(*engine), std::move(spill)));
}

DeviceCapture::DeviceCapture(DeviceCaptureOptions options, std::unique_ptr<DeviceStats> engine,
                             std::unique_ptr<ValueSpill> spill)
    : options_(std::move(options)),
      engine_(std::move(engine)),
      spill_(std::move(spill)),
      values_pool_(ValuePool::Create(options_.value_pool_bytes)) {
  pump_ = std::thread([this] { Pump(); });
  if (spill_ != nullptr) writer_ = std::thread([this] { WriteSpills(); });
}

DeviceCapture::~DeviceCapture() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    // Snapshots nobody will download give their memory back now.
    for (auto& [ticket, p] : snapshots_) {
      engine_->Discard(ticket);
      LoseValuesLocked(*p, absl::CancelledError("the hook closed before the values were sent"));
    }
    snapshots_.clear();
  }
  pump_.join();
  if (writer_.joinable()) {
    {
      absl::MutexLock lock(&mu_);
      writer_stop_ = true;  // after what the pump handed over is written
    }
    writer_.join();
  }
}

void DeviceCapture::LoseValuesLocked(PendingDeviceTensor& p, absl::Status why) {
  p.values_status = std::move(why);
  p.values_done = true;
  p.values.reset();
  ++counters_.values_dropped;
}

template <typename T, typename F, typename G>
absl::StatusOr<T> DeviceCapture::WithRoom(F attempt, absl::Time deadline, bool* stalled,
                                          G before_wait) {
  absl::StatusOr<T> result = attempt();
  if (result.ok() || result.status().code() != absl::StatusCode::kResourceExhausted ||
      options_.policy == BackpressurePolicy::kDrop || *stalled) {
    return result;
  }
  before_wait();
  const absl::Time start = absl::Now();
  ++counters_.waits;
  while (!result.ok() && result.status().code() == absl::StatusCode::kResourceExhausted) {
    // Room comes back when the pump delivers finished work or a snapshot
    // is discarded (generation_), and device memory also when training
    // frees some, which nothing signals: retried every millisecond too.
    const uint64_t seen = generation_;
    auto delivered = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return generation_ != seen || stop_;
    };
    mu_.AwaitWithDeadline(absl::Condition(&delivered),
                          std::min(deadline, absl::Now() + absl::Milliseconds(1)));
    if (stop_ || absl::Now() >= deadline) {
      result = attempt();
      if (!result.ok()) *stalled = true;
      break;
    }
    result = attempt();
  }
  counters_.waited += absl::Now() - start;
  return result;
}

absl::Status DeviceCapture::Fence(void* stream) {
  if (!options_.engine.defer_producer_wait) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  return FenceLocked(stream);
}

absl::Status DeviceCapture::FenceAll() {
  if (!options_.engine.defer_producer_wait) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  absl::Status status;
  const std::vector<void*> streams = unfenced_;
  for (void* stream : streams) status.Update(FenceLocked(stream));
  return status;
}

absl::Status DeviceCapture::FenceLocked(void* stream) {
  auto it = std::find(unfenced_.begin(), unfenced_.end(), stream);
  if (it == unfenced_.end()) return absl::OkStatus();  // no deferred read of its tensors
  absl::Status s = engine_->FenceProducer(stream);
  if (s.ok() || absl::IsFailedPrecondition(s)) {
    // Fenced; or the stream is being captured into a CUDA graph, where
    // neither a wait nor a synchronization is allowed: fenced after it.
    if (s.ok()) unfenced_.erase(it);
    return s;
  }
  unfenced_.erase(it);
  // The stream cannot be ordered after the reads: wait for them here, so
  // the producer cannot overwrite a tensor being read. The caller logs.
  engine_->Drain().IgnoreError();
  return s;
}

DeviceCapture::Enqueued DeviceCapture::Enqueue(absl::Span<const Request> requests,
                                               void* stream, const Ready& ready) {
  Enqueued out;
  out.pending.resize(requests.size());
  const DeviceStatsOptions& eo = options_.engine;
  const absl::Time entered = absl::Now();
  const absl::Time deadline = entered + options_.max_block;
  absl::MutexLock lock(&mu_);
  struct Timed {  // the whole call, counted as it returns
    absl::Time entered;
    absl::Duration* total;
    ~Timed() { *total += absl::Now() - entered; }
  } timed{entered, &counters_.enqueue_time};
  auto engine_call = [this](auto call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const absl::Time start = absl::Now();
    auto result = call();
    counters_.engine_time += absl::Now() - start;
    return result;
  };
  if (stop_) {
    out.dropped = static_cast<uint32_t>(requests.size());
    out.status = absl::FailedPreconditionError("the device capture is closing");
    return out;
  }
  // The reads of earlier saves finish before what the producer does after
  // this one (a deferred batch overlaps only the work between two saves).
  // A failure here was waited for (FenceLocked); the step's end fences
  // again and the hook logs what fails there.
  if (eo.defer_producer_wait) FenceLocked(stream).IgnoreError();
  std::vector<size_t> ready_now;
  auto hand_over = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!ready_now.empty() && ready) {
      const absl::Time start = absl::Now();
      ready(ready_now, out.pending);
      counters_.handover_time += absl::Now() - start;
    }
    ready_now.clear();
  };
  // Statistics: as many tensors per batch as one slot holds.
  size_t i = 0;
  while (i < requests.size()) {
    size_t j = i;
    uint64_t chunks = 0, histograms = 0;
    while (j < requests.size()) {
      const uint64_t c = chunks + StatsChunks(requests[j].ref.count, eo);
      const uint64_t h = histograms + (requests[j].ref.histogram ? 1 : 0);
      if (j > i && StatsBatchBytes(j - i + 1, c, h, eo) > eo.slot_bytes) break;
      chunks = c;
      histograms = h;
      ++j;
    }
    std::vector<DeviceTensorRef> refs;
    refs.reserve(j - i);
    for (size_t k = i; k < j; ++k) refs.push_back(requests[k].ref);
    absl::StatusOr<uint64_t> ticket =
        j - i == 1 && StatsBatchBytes(1, chunks, histograms, eo) > eo.slot_bytes
            // One tensor bigger than a slot: waiting cannot help.
            ? absl::StatusOr<uint64_t>(absl::InvalidArgumentError(absl::StrCat(
                  "tensor of ", requests[i].ref.count, " elements needs more than one batch "
                  "slot (", eo.slot_bytes, " bytes; raise HookOptions::device.slot_bytes)")))
            : WithRoom<uint64_t>(
                  [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                    return engine_call([&]() { return engine_->EnqueueStats(refs, stream); });
                  },
                  deadline, &stats_stalled_, hand_over);
    if (!ticket.ok()) {
      out.dropped += static_cast<uint32_t>(j - i);
      counters_.tensors_dropped += j - i;
      out.status.Update(ticket.status());
      i = j;
      continue;
    }
    ++counters_.batches;
    if (eo.defer_producer_wait &&
        std::find(unfenced_.begin(), unfenced_.end(), stream) == unfenced_.end()) {
      unfenced_.push_back(stream);
    }
    std::vector<std::shared_ptr<PendingDeviceTensor>>& waiters = stats_waiters_[*ticket];
    for (size_t k = i; k < j; ++k) {
      auto p = std::make_shared<PendingDeviceTensor>();
      p->want_histogram = requests[k].ref.histogram;
      out.pending[k] = p;
      waiters.push_back(p);
      if (!requests[k].values) ready_now.push_back(k);
    }
    i = j;
  }
  // Values: a snapshot each, taken now at device speed, downloaded later.
  for (size_t k = 0; k < requests.size(); ++k) {
    const Request& r = requests[k];
    if (!r.values || out.pending[k] == nullptr) continue;
    PendingDeviceTensor& p = *out.pending[k];
    const bool convertible = r.ref.dtype == v1::DTYPE_F32 || r.ref.dtype == v1::DTYPE_F64;
    const v1::DType transfer =
        convertible && r.transfer_dtype != v1::DTYPE_UNSPECIFIED ? r.transfer_dtype : r.ref.dtype;
    p.want_values = true;
    p.values_dtype = transfer;
    p.values_bytes = r.ref.count * SnapshotElementSize(r.ref.dtype, transfer);
    if (p.values_bytes > engine_->snapshot_capacity()) {
      LoseValuesLocked(p, absl::ResourceExhaustedError(absl::StrCat(
                              "its values (", p.values_bytes,
                              " bytes) are larger than all snapshot memory (",
                              engine_->snapshot_capacity(),
                              " bytes; raise HookOptions::device.snapshot_bytes)")));
    } else {
      // While this save waits, the pump spills snapshots to make room.
      bool waiting = false;
      absl::StatusOr<uint64_t> ticket = WithRoom<uint64_t>(
          [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
            return engine_call([&]() { return engine_->EnqueueSnapshot(r.ref, transfer, stream); });
          },
          deadline, &snapshots_stalled_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
            hand_over();
            waiting = true;
            snapshot_wanted_ += p.values_bytes;
          });
      if (waiting) snapshot_wanted_ -= p.values_bytes;
      if (ticket.ok()) {
        snapshots_.emplace_back(*ticket, out.pending[k]);
      } else {
        LoseValuesLocked(p, ticket.status());
      }
    }
    ready_now.push_back(k);
  }
  hand_over();
  counters_.snapshot_bytes_peak =
      std::max(counters_.snapshot_bytes_peak, engine_->snapshot_bytes_used());
  return out;
}

void DeviceCapture::SnapshotMemoryFreedLocked() {
  snapshots_stalled_ = false;
  ++generation_;  // wakes saves waiting for room
}

void DeviceCapture::GrantDownloadsLocked() {
  // Oldest first while the host budget has room; past the first refusal,
  // only the tensors the sender waits for (which always go).
  bool refused = false;
  for (auto it = snapshots_.begin(); it != snapshots_.end();) {
    PendingDeviceTensor* p = it->second.get();
    const bool awaited = std::find(awaited_.begin(), awaited_.end(), p) != awaited_.end();
    if (refused && !awaited) {
      ++it;
      continue;
    }
    if (options_.reserve_host && !options_.reserve_host(p->values_bytes, awaited)) {
      refused = true;
      ++it;
      continue;
    }
    if (options_.reserve_host) p->host_reserved = p->values_bytes;
    p->values = values_pool_->Take(p->values_bytes);
    absl::Status s = engine_->Download(it->first, p->values.get());
    if (s.ok()) {
      downloading_[it->first] = std::move(it->second);
    } else {
      engine_->Discard(it->first);
      LoseValuesLocked(*p, s);
      SnapshotMemoryFreedLocked();
    }
    it = snapshots_.erase(it);
  }
  if (spill_ != nullptr) GrantSpillsLocked();
}

void DeviceCapture::GrantSpillsLocked() {
  if (spill_broken_) return;
  const uint64_t capacity = engine_->snapshot_capacity();
  // The file's room, less what is on its way to it (asked once a round:
  // this runs on every poll of the pump, under the lock training takes).
  const uint64_t room = spill_->room();
  uint64_t coming = spill_downloading_ + spill_queued_;
  // Newest first: the sender takes the oldest next, and those download
  // straight to memory as the budget frees up.
  for (size_t i = snapshots_.size(); i-- > 0;) {
    const uint64_t used = engine_->snapshot_bytes_used();
    // (Spilled values that landed are off the device already.)
    const uint64_t staying = used - std::min(used, spill_downloading_);
    // Over half full, or a waiting save's snapshot does not fit yet.
    if (staying <= capacity / 2 &&
        (snapshot_wanted_ == 0 || staying + snapshot_wanted_ <= capacity)) {
      return;
    }
    auto& [ticket, pending] = snapshots_[i];
    PendingDeviceTensor& p = *pending;
    if (spill_in_flight_ > 0 && spill_in_flight_ + p.values_bytes > kSpillInFlight) return;
    // Where this one does not fit, an older, smaller one may.
    if (coming > room || p.values_bytes > room - coming) continue;
    // Charged past the budget while in memory, so the sender's memory
    // figure stays true; given back once on disk.
    if (options_.reserve_host) {
      options_.reserve_host(p.values_bytes, /*force=*/true);
      p.host_reserved = p.values_bytes;
    }
    p.values = values_pool_->Take(p.values_bytes);
    absl::Status s = engine_->Download(ticket, p.values.get());
    if (s.ok()) {
      p.spilling = true;
      spill_in_flight_ += p.values_bytes;
      spill_downloading_ += p.values_bytes;
      coming += p.values_bytes;
      downloading_[ticket] = std::move(pending);
    } else {
      engine_->Discard(ticket);
      if (options_.release_host) options_.release_host(p.host_reserved);
      p.host_reserved = 0;
      LoseValuesLocked(p, s);
      SnapshotMemoryFreedLocked();
    }
    snapshots_.erase(snapshots_.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

void DeviceCapture::WriteSpills() {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !to_write_.empty() || writer_stop_;
    };
    mu_.Await(absl::Condition(&work));
    if (to_write_.empty()) return;  // stopping, and everything is written
    std::shared_ptr<PendingDeviceTensor> pending = std::move(to_write_.front());
    to_write_.pop_front();
    PendingDeviceTensor& p = *pending;
    const bool awaited = std::find(awaited_.begin(), awaited_.end(), &p) != awaited_.end();
    absl::StatusOr<ValueSpill::Record> record =
        absl::CancelledError("not written: the sender took it or gave it up first");
    // Closing: nobody will read it back, so it is not written.
    if (!awaited && !p.abandoned && !stop_) {
      // Until values_done, only this thread touches the buffer, and the
      // disk's time is nobody else's.
      mu_.Unlock();
      record = spill_->Write(p.values.get(), p.values_bytes);
      mu_.Lock();
    }
    // Counted as coming until now, when the file has it (or not): taken
    // off before, the pump could see room the write is about to take.
    spill_queued_ -= std::min(spill_queued_, p.values_bytes);
    --spill_writes_;
    spill_in_flight_ -= std::min(spill_in_flight_, p.values_bytes);
    p.spilling = false;
    if (record.ok() || p.abandoned) {
      if (options_.release_host && p.host_reserved > 0) options_.release_host(p.host_reserved);
      p.host_reserved = 0;
      p.values.reset();
    }
    if (record.ok() && p.abandoned) {
      mu_.Unlock();
      spill_->Release(*record);
      mu_.Lock();
    } else if (record.ok()) {
      p.values_on_disk = true;
      p.spilled = *record;
      ++counters_.values_spilled;
      counters_.bytes_spilled += p.values_bytes;
      if (options_.spilled) options_.spilled(p.values_bytes);
    } else if (!absl::IsCancelled(record.status()) &&
               !absl::IsResourceExhausted(record.status()) && !spill_broken_) {
      // The values stay in memory (charged): nothing is lost. After a
      // failed write (the disk is full), no more spilling.
      spill_broken_ = true;
      LOG(WARNING) << "sonde: " << record.status().message()
                   << "; device values wait on the device instead (logged once)";
    }
    p.values_done = true;
  }
}

void DeviceCapture::ReadBackLocked(PendingDeviceTensor& p) {
  const ValueSpill::Record record = p.spilled;
  p.values_on_disk = false;
  mu_.Unlock();
  ValuePool::Buffer values = values_pool_->Take(record.bytes);
  absl::Status s = spill_->Read(record, values.get());
  spill_->Release(record);
  mu_.Lock();
  if (!s.ok()) {
    LoseValuesLocked(p, s);
    return;
  }
  if (p.abandoned) return;
  if (options_.reserve_host) {
    options_.reserve_host(record.bytes, /*force=*/true);  // the sender takes them now
    p.host_reserved = record.bytes;
  }
  p.values = std::move(values);
}

bool DeviceCapture::PumpOnce() {
  std::vector<DeviceCompletion> done = engine_->Collect();
  absl::MutexLock lock(&mu_);
  for (DeviceCompletion& c : done) {
    if (c.kind == DeviceCompletion::kStats) {
      auto it = stats_waiters_.find(c.ticket);
      if (it == stats_waiters_.end()) continue;
      for (size_t i = 0; i < it->second.size(); ++i) {
        PendingDeviceTensor& p = *it->second[i];
        if (!c.status.ok() || i >= c.stats.size()) {
          p.status = c.status.ok() ? absl::InternalError("the device returned too few records")
                                   : c.status;
        } else if (p.want_histogram && i >= c.histograms.size()) {
          // Sent without it, the tensor would look whole with an empty
          // histogram: it is lost, and counted, instead.
          p.status = absl::InternalError("the device returned too few histograms");
        } else {
          p.stats = c.stats[i];
          if (p.want_histogram) p.histogram = std::move(c.histograms[i]);
        }
        p.stats_done = true;
      }
      stats_waiters_.erase(it);
      stats_stalled_ = false;  // a batch slot came back
    } else {
      auto it = downloading_.find(c.ticket);
      if (it == downloading_.end()) continue;
      PendingDeviceTensor& p = *it->second;
      if (c.status.ok() && !p.abandoned) counters_.bytes_downloaded += p.values_bytes;
      if (p.spilling) spill_downloading_ -= std::min(spill_downloading_, p.values_bytes);
      if (p.spilling && c.status.ok() && !p.abandoned) {
        ++spill_writes_;  // the writer thread's now
        spill_queued_ += p.values_bytes;
        to_write_.push_back(it->second);
      } else if (p.abandoned || !c.status.ok()) {
        if (p.spilling) spill_in_flight_ -= std::min(spill_in_flight_, p.values_bytes);
        p.spilling = false;
        if (options_.release_host && p.host_reserved > 0) options_.release_host(p.host_reserved);
        p.host_reserved = 0;
        p.values.reset();
        if (!p.abandoned) LoseValuesLocked(p, c.status);
      } else {
        p.values_done = true;
      }
      downloading_.erase(it);
      snapshots_stalled_ = false;  // snapshot memory came back
    }
  }
  GrantDownloadsLocked();
  // Room (a batch slot, snapshot memory) comes back only with a completion:
  // waiters in WithRoom wake then, not on every poll of a busy device.
  if (!done.empty()) ++generation_;
  return DeviceBusyLocked();
}

void DeviceCapture::Pump() {
  absl::Time stop_deadline = absl::InfiniteFuture();
  while (true) {
    bool device_busy;
    {
      absl::MutexLock lock(&mu_);
      if (stop_ && stop_deadline == absl::InfiniteFuture()) stop_deadline = absl::Now() + kStopGrace;
      if (stop_ && (!InFlightLocked() || absl::Now() > stop_deadline)) {
        // Whatever is left will not come: wake its waiters with a reason.
        const absl::Status gone = absl::UnavailableError(
            "the device did not finish this tensor's work before the hook closed");
        for (auto& [ticket, batch] : stats_waiters_) {
          for (auto& p : batch) {
            p->status = gone;
            p->stats_done = true;
          }
        }
        for (auto& [ticket, p] : downloading_) LoseValuesLocked(*p, gone);
        stats_waiters_.clear();
        downloading_.clear();
        ++generation_;
        return;
      }
      if (!InFlightLocked()) {
        auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || InFlightLocked();
        };
        mu_.Await(absl::Condition(&work));
        continue;
      }
      device_busy = DeviceBusyLocked();
      if (!device_busy && stop_) {
        // Closing with only spill writes left (the writer skips them now):
        // wait for it, not in a loop.
        auto written = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return !InFlightLocked() || DeviceBusyLocked();
        };
        mu_.AwaitWithDeadline(absl::Condition(&written), stop_deadline);
        continue;
      } else if (!device_busy) {
        // Only snapshots waiting for the host budget: look again when the
        // sender starts waiting for one, or a little later.
        const size_t awaited = awaited_.size();
        const uint64_t wanted = snapshot_wanted_;
        auto changed = [this, awaited, wanted]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || awaited_.size() != awaited || snapshot_wanted_ != wanted ||
                 DeviceBusyLocked();
        };
        mu_.AwaitWithTimeout(absl::Condition(&changed), kBudgetPoll);
      }
    }
    if (PumpOnce()) absl::SleepFor(options_.poll);
  }
}

absl::Status DeviceCapture::Await(const std::shared_ptr<PendingDeviceTensor>& pending,
                                  absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  awaited_.push_back(pending.get());
  PendingDeviceTensor* p = pending.get();
  auto complete = [this, p]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return (p->stats_done && (!p->want_values || p->values_done)) || (stop_ && !InFlightLocked());
  };
  const bool ok = mu_.AwaitWithTimeout(absl::Condition(&complete), timeout);
  awaited_.erase(std::find(awaited_.begin(), awaited_.end(), p));
  if (!ok) {
    // The sender gives the tensor up: whatever arrives later is let go,
    // and its charge on the host budget given back.
    AbandonLocked(pending);
    return absl::DeadlineExceededError(absl::StrCat("device results not ready after ",
                                                    absl::FormatDuration(timeout)));
  }
  if (!p->stats_done) return absl::UnavailableError("the device capture stopped");
  if (p->values_on_disk) ReadBackLocked(*p);
  return p->status;
}

void DeviceCapture::Abandon(const std::shared_ptr<PendingDeviceTensor>& pending) {
  absl::MutexLock lock(&mu_);
  AbandonLocked(pending);
}

void DeviceCapture::AbandonLocked(const std::shared_ptr<PendingDeviceTensor>& pending) {
  pending->abandoned = true;
  if (pending->values_on_disk) {
    spill_->Release(pending->spilled);  // bookkeeping and a hole punched; no data written
    pending->values_on_disk = false;
    return;
  }
  for (auto it = snapshots_.begin(); it != snapshots_.end(); ++it) {
    if (it->second == pending) {
      engine_->Discard(it->first);
      snapshots_.erase(it);
      SnapshotMemoryFreedLocked();
      return;
    }
  }
  // Downloaded already: give its charge back now. (A download in flight
  // gives it back when it lands, in PumpOnce.)
  if (pending->values_done && pending->host_reserved > 0) {
    if (options_.release_host) options_.release_host(pending->host_reserved);
    pending->host_reserved = 0;
    pending->values.reset();
  }
}

DeviceCapture::Counters DeviceCapture::counters() const {
  absl::MutexLock lock(&mu_);
  Counters c = counters_;
  c.value_buffers_reused = values_pool_->reused();
  return c;
}

}  // namespace sonde
