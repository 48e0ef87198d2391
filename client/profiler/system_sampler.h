// A background thread that collects system metrics (system_collector.h: CPU,
// I/O wait, memory, network, process RSS, NVIDIA GPUs; the metric names are
// listed there) at a fixed interval and hands each sample to a callback,
// cheaply enough to leave on for a whole training run. It measures its own
// cost. Nothing it reads can crash or stall the caller: failing sources are
// left out of samples (logged once), and NVML is loaded on the sampler's
// thread, not the caller's.
// Thread-safe: Stop() and cost() may be called from any thread but the
// callback's.
#ifndef SONDE_CLIENT_PROFILER_SYSTEM_SAMPLER_H_
#define SONDE_CLIENT_PROFILER_SYSTEM_SAMPLER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/call_once.h"
#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/profiler/system_collector.h"

namespace sonde::profiler {

struct SystemSamplerOptions {
  // Time between samples, kept on a fixed cadence (a sample that runs late
  // does not shift the next ones; ticks missed altogether are skipped).
  // Default 500 ms; Start() refuses anything outside kMinInterval..kMaxInterval.
  absl::Duration interval = absl::Milliseconds(500);
  // What to collect and from where; everything from /proc and NVML by default.
  SystemCollectorOptions collection;
};

// What the sampler has cost so far.
struct SamplerCost {
  int64_t samples = 0;  // delivered to the callback
  // CPU time spent collecting (profiler.cpu_seconds), including the first,
  // undelivered reading that rates start from.
  double collect_cpu_seconds = 0;
  // All CPU time of the sampler's thread: collecting, loading NVML, waking
  // up, and running the callback.
  double thread_cpu_seconds = 0;
};

class SystemSampler {
 public:
  // Called on the sampler's thread with each sample; the next sample waits
  // for it to return, so it should be quick (e.g. queue the sample). It must
  // not call Stop().
  using Callback = std::function<void(const SystemSample&)>;

  static constexpr absl::Duration kMinInterval = absl::Milliseconds(100);
  static constexpr absl::Duration kMaxInterval = absl::Seconds(60);

  // Validates the options (InvalidArgument for an interval out of range or an
  // empty callback) and starts the thread. The first sample arrives one
  // interval after the thread has taken the reading that rates start from.
  static absl::StatusOr<std::unique_ptr<SystemSampler>> Start(SystemSamplerOptions options,
                                                              Callback callback);

  // Stops the thread.
  ~SystemSampler();
  SystemSampler(const SystemSampler&) = delete;
  SystemSampler& operator=(const SystemSampler&) = delete;

  // Wakes the thread and waits for it to end: at most a sample in progress
  // (a few /proc reads, or NVML's initialisation if it is still loading) and
  // the callback it is running. No callback runs after Stop() returns.
  // Idempotent.
  void Stop();

  SamplerCost cost() const;

 private:
  SystemSampler(SystemSamplerOptions options, Callback callback);
  void Run();

  const SystemSamplerOptions options_;
  const Callback callback_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  SamplerCost cost_ ABSL_GUARDED_BY(mu_);
  absl::once_flag join_once_;
  std::thread thread_;
};

}  // namespace sonde::profiler

#endif  // SONDE_CLIENT_PROFILER_SYSTEM_SAMPLER_H_
