// device_save_bench: the training thread's cost of saving device tensors,
// what the hook's device path adds per tensor on the CPU before any device
// work (decisions, the capture's bookkeeping, queueing), measured with the
// emulated engine on tiny tensors (its statistics then cost ~nothing), and
// compared with saving the same tensors from host memory in the same run.
//
//   bazel run -c opt //tests/bench:device_save_bench [-- --tensors=300 --steps=2000]
#include <time.h>

#include <chrono>
#include <utility>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "client/hook.h"
#include "cuda/emulated_device_stats.h"
#include "glog/logging.h"
#include "server/collector.h"

ABSL_FLAG(int, tensors, 300, "tensors saved per step, in one SaveTensors call");
ABSL_FLAG(int, steps, 2000, "steps measured");
ABSL_FLAG(int, elements, 16, "elements per tensor");

namespace {

using Clock = std::chrono::steady_clock;

double ThreadCpuMicros() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

// Microseconds a step: wall time and the training thread's CPU time (the
// hook's threads and the collector share this machine's cores).
std::pair<double, double> RunSteps(sonde::Hook& hook, const std::vector<sonde::NamedTensor>& tensors,
                                   int steps) {
  const Clock::time_point start = Clock::now();
  const double cpu = ThreadCpuMicros();
  for (int s = 0; s < steps; ++s) {
    hook.StartStep();
    if (!hook.SaveTensors(tensors).ok()) std::abort();
    hook.EndStep();
  }
  return {std::chrono::duration<double, std::micro>(Clock::now() - start).count() / steps,
          (ThreadCpuMicros() - cpu) / steps};
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  google::InitGoogleLogging(argv[0]);
  const int n = absl::GetFlag(FLAGS_tensors);
  const int steps = absl::GetFlag(FLAGS_steps);
  const int elements = absl::GetFlag(FLAGS_elements);
  std::string dir = "/tmp/sonde-device-save-bench-XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) return 1;
  sonde::server::CollectorOptions co;
  co.listen = "127.0.0.1:0";
  co.data_dir = dir + "/db";
  auto collector = sonde::server::Collector::Start(co);
  if (!collector.ok()) return 1;

  std::vector<std::vector<float>> data(n, std::vector<float>(elements, 1.0f));
  std::pair<double, double> per_step[2];
  for (int device = 0; device < 2; ++device) {
    sonde::HookOptions o;
    o.collector = (*collector)->address();
    o.job = device ? "device" : "host";
    o.config.save_config = sonde::SaveConfig::Every(1);
    o.config.include_collections = {"weights"};
    sonde::ReductionConfig r;
    r.reductions = {"mean"};
    o.config.reduction_config = r;
    o.max_queue_bytes = uint64_t{1} << 30;
    o.device_factory = [](const sonde::DeviceStatsOptions& d)
        -> absl::StatusOr<std::unique_ptr<sonde::DeviceStats>> {
      auto e = sonde::EmulatedDeviceStats::Create(d);
      if (!e.ok()) return e.status();
      return std::unique_ptr<sonde::DeviceStats>(std::move(*e));
    };
    auto hook = sonde::Hook::Create(o);
    if (!hook.ok()) return 1;
    std::vector<sonde::NamedTensor> tensors;
    for (int i = 0; i < n; ++i) {
      const std::string name = absl::StrCat("layer", i, ".weight");
      tensors.push_back({name,
                         device ? sonde::CudaTensor(data[i].data(), sonde::v1::DTYPE_F32, {elements})
                                : sonde::HostTensor(data[i].data(), {elements}),
                         {}});
    }
    RunSteps(**hook, tensors, steps / 10);  // warm-up
    per_step[device] = RunSteps(**hook, tensors, steps);
    (*hook)->Close().IgnoreError();
  }
  std::printf("%d tensors of %d floats a step, %d steps\n", n, elements, steps);
  const char* what[2] = {"host tensors:  ", "device tensors:"};
  for (int d = 0; d < 2; ++d) {
    std::printf("%s wall %8.1f us a step (%.2f a tensor); training thread CPU %8.1f us a step "
                "(%.2f a tensor)\n",
                what[d], per_step[d].first, per_step[d].first / n, per_step[d].second,
                per_step[d].second / n);
  }
  std::printf("device / host: wall x%.2f, training thread CPU x%.2f\n",
              per_step[1].first / per_step[0].first, per_step[1].second / per_step[0].second);
  return 0;
}
