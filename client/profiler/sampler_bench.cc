// What the system metrics sampler costs: CPU time of its thread per wall
// second (as a fraction of one core) and per sample, at 500 ms and 100 ms,
// and at 10 ms as a stress point (below the sampler's 100 ms floor, so that
// one drives SystemCollector from a plain loop on its own thread). Baselines
// measured in the same run: one bare read of each /proc file it reads, and
// one Collect() in a tight loop.
//
//   bazel run -c opt //client/profiler:sampler_bench -- [seconds per run, default 5]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/profiler/proc_stats.h"
#include "client/profiler/system_collector.h"
#include "client/profiler/system_sampler.h"
#include "glog/logging.h"

namespace sonde::profiler {
namespace {

// CPU microseconds per call of `fn`, over `n` calls on this thread.
template <typename Fn>
double CpuMicrosPerCall(int n, Fn fn) {
  const double start = ThreadCpuSeconds();
  for (int i = 0; i < n; ++i) fn();
  return (ThreadCpuSeconds() - start) / n * 1e6;
}

struct RunCost {
  double wall_seconds = 0;
  double thread_cpu_seconds = 0;
  double collect_cpu_seconds = 0;
  int64_t samples = 0;
};

RunCost RunSampler(absl::Duration interval, double seconds) {
  SystemSamplerOptions options;
  options.interval = interval;
  int64_t points = 0;
  const auto start = std::chrono::steady_clock::now();
  auto sampler = SystemSampler::Start(options, [&](const SystemSample& s) {
    points += static_cast<int64_t>(s.points.size());
  });
  CHECK(sampler.ok()) << sampler.status();
  absl::SleepFor(absl::Seconds(seconds));
  (*sampler)->Stop();
  RunCost run;
  run.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const SamplerCost cost = (*sampler)->cost();
  run.thread_cpu_seconds = cost.thread_cpu_seconds;
  run.collect_cpu_seconds = cost.collect_cpu_seconds;
  run.samples = cost.samples;
  return run;
}

// The sampler's loop, without its 100 ms floor: Collect() every `interval`.
RunCost RunCollectorLoop(std::chrono::microseconds interval, double seconds) {
  RunCost run;
  std::thread thread([&] {
    SystemCollector collector{SystemCollectorOptions()};
    collector.Collect();
    const auto start = std::chrono::steady_clock::now();
    const auto end = start + std::chrono::duration<double>(seconds);
    auto next = start + interval;
    while (next < end) {
      std::this_thread::sleep_until(next);
      collector.Collect();
      ++run.samples;
      next += interval;
      const auto now = std::chrono::steady_clock::now();
      while (next <= now) next += interval;
    }
    run.wall_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    run.collect_cpu_seconds = collector.cpu_seconds();
    run.thread_cpu_seconds = ThreadCpuSeconds();
  });
  thread.join();
  return run;
}

void Print(const char* label, const RunCost& run, double bare_stat_read_us) {
  const double per_wall = run.thread_cpu_seconds / run.wall_seconds;
  // Both figures include the first, undelivered reading that rates start from.
  const double readings = static_cast<double>(run.samples + 1);
  const double per_sample_us = run.collect_cpu_seconds / readings * 1e6;
  const double thread_per_sample_us = run.thread_cpu_seconds / readings * 1e6;
  std::printf(
      "%-22s %5lld samples in %5.2f s: thread %7.1f us CPU per wall second = %.5f%% of one "
      "core; per sample %6.1f us collecting (%4.1fx a bare /proc/stat read), %6.1f us all "
      "thread\n",
      label, static_cast<long long>(run.samples), run.wall_seconds, per_wall * 1e6,
      per_wall * 100, per_sample_us, per_sample_us / bare_stat_read_us, thread_per_sample_us);
}

int Main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 5.0;
  if (!(seconds > 0)) {
    std::fprintf(stderr, "usage: sampler_bench [seconds per run > 0]\n");
    return 2;
  }
  std::printf("baselines (CPU time per call on this thread, mean of 2000):\n");
  std::string buffer;
  double stat_read_us = 0;
  for (const char* path : {"/proc/stat", "/proc/meminfo", "/proc/net/dev", "/proc/self/status"}) {
    const double us = CpuMicrosPerCall(2000, [&] { CHECK(ReadProcFile(path, buffer).ok()); });
    if (std::string(path) == "/proc/stat") stat_read_us = us;
    std::printf("  bare read of %-18s %6.1f us (%zu bytes)\n", path, us, buffer.size());
  }
  {
    SystemCollector collector{SystemCollectorOptions()};
    collector.Collect();
    const double us = CpuMicrosPerCall(2000, [&] { collector.Collect(); });
    std::printf("  Collect() back to back     %6.1f us (%d GPU(s))\n", us, collector.gpu_count());
  }
  std::printf("sampler, %.1f s per run:\n", seconds);
  Print("interval 500 ms", RunSampler(absl::Milliseconds(500), seconds), stat_read_us);
  Print("interval 100 ms", RunSampler(absl::Milliseconds(100), seconds), stat_read_us);
  Print("loop at 10 ms (stress)", RunCollectorLoop(std::chrono::milliseconds(10), seconds),
        stat_read_us);
  return 0;
}

}  // namespace
}  // namespace sonde::profiler

int main(int argc, char** argv) {
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  return sonde::profiler::Main(argc, argv);
}
