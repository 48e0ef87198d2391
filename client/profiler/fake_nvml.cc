// The fake NVML described in fake_nvml.h: the symbols nvml.cc resolves, with
// NVML's C signatures, over two GPUs whose readings tests may set.
#include <atomic>
#include <mutex>

#include "client/profiler/fake_nvml.h"
#include "client/profiler/nvml_abi.h"

namespace {

namespace abi = ::sonde::profiler::nvml_abi;
namespace fake = ::sonde::profiler::fake_nvml;

// The handles NVML hands out are opaque; here they point into this array.
struct FakeDevice {
  int index;
};
FakeDevice devices[fake::kGpus] = {{0}, {1}};

std::atomic<int> live_inits{0};
std::atomic<int> failures[fake::kGpus][4] = {};
// The current readings: kReadings until a test sets others. The sampler
// reads them on its thread while a test's loop sets them on another.
std::mutex readings_mu;
fake::FakeGpu readings[fake::kGpus] = {fake::kReadings[0], fake::kReadings[1]};

// nullptr for a handle this library did not give out.
const FakeDevice* Find(abi::Device device) {
  const auto* d = reinterpret_cast<const FakeDevice*>(device);
  for (const FakeDevice& known : devices) {
    if (d == &known) return d;
  }
  return nullptr;
}

// kSuccess and a copy of the GPU's readings, or the error a test asked for.
abi::Return Check(abi::Device device, fake::Field field, fake::FakeGpu* gpu) {
  if (live_inits.load() <= 0) return abi::kUninitialized;
  const FakeDevice* d = Find(device);
  if (d == nullptr) return abi::kInvalidArgument;
  if (const int rc = failures[d->index][field].load(); rc != abi::kSuccess) return rc;
  std::lock_guard<std::mutex> lock(readings_mu);
  *gpu = readings[d->index];
  return abi::kSuccess;
}

}  // namespace

extern "C" {

abi::Return nvmlInit_v2() {
  ++live_inits;
  return abi::kSuccess;
}

abi::Return nvmlShutdown() {
  --live_inits;
  return abi::kSuccess;
}

const char* nvmlErrorString(abi::Return rc) {
  switch (rc) {
    case abi::kSuccess: return "Success";
    case abi::kUninitialized: return "Uninitialized";
    case abi::kInvalidArgument: return "Invalid Argument";
    case abi::kNotSupported: return "Not Supported";
    case abi::kGpuIsLost: return "GPU is lost";
    default: return "Unknown Error";
  }
}

abi::Return nvmlDeviceGetCount_v2(unsigned int* count) {
  if (live_inits.load() <= 0) return abi::kUninitialized;
  *count = fake::kGpus;
  return abi::kSuccess;
}

abi::Return nvmlDeviceGetHandleByIndex_v2(unsigned int index, abi::Device* device) {
  if (live_inits.load() <= 0) return abi::kUninitialized;
  if (index >= static_cast<unsigned int>(fake::kGpus)) return abi::kInvalidArgument;
  *device = reinterpret_cast<abi::Device>(&devices[index]);
  return abi::kSuccess;
}

abi::Return nvmlDeviceGetUtilizationRates(abi::Device device, abi::Utilization* out) {
  fake::FakeGpu gpu{};
  if (abi::Return rc = Check(device, fake::kUtil, &gpu); rc != abi::kSuccess) return rc;
  out->gpu = gpu.util_percent;
  out->memory = gpu.memory_util_percent;
  return abi::kSuccess;
}

abi::Return nvmlDeviceGetMemoryInfo(abi::Device device, abi::Memory* out) {
  fake::FakeGpu gpu{};
  if (abi::Return rc = Check(device, fake::kMemory, &gpu); rc != abi::kSuccess) return rc;
  out->total = gpu.memory_total_bytes;
  out->used = gpu.memory_used_bytes;
  out->free = gpu.memory_total_bytes - gpu.memory_used_bytes;
  return abi::kSuccess;
}

abi::Return nvmlDeviceGetTemperature(abi::Device device, int sensor, unsigned int* celsius) {
  fake::FakeGpu gpu{};
  if (abi::Return rc = Check(device, fake::kTemperature, &gpu); rc != abi::kSuccess) return rc;
  if (sensor != abi::kTemperatureGpu) return abi::kInvalidArgument;
  *celsius = gpu.temperature_c;
  return abi::kSuccess;
}

abi::Return nvmlDeviceGetPowerUsage(abi::Device device, unsigned int* milliwatts) {
  fake::FakeGpu gpu{};
  if (abi::Return rc = Check(device, fake::kPower, &gpu); rc != abi::kSuccess) return rc;
  *milliwatts = gpu.power_mw;
  return abi::kSuccess;
}

void sonde_fake_nvml_fail_field(int gpu, int field, int nvml_return) {
  if (gpu < 0 || gpu >= fake::kGpus || field < 0 || field > fake::kPower) return;
  failures[gpu][field].store(nvml_return);
}

int sonde_fake_nvml_live_inits() { return live_inits.load(); }

int sonde_fake_nvml_set_reading(int gpu, unsigned int util_percent,
                                unsigned int memory_util_percent,
                                unsigned long long memory_used_bytes,
                                unsigned long long memory_total_bytes) {
  if (gpu < 0 || gpu >= fake::kGpus || util_percent > 100 || memory_util_percent > 100 ||
      memory_used_bytes > memory_total_bytes) {
    return -1;
  }
  std::lock_guard<std::mutex> lock(readings_mu);
  fake::FakeGpu& g = readings[gpu];
  g.util_percent = util_percent;
  g.memory_util_percent = memory_util_percent;
  g.memory_used_bytes = memory_used_bytes;
  g.memory_total_bytes = memory_total_bytes;
  return 0;
}

void sonde_fake_nvml_reset_readings() {
  std::lock_guard<std::mutex> lock(readings_mu);
  for (int gpu = 0; gpu < fake::kGpus; ++gpu) readings[gpu] = fake::kReadings[gpu];
}

}  // extern "C"
