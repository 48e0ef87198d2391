// A stand-in for libnvidia-ml.so.1 (fake_nvml.cc, built as a shared library
// for tests only): two GPUs with the readings below, so tests go through
// Nvml's real dlopen/dlsym path. Tests steer it through the C functions
// declared here, found with dlsym in the same loaded copy: make a reading
// fail, or play a recorded series by setting utilisation and memory as a
// workload runs (SetReading).
#ifndef SONDE_CLIENT_PROFILER_FAKE_NVML_H_
#define SONDE_CLIENT_PROFILER_FAKE_NVML_H_

#include <dlfcn.h>

#include <cstdlib>
#include <string>

namespace sonde::profiler::fake_nvml {

// Where Bazel puts the fake library for a test that lists it in `data`.
inline std::string LibraryPath() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return std::string(srcdir != nullptr ? srcdir : ".") + "/" +
         (workspace != nullptr ? workspace : "sonde") + "/client/profiler/libfake_nvml.so";
}

struct FakeGpu {
  unsigned int util_percent;
  unsigned int memory_util_percent;
  unsigned long long memory_total_bytes;
  unsigned long long memory_used_bytes;
  unsigned int temperature_c;
  unsigned int power_mw;
};

inline constexpr int kGpus = 2;
// The readings at load time and after ResetReadings().
inline constexpr FakeGpu kReadings[kGpus] = {
    {37, 12, 16ull << 30, 4ull << 30, 55, 123456},
    {81, 64, 40ull << 30, 30ull << 30, 71, 250000},
};

// Which reading FailField breaks.
enum Field : int { kUtil = 0, kMemory = 1, kTemperature = 2, kPower = 3 };

// Symbol names of the control functions, and their types.
inline constexpr char kFailFieldSymbol[] = "sonde_fake_nvml_fail_field";
using FailFieldFn = void (*)(int gpu, int field, int nvml_return);  // 0 heals
inline constexpr char kLiveInitsSymbol[] = "sonde_fake_nvml_live_inits";
using LiveInitsFn = int (*)();  // nvmlInit_v2 calls not yet undone by nvmlShutdown
// From now on `gpu` reads these (temperature and power keep theirs). Returns
// 0, or -1 (nothing changed) for an unknown gpu, a percentage above 100 or
// used above total.
inline constexpr char kSetReadingSymbol[] = "sonde_fake_nvml_set_reading";
using SetReadingFn = int (*)(int gpu, unsigned int util_percent,
                             unsigned int memory_util_percent,
                             unsigned long long memory_used_bytes,
                             unsigned long long memory_total_bytes);
// Every GPU back to kReadings.
inline constexpr char kResetReadingsSymbol[] = "sonde_fake_nvml_reset_readings";
using ResetReadingsFn = void (*)();

// For tests: keeps the fake loaded (so its state outlives any Nvml that
// loads and unloads it) and steers it.
class Control {
 public:
  Control() : handle_(dlopen(LibraryPath().c_str(), RTLD_NOW | RTLD_LOCAL)) {
    if (handle_ == nullptr) return;
    fail_field_ = reinterpret_cast<FailFieldFn>(dlsym(handle_, kFailFieldSymbol));
    live_inits_ = reinterpret_cast<LiveInitsFn>(dlsym(handle_, kLiveInitsSymbol));
    set_reading_ = reinterpret_cast<SetReadingFn>(dlsym(handle_, kSetReadingSymbol));
    reset_readings_ = reinterpret_cast<ResetReadingsFn>(dlsym(handle_, kResetReadingsSymbol));
  }
  // Heals every field and restores kReadings for the next test.
  ~Control() {
    if (reset_readings_ != nullptr) reset_readings_();
    if (fail_field_ != nullptr) {
      for (int gpu = 0; gpu < kGpus; ++gpu) {
        for (int field = kUtil; field <= kPower; ++field) fail_field_(gpu, field, 0);
      }
    }
    if (handle_ != nullptr) dlclose(handle_);
  }
  Control(const Control&) = delete;
  Control& operator=(const Control&) = delete;

  bool loaded() const {
    return fail_field_ != nullptr && live_inits_ != nullptr && set_reading_ != nullptr &&
           reset_readings_ != nullptr;
  }
  // From now on `field` of `gpu` answers `nvml_return` (0: the reading again).
  void FailField(int gpu, Field field, int nvml_return) { fail_field_(gpu, field, nvml_return); }
  int LiveInits() const { return live_inits_(); }
  // From now on `gpu` reads these utilisations and memory (one value of a
  // recorded series; the sampler reads it at its next sample). False, and
  // nothing changed, for an unknown gpu, a percentage above 100 or used
  // above total.
  bool SetReading(int gpu, unsigned int util_percent, unsigned int memory_util_percent,
                  unsigned long long memory_used_bytes, unsigned long long memory_total_bytes) {
    return set_reading_(gpu, util_percent, memory_util_percent, memory_used_bytes,
                        memory_total_bytes) == 0;
  }
  void ResetReadings() { reset_readings_(); }

 private:
  void* handle_;
  FailFieldFn fail_field_ = nullptr;
  LiveInitsFn live_inits_ = nullptr;
  SetReadingFn set_reading_ = nullptr;
  ResetReadingsFn reset_readings_ = nullptr;
};

}  // namespace sonde::profiler::fake_nvml

#endif  // SONDE_CLIENT_PROFILER_FAKE_NVML_H_
