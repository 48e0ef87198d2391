#include "common/metrics/process_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace sonde::metrics {
namespace {

// Fields of /proc/self/statm: size resident shared text lib data dt (pages).
std::optional<uint64_t> StatmPages(int field) {
  std::ifstream in("/proc/self/statm");
  uint64_t value = 0;
  for (int i = 0; i <= field; ++i) {
    if (!(in >> value)) return std::nullopt;
  }
  return value;
}

std::optional<double> CpuSeconds() {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return std::nullopt;
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

std::optional<double> MaxFds() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) {
    return std::nullopt;
  }
  return static_cast<double>(limit.rlim_cur);
}

// Boot time (/proc/stat btime) plus the process's start in clock ticks
// since boot (/proc/self/stat field 22).
std::optional<double> StartTimeSeconds() {
  std::ifstream stat_file("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');  // the command name may hold spaces
  if (paren == std::string::npos) return std::nullopt;
  std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(stat).substr(paren + 1), ' ', absl::SkipEmpty());
  // fields[0] is field 3 (state); starttime is field 22.
  uint64_t start_ticks = 0;
  if (fields.size() < 20 || !absl::SimpleAtoi(fields[19], &start_ticks)) return std::nullopt;
  std::ifstream proc_stat("/proc/stat");
  std::string line;
  uint64_t boot = 0;
  while (std::getline(proc_stat, line)) {
    if (line.rfind("btime ", 0) == 0 && absl::SimpleAtoi(line.substr(6), &boot)) break;
  }
  const long ticks = sysconf(_SC_CLK_TCK);
  if (boot == 0 || ticks <= 0) return std::nullopt;
  return static_cast<double>(boot) + static_cast<double>(start_ticks) / ticks;
}

Registration Optional(Registry& registry, MetricType type, const std::string& name,
                      const std::string& help, std::function<std::optional<double>()> fn) {
  return registry.AddCallback(type, name, help, {}, [fn = std::move(fn)] {
    std::vector<Sample> out;
    if (auto v = fn()) out.push_back({{}, *v});
    return out;
  });
}

template <typename T>
std::optional<double> AsDouble(std::optional<T> v) {
  if (!v.has_value()) return std::nullopt;
  return static_cast<double>(*v);
}

}  // namespace

std::optional<uint64_t> ResidentMemoryBytes() {
  auto pages = StatmPages(1);
  if (!pages.has_value()) return std::nullopt;
  return *pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

std::optional<uint64_t> VirtualMemoryBytes() {
  auto pages = StatmPages(0);
  if (!pages.has_value()) return std::nullopt;
  return *pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

std::optional<uint64_t> OpenFileDescriptors() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return std::nullopt;
  const int own = dirfd(dir);
  uint64_t count = 0;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    int fd = 0;
    if (absl::SimpleAtoi(e->d_name, &fd) && fd == own) continue;  // the listing itself
    ++count;
  }
  closedir(dir);
  return count;
}

std::vector<Registration> RegisterProcessMetrics(Registry& registry) {
  std::vector<Registration> out;
  out.push_back(Optional(registry, MetricType::kGauge, "process_resident_memory_bytes",
                         "Resident memory size in bytes.",
                         [] { return AsDouble(ResidentMemoryBytes()); }));
  out.push_back(Optional(registry, MetricType::kGauge, "process_virtual_memory_bytes",
                         "Virtual memory size in bytes.",
                         [] { return AsDouble(VirtualMemoryBytes()); }));
  out.push_back(Optional(registry, MetricType::kGauge, "process_open_fds",
                         "Number of open file descriptors.",
                         [] { return AsDouble(OpenFileDescriptors()); }));
  out.push_back(Optional(registry, MetricType::kGauge, "process_max_fds",
                         "Maximum number of open file descriptors.", MaxFds));
  out.push_back(Optional(registry, MetricType::kCounter, "process_cpu_seconds_total",
                         "Total user and system CPU time spent in seconds.", CpuSeconds));
  out.push_back(Optional(registry, MetricType::kGauge, "process_start_time_seconds",
                         "Start time of the process since unix epoch in seconds.",
                         StartTimeSeconds));
  return out;
}

}  // namespace sonde::metrics
