// gpu_check: for anyone with a GPU. Runs the device conformance cases
// against the CPU path, then times the fused statistics kernels against a
// device-to-device copy of the same bytes in the same run, and counts the
// kernel launches one step of a model of a few hundred tensors takes.
//
//   bazel run -c opt //cuda:gpu_check [-- --device=N --repeats=R]
//
// Exit status: 0 all conformance cases pass (or there is no GPU: it says so),
// 1 a case failed or the device reported an error.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "cuda/conformance.h"
#include "cuda/device_stats.h"
#include "cuda/histogram.h"
#include "cuda/statistics.h"

namespace sonde {
namespace {

struct Flags {
  int device = 0;
  int repeats = 20;
};

int Conformance(const Flags& flags) {
  const std::vector<ConformanceCase> cases = ConformanceCases();
  DeviceStatsOptions options;
  options.device = flags.device;
  options.slot_bytes = 64u << 20;
  absl::StatusOr<std::unique_ptr<DeviceStats>> engine = DeviceStats::Create(options);
  if (!engine.ok()) {
    std::printf("conformance: cannot create the engine: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  std::vector<void*> buffers;
  std::vector<DeviceTensorRef> refs;
  for (const ConformanceCase& c : cases) {
    void* p = nullptr;
    if (!c.bytes.empty()) {
      cudaMalloc(&p, c.bytes.size());
      cudaMemcpy(p, c.bytes.data(), c.bytes.size(), cudaMemcpyHostToDevice);
    }
    buffers.push_back(p);
    refs.push_back({p, c.dtype, c.count, true});
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
  std::printf("conformance: %zu of %zu cases match the CPU path\n", cases.size() - failures,
              cases.size());
  return failures == 0 ? 0 : 1;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Milliseconds of `work` on `stream`, by events, median of `repeats`.
template <typename Work>
double TimeOnStream(cudaStream_t stream, int repeats, Work work) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  work();  // warm-up
  cudaStreamSynchronize(stream);
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) {
    cudaEventRecord(start, stream);
    work();
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float t = 0;
    cudaEventElapsedTime(&t, start, stop);
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return Median(ms);
}

void Bandwidth(const Flags& flags) {
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  DeviceStatsOptions options;
  options.device = flags.device;
  absl::StatusOr<std::unique_ptr<DeviceStats>> engine = DeviceStats::Create(options);
  if (!engine.ok()) return;
  for (uint64_t mb : {64, 256}) {
    const uint64_t bytes = mb << 20;
    void* src = nullptr;
    void* dst = nullptr;
    if (cudaMalloc(&src, bytes) != cudaSuccess || cudaMalloc(&dst, bytes) != cudaSuccess) {
      std::printf("bandwidth: cannot allocate 2 x %llu MiB\n", static_cast<unsigned long long>(mb));
      break;
    }
    cudaMemset(src, 0x3c, bytes);  // finite F32 values
    const double copy_ms = TimeOnStream(stream, flags.repeats, [&] {
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
    });
    for (bool hist : {false, true}) {
      DeviceTensorRef ref{src, v1::DTYPE_F32, bytes / 4, hist};
      const double stats_ms = TimeOnStream(stream, flags.repeats, [&] {
        if (!(*engine)->EnqueueStats({&ref, 1}, stream).ok()) std::printf("enqueue refused\n");
      });
      (*engine)->Drain().IgnoreError();
      (*engine)->Collect();
      const double copy_gbs = bytes / copy_ms / 1e6;
      const double stats_gbs = bytes / stats_ms / 1e6;
      std::printf("%4llu MiB F32 %-22s %8.1f GB/s   d2d copy %8.1f GB/s   stats/copy = %.2f\n",
                  static_cast<unsigned long long>(mb), hist ? "statistics+histogram" : "statistics",
                  stats_gbs, copy_gbs, stats_gbs / copy_gbs);
    }
    cudaFree(src);
    cudaFree(dst);
  }
  cudaStreamDestroy(stream);
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
    } else {
      std::fprintf(stderr, "usage: gpu_check [--device=N] [--repeats=R]\n");
      return 2;
    }
  }
  const absl::Status probe = sonde::DeviceStats::Probe(flags.device);
  if (!probe.ok()) {
    std::printf("gpu_check: no GPU to check: %s\n", std::string(probe.message()).c_str());
    return 0;
  }
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, flags.device);
  std::printf("gpu_check: device %d: %s (sm_%d%d, %d SMs)\n", flags.device, prop.name, prop.major,
              prop.minor, prop.multiProcessorCount);
  const int status = sonde::Conformance(flags);
  sonde::Bandwidth(flags);
  sonde::Launches(flags);
  return status;
}
