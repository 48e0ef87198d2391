// spill_bench: how fast device values go through the capture's spill file
// (client/value_spill.h: write with a CRC-32C, read back and check it,
// release with a hole punched), against the same file work without the
// CRCs and bookkeeping (pwrite, pread, hole punching on an unlinked file in
// the same directory) and against memcpy of the same bytes, in the same
// run. spill/file says what the spill file adds over the disk (or page
// cache) it sits on; spill/memcpy puts it against the memory it spares.
//
//   bazel run -c opt //tests/bench:spill_bench [-- --dir=/tmp --mib=1024]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "client/backpressure.h"
#include "client/positional_io.h"
#include "client/value_spill.h"

ABSL_FLAG(std::string, dir, "", "directory of the files (default: $TMPDIR, else /tmp)");
ABSL_FLAG(int, mib, 512, "MiB moved per record size and way");
ABSL_FLAG(int, live, 8, "records held before the oldest is read back (a sender behind)");

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// The same file work without what ValueSpill adds (CRC-32C on write and
// read, bookkeeping): append `count` records of `size`, read back the
// oldest once `live` are held and punch its hole, truncate when none is
// left. GB/s moved (each byte written once and read once counts once).
double Plain(const std::string& dir, size_t size, size_t count, size_t live) {
  absl::StatusOr<int> created = sonde::CreateUnlinkedFile(dir, "sonde-plain", "a plain file");
  if (!created.ok()) return 0;
  const int fd = *created;
  std::vector<char> data(size, 'x'), back(size);
  const Clock::time_point start = Clock::now();
  uint64_t end = 0;
  std::vector<uint64_t> held;
  for (size_t i = 0; i < count; ++i) {
    data[i % size] = static_cast<char>(i);
    if (pwrite(fd, data.data(), size, static_cast<off_t>(end)) != static_cast<ssize_t>(size)) break;
    held.push_back(end);
    end += size;
    while (held.size() > (i + 1 == count ? 0 : live)) {
      if (pread(fd, back.data(), size, static_cast<off_t>(held.front())) !=
          static_cast<ssize_t>(size)) {
        break;
      }
      fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                static_cast<off_t>(held.front()), static_cast<off_t>(size));
      held.erase(held.begin());
    }
    if (held.empty() && ftruncate(fd, 0) == 0) end = 0;
  }
  const double s = Seconds(start);
  close(fd);
  return static_cast<double>(size) * count / s / 1e9;
}

// Memory bandwidth for scale: the same bytes copied in and out once each.
double Memcpy(size_t size, size_t count) {
  std::vector<char> a(size, 'x'), b(size), c(size);
  const Clock::time_point start = Clock::now();
  for (size_t i = 0; i < count; ++i) {
    a[i % size] = static_cast<char>(i);
    std::memcpy(b.data(), a.data(), size);
    std::memcpy(c.data(), b.data(), size);
  }
  const double s = Seconds(start);
  volatile char sink = c[size - 1];  // the copies are used: not optimized away
  (void)sink;
  return static_cast<double>(size) * count / s / 1e9;
}

double Spill(const std::string& dir, size_t size, size_t count, size_t live) {
  auto spill = sonde::ValueSpill::Create(dir, uint64_t{64} << 30);
  if (!spill.ok()) {
    std::fprintf(stderr, "%s\n", std::string(spill.status().message()).c_str());
    return 0;
  }
  std::vector<char> data(size, 'x'), back(size);
  const Clock::time_point start = Clock::now();
  std::vector<sonde::ValueSpill::Record> held;
  for (size_t i = 0; i < count; ++i) {
    data[i % size] = static_cast<char>(i);
    auto r = (*spill)->Write(data.data(), size);
    if (!r.ok()) break;
    held.push_back(*r);
    while (held.size() > (i + 1 == count ? 0 : live)) {
      if (!(*spill)->Read(held.front(), back.data()).ok()) break;
      (*spill)->Release(held.front());
      held.erase(held.begin());
    }
  }
  const double s = Seconds(start);
  return static_cast<double>(size) * count / s / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string dir = sonde::SpillDirOrTemp(absl::GetFlag(FLAGS_dir));
  const uint64_t mib = uint64_t{1} << 20;
  const size_t live = static_cast<size_t>(absl::GetFlag(FLAGS_live));
  std::printf("spill_bench: %d MiB per row through %s, %zu records held\n",
              absl::GetFlag(FLAGS_mib), dir.c_str(), live);
  std::printf("%-10s %12s %11s %11s %11s %13s\n", "record", "memcpy GB/s", "file GB/s",
              "spill GB/s", "spill/file", "spill/memcpy");
  for (size_t size : {size_t{256} << 10, size_t{1} << 20, size_t{4} << 20, size_t{64} << 20}) {
    const size_t count = std::max<size_t>(
        live + 1, static_cast<size_t>(absl::GetFlag(FLAGS_mib)) * mib / size);
    // Alternated, so neither way always runs on a colder page cache.
    constexpr int kRounds = 3;
    double copy = 0, plain = 0, spill = 0;
    for (int round = 0; round < kRounds; ++round) {
      copy += Memcpy(size, count) / kRounds;
      plain += Plain(dir, size, count, live) / kRounds;
      spill += Spill(dir, size, count, live) / kRounds;
    }
    std::printf("%-10s %12.2f %11.2f %11.2f %11.3f %13.3f\n",
                (std::to_string(size >> 10) + " KiB").c_str(), copy, plain, spill,
                plain > 0 ? spill / plain : 0, copy > 0 ? spill / copy : 0);
  }
  return 0;
}
