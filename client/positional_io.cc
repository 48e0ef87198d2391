#include "client/positional_io.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace sonde {

absl::StatusOr<int> CreateUnlinkedFile(const std::string& dir, absl::string_view prefix,
                                       absl::string_view what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot create ", what, " in ", dir, ": ", ec.message()));
  }
  // mkstemp replaces the template's last six characters, which must be X.
  std::string path = absl::StrCat(dir, "/", prefix, "-", std::string(6, 'X'));
  const int fd = mkstemp(path.data());
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot create ", what, " in ", dir, ": ", std::strerror(errno)));
  }
  unlink(path.c_str());
  return fd;
}

absl::Status PWriteAll(int fd, const char* data, size_t n, uint64_t offset,
                       absl::string_view what) {
  size_t done = 0;
  while (done < n) {
    const ssize_t w = pwrite(fd, data + done, n - done, static_cast<off_t>(offset + done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      return absl::InternalError(
          absl::StrCat(what, ": ", w == 0 ? "no progress" : std::strerror(errno)));
    }
    done += static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status PReadAll(int fd, char* data, size_t n, uint64_t offset, absl::string_view what) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = pread(fd, data + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      return absl::DataLossError(
          absl::StrCat(what, ": ", r == 0 ? "short file" : std::strerror(errno)));
    }
    done += static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

}  // namespace sonde
