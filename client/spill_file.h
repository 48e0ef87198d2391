// The sender's spill file: a FIFO of queued tensors and step ends on local
// disk, used while the send queue's memory is full (backpressure policy
// "spill"). Records are appended at the tail and read back in order from
// the head. A record read back gives its blocks back at once (a hole
// punched in the file), and once every record has been read the file is
// truncated, so steady spilling that keeps pace holds only what is unread. The file is created in a directory and unlinked at
// once: it never outlives the process, whatever happens to it. Each record
// carries a CRC-32C; a record that does not read back intact is reported
// (DataLoss), never sent. Not thread-safe (the sender guards it).
#ifndef SONDE_CLIENT_SPILL_FILE_H_
#define SONDE_CLIENT_SPILL_FILE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/queued_tensor.h"
#include "client/spill_budget.h"
#include "proto/collector.pb.h"

namespace sonde {

// One spilled item: a tensor (values included) or a step end.
struct SpillRecord {
  bool is_step_end = false;
  QueuedTensor tensor;
  v1::StepEnd step_end;
};

class SpillFile {
 public:
  // Creates the (unlinked) file in `dir`. Its bytes (until it is drained
  // and truncated) are charged to `budget`, which it may share.
  static absl::StatusOr<std::unique_ptr<SpillFile>> Create(const std::string& dir,
                                                           std::shared_ptr<SpillBudget> budget);
  // With a budget of its own of `max_bytes`.
  static absl::StatusOr<std::unique_ptr<SpillFile>> Create(const std::string& dir,
                                                           uint64_t max_bytes);
  ~SpillFile();

  // ResourceExhausted when the record does not fit in the budget; Internal for a
  // failed write (the file is then unchanged as far as readers go).
  // Device tensors (tensor.pending set) cannot be spilled: InvalidArgument;
  // the sender spills a record with tensor.device_id instead.
  absl::Status Append(const SpillRecord& record);
  // The oldest unread record. DataLoss if it does not read back intact (it
  // is skipped); FailedPrecondition when there is none.
  absl::StatusOr<SpillRecord> ReadNext();
  // Bytes of the next record (0 if none): what reading it will hold in memory.
  uint64_t NextSize() const;

  // The next record is a step end (false if none): what a lost record was.
  bool NextIsStepEnd() const { return !is_step_end_.empty() && is_step_end_.front(); }
  uint64_t records() const { return sizes_.size(); }  // appended, not yet read
  uint64_t step_end_records() const { return step_ends_; }  // of those, step ends
  uint64_t file_bytes() const { return end_; }

 private:
  SpillFile(int fd, std::shared_ptr<SpillBudget> budget) : fd_(fd), budget_(std::move(budget)) {}
  absl::StatusOr<SpillRecord> ReadAt(uint64_t at, uint64_t size) const;

  const int fd_;
  // Charged end_ - punched_ bytes: what the file holds.
  const std::shared_ptr<SpillBudget> budget_;
  uint64_t end_ = 0;   // append offset
  uint64_t punched_ = 0;  // bytes below head_ given back as holes
  uint64_t head_ = 0;  // read offset
  std::deque<uint64_t> sizes_;  // of the unread records, oldest first
  std::deque<bool> is_step_end_;  // likewise
  uint64_t step_ends_ = 0;
};

}  // namespace sonde

#endif  // SONDE_CLIENT_SPILL_FILE_H_
