// gpu_check: for anyone with a GPU. Runs the device conformance cases
// against the CPU path; then times the statistics kernels, with and without
// histograms, through the engine the hook uses (collecting every batch),
// against a read-only sum over the same bytes and a device-to-device copy,
// for 1 MiB to 1 GiB of F32, BF16 and F16 and for one training step's
// batch of 300 tensors (413 MB); and counts the kernel launches of a step.
//
//   bazel run -c opt //cuda:gpu_check [-- --device=N --repeats=R]
//
// For a profiler, narrow it, e.g.: ncu --kernel-name regex:StatsPartials
//   --launch-count 4 gpu_check --no_conformance --no_step --sizes=256
//   --dtypes=f32 --repeats=2
//
// Exit status: 0 all conformance cases pass and no enqueue was refused (or
// there is no GPU: it says so), 1 a case failed, an enqueue was refused or
// the device reported an error.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "cuda/conformance.h"
#include "cuda/device_stats.h"
#include "cuda/stats_kernels.h"
#include "stats/histogram.h"
#include "stats/statistics.h"

namespace sonde {

int LaunchReadSum(const void* data, uint64_t bytes, int32_t dtype, int sms, float* out,
                  void* stream);
int LaunchFill(void* data, uint64_t count, int32_t dtype, uint64_t seed, void* stream);

namespace {

struct Flags {
  int device = 0;
  int repeats = 20;
  // Narrow the run (for a profiler): the sizes in MiB and dtypes timed,
  // and whether the conformance cases and the step batch run.
  std::vector<uint64_t> sizes_mib = {1, 4, 16, 64, 256, 1024};
  std::vector<v1::DType> dtypes = {v1::DTYPE_F32, v1::DTYPE_BF16, v1::DTYPE_F16};
  bool conformance = true;
  bool step = true;
};

// The conformance cases in one batch, each tensor `offset` elements into its
// allocation (1: as a view is, with element loads up to the first 16-byte
// boundary). Returns the cases that failed.
int ConformanceOnce(const Flags& flags, int offset, bool aggregated) {
  const std::vector<ConformanceCase> cases = ConformanceCases();
  DeviceStatsOptions options;
  options.device = flags.device;
  options.slot_bytes = 64u << 20;
  options.warp_aggregated_histograms = aggregated;
  absl::StatusOr<std::unique_ptr<DeviceStats>> engine = DeviceStats::Create(options);
  if (!engine.ok()) {
    std::printf("conformance: cannot create the engine: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  std::vector<void*> buffers;
  std::vector<DeviceTensorRef> refs;
  for (const ConformanceCase& c : cases) {
    void* p = nullptr;
    const size_t skip = c.count > 0 ? offset * (c.bytes.size() / c.count) : 0;
    if (!c.bytes.empty()) {
      cudaMalloc(&p, c.bytes.size() + skip);
      cudaMemcpy(static_cast<char*>(p) + skip, c.bytes.data(), c.bytes.size(),
                 cudaMemcpyHostToDevice);
    }
    buffers.push_back(p);
    refs.push_back({p == nullptr ? nullptr : static_cast<char*>(p) + skip, c.dtype, c.count, true});
  }
  int failures = 0;
  absl::StatusOr<uint64_t> ticket = (*engine)->EnqueueStats(refs, nullptr);
  if (!ticket.ok()) {
    std::printf("conformance: enqueue failed: %s\n", ticket.status().ToString().c_str());
    failures = static_cast<int>(cases.size());
  } else {
    (*engine)->Drain().IgnoreError();
    std::vector<DeviceCompletion> done = (*engine)->Collect();
    if (done.size() != 1 || !done[0].status.ok()) {
      std::printf("conformance: device error: %s\n",
                  done.empty() ? "no result" : done[0].status.ToString().c_str());
      failures = static_cast<int>(cases.size());
    } else {
      for (size_t i = 0; i < cases.size(); ++i) {
        StatsAccumulator cpu;
        AccumulateStatistics(cpu, cases[i].bytes.data(), cases[i].dtype, cases[i].count);
        HistogramCounts hist = HistogramCounts::Empty(options.histogram);
        AccumulateHistogramScalar(hist, cases[i].bytes.data(), cases[i].dtype, cases[i].count);
        absl::Status s = CompareRecords(done[0].stats[i], cpu, cases[i].dtype);
        if (s.ok()) s = CompareHistograms(done[0].histograms[i], hist);
        if (!s.ok()) {
          ++failures;
          std::printf("FAIL %s: %s\n", cases[i].name.c_str(), s.ToString().c_str());
        }
      }
    }
  }
  for (void* p : buffers) {
    if (p) cudaFree(p);
  }
  std::printf("conformance (%s%s): %zu of %zu cases match the CPU path\n",
              offset == 0 ? "as allocated" : "one element in",
              aggregated ? ", warp-aggregated histograms" : "", cases.size() - failures,
              cases.size());
  return failures;
}

int Conformance(const Flags& flags) {
  int failures = 0;
  for (int offset : {0, 1}) {
    for (bool aggregated : {false, true}) failures += ConformanceOnce(flags, offset, aggregated);
  }
  return failures == 0 ? 0 : 1;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Milliseconds of `work` on `stream`, by events, median of `repeats`;
// `after` runs after each repeat, untimed (the engine's Collect).
template <typename Work, typename After>
double TimeOnStream(cudaStream_t stream, int repeats, Work work, After after) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  work();  // warm-up
  cudaStreamSynchronize(stream);
  after();
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) {
    cudaEventRecord(start, stream);
    work();
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float t = 0;
    cudaEventElapsedTime(&t, start, stop);
    ms.push_back(t);
    after();
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return Median(ms);
}

const char* DTypeLabel(v1::DType d) {
  return d == v1::DTYPE_F32 ? "F32" : d == v1::DTYPE_BF16 ? "BF16" : "F16";
}

// Times statistics batches through the engine the hook uses, collecting
// every batch (a batch slot comes back only through Collect) and counting
// refusals and device errors, which make gpu_check fail.
class StatsTimer {
 public:
  StatsTimer(DeviceStats& engine, cudaStream_t stream, int repeats, int* problems)
      : engine_(engine), stream_(stream), repeats_(repeats), problems_(problems) {}

  double Time(const std::vector<DeviceTensorRef>& refs) {
    return TimeOnStream(
        stream_, repeats_,
        [&] {
          absl::StatusOr<uint64_t> t = engine_.EnqueueStats(refs, stream_);
          if (!t.ok()) {
            ++*problems_;
            std::printf("ERROR enqueue refused: %s\n", t.status().ToString().c_str());
          }
        },
        [&] {
          if (!engine_.Drain().ok()) ++*problems_;
          for (const DeviceCompletion& c : engine_.Collect()) {
            if (!c.status.ok()) {
              ++*problems_;
              std::printf("ERROR device: %s\n", c.status.ToString().c_str());
            }
          }
        });
  }

 private:
  DeviceStats& engine_;
  cudaStream_t stream_;
  int repeats_;
  int* problems_;
};

// Statistics (and with histograms) against a read-only sum over the same
// bytes, and a device-to-device copy with its bytes counted once and as
// read + write traffic. Returns the refusals and errors seen.
int Bandwidth(const Flags& flags, int sms) {
  int problems = 0;
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  DeviceStatsOptions options;
  options.device = flags.device;
  options.slot_bytes = 16u << 20;
  absl::StatusOr<std::unique_ptr<DeviceStats>> engine = DeviceStats::Create(options);
  if (!engine.ok()) {
    std::printf("bandwidth: cannot create the engine: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  options.warp_aggregated_histograms = true;
  absl::StatusOr<std::unique_ptr<DeviceStats>> aggregating = DeviceStats::Create(options);
  if (!aggregating.ok()) {
    std::printf("bandwidth: cannot create the engine: %s\n",
                aggregating.status().ToString().c_str());
    return 1;
  }
  StatsTimer timer(**engine, stream, flags.repeats, &problems);
  StatsTimer timer_aggregating(**aggregating, stream, flags.repeats, &problems);
  const uint64_t largest = uint64_t{1} << 30;
  void* src = nullptr;
  void* dst = nullptr;
  float* sum = nullptr;
  if (cudaMalloc(&src, largest) != cudaSuccess || cudaMalloc(&dst, largest) != cudaSuccess ||
      cudaMalloc(reinterpret_cast<void**>(&sum), sizeof(float)) != cudaSuccess) {
    std::printf("bandwidth: cannot allocate 2 GiB\n");
    return 1;
  }
  // Pseudo-normal values (sd 0.02, like weights) in the dtype timed.
  auto fill = [&](v1::DType dtype) {
    const uint64_t count = largest / (dtype == v1::DTYPE_F32 ? 4 : 2);
    if (LaunchFill(src, count, static_cast<int32_t>(dtype), 20261126, stream) != 0) ++problems;
    cudaStreamSynchronize(stream);
  };
  auto read_ms = [&](const void* p, uint64_t bytes, v1::DType dtype) {
    return TimeOnStream(
        stream, flags.repeats,
        [&] {
          if (LaunchReadSum(p, bytes, static_cast<int32_t>(dtype), sms, sum, stream) != 0) {
            ++problems;
          }
        },
        [] {});
  };
  std::printf("\nbandwidth (GB/s of the tensor's bytes, pseudo-normal data; ratios to the "
              "read-only sum in the same run; hist: histograms counted per element, hist/w: "
              "warp-aggregated; the copy counted once and as read + write traffic)\n");
  std::printf("%9s %5s %9s %9s %9s %9s %7s %7s %7s %9s %9s\n", "size", "dtype", "stats", "+hist",
              "+hist/w", "read sum", "s/read", "h/read", "hw/read", "copy 1x", "copy r+w");
  for (v1::DType dtype : flags.dtypes) {
    fill(dtype);
    for (uint64_t mib : flags.sizes_mib) {
      if (mib == 0 || mib > (largest >> 20)) continue;
      const uint64_t bytes = mib << 20;
      const uint64_t count = bytes / (dtype == v1::DTYPE_F32 ? 4 : 2);
      DeviceTensorRef plain{src, dtype, count, false};
      DeviceTensorRef hist{src, dtype, count, true};
      const double stats = bytes / timer.Time({plain}) / 1e6;
      const double with_hist = bytes / timer.Time({hist}) / 1e6;
      const double aggregated = bytes / timer_aggregating.Time({hist}) / 1e6;
      const double read = bytes / read_ms(src, bytes, dtype) / 1e6;
      const double copy = bytes / TimeOnStream(stream, flags.repeats, [&] {
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
      }, [] {}) / 1e6;
      std::printf("%5llu MiB %5s %9.1f %9.1f %9.1f %9.1f %7.2f %7.2f %7.2f %9.1f %9.1f\n",
                  static_cast<unsigned long long>(mib), DTypeLabel(dtype), stats, with_hist,
                  aggregated, read, stats / read, with_hist / read, aggregated / read, copy,
                  2 * copy);
    }
  }
  // One training step's batch: 150 weights [672, 1024] and 150 biases [1024]
  // of F32 (300 tensors, 413 MB) carved from one buffer, whose read-only sum
  // is the baseline.
  if (!flags.step) {
    cudaFree(src);
    cudaFree(dst);
    cudaFree(sum);
    cudaStreamDestroy(stream);
    return problems;
  }
  fill(v1::DTYPE_F32);
  std::vector<DeviceTensorRef> step, step_hist;
  uint64_t offset = 0;
  for (int layer = 0; layer < 150; ++layer) {
    for (uint64_t n : {uint64_t{672} * 1024, uint64_t{1024}}) {
      const void* p = static_cast<const char*>(src) + offset * 4;
      step.push_back({p, v1::DTYPE_F32, n, false});
      step_hist.push_back({p, v1::DTYPE_F32, n, true});
      offset += n;
    }
  }
  const uint64_t step_bytes = offset * 4;
  const double stats = step_bytes / timer.Time(step) / 1e6;
  const double with_hist = step_bytes / timer.Time(step_hist) / 1e6;
  const double aggregated = step_bytes / timer_aggregating.Time(step_hist) / 1e6;
  const double read = step_bytes / read_ms(src, step_bytes, v1::DTYPE_F32) / 1e6;
  std::printf("step batch: %zu F32 tensors, %.0f MB: statistics %.1f GB/s, with histograms %.1f "
              "GB/s (warp-aggregated %.1f), read sum %.1f GB/s: s/read %.2f, h/read %.2f, "
              "hw/read %.2f\n",
              step.size(), step_bytes / 1e6, stats, with_hist, aggregated, read, stats / read,
              with_hist / read, aggregated / read);
  cudaFree(src);
  cudaFree(dst);
  cudaFree(sum);
  cudaStreamDestroy(stream);
  if (problems > 0) std::printf("bandwidth: %d enqueues refused or device errors\n", problems);
  return problems;
}

void Launches(const Flags& flags) {
  // A model of a few hundred tensors: weights and gradients of 150 layers.
  std::vector<DeviceTensorRef> refs;
  std::vector<void*> buffers;
  for (int layer = 0; layer < 150; ++layer) {
    const uint64_t n = 1024ull << (layer % 8);
    for (int g = 0; g < 2; ++g) {
      void* p = nullptr;
      cudaMalloc(&p, n * 4);
      cudaMemset(p, 0, n * 4);
      buffers.push_back(p);
      refs.push_back({p, v1::DTYPE_F32, n, g == 1});
    }
  }
  DeviceStatsOptions options;
  options.device = flags.device;
  absl::StatusOr<std::unique_ptr<DeviceStats>> engine = DeviceStats::Create(options);
  if (engine.ok() && (*engine)->EnqueueStats(refs, nullptr).ok()) {
    std::printf("launches per step: %d kernel launches for %zu tensors\n",
                (*engine)->LastBatchLaunches(), refs.size());
    (*engine)->Drain().IgnoreError();
    (*engine)->Collect();
  }
  for (void* p : buffers) cudaFree(p);
}

}  // namespace
}  // namespace sonde

int main(int argc, char** argv) {
  sonde::Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (absl::StartsWith(arg, "--device=")) {
      (void)absl::SimpleAtoi(arg.substr(9), &flags.device);
    } else if (absl::StartsWith(arg, "--repeats=")) {
      (void)absl::SimpleAtoi(arg.substr(10), &flags.repeats);
    } else if (absl::StartsWith(arg, "--sizes=")) {
      flags.sizes_mib.clear();
      for (absl::string_view s : absl::StrSplit(arg.substr(8), ',')) {
        uint64_t mib = 0;
        if (absl::SimpleAtoi(s, &mib)) flags.sizes_mib.push_back(mib);
      }
    } else if (absl::StartsWith(arg, "--dtypes=")) {
      flags.dtypes.clear();
      for (absl::string_view s : absl::StrSplit(arg.substr(9), ',')) {
        if (s == "f32") flags.dtypes.push_back(sonde::v1::DTYPE_F32);
        if (s == "bf16") flags.dtypes.push_back(sonde::v1::DTYPE_BF16);
        if (s == "f16") flags.dtypes.push_back(sonde::v1::DTYPE_F16);
      }
    } else if (arg == "--no_conformance") {
      flags.conformance = false;
    } else if (arg == "--no_step") {
      flags.step = false;
    } else {
      std::fprintf(stderr,
                   "usage: gpu_check [--device=N] [--repeats=R] [--sizes=MIB,...] "
                   "[--dtypes=f32,bf16,f16] [--no_conformance] [--no_step]\n");
      return 2;
    }
  }
  const absl::Status probe = sonde::DeviceStats::Probe(flags.device);
  if (!probe.ok()) {
    std::printf("gpu_check: no GPU to check: %s\n", std::string(probe.message()).c_str());
    return 0;
  }
  // Every allocation, stream and kernel query below is on this device.
  cudaSetDevice(flags.device);
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, flags.device);
  std::printf("gpu_check: device %d: %s (sm_%d%d, %d SMs)\n", flags.device, prop.name, prop.major,
              prop.minor, prop.multiProcessorCount);
  sonde::StatsKernelInfo kernel;
  if (sonde::QueryStatsKernel(&kernel) == 0) {
    const int threads = kernel.blocks_per_sm * kernel.threads;
    std::printf("statistics kernel: %d registers a thread, %d blocks of %d per SM: %d threads, "
                "theoretical occupancy %.1f%%\n",
                kernel.registers, kernel.blocks_per_sm, kernel.threads, threads,
                100.0 * threads / prop.maxThreadsPerMultiProcessor);
  }
  const int conformance = flags.conformance ? sonde::Conformance(flags) : 0;
  const int problems = sonde::Bandwidth(flags, prop.multiProcessorCount);
  sonde::Launches(flags);
  return conformance != 0 || problems != 0 ? 1 : 0;
}
