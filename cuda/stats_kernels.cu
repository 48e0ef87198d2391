// The fused statistics kernels. Each block reads one chunk once, with
// 16-byte loads, four in flight per thread (FoldChunkThread in
// math/chunk_math.h, which the CPU replay shares): counts, NaN-skipping
// extremes in the element's precision, and the chunk's sums shifted by its
// first finite element K (s1 = sum(x-K), s2 = sum((x-K)^2), so the chunk's
// m2 = s2 - s1^2/n is free of cancellation), with histogram counts in
// shared memory. F32/F16/BF16 elements are folded in float 16 at a time
// (exact per-group two-pass, then widened to double once a group), so the
// per-element work is float; groups holding NaN/Inf, or values whose
// squares would overflow or underflow float, and all F64 data, are folded
// element by element in double. At most 64 registers a thread (4 blocks of
// 256 per SM).
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "math/chunk_math.h"
#include "math/float16_math.h"
#include "math/histogram_math.h"
#include "cuda/multi_tensor.h"
#include "cuda/stats_kernels.h"
#include "math/stats_math.h"

namespace sonde {
namespace {

constexpr int kThreads = kChunkThreads;
constexpr int kWarps = kThreads / 32;
// Blocks of the partials kernel resident per SM that the register budget
// must allow. Hopper: 4 x 256 threads, so at most 64 registers a thread,
// which ptxas meets without spilling; with four 16-byte loads in flight per
// thread that is 64 KiB in flight per SM. Earlier architectures spill 40
// bytes at 64 registers, so 3 blocks (80 registers, no spill).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr int kPartialsBlocksPerSm = 3;
#else
constexpr int kPartialsBlocksPerSm = 4;
#endif
// Shared histogram counters: 44 KiB of u32, leaving the kernel's static
// shared memory (about 2 KiB) within the default 48 KiB a block.
constexpr uint32_t kMaxSharedCounters = 11 * 1024;

// How the kernel reads each dtype: Raw is 16 bytes (one vector load);
// Unpack widens the k-th element of a vector, Load one element by index.
// F16 widens with the hardware conversion (exact, as SondeHalfToFloat).
__device__ inline float HalfBitsToFloat(uint32_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(static_cast<unsigned short>(h)));
  return f;
}

template <typename T>
struct Source;
template <>
struct Source<float> {
  using Acc = float;
  static constexpr int kPerVector = 4;
  using Raw = uint4;
  const float* p;
  __device__ Raw LoadVector(uint64_t v) const { return __ldg(reinterpret_cast<const uint4*>(p) + v); }
  __device__ float Unpack(const Raw& r, int k) const {
    return __uint_as_float(k == 0 ? r.x : k == 1 ? r.y : k == 2 ? r.z : r.w);
  }
  __device__ float Load(uint64_t i) const { return __ldg(p + i); }
  __device__ Source At(uint64_t i) const { return Source{p + i}; }
};
template <>
struct Source<double> {
  using Acc = double;
  static constexpr int kPerVector = 2;
  using Raw = double2;
  const double* p;
  __device__ Raw LoadVector(uint64_t v) const { return __ldg(reinterpret_cast<const double2*>(p) + v); }
  __device__ double Unpack(const Raw& r, int k) const { return k == 0 ? r.x : r.y; }
  __device__ double Load(uint64_t i) const { return __ldg(p + i); }
  __device__ Source At(uint64_t i) const { return Source{p + i}; }
};
struct Half {};
struct BFloat {};
__device__ inline uint32_t Word(const uint4& r, int k) {
  return k == 0 ? r.x : k == 1 ? r.y : k == 2 ? r.z : r.w;
}
// F16 and BF16: eight 16-bit elements a vector, widened by Widen.
template <typename Format>
struct Source16 {
  using Acc = float;
  static constexpr int kPerVector = 8;
  using Raw = uint4;
  const uint16_t* p;
  __device__ Raw LoadVector(uint64_t v) const { return __ldg(reinterpret_cast<const uint4*>(p) + v); }
  __device__ float Unpack(const Raw& r, int k) const {
    const uint32_t w = Word(r, k / 2);
    return Format::Widen(k % 2 == 0 ? (w & 0xffffu) : (w >> 16));
  }
  __device__ float Load(uint64_t i) const { return Format::Widen(__ldg(p + i)); }
  __device__ Source16 At(uint64_t i) const { return Source16{p + i}; }
};
struct HalfFormat {
  __device__ static float Widen(uint32_t bits) { return HalfBitsToFloat(bits); }
};
struct BFloatFormat {
  __device__ static float Widen(uint32_t bits) { return __uint_as_float(bits << 16); }
};
// The source type of each element type.
template <typename T>
struct SourceOf {
  using type = Source<T>;
};
template <>
struct SourceOf<Half> {
  using type = Source16<HalfFormat>;
};
template <>
struct SourceOf<BFloat> {
  using type = Source16<BFloatFormat>;
};

__device__ inline uint32_t Bin(const HistogramParams& p, float x) { return HistogramBinF32(p, x); }
__device__ inline uint32_t Bin(const HistogramParams& p, double x) { return HistogramBinF64(p, x); }

template <typename T>
__device__ T ShflDown(T v, int offset) {
  return __shfl_down_sync(0xffffffffu, v, offset);
}

// The warp's partials folded into lane 0, in the order the CPU emulation
// (KernelEmulation in the tests) replays: offsets 16, 8, 4, 2, 1.
template <typename Acc>
__device__ void WarpReduce(ChunkPartial<Acc>& s) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    ChunkPartial<Acc> o;
    o.nan = ShflDown(s.nan, offset);
    o.pos_inf = ShflDown(s.pos_inf, offset);
    o.neg_inf = ShflDown(s.neg_inf, offset);
    o.zero = ShflDown(s.zero, offset);
    o.mn = ShflDown(s.mn, offset);
    o.mx = ShflDown(s.mx, offset);
    o.amn = ShflDown(s.amn, offset);
    o.amx = ShflDown(s.amx, offset);
    o.s1 = ShflDown(s.s1, offset);
    o.s2 = ShflDown(s.s2, offset);
    o.l1 = ShflDown(s.l1, offset);
    o.sq = ShflDown(s.sq, offset);
    s.Merge(o);
  }
}

// Histogram counts of every element a thread folds: shared-memory counters
// when the spec fits, else the batch's global ones. kAggregate: the lanes of
// a warp that fall in the same bin add once, by their first lane (one
// atomic per distinct bin instead of conflicting ones; data with many equal
// bins, zeros after a ReLU, gains most), at the cost of a match per element.
template <bool kAggregate>
struct HistogramCounting {
  const HistogramParams* hp;
  uint32_t* shared_counters;
  unsigned long long* counters;
  uint64_t offset;
  template <typename Acc>
  __device__ void operator()(Acc x) const {
    const uint32_t bin = Bin(*hp, x);
    uint32_t add = 1;
    if (kAggregate) {
      const unsigned peers = __match_any_sync(__activemask(), bin);
      if ((threadIdx.x & 31u) != static_cast<unsigned>(__ffs(peers) - 1)) return;
      add = static_cast<uint32_t>(__popc(peers));
    }
    if (bin >= hp->count) return;
    if (shared_counters != nullptr) {
      atomicAdd(&shared_counters[bin], add);
    } else {
      atomicAdd(&counters[offset + bin], static_cast<unsigned long long>(add));
    }
  }
};

struct NoHistogram {
  template <typename Acc>
  __device__ void operator()(Acc) const {}
};

template <typename T>
__device__ void ChunkStats(const KernelTensor& t, const KernelChunk& c, const HistogramParams& hp,
                           int histogram_mode, uint32_t* shared_counters,
                           unsigned long long* counters, StatsAccumulator* partial) {
  using S = typename SourceOf<T>::type;
  using Acc = typename S::Acc;
  using Element = std::remove_const_t<std::remove_pointer_t<decltype(S::p)>>;
  const S src{static_cast<const Element*>(t.data) + c.begin};
  ChunkPartial<Acc> s;
  s.Reset();
  const double shift = ChunkShift(src.Load(0));
  const uint64_t head =
      ChunkHead(reinterpret_cast<uintptr_t>(src.p), sizeof(Element), c.count);
  // Two instantiations, so that a tensor without a histogram pays nothing
  // per element for it.
  if (t.histogram != 0 && hp.count > 0 && histogram_mode == kHistogramWarpAggregated) {
    HistogramCounting<true> each{&hp, shared_counters, counters, t.hist_offset};
    FoldChunkThread<Acc, S::kPerVector>(s, src, c.count, threadIdx.x, head, shift, each);
  } else if (t.histogram != 0 && hp.count > 0) {
    HistogramCounting<false> each{&hp, shared_counters, counters, t.hist_offset};
    FoldChunkThread<Acc, S::kPerVector>(s, src, c.count, threadIdx.x, head, shift, each);
  } else {
    NoHistogram each;
    FoldChunkThread<Acc, S::kPerVector>(s, src, c.count, threadIdx.x, head, shift, each);
  }

  WarpReduce(s);
  __shared__ ChunkPartial<Acc> warp_partials[kWarps];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) warp_partials[warp] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    ChunkPartial<Acc> b = warp_partials[0];
    for (int w = 1; w < kWarps; ++w) b.Merge(warp_partials[w]);
    *partial = FinishChunk(b, c.count, shift);
  }
}

__global__ void __launch_bounds__(kThreads, kPartialsBlocksPerSm)
    StatsPartialsKernel(const KernelTensor* tensors, const KernelChunk* chunks,
                        HistogramParams hp, int histogram_mode, StatsAccumulator* partials,
                        unsigned long long* counters, int shared_hist) {
  extern __shared__ uint32_t shared_counters[];
  const KernelChunk c = chunks[blockIdx.x];
  const KernelTensor t = tensors[c.tensor];
  const bool hist = t.histogram != 0 && hp.count > 0;
  uint32_t* local = (hist && shared_hist) ? shared_counters : nullptr;
  if (local != nullptr) {
    for (uint32_t i = threadIdx.x; i < hp.count; i += kThreads) local[i] = 0;
    __syncthreads();
  }
  switch (t.dtype) {
    case kKernelF32: ChunkStats<float>(t, c, hp, histogram_mode, local, counters, &partials[blockIdx.x]); break;
    case kKernelF64: ChunkStats<double>(t, c, hp, histogram_mode, local, counters, &partials[blockIdx.x]); break;
    case kKernelF16: ChunkStats<Half>(t, c, hp, histogram_mode, local, counters, &partials[blockIdx.x]); break;
    case kKernelBF16: ChunkStats<BFloat>(t, c, hp, histogram_mode, local, counters, &partials[blockIdx.x]); break;
    default: break;
  }
  if (local != nullptr) {
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < hp.count; i += kThreads) {
      if (local[i] != 0) atomicAdd(&counters[t.hist_offset + i], static_cast<unsigned long long>(local[i]));
    }
  }
}

__global__ void __launch_bounds__(kMergeThreads)
    StatsMergeKernel(const KernelTensor* tensors, const StatsAccumulator* partials,
                     StatsAccumulator* out) {
  // StatsAccumulator has default member initializers, which shared memory
  // cannot run: raw storage, each slot assigned before it is read.
  __shared__ alignas(StatsAccumulator) unsigned char storage[kMergeThreads * sizeof(StatsAccumulator)];
  StatsAccumulator* acc = reinterpret_cast<StatsAccumulator*>(storage);
  static_assert(sizeof(StatsAccumulator) % sizeof(uint64_t) == 0, "records are whole words");
  constexpr uint32_t kWords = sizeof(StatsAccumulator) / sizeof(uint64_t);
  const KernelTensor t = tensors[blockIdx.x];
  // The records come through shared memory a tile of kMergeThreads at a
  // time, read as coalesced words with every load of a thread in flight
  // before any is stored (on the GPU of 2026-11-28 each thread merged its
  // run one dependent load after another: 20 us for 1,024 records). Thread
  // i merges records i, i + kMergeThreads, ..., then a fixed tree merges
  // the threads': the same order every time, so the same input gives the
  // same bits (kernel_emulation_test replays it).
  const uint64_t* src = reinterpret_cast<const uint64_t*>(partials + t.first_chunk);
  uint64_t* tile = reinterpret_cast<uint64_t*>(storage);
  StatsAccumulator mine;
  for (uint32_t base = 0; base < t.chunk_count; base += kMergeThreads) {
    const uint32_t n = min(static_cast<uint32_t>(kMergeThreads), t.chunk_count - base);
    const uint32_t words = n * kWords;
    const uint64_t* from = src + static_cast<uint64_t>(base) * kWords;
    uint64_t w[kWords];
#pragma unroll
    for (uint32_t k = 0; k < kWords; ++k) {
      const uint32_t i = threadIdx.x + k * kMergeThreads;
      w[k] = i < words ? __ldg(from + i) : 0;
    }
#pragma unroll
    for (uint32_t k = 0; k < kWords; ++k) {
      const uint32_t i = threadIdx.x + k * kMergeThreads;
      if (i < words) tile[i] = w[k];
    }
    __syncthreads();
    if (threadIdx.x < n) StatsMerge(mine, acc[threadIdx.x]);
    __syncthreads();
  }
  acc[threadIdx.x] = mine;
  __syncthreads();
  for (int stride = kMergeThreads / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) StatsMerge(acc[threadIdx.x], acc[threadIdx.x + stride]);
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = acc[0];
}

// `words` words of W from src to dst, grid-stride, four loads in flight a
// thread; then the `tail` bytes after them, by the first thread.
template <typename W>
__global__ void CopyKernel(const W* src, W* dst, uint64_t words, const uint8_t* tail_src,
                           uint8_t* tail_dst, uint32_t tail) {
  const uint64_t threads = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  const uint64_t first = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  uint64_t i = first;
  for (; i + 3 * threads < words; i += 4 * threads) {
    W v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = src[i + k * threads];
#pragma unroll
    for (int k = 0; k < 4; ++k) dst[i + k * threads] = v[k];
  }
  for (; i < words; i += threads) dst[i] = src[i];
  if (first == 0) {
    for (uint32_t b = 0; b < tail; ++b) tail_dst[b] = tail_src[b];
  }
}

template <typename W>
int LaunchCopyAs(const void* src, void* dst, uint64_t bytes, cudaStream_t stream) {
  const uint64_t words = bytes / sizeof(W);
  const uint64_t done = words * sizeof(W);
  const uint64_t blocks64 = (words / 4 + 255) / 256 + 1;
  const unsigned blocks = static_cast<unsigned>(blocks64 < 8192 ? blocks64 : 8192);
  CopyKernel<W><<<blocks, 256, 0, stream>>>(
      static_cast<const W*>(src), static_cast<W*>(dst), words,
      static_cast<const uint8_t*>(src) + done, static_cast<uint8_t*>(dst) + done,
      static_cast<uint32_t>(bytes - done));
  return static_cast<int>(cudaGetLastError());
}

template <typename Src>
__device__ float LoadAsFloat(const void* p, uint64_t i) {
  return static_cast<float>(static_cast<const Src*>(p)[i]);
}

__global__ void ConvertKernel(const void* src, int32_t src_dtype, void* dst, int32_t dst_dtype,
                              uint64_t count) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < count;
       i += stride) {
    const float v = src_dtype == kKernelF64 ? LoadAsFloat<double>(src, i) : LoadAsFloat<float>(src, i);
    if (dst_dtype == kKernelF16) {
      static_cast<uint16_t*>(dst)[i] = SondeFloatToHalf(v);
    } else if (dst_dtype == kKernelBF16) {
      static_cast<uint16_t*>(dst)[i] = SondeFloatToBf16(v);
    } else {
      static_cast<float*>(dst)[i] = v;
    }
  }
}

}  // namespace

int LaunchStatsBatch(const KernelTensor* tensors, uint32_t tensor_count,
                     const KernelChunk* chunks, uint32_t chunk_count,
                     const HistogramParams& histogram, int histogram_mode,
                     StatsAccumulator* partials, unsigned long long* counters,
                     StatsAccumulator* out, void* stream) {
  if (tensor_count == 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (chunk_count > 0) {
    const int shared_hist = histogram.count > 0 && histogram.count <= kMaxSharedCounters;
    const size_t shared_bytes = shared_hist ? histogram.count * sizeof(uint32_t) : 0;
    StatsPartialsKernel<<<chunk_count, kThreads, shared_bytes, s>>>(
        tensors, chunks, histogram, histogram_mode, partials, counters, shared_hist);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return static_cast<int>(e);
  }
  StatsMergeKernel<<<tensor_count, kMergeThreads, 0, s>>>(tensors, partials, out);
  return static_cast<int>(cudaGetLastError());
}

int QueryStatsKernel(StatsKernelInfo* info) {
  cudaFuncAttributes attributes;
  cudaError_t e = cudaFuncGetAttributes(&attributes, StatsPartialsKernel);
  if (e != cudaSuccess) return static_cast<int>(e);
  info->registers = attributes.numRegs;
  info->threads = kThreads;
  // Without a histogram's shared memory (the default spec's 515 counters
  // add 2 KiB a block, which does not limit residency).
  e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&info->blocks_per_sm, StatsPartialsKernel,
                                                     kThreads, 0);
  return static_cast<int>(e);
}

int LaunchCopy(const void* src, void* dst, uint64_t bytes, void* stream) {
  if (bytes == 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const uintptr_t both = reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst);
  if (both % 16 == 0) return LaunchCopyAs<uint4>(src, dst, bytes, s);
  if (both % 4 == 0) return LaunchCopyAs<uint32_t>(src, dst, bytes, s);
  if (both % 2 == 0) return LaunchCopyAs<uint16_t>(src, dst, bytes, s);  // F16/BF16 views
  return LaunchCopyAs<uint8_t>(src, dst, bytes, s);
}

int LaunchConvert(const void* src, int32_t src_dtype, void* dst, int32_t dst_dtype,
                  uint64_t count, void* stream) {
  if (count == 0) return 0;
  const uint64_t blocks64 = (count + 255) / 256;
  const unsigned blocks = static_cast<unsigned>(blocks64 < 65535 ? blocks64 : 65535);
  ConvertKernel<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(src, src_dtype, dst,
                                                                      dst_dtype, count);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace sonde
