// A build without a CUDA toolkit: only the host stand-in exists.
#include "tests/bench/training_device.h"

namespace sonde::bench {

absl::StatusOr<std::unique_ptr<TrainingDevice>> MakeCudaTrainingDevice() {
  return absl::UnavailableError("this build has no CUDA support");
}

}  // namespace sonde::bench
