// The client's spill files: creating one (unlinked, so nothing is left
// behind by a crash), and whole-buffer positional reads and writes
// (pread/pwrite, retried on short transfers and EINTR). Thread-safe: no
// state beyond the descriptor, and no shared file offset.
#ifndef SONDE_CLIENT_POSITIONAL_IO_H_
#define SONDE_CLIENT_POSITIONAL_IO_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sonde {

// A new empty file in `dir` (created with its parents, as the spool's is,
// if missing), opened read-write and already unlinked: its descriptor.
// Unavailable, naming `what` and `dir`, when it cannot be made.
absl::StatusOr<int> CreateUnlinkedFile(const std::string& dir, absl::string_view prefix,
                                       absl::string_view what);

// Writes all `n` bytes at `offset`. Internal ("<what>: <errno text>") on failure.
absl::Status PWriteAll(int fd, const char* data, size_t n, uint64_t offset,
                       absl::string_view what);
// Reads all `n` bytes at `offset`. DataLoss on failure or a short file.
absl::Status PReadAll(int fd, char* data, size_t n, uint64_t offset, absl::string_view what);

}  // namespace sonde

#endif  // SONDE_CLIENT_POSITIONAL_IO_H_
