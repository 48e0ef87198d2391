#include "cuda/emulated_device_stats.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/dtype.h"
#include "stats/cpu_stats.h"
#include "math/float16_math.h"
#include "stats/histogram.h"

namespace sonde {
namespace {

constexpr uint64_t kDefaultEmulatedSnapshotBytes = uint64_t{256} << 20;

bool Supported(v1::DType d) {
  return d == v1::DTYPE_F32 || d == v1::DTYPE_F16 || d == v1::DTYPE_BF16 || d == v1::DTYPE_F64;
}

// The conversion kernel's arithmetic: through float, rounding to nearest even.
void Convert(const void* src, v1::DType from, char* dst, v1::DType to, uint64_t count) {
  for (uint64_t i = 0; i < count; ++i) {
    const float v = from == v1::DTYPE_F64 ? static_cast<float>(static_cast<const double*>(src)[i])
                                          : static_cast<const float*>(src)[i];
    if (to == v1::DTYPE_F16 || to == v1::DTYPE_BF16) {
      const uint16_t h = to == v1::DTYPE_F16 ? SondeFloatToHalf(v) : SondeFloatToBf16(v);
      std::memcpy(dst + 2 * i, &h, 2);
    } else {
      std::memcpy(dst + 4 * i, &v, 4);
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<EmulatedDeviceStats>> EmulatedDeviceStats::Create(
    const DeviceStatsOptions& options, const EmulatedDeviceOptions& emulated) {
  absl::Status valid = ValidateDeviceStatsOptions(options);
  if (!valid.ok()) return valid;
  std::unique_ptr<EmulatedDeviceStats> engine(new EmulatedDeviceStats(options, emulated));
  engine->capacity_ =
      options.snapshot_bytes > 0 ? options.snapshot_bytes : kDefaultEmulatedSnapshotBytes;
  return engine;
}

absl::StatusOr<uint64_t> EmulatedDeviceStats::EnqueueStats(
    absl::Span<const DeviceTensorRef> tensors, void* producer_stream) {
  for (const DeviceTensorRef& t : tensors) {
    if (!Supported(t.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device statistics support F32, F16, BF16 and F64, not ", DTypeName(t.dtype)));
    }
    if (t.count > 0 && t.data == nullptr) {
      return absl::InvalidArgumentError("device tensor has elements but no data pointer");
    }
  }
  const uint64_t need = StatsBatchBytes(tensors, options_);
  absl::MutexLock lock(&mu_);
  if (need > options_.slot_bytes) {
    ++counters_.batches_refused;
    return absl::ResourceExhaustedError(absl::StrCat(
        "a batch of ", tensors.size(), " device tensors needs ", need,
        " bytes of pinned staging; the slot has ", options_.slot_bytes,
        " (raise DeviceStatsOptions::slot_bytes or split the batch)"));
  }
  if (jobs_.size() >= static_cast<size_t>(options_.batch_slots)) {
    ++counters_.batches_refused;
    return absl::ResourceExhaustedError(absl::StrCat(
        "all ", options_.batch_slots, " device statistics batches are still in flight"));
  }
  StatsJob job;
  job.ticket = ++last_ticket_;
  job.due = absl::Now() + emulated_.stats_latency;
  job.result.kind = DeviceCompletion::kStats;
  job.result.ticket = job.ticket;
  const bool histograms = options_.histogram.kind != kHistogramNone;
  // Read now, as the device reads before the producer may go on.
  for (const DeviceTensorRef& t : tensors) {
    StatsAccumulator stats;
    HistogramCounts h;
    if (t.histogram && histograms) h = HistogramCounts::Empty(options_.histogram);
    absl::Status s = CpuAccumulate(&stats, t.histogram && histograms ? &h : nullptr, t.data,
                                   t.dtype, t.count);
    if (!s.ok()) job.result.status.Update(s);
    job.result.stats.push_back(stats);
    job.result.histograms.push_back(std::move(h));
  }
  if (!fail_stats_.ok()) {
    job.result.status = fail_stats_;
    fail_stats_ = absl::OkStatus();
  }
  if (!job.result.status.ok()) {
    job.result.stats.clear();
    job.result.histograms.clear();
  }
  jobs_.push_back(std::move(job));
  if (options_.defer_producer_wait) ++unfenced_[producer_stream];
  ++counters_.batches;
  counters_.tensors += tensors.size();
  counters_.peak_slots_in_flight = std::max<uint64_t>(counters_.peak_slots_in_flight, jobs_.size());
  last_launches_ = tensors.empty() ? 0 : 2;
  return jobs_.back().ticket;
}

absl::StatusOr<uint64_t> EmulatedDeviceStats::EnqueueSnapshot(const DeviceTensorRef& tensor,
                                                              v1::DType transfer,
                                                              void* /*producer_stream*/) {
  if (transfer == v1::DTYPE_UNSPECIFIED) transfer = tensor.dtype;
  const size_t size = SnapshotElementSize(tensor.dtype, transfer);
  if (size == 0 || !Supported(tensor.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device snapshots convert F32/F64 to F32/F16/BF16, not ", DTypeName(tensor.dtype), " to ",
        DTypeName(transfer)));
  }
  if (tensor.count > 0 && tensor.data == nullptr) {
    return absl::InvalidArgumentError("device tensor has elements but no data pointer");
  }
  const uint64_t bytes = tensor.count * size;
  absl::MutexLock lock(&mu_);
  if (used_ + bytes > capacity_) {
    ++counters_.snapshots_refused;
    return absl::ResourceExhaustedError(absl::StrCat("snapshot memory is full: ", used_, " of ",
                                                     capacity_, " bytes wait for download, ",
                                                     bytes, " more asked"));
  }
  const uint64_t ticket = ++last_ticket_;
  Snapshot& s = snapshots_[ticket];
  s.bytes.resize(bytes);
  if (transfer == tensor.dtype) {
    if (bytes > 0) std::memcpy(&s.bytes[0], tensor.data, bytes);
  } else {
    Convert(tensor.data, tensor.dtype, s.bytes.data(), transfer, tensor.count);
  }
  used_ += bytes;
  ++counters_.snapshots;
  counters_.peak_snapshot_bytes = std::max(counters_.peak_snapshot_bytes, used_);
  return ticket;
}

absl::Status EmulatedDeviceStats::Download(uint64_t ticket, char* destination) {
  absl::MutexLock lock(&mu_);
  auto it = snapshots_.find(ticket);
  if (it == snapshots_.end() || it->second.downloading) {
    return absl::NotFoundError(absl::StrCat("no snapshot ", ticket, " waits for download"));
  }
  Snapshot& s = it->second;
  if (!s.bytes.empty() && destination == nullptr) {
    return absl::InvalidArgumentError("download without a destination");
  }
  s.downloading = true;
  s.destination = destination;
  const uint64_t pieces =
      (s.bytes.size() + options_.ring_buffer_bytes - 1) / options_.ring_buffer_bytes;
  // One copy stream: downloads follow one another.
  const absl::Time start = std::max(absl::Now(), download_clock_);
  s.due = start + emulated_.piece_latency * static_cast<int64_t>(pieces);
  download_clock_ = s.due;
  counters_.pieces += pieces;
  return absl::OkStatus();
}

void EmulatedDeviceStats::Discard(uint64_t ticket) {
  absl::MutexLock lock(&mu_);
  auto it = snapshots_.find(ticket);
  if (it == snapshots_.end() || it->second.downloading) return;
  used_ -= it->second.bytes.size();
  snapshots_.erase(it);
}

uint64_t EmulatedDeviceStats::SnapshotBytes(uint64_t ticket) const {
  absl::MutexLock lock(&mu_);
  auto it = snapshots_.find(ticket);
  return it == snapshots_.end() ? 0 : it->second.bytes.size();
}

std::vector<DeviceCompletion> EmulatedDeviceStats::Collect() {
  std::vector<DeviceCompletion> done;
  absl::MutexLock lock(&mu_);
  if (paused_) return done;
  const absl::Time now = absl::Now();
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    if (it->due <= now) {
      if (drop_histograms_ && it->result.kind == DeviceCompletion::kStats &&
          !it->result.histograms.empty()) {
        it->result.histograms.clear();
        drop_histograms_ = false;
      }
      done.push_back(std::move(it->result));
      it = jobs_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = snapshots_.begin(); it != snapshots_.end();) {
    Snapshot& s = it->second;
    if (!s.downloading || s.due > now) {
      ++it;
      continue;
    }
    DeviceCompletion c;
    c.kind = DeviceCompletion::kValues;
    c.ticket = it->first;
    if (!fail_download_.ok()) {
      c.status = fail_download_;
      fail_download_ = absl::OkStatus();
    } else {
      // Piece by piece, as through the ring.
      for (uint64_t at = 0; at < s.bytes.size(); at += options_.ring_buffer_bytes) {
        const uint64_t n = std::min<uint64_t>(options_.ring_buffer_bytes, s.bytes.size() - at);
        std::memcpy(s.destination + at, s.bytes.data() + at, n);
      }
    }
    ++counters_.downloads;
    used_ -= s.bytes.size();
    done.push_back(std::move(c));
    it = snapshots_.erase(it);
  }
  std::sort(done.begin(), done.end(), [](const DeviceCompletion& a, const DeviceCompletion& b) {
    return a.ticket < b.ticket;
  });
  return done;
}

absl::Status EmulatedDeviceStats::FenceProducer(void* producer_stream) {
  absl::MutexLock lock(&mu_);
  ++fences_;
  unfenced_.erase(producer_stream);
  return absl::OkStatus();
}

uint64_t EmulatedDeviceStats::fences() const {
  absl::MutexLock lock(&mu_);
  return fences_;
}

uint64_t EmulatedDeviceStats::unfenced_batches(void* producer_stream) const {
  absl::MutexLock lock(&mu_);
  auto it = unfenced_.find(producer_stream);
  return it == unfenced_.end() ? 0 : it->second;
}

absl::Status EmulatedDeviceStats::Drain() {
  absl::Time until = absl::Now();
  {
    absl::MutexLock lock(&mu_);
    if (paused_) return absl::FailedPreconditionError("the emulated device is paused");
    for (const StatsJob& j : jobs_) until = std::max(until, j.due);
  }
  absl::SleepFor(until - absl::Now());
  return absl::OkStatus();
}

uint64_t EmulatedDeviceStats::snapshot_capacity() const { return capacity_; }

uint64_t EmulatedDeviceStats::snapshot_bytes_used() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

int EmulatedDeviceStats::LastBatchLaunches() const {
  absl::MutexLock lock(&mu_);
  return last_launches_;
}

void EmulatedDeviceStats::Pause() {
  absl::MutexLock lock(&mu_);
  paused_ = true;
}

void EmulatedDeviceStats::Resume() {
  absl::MutexLock lock(&mu_);
  paused_ = false;
}

void EmulatedDeviceStats::SetLatencies(absl::Duration stats, absl::Duration piece) {
  absl::MutexLock lock(&mu_);
  emulated_.stats_latency = stats;
  emulated_.piece_latency = piece;
}

void EmulatedDeviceStats::FailNextStats(absl::Status status) {
  absl::MutexLock lock(&mu_);
  fail_stats_ = std::move(status);
}

void EmulatedDeviceStats::FailNextDownload(absl::Status status) {
  absl::MutexLock lock(&mu_);
  fail_download_ = std::move(status);
}

void EmulatedDeviceStats::DropNextHistograms() {
  absl::MutexLock lock(&mu_);
  drop_histograms_ = true;
}

EmulatedDeviceStats::Counters EmulatedDeviceStats::counters() const {
  absl::MutexLock lock(&mu_);
  return counters_;
}

}  // namespace sonde
