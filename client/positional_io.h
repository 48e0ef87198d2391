// Whole-buffer positional reads and writes (pread/pwrite, retried on short
// transfers and EINTR), shared by the client's spill files. Thread-safe:
// no state beyond the descriptor, and no shared file offset.
#ifndef SONDE_CLIENT_POSITIONAL_IO_H_
#define SONDE_CLIENT_POSITIONAL_IO_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace sonde {

// Writes all `n` bytes at `offset`. Internal ("<what>: <errno text>") on failure.
absl::Status PWriteAll(int fd, const char* data, size_t n, uint64_t offset,
                       absl::string_view what);
// Reads all `n` bytes at `offset`. DataLoss on failure or a short file.
absl::Status PReadAll(int fd, char* data, size_t n, uint64_t offset, absl::string_view what);

}  // namespace sonde

#endif  // SONDE_CLIENT_POSITIONAL_IO_H_
