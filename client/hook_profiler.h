// The hook's profiler half (issue 7): system metrics from a background
// sampler (client/profiler/system_sampler.h) and framework events (steps,
// data waits, forward/backward, user spans, initialisation), gathered into
// one ProfileBatch per sampling interval and handed to a sink (the hook's
// sender). Recording an event costs a check, a mutex and a vector push; everything
// else happens on the sampler's thread. Internal to client/; users set
// HookOptions::profiler and call Hook::RecordEvent / Hook::Span.
// Thread-safe.
#ifndef SONDE_CLIENT_HOOK_PROFILER_H_
#define SONDE_CLIENT_HOOK_PROFILER_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/profile.pb.h"

namespace sonde {

namespace profiler {
class SystemSampler;
}  // namespace profiler

struct ProfilerOptions {
  // Off by default: the hook then records nothing and starts no thread.
  bool enabled = false;
  // Time between system samples and between batches sent. 100 ms to 60 s;
  // default 500 ms (SageMaker's default).
  absl::Duration interval = absl::Milliseconds(500);
  // System metrics (CPU, memory, network, process RSS, GPUs through NVML).
  bool system = true;
  // Framework events: steps (recorded by the hook itself), initialisation,
  // and what callers record (data waits, forward/backward, spans).
  bool framework = true;
  // The NVML library the system sampler dlopens for gpu.* metrics (a soname
  // or a path). Default "libnvidia-ml.so.1", the driver's; give a path where
  // NVML is installed elsewhere. Tests point it at a fake
  // (client/profiler/fake_nvml.h). Must not be empty. A library that cannot
  // be loaded means no gpu.* metric, as on a machine without a GPU.
  std::string nvml_library = "libnvidia-ml.so.1";
};

class HookProfiler {
 public:
  using Sink = std::function<void(v1::ProfileBatch)>;
  // Largest batch handed to the sink (serialized): well inside a stream's
  // message limit and a cluster log entry, however many events piled up.
  static constexpr size_t kMaxBatchBytes = 256 << 10;

  // Interval limits (the system sampler's); a non-empty nvml_library.
  static absl::Status ValidateOptions(const ProfilerOptions& options);

  // Starts the sampler. InvalidArgument for an interval out of range.
  static absl::StatusOr<std::unique_ptr<HookProfiler>> Start(const ProfilerOptions& options,
                                                             Sink sink);
  ~HookProfiler();  // Stop()

  // Queues an event for the next batch. Dropped when framework events are
  // off, after Stop(), or when the collector would refuse it
  // (common/profile_check.h; logged once): one bad event must not end the
  // stream. A span that ends before it starts (a clock step) is clamped.
  void Record(v1::TraceEvent event);
  // A framework gauge (e.g. framework.dataloader_workers): its latest value
  // goes with every system sample from now on. Checked like Record's events.
  void SetGauge(const std::string& name, double value);
  // Records the initialisation event: from when the process started until
  // `first_step_start`. The hook calls it once, when step 0 starts.
  void RecordInit(absl::Time first_step_start, v1::Mode mode);

  // Stops the sampler and sends what is left, once. Idempotent; nothing
  // recorded after it is sent.
  void Stop();

 private:
  HookProfiler(ProfilerOptions options, Sink sink);
  // Sends the queued events with `snapshot` (if any), in batches of at
  // most kMaxBatchBytes, the snapshot with the first.
  void Flush(std::optional<v1::MetricSnapshot> snapshot);
  void LogOnce(const absl::Status& dropped) ABSL_LOCKS_EXCLUDED(mu_);

  const ProfilerOptions options_;
  const Sink sink_;
  const absl::Time process_start_;
  std::unique_ptr<profiler::SystemSampler> sampler_;
  absl::Mutex mu_;
  std::vector<v1::TraceEvent> events_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, double> gauges_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool logged_drop_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace sonde

#endif  // SONDE_CLIENT_HOOK_PROFILER_H_
