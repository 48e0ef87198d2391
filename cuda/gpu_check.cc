// gpu_check: for anyone with a GPU. Runs the device conformance cases
// against the CPU path; then times the statistics kernels, with and without
// histograms, through the engine the hook uses (collecting every batch),
// against a read-only sum over the same bytes and a device-to-device copy,
// for 1 MiB to 1 GiB of F32, BF16 and F16 and for one training step's
// batch of 300 tensors (413 MB); sweeps the chunk size (elements a block
// reads) over 32 MiB, 256 MiB and the step batch, so that one run says
// which default to keep; times what training waits for when it saves
// values (a snapshot), idle and with downloads in flight, by
// cudaMemcpyAsync and by a copy kernel; and counts the kernel launches of
// a step.
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
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cuda/conformance.h"
#include "cuda/device_stats.h"
#include "cuda/multi_tensor.h"
#include "cuda/stats_kernels.h"
#include "stats/histogram.h"
#include "stats/statistics.h"

namespace sonde {

int LaunchReadSum(const void* data, uint64_t bytes, int32_t dtype, int sms, float* out,
                  void* stream);
int LaunchFill(void* data, uint64_t count, int32_t dtype, uint64_t seed, void* stream);
int LaunchDelay(uint64_t ns, void* stream);

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
  // Chunk sizes (elements) the sweep times; empty: no sweep.
  std::vector<uint64_t> chunk_sweep = {4096, 8192, 16384, 32768, 65536};
  // The snapshot section (what training waits for when it saves values).
  bool snapshots = true;
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
      if (cudaMalloc(&p, c.bytes.size() + skip) != cudaSuccess ||
          cudaMemcpy(static_cast<char*>(p) + skip, c.bytes.data(), c.bytes.size(),
                     cudaMemcpyHostToDevice) != cudaSuccess) {
        std::printf("conformance: cannot place case %s on the device: %s\n", c.name.c_str(),
                    cudaGetErrorString(cudaGetLastError()));
        for (void* b : buffers) cudaFree(b);
        if (p != nullptr) cudaFree(p);
        return static_cast<int>(cases.size());
      }
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

// Not a number if any repeat failed (or there were none).
double Median(std::vector<double> v) {
  if (v.empty() || std::any_of(v.begin(), v.end(), [](double x) { return std::isnan(x); })) {
    return std::nan("");
  }
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Milliseconds of `work` on `stream`, by events, median of `repeats`;
// `after` runs after each repeat, untimed (the engine's Collect). Each
// repeat's start event waits behind a 2 ms delay kernel, so the region
// holds the device's work only, not the host's time to queue it (the
// engine plans and uploads a batch's tables: tens to hundreds of
// microseconds, against 20 us to read 64 MiB). A failed event counts as
// a problem and the time as not a number.
template <typename Work, typename After>
double TimeOnStream(cudaStream_t stream, int repeats, int* problems, Work work, After after) {
  cudaEvent_t start, stop;
  if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess) {
    ++*problems;
    std::printf("ERROR cudaEventCreate: %s\n", cudaGetErrorString(cudaGetLastError()));
    return std::nan("");
  }
  work();  // warm-up
  cudaStreamSynchronize(stream);
  after();
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) {
    if (LaunchDelay(2000000, stream) != 0) ++*problems;
    cudaEventRecord(start, stream);
    work();
    cudaEventRecord(stop, stream);
    const cudaError_t e = cudaEventSynchronize(stop);
    float t = 0;
    if (e != cudaSuccess || cudaEventElapsedTime(&t, start, stop) != cudaSuccess) {
      ++*problems;
      std::printf("ERROR timing: %s\n", cudaGetErrorString(e != cudaSuccess ? e : cudaGetLastError()));
      t = std::nanf("");
    }
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
        stream_, repeats_, problems_,
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

// What the timed sections share: a stream, a 1 GiB source filled with
// pseudo-normal values (sd 0.02, like weights) of the dtype timed, a copy
// destination, and the read-only sum that is every ratio's baseline.
class Bench {
 public:
  static constexpr uint64_t kLargest = uint64_t{1} << 30;

  Bench(const Flags& flags, int sms, int* problems)
      : flags_(flags), sms_(sms), problems_(problems) {
    cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    ok_ = cudaMalloc(&src_, kLargest) == cudaSuccess &&
          cudaMalloc(&dst_, kLargest) == cudaSuccess &&
          cudaMalloc(reinterpret_cast<void**>(&sum_), sizeof(float)) == cudaSuccess;
    if (!ok_) {
      ++*problems_;
      std::printf("ERROR cannot allocate 2 GiB\n");
    }
  }
  ~Bench() {
    if (src_ != nullptr) cudaFree(src_);
    if (dst_ != nullptr) cudaFree(dst_);
    if (sum_ != nullptr) cudaFree(sum_);
    cudaStreamDestroy(stream_);
  }
  Bench(const Bench&) = delete;
  Bench& operator=(const Bench&) = delete;

  bool ok() const { return ok_; }
  cudaStream_t stream() const { return stream_; }
  int* problems() const { return problems_; }

  // The engine statistics are timed through: as the hook makes one, with
  // slots that hold the step batch's tables at any chunk size timed (under
  // 2 MiB at 4 Ki elements) and little snapshot memory, which statistics
  // do not use.
  std::unique_ptr<DeviceStats> StatsEngine(uint64_t chunk_elements, bool aggregated) {
    DeviceStatsOptions options;
    options.chunk_elements = chunk_elements;
    options.slot_bytes = 16u << 20;
    options.snapshot_bytes = 16u << 20;
    options.warp_aggregated_histograms = aggregated;
    return Engine(options);
  }

  // An engine with `options` on the device checked; nullptr (counted as a
  // problem) if it cannot be made.
  std::unique_ptr<DeviceStats> Engine(DeviceStatsOptions options) {
    options.device = flags_.device;
    absl::StatusOr<std::unique_ptr<DeviceStats>> engine = DeviceStats::Create(options);
    if (!engine.ok()) {
      ++*problems_;
      std::printf("ERROR cannot create the engine: %s\n", engine.status().ToString().c_str());
      return nullptr;
    }
    return *std::move(engine);
  }

  void Fill(v1::DType dtype) {
    if (LaunchFill(src_, kLargest / DTypeBytes(dtype), static_cast<int32_t>(dtype), 20261126,
                   stream_) != 0) {
      ++*problems_;
    }
    cudaStreamSynchronize(stream_);
  }

  // GB/s of the source's first `bytes`: the read-only sum, the copy
  // (counted once), and statistics batches of `refs` through `engine`.
  double ReadGBs(uint64_t bytes, v1::DType dtype) {
    return bytes / TimeOnStream(stream_, flags_.repeats, problems_, [&] {
      if (LaunchReadSum(src_, bytes, static_cast<int32_t>(dtype), sms_, sum_, stream_) != 0) {
        ++*problems_;
      }
    }, [] {}) / 1e6;
  }
  double CopyGBs(uint64_t bytes) {
    return bytes / TimeOnStream(stream_, flags_.repeats, problems_, [&] {
      cudaMemcpyAsync(dst_, src_, bytes, cudaMemcpyDeviceToDevice, stream_);
    }, [] {}) / 1e6;
  }
  double StatsGBs(DeviceStats& engine, const std::vector<DeviceTensorRef>& refs, uint64_t bytes) {
    return bytes / StatsTimer(engine, stream_, flags_.repeats, problems_).Time(refs) / 1e6;
  }

  // The first `bytes` of the source as one tensor of `dtype`.
  std::vector<DeviceTensorRef> Tensor(uint64_t bytes, v1::DType dtype, bool histogram) const {
    return {{src_, dtype, bytes / DTypeBytes(dtype), histogram}};
  }

  // One training step's batch: 150 weights [672, 1024] and 150 biases
  // [1024] of F32 (300 tensors, 413 MB) carved from the source, which must
  // hold F32. Returns its bytes.
  uint64_t StepBatch(bool histograms, std::vector<DeviceTensorRef>* refs) const {
    uint64_t offset = 0;
    for (int layer = 0; layer < 150; ++layer) {
      for (uint64_t n : {uint64_t{672} * 1024, uint64_t{1024}}) {
        refs->push_back(
            {static_cast<const char*>(src_) + offset * 4, v1::DTYPE_F32, n, histograms});
        offset += n;
      }
    }
    return offset * 4;
  }

  static uint64_t DTypeBytes(v1::DType dtype) { return dtype == v1::DTYPE_F32 ? 4 : 2; }

 private:
  const Flags& flags_;
  const int sms_;
  int* problems_;
  bool ok_ = false;
  cudaStream_t stream_ = nullptr;
  void* src_ = nullptr;
  void* dst_ = nullptr;
  float* sum_ = nullptr;
};

// Statistics (and with histograms, both countings) against a read-only sum
// over the same bytes, and a device-to-device copy with its bytes counted
// once and as read + write traffic; then the step batch.
void Bandwidth(const Flags& flags, Bench& bench) {
  std::unique_ptr<DeviceStats> engine = bench.StatsEngine(kDefaultChunkElements, false);
  std::unique_ptr<DeviceStats> aggregating = bench.StatsEngine(kDefaultChunkElements, true);
  if (engine == nullptr || aggregating == nullptr) return;
  std::printf("\nbandwidth (GB/s of the tensor's bytes, pseudo-normal data; ratios to the "
              "read-only sum in the same run; hist: histograms counted per element, hist/w: "
              "warp-aggregated; the copy counted once and as read + write traffic)\n");
  std::printf("%9s %5s %9s %9s %9s %9s %7s %7s %7s %9s %9s\n", "size", "dtype", "stats", "+hist",
              "+hist/w", "read sum", "s/read", "h/read", "hw/read", "copy 1x", "copy r+w");
  for (v1::DType dtype : flags.dtypes) {
    bench.Fill(dtype);
    for (uint64_t mib : flags.sizes_mib) {
      if (mib == 0 || mib > (Bench::kLargest >> 20)) continue;
      const uint64_t bytes = mib << 20;
      const double stats = bench.StatsGBs(*engine, bench.Tensor(bytes, dtype, false), bytes);
      const double hist = bench.StatsGBs(*engine, bench.Tensor(bytes, dtype, true), bytes);
      const double aggregated =
          bench.StatsGBs(*aggregating, bench.Tensor(bytes, dtype, true), bytes);
      const double read = bench.ReadGBs(bytes, dtype);
      const double copy = bench.CopyGBs(bytes);
      std::printf("%5llu MiB %5s %9.1f %9.1f %9.1f %9.1f %7.2f %7.2f %7.2f %9.1f %9.1f\n",
                  static_cast<unsigned long long>(mib), DTypeLabel(dtype), stats, hist,
                  aggregated, read, stats / read, hist / read, aggregated / read, copy,
                  2 * copy);
    }
  }
  if (!flags.step) return;
  bench.Fill(v1::DTYPE_F32);
  std::vector<DeviceTensorRef> step, step_hist;
  const uint64_t bytes = bench.StepBatch(false, &step);
  bench.StepBatch(true, &step_hist);
  const double stats = bench.StatsGBs(*engine, step, bytes);
  const double hist = bench.StatsGBs(*engine, step_hist, bytes);
  const double aggregated = bench.StatsGBs(*aggregating, step_hist, bytes);
  const double read = bench.ReadGBs(bytes, v1::DTYPE_F32);
  std::printf("step batch: %zu F32 tensors, %.0f MB: statistics %.1f GB/s, with histograms %.1f "
              "GB/s (warp-aggregated %.1f), read sum %.1f GB/s: s/read %.2f, h/read %.2f, "
              "hw/read %.2f\n",
              step.size(), bytes / 1e6, stats, hist, aggregated, read, stats / read, hist / read,
              aggregated / read);
}

// Chunk sizes (DeviceStatsOptions::chunk_elements) side by side on F32, so
// that one run on a GPU says which default to keep: a 32 MiB tensor (at
// most 2,048 chunks a tensor, so every size swept takes effect there), a
// 256 MiB one (whose chunks cannot be under 32 Ki elements: the size it
// gets is printed) and the step batch, each as statistics and with
// histograms, as ratios to the read-only sum over the same bytes.
void ChunkSweep(const Flags& flags, Bench& bench) {
  if (flags.chunk_sweep.empty()) return;
  bench.Fill(v1::DTYPE_F32);
  struct Workload {
    std::string name;
    uint64_t bytes;
    std::vector<DeviceTensorRef> plain, hist;
    double read;
  };
  std::vector<Workload> loads;
  for (uint64_t mib : {32, 256}) {
    const uint64_t bytes = uint64_t{mib} << 20;
    loads.push_back({absl::StrCat(mib, " MiB"), bytes, bench.Tensor(bytes, v1::DTYPE_F32, false),
                     bench.Tensor(bytes, v1::DTYPE_F32, true), 0});
  }
  if (flags.step) {
    Workload step{"step batch", 0, {}, {}, 0};
    step.bytes = bench.StepBatch(false, &step.plain);
    bench.StepBatch(true, &step.hist);
    loads.push_back(std::move(step));
  }
  for (Workload& w : loads) w.read = bench.ReadGBs(w.bytes, v1::DTYPE_F32);
  std::printf("\nchunk sweep (F32; statistics and with histograms as ratios to the read-only sum "
              "over the same bytes; [N]: the chunk a tensor that large gets instead; the default "
              "is %llu elements)\n",
              static_cast<unsigned long long>(kDefaultChunkElements));
  std::printf("%10s", "chunk");
  for (const Workload& w : loads) std::printf(" %20s", (w.name + " s/read h/read").c_str());
  std::printf("\n");
  for (uint64_t chunk : flags.chunk_sweep) {
    std::unique_ptr<DeviceStats> engine = bench.StatsEngine(chunk, false);
    if (engine == nullptr) continue;
    std::printf("%10llu", static_cast<unsigned long long>(chunk));
    for (const Workload& w : loads) {
      const double stats = bench.StatsGBs(*engine, w.plain, w.bytes);
      const double hist = bench.StatsGBs(*engine, w.hist, w.bytes);
      const uint64_t effective = TensorChunkElements(w.plain[0].count, chunk);
      const std::string note =
          effective == chunk ? "" : absl::StrCat("[", effective, "]");
      std::printf(" %8s %5.2f %5.2f", note.c_str(), stats / w.read, hist / w.read);
    }
    std::printf("\n");
  }
}

// What training waits for when it saves values: the snapshot. A 256 MiB
// F32 snapshot timed on the producer's stream (from before EnqueueSnapshot
// to after the producer's wait for it, behind a delay kernel as above),
// idle and while a 1 GiB snapshot is downloaded through the ring (a pump
// thread collecting, as the hook's does), taken by cudaMemcpyAsync and by
// the copy kernel (DeviceStatsOptions::snapshot_copy_kernel), against a
// plain device-to-device copy of the same bytes. A snapshot that slows
// down while downloads are in flight waits for a copy engine's PCIe work.
void Snapshots(const Flags& flags, Bench& bench) {
  if (!flags.snapshots) return;
  bench.Fill(v1::DTYPE_F32);
  const uint64_t small = uint64_t{256} << 20;
  const DeviceTensorRef timed = bench.Tensor(small, v1::DTYPE_F32, false)[0];
  const DeviceTensorRef big = bench.Tensor(Bench::kLargest, v1::DTYPE_F32, false)[0];
  std::vector<char> host(Bench::kLargest);
  const int repeats = std::max(1, std::min(flags.repeats, 5));
  cudaStream_t stream = bench.stream();
  int* problems = bench.problems();
  const double copy_ms = small / bench.CopyGBs(small) / 1e6;
  std::printf("\nsnapshots (256 MiB of F32: ms the producer waits, median of %d; idle, then "
              "while a 1 GiB snapshot downloads through the ring; a D2D copy alone takes "
              "%.3f ms)\n", repeats, copy_ms);
  for (const bool kernel : {false, true}) {
    DeviceStatsOptions options;
    options.snapshot_bytes = Bench::kLargest + small + (uint64_t{64} << 20);
    options.snapshot_copy_kernel = kernel;
    std::unique_ptr<DeviceStats> created = bench.Engine(options);
    if (created == nullptr) return;
    DeviceStats& engine = *created;
    // The hook's pump: collects while downloads are in flight.
    absl::Mutex mu;
    std::set<uint64_t> landed;
    bool stop = false;
    int pump_problems = 0;  // added to the run's after the pump stops
    std::thread pump([&] {
      for (;;) {
        std::vector<DeviceCompletion> done = engine.Collect();
        absl::MutexLock lock(&mu);
        for (const DeviceCompletion& c : done) {
          if (!c.status.ok()) {
            ++pump_problems;
            std::printf("ERROR device: %s\n", c.status.ToString().c_str());
          }
          landed.insert(c.ticket);
        }
        if (stop) return;
        mu.AwaitWithTimeout(absl::Condition(&stop), absl::Microseconds(20));
      }
    });
    // A warm-up and one timed snapshot, each discarded after it (untimed).
    auto snapshot_ms = [&] {
      uint64_t ticket = 0;
      return TimeOnStream(
          stream, 1, problems,
          [&] {
            absl::StatusOr<uint64_t> t =
                engine.EnqueueSnapshot(timed, v1::DTYPE_UNSPECIFIED, stream);
            if (t.ok()) {
              ticket = *t;
            } else {
              ++*problems;
              std::printf("ERROR snapshot refused: %s\n", t.status().ToString().c_str());
            }
          },
          [&] {
            if (ticket != 0) engine.Discard(ticket);
            ticket = 0;
          });
    };
    std::vector<double> idle, busy, download_gbs;
    for (int r = 0; r < repeats; ++r) {
      idle.push_back(snapshot_ms());
      absl::StatusOr<uint64_t> download = engine.EnqueueSnapshot(big, v1::DTYPE_UNSPECIFIED, stream);
      cudaStreamSynchronize(stream);
      const absl::Time started = absl::Now();
      if (!download.ok() || !engine.Download(*download, host.data()).ok()) {
        ++*problems;
        std::printf("ERROR the 1 GiB download did not start\n");
        break;
      }
      absl::SleepFor(absl::Milliseconds(2));  // the ring's pieces are under way
      busy.push_back(snapshot_ms());
      absl::MutexLock lock(&mu);
      const uint64_t want = *download;
      auto arrived = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return landed.count(want) > 0; };
      if (!mu.AwaitWithTimeout(absl::Condition(&arrived), absl::Seconds(30))) {
        ++*problems;
        std::printf("ERROR the 1 GiB download did not land in 30 s\n");
        break;
      }
      download_gbs.push_back(Bench::kLargest / absl::ToDoubleSeconds(absl::Now() - started) / 1e9);
    }
    {
      absl::MutexLock lock(&mu);
      stop = true;
    }
    pump.join();
    *problems += pump_problems;
    // The download's rate says how busy the copy engines were (the ring
    // waits for the pump's copies out of it).
    const double idle_ms = Median(idle), busy_ms = Median(busy);
    std::printf("%-16s idle %8.3f ms (%.2f x the copy), downloads in flight %8.3f ms (x %.2f); "
                "the 1 GiB download ran at %.1f GB/s\n",
                kernel ? "copy kernel" : "cudaMemcpyAsync", idle_ms, idle_ms / copy_ms, busy_ms,
                busy_ms / idle_ms, Median(download_gbs));
  }
}

int TimedSections(const Flags& flags, int sms) {
  int problems = 0;
  {
    Bench bench(flags, sms, &problems);
    if (bench.ok()) {
      Bandwidth(flags, bench);
      ChunkSweep(flags, bench);
      Snapshots(flags, bench);
    }
  }
  if (problems > 0) std::printf("timed sections: %d enqueues refused or device errors\n", problems);
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
      if (cudaMalloc(&p, n * 4) != cudaSuccess || cudaMemset(p, 0, n * 4) != cudaSuccess) {
        std::printf("launches: cannot allocate: %s\n", cudaGetErrorString(cudaGetLastError()));
        if (p != nullptr) cudaFree(p);
        for (void* b : buffers) cudaFree(b);
        return;
      }
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
    } else if (absl::StartsWith(arg, "--chunk_sweep=")) {
      flags.chunk_sweep.clear();
      for (absl::string_view s : absl::StrSplit(arg.substr(14), ',', absl::SkipEmpty())) {
        uint64_t chunk = 0;
        if (absl::SimpleAtoi(s, &chunk) && chunk > 0) flags.chunk_sweep.push_back(chunk);
      }
    } else if (arg == "--no_conformance") {
      flags.conformance = false;
    } else if (arg == "--no_step") {
      flags.step = false;
    } else if (arg == "--no_snapshots") {
      flags.snapshots = false;
    } else {
      std::fprintf(stderr,
                   "usage: gpu_check [--device=N] [--repeats=R] [--sizes=MIB,...] "
                   "[--dtypes=f32,bf16,f16] [--chunk_sweep=ELEMENTS,...] [--no_conformance] "
                   "[--no_step] [--no_snapshots]\n");
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
  const int problems = sonde::TimedSections(flags, prop.multiProcessorCount);
  sonde::Launches(flags);
  return conformance != 0 || problems != 0 ? 1 : 0;
}
