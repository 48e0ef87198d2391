#include "client/profiler/nvml.h"

#include <dlfcn.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/profiler/nvml_abi.h"
#include "common/status_macros.h"

namespace sonde::profiler {

struct Nvml::Library {
  struct Gpu {
    nvml_abi::Device device = nullptr;
    std::string error;  // why there is no handle
  };

  ~Library() {
    if (initialized) shutdown();
    if (handle != nullptr) dlclose(handle);
  }

  std::string Describe(nvml_abi::Return rc) const {
    const char* text = error_string != nullptr ? error_string(rc) : nullptr;
    return text != nullptr ? std::string(text) : absl::StrCat("NVML error ", rc);
  }

  absl::Status Unavailable(absl::string_view what) const {
    return absl::UnavailableError(absl::StrCat("NVML (", path, "): ", what));
  }

  template <typename Fn>
  absl::Status Resolve(const char* name, Fn& fn) {
    dlerror();  // clear
    fn = reinterpret_cast<Fn>(dlsym(handle, name));
    if (fn != nullptr) return absl::OkStatus();
    const char* error = dlerror();
    return Unavailable(absl::StrCat("no symbol ", name, error != nullptr ? ": " : "",
                                    error != nullptr ? error : ""));
  }

  std::string path;
  void* handle = nullptr;
  bool initialized = false;
  nvml_abi::InitFn init = nullptr;
  nvml_abi::ShutdownFn shutdown = nullptr;
  nvml_abi::DeviceGetCountFn get_count = nullptr;
  nvml_abi::DeviceGetHandleByIndexFn get_handle = nullptr;
  nvml_abi::DeviceGetUtilizationRatesFn get_utilization = nullptr;
  nvml_abi::DeviceGetMemoryInfoFn get_memory = nullptr;
  nvml_abi::DeviceGetTemperatureFn get_temperature = nullptr;
  nvml_abi::DeviceGetPowerUsageFn get_power = nullptr;
  nvml_abi::ErrorStringFn error_string = nullptr;
  std::vector<Gpu> gpus;
};

Nvml::Nvml(std::unique_ptr<Library> library) : library_(std::move(library)) {}
Nvml::~Nvml() = default;

absl::StatusOr<std::unique_ptr<Nvml>> Nvml::Load() { return LoadFrom(kLibrary); }

absl::StatusOr<std::unique_ptr<Nvml>> Nvml::LoadFrom(const std::string& path) {
  auto lib = std::make_unique<Library>();
  lib->path = path;
  lib->handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib->handle == nullptr) {
    const char* error = dlerror();
    return lib->Unavailable(error != nullptr ? error : "dlopen failed");
  }
  SONDE_RETURN_IF_ERROR(lib->Resolve("nvmlErrorString", lib->error_string));
  SONDE_RETURN_IF_ERROR(lib->Resolve("nvmlInit_v2", lib->init));
  SONDE_RETURN_IF_ERROR(lib->Resolve("nvmlShutdown", lib->shutdown));
  SONDE_RETURN_IF_ERROR(lib->Resolve("nvmlDeviceGetCount_v2", lib->get_count));
  SONDE_RETURN_IF_ERROR(lib->Resolve("nvmlDeviceGetHandleByIndex_v2", lib->get_handle));
  SONDE_RETURN_IF_ERROR(lib->Resolve("nvmlDeviceGetUtilizationRates", lib->get_utilization));
  SONDE_RETURN_IF_ERROR(lib->Resolve("nvmlDeviceGetMemoryInfo", lib->get_memory));
  SONDE_RETURN_IF_ERROR(lib->Resolve("nvmlDeviceGetTemperature", lib->get_temperature));
  SONDE_RETURN_IF_ERROR(lib->Resolve("nvmlDeviceGetPowerUsage", lib->get_power));

  nvml_abi::Return rc = lib->init();
  if (rc != nvml_abi::kSuccess) {
    return lib->Unavailable(absl::StrCat("nvmlInit_v2: ", lib->Describe(rc)));
  }
  lib->initialized = true;
  unsigned int count = 0;
  rc = lib->get_count(&count);
  if (rc != nvml_abi::kSuccess) {
    return lib->Unavailable(absl::StrCat("nvmlDeviceGetCount_v2: ", lib->Describe(rc)));
  }
  if (count == 0) return lib->Unavailable("no GPU");
  lib->gpus.resize(count);
  for (unsigned int i = 0; i < count; ++i) {
    rc = lib->get_handle(i, &lib->gpus[i].device);
    if (rc != nvml_abi::kSuccess) {
      lib->gpus[i].device = nullptr;
      lib->gpus[i].error = absl::StrCat("nvmlDeviceGetHandleByIndex_v2: ", lib->Describe(rc));
    }
  }
  return std::unique_ptr<Nvml>(new Nvml(std::move(lib)));
}

int Nvml::device_count() const { return static_cast<int>(library_->gpus.size()); }

absl::StatusOr<GpuReading> Nvml::Read(int index) const {
  const Library& lib = *library_;
  if (index < 0 || index >= device_count()) {
    return absl::OutOfRangeError(
        absl::StrCat("GPU ", index, " does not exist; NVML saw ", device_count()));
  }
  const Library::Gpu& gpu = lib.gpus[index];
  if (gpu.device == nullptr) {
    return absl::UnavailableError(absl::StrCat("GPU ", index, ": ", gpu.error));
  }
  GpuReading reading;
  auto refused = [&](const char* field, nvml_abi::Return rc) {
    reading.errors.push_back({field, lib.Describe(rc)});
  };

  nvml_abi::Utilization utilization{};
  nvml_abi::Return rc = lib.get_utilization(gpu.device, &utilization);
  if (rc == nvml_abi::kSuccess) {
    reading.util_percent = utilization.gpu;
    reading.memory_util_percent = utilization.memory;
  } else {
    refused("util", rc);
  }

  nvml_abi::Memory memory{};
  rc = lib.get_memory(gpu.device, &memory);
  if (rc == nvml_abi::kSuccess) {
    reading.memory_used_bytes = memory.used;
    reading.memory_total_bytes = memory.total;
  } else {
    refused("memory", rc);
  }

  unsigned int celsius = 0;
  rc = lib.get_temperature(gpu.device, nvml_abi::kTemperatureGpu, &celsius);
  if (rc == nvml_abi::kSuccess) {
    reading.temperature_c = celsius;
  } else {
    refused("temperature", rc);
  }

  unsigned int milliwatts = 0;
  rc = lib.get_power(gpu.device, &milliwatts);
  if (rc == nvml_abi::kSuccess) {
    reading.power_w = milliwatts / 1000.0;
  } else {
    refused("power", rc);
  }
  return reading;
}

}  // namespace sonde::profiler
