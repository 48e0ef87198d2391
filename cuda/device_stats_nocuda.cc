// The device path of a build without a CUDA toolkit: always unavailable.
#include "cuda/device_stats.h"

namespace sonde {

absl::Status DeviceStats::Probe(int device) {
  return absl::UnavailableError(
      "this build of Sonde has no CUDA support (no CUDA toolkit was found when it was "
      "built); statistics are computed on the CPU");
}

absl::StatusOr<std::unique_ptr<DeviceStats>> DeviceStats::Create(
    const DeviceStatsOptions& options) {
  absl::Status status = Probe(options.device);
  return status;
}

}  // namespace sonde
