#include "client/profiler/system_collector.h"

#include <time.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace sonde::profiler {

std::optional<double> SystemSample::Find(absl::string_view name) const {
  for (const MetricPoint& p : points) {
    if (p.name == name) return p.value;
  }
  return std::nullopt;
}

double ThreadCpuSeconds() {
  timespec ts{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

SystemCollector::SystemCollector(SystemCollectorOptions options)
    : options_(std::move(options)),
      stat_path_(options_.proc_root + "/stat"),
      meminfo_path_(options_.proc_root + "/meminfo"),
      net_dev_path_(options_.proc_root + "/net/dev"),
      status_path_(options_.proc_root + "/self/status") {
  if (!options_.groups.gpu) return;
  auto nvml = Nvml::LoadFrom(options_.nvml_library);
  if (nvml.ok()) {
    nvml_ = *std::move(nvml);
    LOG(INFO) << "system metrics: " << nvml_->device_count() << " GPU(s) through "
              << options_.nvml_library;
  } else {
    LOG(INFO) << "system metrics: no GPU metrics: " << nvml.status();
  }
}

SystemCollector::~SystemCollector() = default;

SystemSample SystemCollector::Collect() {
  const double start = ThreadCpuSeconds();
  SystemSample sample;
  const SystemMetricGroups& groups = options_.groups;
  if (groups.cpu) {
    if (absl::Status s = CollectCpu(sample); !s.ok()) ReportOnce("cpu", s);
  }
  if (groups.memory) {
    if (absl::Status s = CollectMemory(sample); !s.ok()) ReportOnce("memory", s);
  }
  if (groups.network) {
    if (absl::Status s = CollectNetwork(sample); !s.ok()) ReportOnce("network", s);
  }
  if (groups.process) {
    if (absl::Status s = CollectProcess(sample); !s.ok()) ReportOnce("process", s);
  }
  if (nvml_ != nullptr) CollectGpus(sample);
  sample.timestamp_us = absl::ToUnixMicros(absl::Now());
  cpu_seconds_ += ThreadCpuSeconds() - start;
  if (groups.own_cost) sample.points.push_back({"profiler.cpu_seconds", cpu_seconds_});
  return sample;
}

absl::Status SystemCollector::CollectCpu(SystemSample& sample) {
  SONDE_RETURN_IF_ERROR(ReadProcFile(stat_path_, buffer_));
  SONDE_ASSIGN_OR_RETURN(ProcStat stat, ParseProcStat(buffer_));
  if (last_stat_.has_value()) {
    const CpuUsageReport usage = CpuUsageBetween(*last_stat_, stat);
    if (usage.total.has_value()) {
      sample.points.push_back({"cpu.util_percent", usage.total->util_percent});
      sample.points.push_back({"cpu.iowait_percent", usage.total->iowait_percent});
    }
    for (const auto& [core, core_usage] : usage.cores) {
      sample.points.push_back({absl::StrCat("cpu.", core, ".util_percent"), core_usage.util_percent});
    }
  }
  last_stat_ = std::move(stat);
  return absl::OkStatus();
}

absl::Status SystemCollector::CollectMemory(SystemSample& sample) {
  SONDE_RETURN_IF_ERROR(ReadProcFile(meminfo_path_, buffer_));
  SONDE_ASSIGN_OR_RETURN(const MemInfo info, ParseMeminfo(buffer_));
  sample.points.push_back({"memory.used_bytes", static_cast<double>(info.used_bytes())});
  sample.points.push_back({"memory.total_bytes", static_cast<double>(info.total_bytes)});
  return absl::OkStatus();
}

absl::Status SystemCollector::CollectNetwork(SystemSample& sample) {
  SONDE_RETURN_IF_ERROR(ReadProcFile(net_dev_path_, buffer_));
  const auto now = std::chrono::steady_clock::now();
  SONDE_ASSIGN_OR_RETURN(NetDevBytes bytes, ParseNetDev(buffer_));
  if (last_net_.has_value()) {
    const double seconds = std::chrono::duration<double>(now - last_net_time_).count();
    if (seconds > 0) {
      const InterfaceBytes moved = NetBytesBetween(*last_net_, bytes);
      sample.points.push_back({"network.rx_bytes_per_s", static_cast<double>(moved.rx) / seconds});
      sample.points.push_back({"network.tx_bytes_per_s", static_cast<double>(moved.tx) / seconds});
    }
  }
  last_net_ = std::move(bytes);
  last_net_time_ = now;
  return absl::OkStatus();
}

absl::Status SystemCollector::CollectProcess(SystemSample& sample) {
  SONDE_RETURN_IF_ERROR(ReadProcFile(status_path_, buffer_));
  SONDE_ASSIGN_OR_RETURN(const uint64_t rss, ParseVmRssBytes(buffer_));
  sample.points.push_back({"process.rss_bytes", static_cast<double>(rss)});
  return absl::OkStatus();
}

void SystemCollector::CollectGpus(SystemSample& sample) {
  for (int i = 0; i < nvml_->device_count(); ++i) {
    const std::string prefix = absl::StrCat("gpu.", i, ".");
    absl::StatusOr<GpuReading> reading = nvml_->Read(i);
    if (!reading.ok()) {
      ReportOnce(absl::StrCat("gpu.", i), reading.status());
      continue;
    }
    auto add = [&](absl::string_view name, const auto& value) {
      if (value.has_value()) {
        sample.points.push_back({absl::StrCat(prefix, name), static_cast<double>(*value)});
      }
    };
    add("util_percent", reading->util_percent);
    add("memory_util_percent", reading->memory_util_percent);
    add("memory_used_bytes", reading->memory_used_bytes);
    add("memory_total_bytes", reading->memory_total_bytes);
    add("temperature_c", reading->temperature_c);
    add("power_w", reading->power_w);
    for (const GpuFieldError& error : reading->errors) {
      ReportOnce(absl::StrCat(prefix, error.field), absl::UnavailableError(error.message));
    }
  }
}

void SystemCollector::ReportOnce(const std::string& what, const absl::Status& status) {
  if (!reported_.insert(what).second) return;
  LOG(WARNING) << "system metrics: " << what << " left out: " << status
               << " (said once; tried again at every sample)";
}

}  // namespace sonde::profiler
