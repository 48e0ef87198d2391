#include "client/spool/spool.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"
#include "glog/logging.h"

namespace sonde::spool {
namespace {

namespace fs = std::filesystem;

constexpr char kHello[] = "hello.pb";
constexpr char kCollector[] = "collector";
constexpr char kLock[] = "lock";
constexpr char kSuffix[] = ".seg";
constexpr size_t kRecordHeader = 8;  // u32 length, u32 crc32c

std::string Errno(const std::string& what) {
  return absl::StrCat(what, ": ", std::strerror(errno));
}

std::string SegmentName(uint64_t index) { return absl::StrFormat("%020d%s", index, kSuffix); }

// Writes `data` to `path` through a temporary file and a rename: the file
// is whole or absent.
absl::Status WriteWhole(const std::string& path, const std::string& data) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(Errno("cannot create " + tmp));
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string error = Errno("cannot write " + tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      return absl::InternalError(error);
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string error = Errno("cannot write " + path);
    ::unlink(tmp.c_str());
    return absl::InternalError(error);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadWhole(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return errno == ENOENT ? absl::NotFoundError(absl::StrCat("no file ", path))
                           : absl::InternalError(Errno("cannot open " + path));
  }
  std::string data;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string error = Errno("cannot read " + path);
      ::close(fd);
      return absl::InternalError(error);
    }
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return data;
}

// Records serialized in place into one buffer (payloads are most of the
// bytes: each is copied once, into the buffer, before the write). The seq
// numbers go along but mean nothing: the stream that sends a record numbers
// it again.
std::string Encode(const std::vector<v1::ClientMessage>& messages) {
  std::vector<size_t> sizes;
  sizes.reserve(messages.size());
  size_t total = 0;
  for (const v1::ClientMessage& m : messages) {
    sizes.push_back(m.ByteSizeLong());
    total += kRecordHeader + sizes.back();
  }
  std::string out;
  out.resize(total);
  char* at = out.data();
  for (size_t i = 0; i < messages.size(); ++i) {
    const uint32_t length = static_cast<uint32_t>(sizes[i]);
    messages[i].SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(at + kRecordHeader));
    const uint32_t crc = Crc32c(absl::string_view(at + kRecordHeader, length));
    std::memcpy(at, &length, 4);
    std::memcpy(at + 4, &crc, 4);
    at += kRecordHeader + length;
  }
  return out;
}

absl::StatusOr<std::vector<v1::ClientMessage>> Decode(const std::string& data,
                                                      const std::string& path) {
  std::vector<v1::ClientMessage> messages;
  size_t at = 0;
  while (at < data.size()) {
    uint32_t length, crc;
    if (data.size() - at < kRecordHeader) {
      return absl::DataLossError(absl::StrCat(path, " ends inside a record header"));
    }
    std::memcpy(&length, data.data() + at, 4);
    std::memcpy(&crc, data.data() + at + 4, 4);
    at += kRecordHeader;
    if (length > data.size() - at) {
      return absl::DataLossError(absl::StrCat(path, " ends inside a record"));
    }
    const absl::string_view body(data.data() + at, length);
    at += length;
    if (Crc32c(body) != crc) {
      return absl::DataLossError(absl::StrCat(path, ": a record fails its CRC"));
    }
    messages.emplace_back();
    if (!messages.back().ParseFromArray(body.data(), static_cast<int>(body.size()))) {
      return absl::DataLossError(absl::StrCat(path, ": a record does not parse"));
    }
  }
  return messages;
}

// The segment indices in a spool directory, in order.
std::vector<uint64_t> Segments(const std::string& path, uint64_t* bytes) {
  std::vector<uint64_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(path, ec)) {
    const std::string name = e.path().filename().string();
    const size_t n = name.size() - std::strlen(kSuffix);
    if (name.size() <= std::strlen(kSuffix) || name.compare(n, std::string::npos, kSuffix) != 0) {
      continue;
    }
    uint64_t index;
    if (!absl::SimpleAtoi(name.substr(0, n), &index)) continue;
    out.push_back(index);
    if (bytes != nullptr) {
      std::error_code size_ec;
      const auto size = fs::file_size(e.path(), size_ec);
      if (!size_ec) *bytes += size;
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::string DefaultDir() {
  if (const char* d = std::getenv("SONDE_SPOOL_DIR"); d != nullptr && *d != '\0') return d;
  // Under `bazel test` (and other runners that set it): the test's own
  // temporary directory, so tests never meet each other's spools.
  if (const char* d = std::getenv("TEST_TMPDIR"); d != nullptr && *d != '\0') {
    return absl::StrCat(d, "/sonde-spool");
  }
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d != nullptr && *d != '\0') {
    return absl::StrCat(d, "/sonde/spool");
  }
  if (const char* d = std::getenv("HOME"); d != nullptr && *d != '\0') {
    return absl::StrCat(d, "/.cache/sonde/spool");
  }
  return absl::StrCat("/tmp/sonde-spool-", ::getuid());
}

absl::StatusOr<std::unique_ptr<Spool>> Spool::Create(const std::string& dir,
                                                     const v1::Hello& hello,
                                                     const std::string& collector,
                                                     uint64_t max_bytes) {
  const std::string path = absl::StrFormat("%s/%s/%d-%016x", dir, hello.job(), hello.worker(),
                                           hello.client_id());
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot create the spool directory ", path, ": ", ec.message()));
  }
  const std::string lock = path + "/" + kLock;
  const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(Errno("cannot create " + lock));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("the spool ", path, " is in use"));
  }
  std::unique_ptr<Spool> spool(new Spool(path, fd, max_bytes));
  v1::Hello stored = hello;
  if (absl::Status s = WriteWhole(path + "/" + kHello, stored.SerializeAsString()); !s.ok()) {
    return s;
  }
  if (absl::Status s = WriteWhole(path + "/" + kCollector, collector); !s.ok()) return s;
  return spool;
}

Spool::~Spool() {
  if (sizes_.empty()) RemoveLeft(path_);  // before the unlock: no upload sees it half gone
  ::close(lock_fd_);
}

absl::Status Spool::Write(uint64_t index, const std::vector<v1::ClientMessage>& messages) {
  const std::string data = Encode(messages);
  if (bytes_ + data.size() > max_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the spool ", path_, " holds ", bytes_, " bytes; ", data.size(),
                     " more would pass its limit of ", max_bytes_));
  }
  absl::Status s = WriteWhole(absl::StrCat(path_, "/", SegmentName(index)), data);
  if (!s.ok()) return s;
  bytes_ += data.size();
  sizes_[index] = data.size();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::ClientMessage>> Spool::Read(uint64_t index) const {
  return ReadSegment(path_, index);
}

void Spool::Remove(uint64_t index) {
  auto it = sizes_.find(index);
  if (it == sizes_.end()) return;
  RemoveSegment(path_, index);
  bytes_ -= it->second;
  sizes_.erase(it);
}

void Spool::RemoveAll() {
  while (!sizes_.empty()) Remove(sizes_.begin()->first);
}

std::vector<LeftSpool> FindLeft(const std::string& dir) {
  std::vector<std::pair<fs::file_time_type, LeftSpool>> found;
  std::error_code ec;
  for (const auto& job : fs::directory_iterator(dir, ec)) {
    if (!job.is_directory()) continue;
    std::error_code inner;
    for (const auto& client : fs::directory_iterator(job.path(), inner)) {
      if (!client.is_directory()) continue;
      const std::string path = client.path().string();
      absl::StatusOr<int> lock = LockLeft(path);
      if (!lock.ok()) continue;  // its client lives, or an upload has it
      ::close(*lock);
      LeftSpool left;
      left.path = path;
      absl::StatusOr<std::string> hello = ReadWhole(path + "/" + kHello);
      if (!hello.ok() || !left.hello.ParseFromString(*hello)) {
        LOG(WARNING) << "sonde: skipping the spool " << path << ": no readable " << kHello;
        continue;
      }
      absl::StatusOr<std::string> collector = ReadWhole(path + "/" + kCollector);
      if (collector.ok()) left.collector = *collector;
      left.segments = Segments(path, &left.bytes);
      std::error_code time_ec;
      const auto when = fs::last_write_time(client.path(), time_ec);
      found.emplace_back(when, std::move(left));
    }
  }
  std::stable_sort(found.begin(), found.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<LeftSpool> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

absl::StatusOr<int> LockLeft(const std::string& path) {
  const std::string lock = path + "/" + kLock;
  const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(Errno("cannot open " + lock));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("the spool ", path, " is in use"));
  }
  return fd;
}

absl::StatusOr<std::vector<v1::ClientMessage>> ReadSegment(const std::string& path,
                                                           uint64_t index) {
  const std::string file = absl::StrCat(path, "/", SegmentName(index));
  absl::StatusOr<std::string> data = ReadWhole(file);
  if (!data.ok()) return data.status();
  return Decode(*data, file);
}

void RemoveSegment(const std::string& path, uint64_t index) {
  ::unlink(absl::StrCat(path, "/", SegmentName(index)).c_str());
}

void RemoveLeft(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  // The job's directory goes too once no client's is left in it.
  fs::remove(fs::path(path).parent_path(), ec);
}

}  // namespace sonde::spool
