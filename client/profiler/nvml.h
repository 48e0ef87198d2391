// NVIDIA GPUs' utilisation, memory, temperature and power through NVML, the
// driver's management library. NVML is loaded at run time with dlopen and
// never linked, so every binary starts on machines without a GPU or driver;
// there Load() returns Unavailable and the caller simply reports no GPU.
// An Nvml owns the loaded library: destroying it shuts NVML down and unloads
// it. Thread-safe (immutable after loading; NVML's calls are thread-safe).
#ifndef SONDE_CLIENT_PROFILER_NVML_H_
#define SONDE_CLIENT_PROFILER_NVML_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace sonde::profiler {

// A reading NVML refused, e.g. {"power", "Not Supported"} on GPUs without a
// power sensor.
struct GpuFieldError {
  std::string field;  // "util", "memory", "temperature" or "power"
  std::string message;
};

// One GPU's readings; a field NVML refused is empty and named in `errors`.
struct GpuReading {
  std::optional<double> util_percent;         // a kernel ran, % of NVML's last period
  std::optional<double> memory_util_percent;  // device memory was read or written, %
  std::optional<uint64_t> memory_used_bytes;
  std::optional<uint64_t> memory_total_bytes;
  std::optional<double> temperature_c;  // GPU die
  std::optional<double> power_w;        // whole board
  std::vector<GpuFieldError> errors;
};

class Nvml {
 public:
  // The driver's library, by soname.
  static constexpr char kLibrary[] = "libnvidia-ml.so.1";

  // Loads kLibrary. Unavailable, with the path and dlerror's or NVML's words,
  // when the library, one of its symbols, the driver or any GPU is missing.
  static absl::StatusOr<std::unique_ptr<Nvml>> Load();
  // The same from a given file: tests load a fake library with this.
  static absl::StatusOr<std::unique_ptr<Nvml>> LoadFrom(const std::string& path);

  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  // GPUs NVML saw at load time, numbered 0..device_count()-1 as NVML does.
  int device_count() const;

  // OutOfRange for an index outside 0..device_count()-1; Unavailable for a
  // GPU NVML gave no handle for (e.g. no permission inside a container).
  absl::StatusOr<GpuReading> Read(int index) const;

 private:
  struct Library;
  explicit Nvml(std::unique_ptr<Library> library);

  std::unique_ptr<Library> library_;
};

}  // namespace sonde::profiler

#endif  // SONDE_CLIENT_PROFILER_NVML_H_
