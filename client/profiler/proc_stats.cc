#include "client/profiler/proc_stats.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <initializer_list>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace sonde::profiler {
namespace {

constexpr size_t kMinReadBuffer = 4096;

// How much a counter rose; a decrease counts as none.
uint64_t Rise(uint64_t before, uint64_t after) { return after > before ? after - before : 0; }

std::vector<absl::string_view> Fields(absl::string_view text) {
  return absl::StrSplit(text, absl::ByAnyChar(" \t"), absl::SkipEmpty());
}

absl::StatusOr<CpuJiffies> ParseCpuLine(absl::string_view line, absl::string_view columns) {
  const std::vector<absl::string_view> fields = Fields(columns);
  if (fields.size() < 4) {
    return absl::InvalidArgumentError(absl::StrCat("/proc/stat line '", line, "' has ",
                                                   fields.size(), " columns, expected at least 4"));
  }
  CpuJiffies j;
  uint64_t* const slots[] = {&j.user, &j.nice,   &j.system,  &j.idle,
                             &j.iowait, &j.irq, &j.softirq, &j.steal};
  for (size_t i = 0; i < fields.size() && i < 8; ++i) {
    if (!absl::SimpleAtoi(fields[i], slots[i])) {
      return absl::InvalidArgumentError(absl::StrCat("/proc/stat line '", line, "': column ",
                                                     i + 1, " '", fields[i], "' is not a number"));
    }
  }
  return j;
}

// "  1234 kB" -> 1234 * 1024; a bare number is taken as it is.
std::optional<uint64_t> KilobyteValue(absl::string_view value) {
  const std::vector<absl::string_view> fields = Fields(value);
  uint64_t n = 0;
  if (fields.empty() || !absl::SimpleAtoi(fields[0], &n)) return std::nullopt;
  if (fields.size() > 1 && fields[1] == "kB") n *= 1024;
  return n;
}

}  // namespace

absl::Status ReadProcFile(const std::string& path, std::string& out) {
  int fd;
  do {
    fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  out.resize(std::max(out.capacity(), kMinReadBuffer));
  size_t size = 0;
  while (true) {
    if (size == out.size()) out.resize(2 * out.size());
    const ssize_t n = read(fd, &out[size], out.size() - size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      close(fd);
      out.clear();
      return absl::ErrnoToStatus(error, absl::StrCat("cannot read ", path));
    }
    if (n == 0) break;
    size += static_cast<size_t>(n);
  }
  close(fd);
  out.resize(size);
  return absl::OkStatus();
}

absl::StatusOr<ProcStat> ParseProcStat(absl::string_view text) {
  ProcStat stat;
  bool have_total = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, "cpu")) {
      // The cpu lines come first; stop before the long intr line.
      if (have_total) break;
      continue;
    }
    const size_t end_of_name = std::min(line.find_first_of(" \t"), line.size());
    const absl::string_view name = line.substr(0, end_of_name);
    auto jiffies = ParseCpuLine(line, line.substr(end_of_name));
    if (!jiffies.ok()) return jiffies.status();
    if (name == "cpu") {
      stat.total = *jiffies;
      have_total = true;
      continue;
    }
    int core = 0;
    if (!absl::SimpleAtoi(name.substr(3), &core) || core < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("/proc/stat line '", line, "': '", name, "' is not cpu<N>"));
    }
    stat.cores[core] = *jiffies;
  }
  if (!have_total) return absl::InvalidArgumentError("/proc/stat has no 'cpu' line");
  return stat;
}

std::optional<CpuUsage> CpuUsageBetween(const CpuJiffies& before, const CpuJiffies& after) {
  uint64_t busy = 0;
  for (uint64_t CpuJiffies::*field : {&CpuJiffies::user, &CpuJiffies::nice, &CpuJiffies::system,
                                      &CpuJiffies::irq, &CpuJiffies::softirq, &CpuJiffies::steal}) {
    if (after.*field < before.*field) return std::nullopt;
    busy += after.*field - before.*field;
  }
  const uint64_t iowait = Rise(before.iowait, after.iowait);
  const uint64_t total = busy + Rise(before.idle, after.idle) + iowait;
  if (total == 0) return std::nullopt;
  CpuUsage usage;
  usage.util_percent = 100.0 * static_cast<double>(busy) / static_cast<double>(total);
  usage.iowait_percent = 100.0 * static_cast<double>(iowait) / static_cast<double>(total);
  return usage;
}

CpuUsageReport CpuUsageBetween(const ProcStat& before, const ProcStat& after) {
  CpuUsageReport report;
  report.total = CpuUsageBetween(before.total, after.total);
  for (const auto& [core, jiffies] : after.cores) {
    auto it = before.cores.find(core);
    if (it == before.cores.end()) continue;  // came online since the last reading
    if (auto usage = CpuUsageBetween(it->second, jiffies)) report.cores[core] = *usage;
  }
  return report;
}

absl::StatusOr<MemInfo> ParseMeminfo(absl::string_view text) {
  std::optional<uint64_t> total, available, free, buffers, cached;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    const absl::string_view key = line.substr(0, colon);
    std::optional<uint64_t>* slot = key == "MemTotal"       ? &total
                                    : key == "MemAvailable" ? &available
                                    : key == "MemFree"      ? &free
                                    : key == "Buffers"      ? &buffers
                                    : key == "Cached"       ? &cached
                                                            : nullptr;
    if (slot == nullptr) continue;
    *slot = KilobyteValue(line.substr(colon + 1));
    if (!slot->has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("/proc/meminfo line '", line, "' has no number"));
    }
  }
  if (!total.has_value()) return absl::InvalidArgumentError("/proc/meminfo has no MemTotal");
  MemInfo info;
  info.total_bytes = *total;
  if (available.has_value()) {
    info.available_bytes = *available;
  } else if (free.has_value()) {
    info.available_bytes = *free + buffers.value_or(0) + cached.value_or(0);
  } else {
    return absl::InvalidArgumentError("/proc/meminfo has neither MemAvailable nor MemFree");
  }
  return info;
}

absl::StatusOr<NetDevBytes> ParseNetDev(absl::string_view text) {
  NetDevBytes out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    // Header lines have no colon. Old kernels print "eth0:123" with no space.
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    const absl::string_view name = absl::StripAsciiWhitespace(line.substr(0, colon));
    if (name == "lo") continue;
    const std::vector<absl::string_view> fields = Fields(line.substr(colon + 1));
    InterfaceBytes bytes;
    if (fields.size() < 9 || !absl::SimpleAtoi(fields[0], &bytes.rx) ||
        !absl::SimpleAtoi(fields[8], &bytes.tx)) {
      return absl::InvalidArgumentError(
          absl::StrCat("/proc/net/dev line '", line, "': expected at least 9 counters"));
    }
    out[std::string(name)] = bytes;
  }
  return out;
}

InterfaceBytes NetBytesBetween(const NetDevBytes& before, const NetDevBytes& after) {
  InterfaceBytes moved;
  for (const auto& [name, bytes] : after) {
    auto it = before.find(name);
    if (it == before.end()) continue;
    moved.rx += Rise(it->second.rx, bytes.rx);
    moved.tx += Rise(it->second.tx, bytes.tx);
  }
  return moved;
}

absl::StatusOr<uint64_t> ParseStartTicks(absl::string_view pid_stat_text) {
  const size_t paren = pid_stat_text.rfind(')');
  if (paren == absl::string_view::npos) {
    return absl::InvalidArgumentError("process stat has no ')' after the command name");
  }
  std::vector<absl::string_view> fields =
      absl::StrSplit(pid_stat_text.substr(paren + 1), ' ', absl::SkipWhitespace());
  // Field 3 (state) is the first after the name, so field 22 is the 20th.
  uint64_t ticks = 0;
  if (fields.size() < 20 || !absl::SimpleAtoi(fields[19], &ticks)) {
    return absl::InvalidArgumentError(
        absl::StrCat("process stat has no starttime field (", fields.size(), " fields after the name)"));
  }
  return ticks;
}

absl::StatusOr<int64_t> ParseBootTime(absl::string_view stat_text) {
  for (absl::string_view line : absl::StrSplit(stat_text, '\n')) {
    if (!absl::ConsumePrefix(&line, "btime ")) continue;
    int64_t seconds = 0;
    if (absl::SimpleAtoi(line, &seconds)) return seconds;
    return absl::InvalidArgumentError(absl::StrCat("stat line 'btime ", line, "' has no number"));
  }
  return absl::NotFoundError("stat has no btime line");
}

absl::StatusOr<absl::Time> ProcessStartTime() {
  std::string self, stat;
  SONDE_RETURN_IF_ERROR(ReadProcFile("/proc/self/stat", self));
  SONDE_RETURN_IF_ERROR(ReadProcFile("/proc/stat", stat));
  SONDE_ASSIGN_OR_RETURN(const uint64_t ticks, ParseStartTicks(self));
  SONDE_ASSIGN_OR_RETURN(const int64_t boot, ParseBootTime(stat));
  const long hz = sysconf(_SC_CLK_TCK);
  if (hz <= 0) return absl::InternalError("sysconf(_SC_CLK_TCK) gave no clock tick rate");
  return absl::FromUnixSeconds(boot) +
         absl::Milliseconds(static_cast<int64_t>(ticks) * 1000 / hz);
}

absl::StatusOr<uint64_t> ParseVmRssBytes(absl::string_view status_text) {
  for (absl::string_view line : absl::StrSplit(status_text, '\n')) {
    if (!absl::StartsWith(line, "VmRSS:")) continue;
    if (auto bytes = KilobyteValue(line.substr(6))) return *bytes;
    return absl::InvalidArgumentError(absl::StrCat("status line '", line, "' has no number"));
  }
  return absl::NotFoundError("status has no VmRSS line (a kernel thread?)");
}

}  // namespace sonde::profiler
