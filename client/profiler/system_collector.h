// One reading of the machine's and the process's vital signs, as a flat list
// of named values: CPU per core and in total, I/O wait, memory, network, this
// process's resident memory, and every NVIDIA GPU through NVML (loaded at run
// time; machines without a GPU or driver report no gpu.* metric).
// SystemSampler calls Collect() on its own thread at a fixed interval; code
// that wants readings at moments of its choosing may call it directly.
// Not thread-safe: one owner calls Collect().
//
// Metric names are stable and carry their unit; <i> is the kernel's core
// number or NVML's GPU index:
//   cpu.util_percent              all cores: busy share of the interval, 0..100
//   cpu.iowait_percent            all cores: share idle while waiting for I/O
//   cpu.<i>.util_percent          one core (offline cores are left out)
//   memory.used_bytes             MemTotal - MemAvailable
//   memory.total_bytes            MemTotal
//   network.rx_bytes_per_s        received over every interface but lo
//   network.tx_bytes_per_s        sent over every interface but lo
//   process.rss_bytes             this process's resident set (VmRSS)
//   gpu.<i>.util_percent          a kernel ran, share of NVML's last period
//   gpu.<i>.memory_util_percent   device memory was read or written, share
//   gpu.<i>.memory_used_bytes
//   gpu.<i>.memory_total_bytes
//   gpu.<i>.temperature_c         GPU die
//   gpu.<i>.power_w               whole board
//   profiler.cpu_seconds          CPU time Collect() has used so far (cumulative)
// cpu.* and network.* are rates over the time since the previous Collect():
// the first call has none of them.
//
// Failures never stop collection: a group whose source fails (a /proc file
// unreadable or malformed, a GPU reading NVML refuses) is left out of that
// sample, logged once as a warning, and tried again at the next sample.
#ifndef SONDE_CLIENT_PROFILER_SYSTEM_COLLECTOR_H_
#define SONDE_CLIENT_PROFILER_SYSTEM_COLLECTOR_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "client/profiler/nvml.h"
#include "client/profiler/proc_stats.h"

namespace sonde::profiler {

struct MetricPoint {
  std::string name;
  double value = 0;
};

struct SystemSample {
  int64_t timestamp_us = 0;  // unix time of the reading, microseconds
  std::vector<MetricPoint> points;

  // The value of the point called `name`, if there is one.
  std::optional<double> Find(absl::string_view name) const;
};

// Which metrics to collect; all by default.
struct SystemMetricGroups {
  bool cpu = true;       // cpu.*       from /proc/stat
  bool memory = true;    // memory.*    from /proc/meminfo
  bool network = true;   // network.*   from /proc/net/dev
  bool process = true;   // process.*   from /proc/self/status
  bool gpu = true;       // gpu.*       from NVML
  bool own_cost = true;  // profiler.cpu_seconds
};

struct SystemCollectorOptions {
  SystemMetricGroups groups;
  // Where procfs is mounted. Default "/proc"; tests point it at fixtures.
  std::string proc_root = "/proc";
  // The NVML library to dlopen for gpu.*. Default Nvml::kLibrary, the
  // driver's "libnvidia-ml.so.1"; tests give a fake's path.
  std::string nvml_library = Nvml::kLibrary;
};

// CPU time the calling thread has used, in seconds (CLOCK_THREAD_CPUTIME_ID).
double ThreadCpuSeconds();

class SystemCollector {
 public:
  // Loads NVML when options.groups.gpu; that can take a while on a machine
  // with GPUs, so SystemSampler constructs its collector on its own thread.
  // Where NVML cannot be loaded this is logged once (INFO) and gpu.* stays
  // out of every sample.
  explicit SystemCollector(SystemCollectorOptions options);
  ~SystemCollector();
  SystemCollector(const SystemCollector&) = delete;
  SystemCollector& operator=(const SystemCollector&) = delete;

  SystemSample Collect();

  // CPU time spent inside Collect() so far, measured with
  // CLOCK_THREAD_CPUTIME_ID around each call (profiler.cpu_seconds).
  double cpu_seconds() const { return cpu_seconds_; }

  // GPUs read at each sample: 0 without NVML.
  int gpu_count() const { return nvml_ != nullptr ? nvml_->device_count() : 0; }

 private:
  absl::Status CollectCpu(SystemSample& sample);
  absl::Status CollectMemory(SystemSample& sample);
  absl::Status CollectNetwork(SystemSample& sample);
  absl::Status CollectProcess(SystemSample& sample);
  void CollectGpus(SystemSample& sample);
  // Logs `status` the first time `what` fails.
  void ReportOnce(const std::string& what, const absl::Status& status);

  const SystemCollectorOptions options_;
  const std::string stat_path_, meminfo_path_, net_dev_path_, status_path_;
  std::string buffer_;  // file text, reused across reads
  std::optional<ProcStat> last_stat_;
  std::optional<NetDevBytes> last_net_;
  std::chrono::steady_clock::time_point last_net_time_;
  std::unique_ptr<Nvml> nvml_;
  absl::flat_hash_set<std::string> reported_;
  double cpu_seconds_ = 0;
};

}  // namespace sonde::profiler

#endif  // SONDE_CLIENT_PROFILER_SYSTEM_COLLECTOR_H_
