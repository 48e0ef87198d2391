// The durable spool: a client's wire messages that the collector has not
// acknowledged, kept on local disk so that they outlive the process (a
// collector down for the whole run, a close() that times out, kill -9).
// `sonde sync` (client/spool/upload.h), or the next hook started with the
// same spool directory, uploads them later; the collector stores each step
// once (it acknowledges steps it already has as duplicates).
//
// Layout: <dir>/<job>/<worker>-<client id, 16 hex digits>/ holds
//   hello.pb      the stream's Hello (job, worker, client id, rules...)
//   collector     the address it was streaming to
//   lock          flock()ed while the client lives: uploads skip it
//   <index>.seg   one entry (a step's messages and its end, a profiler
//                 batch, or the job end), index = order of sending, 20
//                 digits; records of u32 length, u32 CRC-32C, a serialized
//                 ClientMessage. Written to a temporary name and renamed,
//                 so a segment is whole or absent.
// Segments are in the page cache once written: they survive the process
// (kill -9 included), not a power loss (no fsync). A segment is removed
// once its entry is acknowledged; the directory once the job end is.
// Not thread-safe (the sender guards it).
#ifndef SONDE_CLIENT_SPOOL_SPOOL_H_
#define SONDE_CLIENT_SPOOL_SPOOL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/collector.pb.h"

namespace sonde::spool {

// The default spool directory: $SONDE_SPOOL_DIR, else $TEST_TMPDIR/sonde-spool
// (under a test runner), else $XDG_CACHE_HOME/sonde/spool, else
// $HOME/.cache/sonde/spool, else /tmp/sonde-spool-<uid>.
std::string DefaultDir();

class Spool {
 public:
  // Creates this client's directory under `dir` (and `dir` itself) and takes
  // its lock. `max_bytes` bounds the segments' total size.
  static absl::StatusOr<std::unique_ptr<Spool>> Create(const std::string& dir,
                                                       const v1::Hello& hello,
                                                       const std::string& collector,
                                                       uint64_t max_bytes);
  // Releases the lock; removes the directory when no segment is left.
  ~Spool();

  // Writes entry `index`'s messages (their seq numbers mean nothing there).
  // ResourceExhausted when they would pass max_bytes; Internal for a failed
  // write (nothing is left behind).
  absl::Status Write(uint64_t index, const std::vector<v1::ClientMessage>& messages);
  // DataLoss if the segment does not read back intact; NotFound if absent.
  absl::StatusOr<std::vector<v1::ClientMessage>> Read(uint64_t index) const;
  void Remove(uint64_t index);
  // Removes every segment (the collector refused the job: nothing in it
  // can ever be stored).
  void RemoveAll();

  const std::string& path() const { return path_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t segments() const { return sizes_.size(); }

 private:
  Spool(std::string path, int lock_fd, uint64_t max_bytes)
      : path_(std::move(path)), lock_fd_(lock_fd), max_bytes_(max_bytes) {}

  const std::string path_;
  const int lock_fd_;
  const uint64_t max_bytes_;
  uint64_t bytes_ = 0;
  std::map<uint64_t, uint64_t> sizes_;  // index -> bytes on disk
};

// A spool left by a client that is gone (its lock is free).
struct LeftSpool {
  std::string path;
  v1::Hello hello;
  std::string collector;
  std::vector<uint64_t> segments;  // indices, in order
  uint64_t bytes = 0;
};

// The spools under `dir` whose client is gone, oldest client first (by the
// directory's modification time); unreadable ones are skipped with a
// warning. An absent `dir` has none.
std::vector<LeftSpool> FindLeft(const std::string& dir);

// Locks a left spool for an upload (so two uploads never send the same
// spool at once). Returns the lock's descriptor, or Unavailable when its
// client (or another upload) holds it. Close the descriptor to release.
absl::StatusOr<int> LockLeft(const std::string& path);

// Reads segment `index` of the spool at `path`.
absl::StatusOr<std::vector<v1::ClientMessage>> ReadSegment(const std::string& path,
                                                           uint64_t index);
// Removes segment `index`; RemoveLeft removes the whole spool directory.
void RemoveSegment(const std::string& path, uint64_t index);
void RemoveLeft(const std::string& path);

}  // namespace sonde::spool

#endif  // SONDE_CLIENT_SPOOL_SPOOL_H_
