#include "client/value_spill.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "client/positional_io.h"
#include "common/crc32c.h"

namespace sonde {

absl::StatusOr<std::unique_ptr<ValueSpill>> ValueSpill::Create(const std::string& dir,
                                                               uint64_t max_bytes) {
  std::string path = dir + "/sonde-values-XXXXXX";
  const int fd = mkstemp(path.data());
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot create a device values spill file in ",
                                               dir, ": ", std::strerror(errno)));
  }
  unlink(path.c_str());
  return std::unique_ptr<ValueSpill>(new ValueSpill(fd, max_bytes));
}

ValueSpill::~ValueSpill() { close(fd_); }

absl::StatusOr<ValueSpill::Record> ValueSpill::Write(const char* data, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (bytes > max_bytes_ || end_ > max_bytes_ - bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the device values spill file would pass its limit of ", max_bytes_, " bytes"));
  }
  Record r;
  r.offset = end_;
  r.bytes = bytes;
  r.crc = Crc32c(absl::string_view(data, bytes));
  // On failure end_ stays: the partial record is overwritten next time.
  absl::Status s = PWriteAll(fd_, data, bytes, end_, "device values spill write");
  if (!s.ok()) return s;
  end_ += bytes;
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
  // Every record is read: give the disk space back. (If truncating fails,
  // writing simply goes on after the old data.)
  if (--live_ == 0 && ftruncate(fd_, 0) == 0) end_ = 0;
}

uint64_t ValueSpill::live_records() const {
  absl::MutexLock lock(&mu_);
  return live_;
}

uint64_t ValueSpill::file_bytes() const {
  absl::MutexLock lock(&mu_);
  return end_;
}

}  // namespace sonde
