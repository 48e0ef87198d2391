// The process's own vital signs as callback metrics, with the names every
// Prometheus client uses (so stock dashboards work): resident and virtual
// memory, open and maximum file descriptors, CPU time, start time. Read from
// /proc/self and getrusage at scrape time (Linux); a value that cannot be
// read is left out of the scrape. Thread-safe.
#ifndef SONDE_COMMON_METRICS_PROCESS_METRICS_H_
#define SONDE_COMMON_METRICS_PROCESS_METRICS_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "common/metrics/metrics.h"

namespace sonde::metrics {

// Registers process_resident_memory_bytes, process_virtual_memory_bytes,
// process_open_fds, process_max_fds, process_cpu_seconds_total and
// process_start_time_seconds in `registry`; they stay while the returned
// registrations live.
std::vector<Registration> RegisterProcessMetrics(Registry& registry);

// The readings behind them (nullopt where /proc cannot be read).
std::optional<uint64_t> ResidentMemoryBytes();
std::optional<uint64_t> VirtualMemoryBytes();
std::optional<uint64_t> OpenFileDescriptors();

}  // namespace sonde::metrics

#endif  // SONDE_COMMON_METRICS_PROCESS_METRICS_H_
