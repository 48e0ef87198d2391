#include "stats/cpu_stats.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/dtype.h"
#include "common/thread_pool.h"
#include "stats/cpu_stats_kernels.h"

namespace sonde {
namespace {

using cpu_stats_internal::CpuBlockKernels;
using cpu_stats_internal::HistogramLanes;
using cpu_stats_internal::kCpuStatsBlock;
using cpu_stats_internal::kHistogramLanes;

// ---- portable kernels
// --------------------------------------------------------
//
// Elements are converted to double in sub-blocks of 1024: a tight loop
// without divisions gathers sums and extremes, a second pass over the same
// sub-block gives its M2 exactly around the sub-block mean, and sub-blocks
// merge with Chan's formula. A sub-block holding a NaN or an infinity takes
// the per-element path, so the two paths define the same record.

constexpr uint32_t kPortableBlock = 1024;

void AccumulateDoubles(StatsAccumulator& acc, const double* x, uint32_t n) {
  bool finite = true;
  for (uint32_t i = 0; i < n; ++i) finite &= (x[i] - x[i] == 0);
  if (!finite) {
    for (uint32_t i = 0; i < n; ++i) StatsAdd(acc, x[i]);
    return;
  }
  if (n == 0) return;
  double sum = 0, l1 = 0, sq = 0;
  double mn = x[0], mx = x[0], amn = std::fabs(x[0]), amx = amn;
  uint64_t zeros = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const double v = x[i];
    const double a = std::fabs(v);
    sum += v;
    l1 += a;
    sq += v * v;
    mn = v < mn ? v : mn;
    mx = v > mx ? v : mx;
    amn = a < amn ? a : amn;
    amx = a > amx ? a : amx;
    zeros += v == 0;
  }
  const double mean = sum / n;
  double m2 = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const double d = x[i] - mean;
    m2 += d * d;
  }
  StatsAccumulator block;
  block.count = block.finite_count = n;
  block.zero_count = zeros;
  block.min = mn;
  block.max = mx;
  block.abs_min = amn;
  block.abs_max = amx;
  block.sum = sum;
  block.l1 = l1;
  block.sum_squares = sq;
  block.mean = mean;
  block.m2 = m2;
  StatsMerge(acc, block);
}

template <typename T>
T LoadAt(const T* x, uint32_t i) {
  T v;
  std::memcpy(&v, x + i, sizeof(T));
  return v;
}

// Exact two-pass m2 per sub-block: needs no shift.
template <typename T>
void PortableStats(const T* x, uint32_t n, double /*shift*/,
                   StatsAccumulator* out) {
  *out = StatsAccumulator();
  double buf[kPortableBlock];
  for (uint32_t start = 0; start < n; start += kPortableBlock) {
    const uint32_t m = std::min(kPortableBlock, n - start);
    for (uint32_t i = 0; i < m; ++i)
      buf[i] = static_cast<double>(LoadAt(x, start + i));
    AccumulateDoubles(*out, buf, m);
  }
}

void AddBin(HistogramLanes* h, uint32_t bin, uint32_t lane) {
  if (bin == kBinNan) {
    ++h->nan;
  } else if (bin == kBinPosInf) {
    ++h->pos_inf;
  } else if (bin == kBinNegInf) {
    ++h->neg_inf;
  } else {
    ++h->counters[bin * kHistogramLanes + lane];
  }
}

void PortableHistF32(const float* x, uint32_t n, bool, HistogramLanes* h) {
  for (uint32_t i = 0; i < n; ++i)
    AddBin(h, HistogramBinF32(h->params, LoadAt(x, i)), i % kHistogramLanes);
}

void PortableHistF64(const double* x, uint32_t n, bool, HistogramLanes* h) {
  for (uint32_t i = 0; i < n; ++i)
    AddBin(h, HistogramBinF64(h->params, LoadAt(x, i)), i % kHistogramLanes);
}

template <typename T>
bool PortableAllFinite(const T* x, uint32_t n) {
  bool finite = true;
  for (uint32_t i = 0; i < n; ++i) {
    const T v = LoadAt(x, i);
    finite &= (v - v == 0);
  }
  return finite;
}

void PortableF16ToF32(const uint16_t* x, uint32_t n, float* out) {
  for (uint32_t i = 0; i < n; ++i) out[i] = HalfToFloat(LoadAt(x, i));
}

void PortableBF16ToF32(const uint16_t* x, uint32_t n, float* out) {
  for (uint32_t i = 0; i < n; ++i) out[i] = BFloat16ToFloat(LoadAt(x, i));
}

const CpuBlockKernels& PortableKernels() {
  static const CpuBlockKernels kernels = {
      "portable",
      PortableStats<float>,
      PortableStats<double>,
      PortableHistF32,
      PortableHistF64,
      PortableAllFinite<float>,
      PortableAllFinite<double>,
      PortableF16ToF32,
      PortableBF16ToF32,
  };
  return kernels;
}

bool CpuHasAvx2Fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

const CpuBlockKernels& Kernels(bool force_portable) {
  static const bool avx2 = CpuHasAvx2Fma();
  return avx2 && !force_portable ? cpu_stats_internal::Avx2Kernels()
                                 : PortableKernels();
}

// ---- one contiguous range on one thread
// ---------------------------------------

// The statistics and histogram of one contiguous range of the tensor.
struct Part {
  StatsAccumulator stats;
  std::vector<uint32_t> counters;  // HistogramLanes::counters
  HistogramLanes lanes;
  HistogramCounts histogram;  // where `lanes` is flushed to
};

// Adds the lanes' counters to `h` and zeroes them.
void FlushLanes(HistogramLanes& lanes, HistogramCounts& h) {
  for (uint32_t bin = 0; bin < lanes.params.count; ++bin) {
    uint32_t* c = lanes.counters + bin * kHistogramLanes;
    uint64_t sum = 0;
    for (uint32_t l = 0; l < kHistogramLanes; ++l) {
      sum += c[l];
      c[l] = 0;
    }
    h.counts[bin] += sum;
  }
  h.nan_count += lanes.nan;
  h.pos_inf_count += lanes.pos_inf;
  h.neg_inf_count += lanes.neg_inf;
  lanes.nan = lanes.pos_inf = lanes.neg_inf = 0;
}

// A lane counter gets at most one increment per 8 elements (plus a tail of
// < 8), so flushing every 2^34 elements keeps each below 2^32.
constexpr uint64_t kFlushElements = uint64_t{1} << 34;

// One block: kernels for the first n & ~7 elements, the scalar functions
// for the rest. `x` is F32 or F64 data (possibly converted).
template <typename T>
void AccumulateBlock(const CpuBlockKernels& k, const T* x, uint32_t n,
                     StatsAccumulator* stats, HistogramLanes* lanes) {
  constexpr bool kF32 = sizeof(T) == 4;
  const uint32_t n8 = n & ~7u;
  bool all_finite = false;
  if (stats != nullptr) {
    StatsAccumulator block;
    const double shift = stats->finite_count > 0
                             ? stats->mean
                             : std::numeric_limits<double>::quiet_NaN();
    if constexpr (kF32) {
      k.stats_f32(x, n8, shift, &block);
    } else {
      k.stats_f64(x, n8, shift, &block);
    }
    all_finite = block.finite_count == block.count;
    for (uint32_t i = n8; i < n; ++i)
      StatsAdd(block, static_cast<double>(LoadAt(x, i)));
    StatsMerge(*stats, block);
  } else if (lanes != nullptr) {
    if constexpr (kF32) {
      all_finite = k.all_finite_f32(x, n8);
    } else {
      all_finite = k.all_finite_f64(x, n8);
    }
  }
  if (lanes != nullptr) {
    if constexpr (kF32) {
      k.hist_f32(x, n8, all_finite, lanes);
      for (uint32_t i = n8; i < n; ++i)
        AddBin(lanes, HistogramBinF32(lanes->params, LoadAt(x, i)), 0);
    } else {
      k.hist_f64(x, n8, all_finite, lanes);
      for (uint32_t i = n8; i < n; ++i)
        AddBin(lanes, HistogramBinF64(lanes->params, LoadAt(x, i)), 0);
    }
  }
}

template <typename T>
void WidenToDouble(const char* p, uint32_t n, double* out) {
  for (uint32_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, p + sizeof(T) * i, sizeof(T));
    out[i] = static_cast<double>(v);
  }
}

// Elements [begin, end) of the tensor into `part`.
void AccumulateRange(const CpuBlockKernels& k, const char* data,
                     v1::DType dtype, uint64_t begin, uint64_t end,
                     bool want_stats, bool want_histogram, Part& part) {
  StatsAccumulator* stats = want_stats ? &part.stats : nullptr;
  HistogramLanes* lanes = want_histogram ? &part.lanes : nullptr;
  std::unique_ptr<float[]> floats;
  std::unique_ptr<double[]> doubles;
  if (dtype == v1::DTYPE_F16 || dtype == v1::DTYPE_BF16) {
    floats.reset(new float[kCpuStatsBlock]);
  } else if (dtype != v1::DTYPE_F32 && dtype != v1::DTYPE_F64) {
    doubles.reset(new double[kCpuStatsBlock]);
  }
  uint64_t since_flush = 0;
  for (uint64_t start = begin; start < end; start += kCpuStatsBlock) {
    const uint32_t n =
        static_cast<uint32_t>(std::min<uint64_t>(kCpuStatsBlock, end - start));
    const uint32_t n8 = n & ~7u;
    switch (dtype) {
      case v1::DTYPE_F32:
        AccumulateBlock(k, reinterpret_cast<const float*>(data + 4 * start), n,
                        stats, lanes);
        break;
      case v1::DTYPE_F64:
        AccumulateBlock(k, reinterpret_cast<const double*>(data + 8 * start), n,
                        stats, lanes);
        break;
      case v1::DTYPE_F16:
      case v1::DTYPE_BF16: {
        const uint16_t* x = reinterpret_cast<const uint16_t*>(data + 2 * start);
        const bool half = dtype == v1::DTYPE_F16;
        (half ? k.f16_to_f32 : k.bf16_to_f32)(x, n8, floats.get());
        for (uint32_t i = n8; i < n; ++i) {
          const uint16_t v = LoadAt(x, i);
          floats[i] = half ? HalfToFloat(v) : BFloat16ToFloat(v);
        }
        AccumulateBlock(k, static_cast<const float*>(floats.get()), n, stats,
                        lanes);
        break;
      }
      default: {
        const char* p = data + DTypeSize(dtype) * start;
        double* out = doubles.get();
        switch (dtype) {
          case v1::DTYPE_I8:
            WidenToDouble<int8_t>(p, n, out);
            break;
          case v1::DTYPE_I16:
            WidenToDouble<int16_t>(p, n, out);
            break;
          case v1::DTYPE_I32:
            WidenToDouble<int32_t>(p, n, out);
            break;
          case v1::DTYPE_I64:
            WidenToDouble<int64_t>(p, n, out);
            break;
          case v1::DTYPE_U8:
            WidenToDouble<uint8_t>(p, n, out);
            break;
          default:  // DTYPE_BOOL
            for (uint32_t i = 0; i < n; ++i) out[i] = p[i] != 0 ? 1.0 : 0.0;
            break;
        }
        AccumulateBlock(k, static_cast<const double*>(out), n, stats, lanes);
        break;
      }
    }
    since_flush += n;
    if (lanes != nullptr && since_flush >= kFlushElements) {
      FlushLanes(*lanes, part.histogram);
      since_flush = 0;
    }
  }
  if (lanes != nullptr) FlushLanes(*lanes, part.histogram);
}

// ---- the worker pool
// -----------------------------------------------------------

// Asked once: glibc answers hardware_concurrency by reading sysfs (an open,
// a read and a close), which cost more than the statistics of a small
// tensor when asked on every call.
int DefaultThreads() {
  static const int threads =
      static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
  return threads;
}

// Workers shared by every call, created on the first call that splits a
// tensor and never destroyed (threads blocked on an empty queue at exit are
// harmless; joining them from a static destructor is not). Each call also
// works on its own parts, so a busy pool slows calls down but never blocks
// them.
ThreadPool& SharedPool() {
  static ThreadPool* pool =
      new ThreadPool(std::max(1, DefaultThreads() - 1), /*max_queue=*/1024);
  return *pool;
}

// The parts of one call. Shared with the pool's tasks, which may start
// after the caller has finished every part; they then find nothing to do
// and never touch `run_`'s captures, which live on the caller's stack.
class PartQueue {
 public:
  PartQueue(int parts, std::function<void(int)> run)
      : parts_(parts), run_(std::move(run)) {}

  // Runs unclaimed parts until none is left.
  void Work() {
    for (;;) {
      const int i = next_.fetch_add(1, std::memory_order_relaxed);
      if (i >= parts_) return;
      run_(i);
      absl::MutexLock lock(&mu_);
      ++done_;
    }
  }

  void WaitUntilAllDone() {
    absl::MutexLock lock(&mu_);
    auto all_done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return done_ == parts_;
    };
    mu_.Await(absl::Condition(&all_done));
  }

 private:
  const int parts_;
  const std::function<void(int)> run_;
  std::atomic<int> next_{0};
  absl::Mutex mu_;
  int done_ ABSL_GUARDED_BY(mu_) = 0;
};

void RunParts(int parts, std::function<void(int)> run) {
  auto queue = std::make_shared<PartQueue>(parts, std::move(run));
  ThreadPool& pool = SharedPool();
  const int helpers = std::min(parts - 1, std::max(1, DefaultThreads() - 1));
  for (int i = 0; i < helpers; ++i) pool.Schedule([queue] { queue->Work(); });
  queue->Work();
  queue->WaitUntilAllDone();
}

// Below this many elements a histogram is counted element by element
// straight into its counters (setting up lanes would cost more).
constexpr uint64_t kSmallHistogram = 256;

}  // namespace

absl::Status CpuAccumulate(StatsAccumulator* stats, HistogramCounts* histogram,
                           const void* data, v1::DType dtype, uint64_t count,
                           const CpuStatsOptions& options) {
  const size_t size = DTypeSize(dtype);
  if (size == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "statistics: unsupported dtype ", static_cast<int>(dtype)));
  }
  if (histogram != nullptr) {
    absl::Status valid = ValidateSpec(histogram->spec);
    if (!valid.ok()) return valid;
    if (histogram->counts.size() != HistogramBinCount(histogram->spec)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "histogram: spec needs ", HistogramBinCount(histogram->spec),
          " counters, got ", histogram->counts.size()));
    }
  }
  if (count == 0 || (stats == nullptr && histogram == nullptr))
    return absl::OkStatus();
  const char* bytes = static_cast<const char*>(data);
  if (histogram != nullptr && count < kSmallHistogram) {
    AccumulateHistogramScalar(*histogram, bytes, dtype, count);
    histogram = nullptr;
    if (stats == nullptr) return absl::OkStatus();
  }

  const CpuBlockKernels& kernels = Kernels(options.force_portable);
  const uint64_t blocks = (count + kCpuStatsBlock - 1) / kCpuStatsBlock;
  const int threads = options.threads > 0 ? options.threads : DefaultThreads();
  uint64_t parts = 1;
  if (threads > 1 && count * size >= options.parallel_min_bytes) {
    parts = std::min<uint64_t>(static_cast<uint64_t>(threads), blocks);
  }
  const uint64_t blocks_per_part = (blocks + parts - 1) / parts;
  parts = (blocks + blocks_per_part - 1) / blocks_per_part;

  std::vector<Part> results(parts);
  const HistogramParams params = histogram != nullptr
                                     ? MakeHistogramParams(histogram->spec)
                                     : HistogramParams();
  auto run = [&](int i) {
    Part& part = results[i];
    if (histogram != nullptr) {
      part.counters.assign((params.count + 1) * kHistogramLanes, 0);
      part.lanes.params = params;
      part.lanes.counters = part.counters.data();
      part.histogram = HistogramCounts::Empty(histogram->spec);
    }
    const uint64_t begin =
        static_cast<uint64_t>(i) * blocks_per_part * kCpuStatsBlock;
    const uint64_t end =
        std::min(count, begin + blocks_per_part * kCpuStatsBlock);
    AccumulateRange(kernels, bytes, dtype, begin, end, stats != nullptr,
                    histogram != nullptr, part);
  };
  if (parts == 1) {
    run(0);
  } else {
    RunParts(static_cast<int>(parts), run);
  }
  // In part order, so the result depends only on the number of parts.
  for (const Part& part : results) {
    if (stats != nullptr) StatsMerge(*stats, part.stats);
    if (histogram != nullptr) {
      absl::Status merged = MergeInto(*histogram, part.histogram);
      if (!merged.ok()) return merged;  // not reached: same spec
    }
  }
  return absl::OkStatus();
}

const char* CpuStatsImplementation() {
  return Kernels(/*force_portable=*/false).name;
}

}  // namespace sonde
