#include "server/tensorboard/event_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "server/tensorboard/tfrecord.h"

namespace sonde::server::tensorboard {
namespace {

absl::Status ErrnoError(int err, absl::string_view what, absl::string_view path) {
  const std::string message = absl::StrCat(what, " '", path, "': ", std::strerror(err));
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    case ENOENT:
      return absl::NotFoundError(message);
    default:
      return absl::InternalError(message);
  }
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  std::string host(name);
  // The name becomes part of a file name.
  for (char& c : host) {
    if (c == '/') c = '_';
  }
  return host;
}

}  // namespace

absl::StatusOr<std::unique_ptr<EventFile>> EventFile::Create(const std::string& dir,
                                                             absl::Time now) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return ErrnoError(ec.value(), "cannot create directory", dir);
  const std::string base =
      absl::StrCat(dir, "/events.out.tfevents.", absl::ToUnixSeconds(now), ".", HostName());
  std::string path = base;
  int fd = -1;
  for (int n = 1;; ++n) {
    fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) break;
    if (errno != EEXIST || n > 1000) return ErrnoError(errno, "cannot create event file", path);
    // A file of the same second (a quick restart): a later name sorts after it.
    path = absl::StrCat(base, ".", n);
  }
  std::unique_ptr<EventFile> file(new EventFile(path, fd));
  tfevents::Event version;
  version.set_wall_time(absl::ToDoubleSeconds(now - absl::UnixEpoch()));
  version.set_file_version("brain.Event:2");
  file->Append(version);
  absl::Status flushed = file->Flush();
  if (!flushed.ok()) return flushed;
  return file;
}

EventFile::~EventFile() { close(fd_); }

void EventFile::Append(const tfevents::Event& event) {
  AppendTfRecord(buffer_, event.SerializeAsString());
}

absl::Status EventFile::Flush() {
  size_t done = 0;
  while (done < buffer_.size()) {
    const ssize_t n = write(fd_, buffer_.data() + done, buffer_.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      buffer_.clear();
      return ErrnoError(err, "cannot write event file", path_);
    }
    done += static_cast<size_t>(n);
  }
  size_ += buffer_.size();
  buffer_.clear();
  return absl::OkStatus();
}

absl::Status TruncateEventFile(const std::string& path, uint64_t size) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoError(errno, "cannot stat event file", path);
  }
  if (static_cast<uint64_t>(st.st_size) <= size) return absl::OkStatus();
  if (truncate(path.c_str(), static_cast<off_t>(size)) != 0) {
    return ErrnoError(errno, "cannot truncate event file", path);
  }
  return absl::OkStatus();
}

}  // namespace sonde::server::tensorboard
