// One TensorBoard event file being written: created under a run directory
// with TensorBoard's name (events.out.tfevents.<unix seconds>.<hostname>,
// plus ".<n>" if that name is taken), opened with TensorFlow's
// file_version record ("brain.Event:2"), then appended to. Events are
// buffered in memory until Flush, which hands them to the kernel in one
// write: after Flush they survive the collector's crash (not a power
// loss; there is no fsync). Not thread-safe: one owner.
#ifndef SONDE_SERVER_TENSORBOARD_EVENT_FILE_H_
#define SONDE_SERVER_TENSORBOARD_EVENT_FILE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/tensorboard.pb.h"

namespace sonde::server::tensorboard {

class EventFile {
 public:
  // Creates `dir` (and its parents) if missing and a new event file in it,
  // whose first record is the file_version event at `now`. The file is on
  // disk (header flushed) when this returns. Errors from the file system,
  // with the path.
  static absl::StatusOr<std::unique_ptr<EventFile>> Create(const std::string& dir,
                                                           absl::Time now);
  ~EventFile();  // closes the file; what was not flushed is lost

  EventFile(const EventFile&) = delete;
  EventFile& operator=(const EventFile&) = delete;

  // Buffers one event.
  void Append(const tfevents::Event& event);
  // Bytes buffered and not yet written.
  size_t buffered() const { return buffer_.size(); }
  // Writes what is buffered. On error the file may hold part of it; its
  // owner truncates back to size() before writing more (see
  // TruncateEventFile).
  absl::Status Flush();

  const std::string& path() const { return path_; }
  // Bytes on disk: the records written by the last successful Flush.
  uint64_t size() const { return size_; }

 private:
  EventFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

  const std::string path_;
  const int fd_;
  std::string buffer_;
  uint64_t size_ = 0;
};

// Cuts the file at `path` back to `size` bytes if it is longer: drops
// records written after the last point its owner recorded. OK if the file
// is missing or not longer.
absl::Status TruncateEventFile(const std::string& path, uint64_t size);

}  // namespace sonde::server::tensorboard

#endif  // SONDE_SERVER_TENSORBOARD_EVENT_FILE_H_
