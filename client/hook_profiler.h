// The hook's profiler half (issue 7): system metrics from a background
// sampler (client/profiler/system_sampler.h) and framework events (steps,
// data waits, forward/backward, user spans, initialisation), gathered into
// one ProfileBatch per sampling interval and handed to a sink (the hook's
// sender). Recording an event costs a mutex and a vector push; everything
// else happens on the sampler's thread. Internal to client/; users set
// HookOptions::profiler and call Hook::RecordEvent / Hook::Span.
// Thread-safe.
#ifndef SONDE_CLIENT_HOOK_PROFILER_H_
#define SONDE_CLIENT_HOOK_PROFILER_H_

#include <functional>
#include <map>
#include <memory>
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
};

class HookProfiler {
 public:
  using Sink = std::function<void(v1::ProfileBatch)>;

  // Starts the sampler. InvalidArgument for an interval out of range.
  static absl::StatusOr<std::unique_ptr<HookProfiler>> Start(const ProfilerOptions& options,
                                                             Sink sink);
  ~HookProfiler();  // Stop()

  // Queues an event for the next batch (dropped when framework events are
  // off or after Stop()).
  void Record(v1::TraceEvent event);
  // A framework gauge (e.g. framework.dataloader_workers): its latest value
  // goes with every system sample from now on.
  void SetGauge(const std::string& name, double value);
  bool framework() const { return options_.framework; }

  // Stops the sampler and sends what is left, once. Idempotent.
  void Stop();

  // CPU seconds the sampler's thread has used so far.
  double cpu_seconds() const;

 private:
  HookProfiler(ProfilerOptions options, Sink sink);
  // Sends the queued events with `snapshot` (if any) as one batch.
  void Flush(const v1::MetricSnapshot* snapshot);

  const ProfilerOptions options_;
  const Sink sink_;
  std::unique_ptr<profiler::SystemSampler> sampler_;
  absl::Mutex mu_;
  std::vector<v1::TraceEvent> events_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, double> gauges_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

// When this process started (from /proc/self/stat and the boot time), for
// the initialisation event; `fallback` where /proc cannot tell.
absl::Time ProcessStartTime(absl::Time fallback);

}  // namespace sonde

#endif  // SONDE_CLIENT_HOOK_PROFILER_H_
