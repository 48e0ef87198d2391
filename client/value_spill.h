// Device values on local disk: where the capture pipeline keeps downloaded
// values that the sender's memory budget has no room for (backpressure
// policy "spill"), so that snapshot memory on the device comes back and
// training does not wait for the collector. Unlike the sender's FIFO spill
// file, records are read in any order, each once: the sender takes device
// tensors in save order, while the newest snapshots are the ones spilled.
// The file is created in a directory and unlinked at once. A released
// record's blocks are given back at once (a hole punched in the file),
// and once no record is left the file is truncated; the limit counts the
// bytes records hold (and released records whose hole could not be
// punched), not how far the file reaches. Each record's CRC-32C is
// checked when it is read back (DataLoss, never wrong values).
// Thread-safe; no lock is held during disk I/O, so a Release never waits
// for a Write's data to reach the disk.
#ifndef SONDE_CLIENT_VALUE_SPILL_H_
#define SONDE_CLIENT_VALUE_SPILL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/spill_budget.h"

namespace sonde {

class ValueSpill {
 public:
  struct Record {
    uint64_t offset = 0;
    uint64_t bytes = 0;
    uint32_t crc = 0;
  };

  // Creates the (unlinked) file in `dir`; Unavailable if it cannot. The
  // bytes its records hold are charged to `budget`, which it may share.
  static absl::StatusOr<std::unique_ptr<ValueSpill>> Create(const std::string& dir,
                                                            std::shared_ptr<SpillBudget> budget);
  // With a budget of its own of `max_bytes`.
  static absl::StatusOr<std::unique_ptr<ValueSpill>> Create(const std::string& dir,
                                                            uint64_t max_bytes);
  ~ValueSpill();
  ValueSpill(const ValueSpill&) = delete;
  ValueSpill& operator=(const ValueSpill&) = delete;

  // Bytes that would fit in the budget now.
  uint64_t room() const;
  // Appends `bytes` bytes. ResourceExhausted when they do not fit,
  // Internal when the write fails (the disk is full).
  absl::StatusOr<Record> Write(const char* data, uint64_t bytes);
  // Reads a live record into `out` (record.bytes long). DataLoss if it
  // does not read back intact.
  absl::Status Read(const Record& record, char* out) const;
  // The record will not be read again.
  void Release(const Record& record);

  uint64_t live_records() const;
  uint64_t held_bytes() const;  // what the limit counts
  uint64_t file_bytes() const;  // how far the file reaches (sparse where released)

 private:
  ValueSpill(int fd, std::shared_ptr<SpillBudget> budget) : fd_(fd), budget_(std::move(budget)) {}
  // Gives a region's blocks back (a hole punched; the file keeps its
  // size). Where the file system cannot, they count until the truncation.
  void PunchLocked(uint64_t offset, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Truncates the file once nothing in it is live or being written.
  void MaybeTruncateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int fd_;
  const std::shared_ptr<SpillBudget> budget_;  // charged held_ bytes
  mutable absl::Mutex mu_;
  uint64_t end_ ABSL_GUARDED_BY(mu_) = 0;      // next record's offset
  uint64_t held_ ABSL_GUARDED_BY(mu_) = 0;     // bytes charged to budget_
  uint64_t live_ ABSL_GUARDED_BY(mu_) = 0;     // records written and not released
  uint64_t writing_ ABSL_GUARDED_BY(mu_) = 0;  // writes under way
};

}  // namespace sonde

#endif  // SONDE_CLIENT_VALUE_SPILL_H_
