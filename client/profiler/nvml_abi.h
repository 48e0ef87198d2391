// The few parts of NVML's C ABI (nvml.h, NVIDIA Management Library) that the
// sampler calls, declared here so that nothing needs the driver's headers or
// links the library: it is dlopen'ed at run time (nvml.cc), and a fake with
// the same symbols stands in for it in tests (fake_nvml.cc).
// Layouts and values as NVML's reference and its public nvml.h give them:
// C enums are int-sized; nvmlUtilization_t is {gpu, memory}; nvmlMemory_t
// (v1) is {total, free, used} in bytes; NVML_TEMPERATURE_GPU is 0; power is
// in milliwatts.
#ifndef SONDE_CLIENT_PROFILER_NVML_ABI_H_
#define SONDE_CLIENT_PROFILER_NVML_ABI_H_

namespace sonde::profiler::nvml_abi {

using Return = int;                        // nvmlReturn_t
inline constexpr Return kSuccess = 0;          // NVML_SUCCESS
inline constexpr Return kUninitialized = 1;    // NVML_ERROR_UNINITIALIZED
inline constexpr Return kInvalidArgument = 2;  // NVML_ERROR_INVALID_ARGUMENT
inline constexpr Return kNotSupported = 3;     // NVML_ERROR_NOT_SUPPORTED
inline constexpr Return kGpuIsLost = 15;       // NVML_ERROR_GPU_IS_LOST

inline constexpr int kTemperatureGpu = 0;  // NVML_TEMPERATURE_GPU

struct DeviceStruct;
using Device = DeviceStruct*;  // nvmlDevice_t, an opaque handle

struct Utilization {  // nvmlUtilization_t
  unsigned int gpu;     // percent of the last sample period a kernel ran
  unsigned int memory;  // percent of it device memory was read or written
};

struct Memory {  // nvmlMemory_t
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

// The symbols resolved, with their C signatures.
using InitFn = Return (*)();                                           // nvmlInit_v2
using ShutdownFn = Return (*)();                                       // nvmlShutdown
using DeviceGetCountFn = Return (*)(unsigned int*);                    // nvmlDeviceGetCount_v2
using DeviceGetHandleByIndexFn = Return (*)(unsigned int, Device*);    // ..._v2
using DeviceGetUtilizationRatesFn = Return (*)(Device, Utilization*);  // nvmlDeviceGetUtilizationRates
using DeviceGetMemoryInfoFn = Return (*)(Device, Memory*);             // nvmlDeviceGetMemoryInfo
using DeviceGetTemperatureFn = Return (*)(Device, int, unsigned int*); // nvmlDeviceGetTemperature
using DeviceGetPowerUsageFn = Return (*)(Device, unsigned int*);       // nvmlDeviceGetPowerUsage
using ErrorStringFn = const char* (*)(Return);                         // nvmlErrorString

}  // namespace sonde::profiler::nvml_abi

#endif  // SONDE_CLIENT_PROFILER_NVML_ABI_H_
