// Parsers for the Linux /proc files the system metrics sampler reads, and the
// arithmetic that turns two readings of monotonic counters into rates and
// percentages. Pure functions of their text (no I/O except ReadProcFile and
// ProcessStartTime), so every kernel's format is tested from fixtures.
// Thread-compatible.
#ifndef SONDE_CLIENT_PROFILER_PROC_STATS_H_
#define SONDE_CLIENT_PROFILER_PROC_STATS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace sonde::profiler {

// Reads a whole /proc file into `out` (reusing its capacity: /proc files
// report size 0, so they are read until end of file). NotFound or
// PermissionDenied etc. with the path and errno text.
absl::Status ReadProcFile(const std::string& path, std::string& out);

// One line of /proc/stat, in USER_HZ ticks. Columns an old kernel does not
// print are 0: 2.4 prints user..idle, 2.6.0 adds iowait, irq, softirq, 2.6.11
// steal. guest and guest_nice (2.6.24, 2.6.33) are ignored on purpose: the
// kernel already counts them in user and nice.
struct CpuJiffies {
  uint64_t user = 0;
  uint64_t nice = 0;
  uint64_t system = 0;
  uint64_t idle = 0;
  uint64_t iowait = 0;
  uint64_t irq = 0;
  uint64_t softirq = 0;
  uint64_t steal = 0;
};

struct ProcStat {
  CpuJiffies total;               // the "cpu" line
  std::map<int, CpuJiffies> cores;  // "cpuN" lines by N; offline cores are absent
};

// InvalidArgument when there is no "cpu" line, a cpu line has fewer than four
// columns or a column that is not a number.
absl::StatusOr<ProcStat> ParseProcStat(absl::string_view text);

// Utilisation of one CPU (or all of them) between two readings, in percent of
// the time that passed: busy = user + nice + system + irq + softirq + steal;
// iowait counts as idle time, reported on its own.
struct CpuUsage {
  double util_percent = 0;
  double iowait_percent = 0;
};

// nullopt when no tick passed between the readings (an offline core) or a
// busy counter went backwards (the core was unplugged and its counters reset,
// or a 32-bit counter wrapped): the interval cannot be known, so nothing is
// reported rather than a negative or absurd value. idle and iowait may step
// back a little on NO_HZ kernels (proc(5)); there a decrease counts as zero.
std::optional<CpuUsage> CpuUsageBetween(const CpuJiffies& before, const CpuJiffies& after);

struct CpuUsageReport {
  std::optional<CpuUsage> total;
  std::map<int, CpuUsage> cores;  // only cores present and valid in both readings
};
CpuUsageReport CpuUsageBetween(const ProcStat& before, const ProcStat& after);

// /proc/meminfo. used = total - available. Kernels before 3.14 have no
// MemAvailable; there available is estimated as MemFree + Buffers + Cached.
struct MemInfo {
  uint64_t total_bytes = 0;
  uint64_t available_bytes = 0;
  uint64_t used_bytes() const {
    return total_bytes > available_bytes ? total_bytes - available_bytes : 0;
  }
};
// InvalidArgument without MemTotal or without any way to tell what is available.
absl::StatusOr<MemInfo> ParseMeminfo(absl::string_view text);

// /proc/net/dev byte counters by interface name. The loopback interface `lo`
// is left out: traffic to oneself is not network traffic (a collector on the
// same host would otherwise count twice).
struct InterfaceBytes {
  uint64_t rx = 0;
  uint64_t tx = 0;
};
using NetDevBytes = std::map<std::string, InterfaceBytes, std::less<>>;
// InvalidArgument on a line with fewer than nine counters or a non-number.
absl::StatusOr<NetDevBytes> ParseNetDev(absl::string_view text);

// Bytes moved between two readings, summed over interfaces present in both.
// A counter that went backwards (interface re-created, 32-bit wrap on old
// kernels) adds nothing; an interface that came or went adds nothing.
InterfaceBytes NetBytesBetween(const NetDevBytes& before, const NetDevBytes& after);

// VmRSS of a /proc/<pid>/status, in bytes. NotFound when the line is absent
// (kernel threads, zombies).
absl::StatusOr<uint64_t> ParseVmRssBytes(absl::string_view status_text);

// When a process started, in clock ticks since boot: field 22 (starttime)
// of /proc/<pid>/stat. The command name (field 2) may hold spaces and
// parentheses; fields are counted after its last ')'.
absl::StatusOr<uint64_t> ParseStartTicks(absl::string_view pid_stat_text);

// The boot time in seconds since the epoch: the "btime" line of /proc/stat.
absl::StatusOr<int64_t> ParseBootTime(absl::string_view stat_text);

// When this process started: the boot time plus its starttime, read from
// /proc/stat and /proc/self/stat. The errors of reading or parsing either.
absl::StatusOr<absl::Time> ProcessStartTime();

}  // namespace sonde::profiler

#endif  // SONDE_CLIENT_PROFILER_PROC_STATS_H_
