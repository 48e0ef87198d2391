#include "client/value_spill.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "client/positional_io.h"
#include "common/crc32c.h"

namespace sonde {

absl::StatusOr<std::unique_ptr<ValueSpill>> ValueSpill::Create(
    const std::string& dir, std::shared_ptr<SpillBudget> budget) {
  absl::StatusOr<int> fd = CreateUnlinkedFile(dir, "sonde-values", "a device values spill file");
  if (!fd.ok()) return fd.status();
  return std::unique_ptr<ValueSpill>(new ValueSpill(*fd, std::move(budget)));
}

absl::StatusOr<std::unique_ptr<ValueSpill>> ValueSpill::Create(const std::string& dir,
                                                               uint64_t max_bytes) {
  return Create(dir, std::make_shared<SpillBudget>(max_bytes));
}

ValueSpill::~ValueSpill() {
  close(fd_);
  absl::MutexLock lock(&mu_);
  budget_->Give(held_);
}

uint64_t ValueSpill::room() const { return budget_->room(); }

void ValueSpill::PunchLocked(uint64_t offset, uint64_t bytes) {
  if (bytes > 0 && fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                             static_cast<off_t>(offset), static_cast<off_t>(bytes)) == 0) {
    bytes = std::min(held_, bytes);
    held_ -= bytes;
    budget_->Give(bytes);
  }
}

absl::StatusOr<ValueSpill::Record> ValueSpill::Write(const char* data, uint64_t bytes) {
  Record r;
  {
    absl::MutexLock lock(&mu_);
    if (!budget_->TryTake(bytes)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the spill files would pass their limit of ", budget_->limit(),
                       " bytes (max_spill_bytes; ", budget_->held(), " held)"));
    }
    r.offset = end_;
    r.bytes = bytes;
    end_ += bytes;
    held_ += bytes;
    ++writing_;
  }
  r.crc = Crc32c(absl::string_view(data, bytes));
  absl::Status s = PWriteAll(fd_, data, bytes, r.offset, "device values spill write");
  absl::MutexLock lock(&mu_);
  --writing_;
  if (!s.ok()) {
    PunchLocked(r.offset, bytes);  // whatever reached the disk
    MaybeTruncateLocked();
    return s;
  }
  ++live_;
  return r;
}

absl::Status ValueSpill::Read(const Record& record, char* out) const {
  absl::Status s = PReadAll(fd_, out, record.bytes, record.offset, "device values spill read");
  if (!s.ok()) return s;
  if (Crc32c(absl::string_view(out, record.bytes)) != record.crc) {
    return absl::DataLossError("spilled device values fail their CRC");
  }
  return absl::OkStatus();
}

void ValueSpill::Release(const Record& record) {
  absl::MutexLock lock(&mu_);
  if (live_ == 0 || record.offset + record.bytes > end_) return;  // not a live record
  --live_;
  PunchLocked(record.offset, record.bytes);
  MaybeTruncateLocked();
}

void ValueSpill::MaybeTruncateLocked() {
  // (If truncating fails, writing simply goes on after the old data.)
  if (live_ == 0 && writing_ == 0 && ftruncate(fd_, 0) == 0) {
    budget_->Give(held_);
    end_ = held_ = 0;
  }
}

uint64_t ValueSpill::live_records() const {
  absl::MutexLock lock(&mu_);
  return live_;
}

uint64_t ValueSpill::held_bytes() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

uint64_t ValueSpill::file_bytes() const {
  absl::MutexLock lock(&mu_);
  return end_;
}

}  // namespace sonde
