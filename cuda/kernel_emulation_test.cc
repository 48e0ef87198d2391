// Replays the statistics kernels on the CPU with the same host/device
// functions and the same order of operations (each of 256 threads walks its
// part of a chunk with FoldChunkThread, as the kernel does: four 16-byte
// loads, then groups of 16 folded in float or element by element; warp
// folds at offsets 16..1, warps folded in order, then the merge of chunk
// records), and checks the result against the CPU path on every
// conformance case, for aligned and unaligned data. A GPU run then only has to match
// this replay; gpu_check and device_stats_test check that where a GPU exists.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "math/chunk_math.h"
#include "cuda/conformance.h"
#include "cuda/device_stats.h"
#include "math/float16_math.h"
#include "cuda/multi_tensor.h"
#include "math/histogram_math.h"
#include "stats/histogram.h"
#include "stats/statistics.h"
#include "gtest/gtest.h"

namespace sonde {
namespace {

constexpr int kThreads = kChunkThreads;

// Reads a chunk from the case's bytes as the kernel's Source<T> reads device
// memory: 16-byte vectors and single elements, widened to Acc.
template <typename Acc>
struct HostSource {
  struct Raw {
    unsigned char bytes[16];
  };
  const ConformanceCase* c;
  uint64_t begin;  // first element of the chunk
  size_t size;     // bytes per element

  Acc Decode(const unsigned char* p) const {
    switch (c->dtype) {
      case v1::DTYPE_F32: {
        float v;
        std::memcpy(&v, p, 4);
        return static_cast<Acc>(v);
      }
      case v1::DTYPE_F64: {
        double v;
        std::memcpy(&v, p, 8);
        return static_cast<Acc>(v);
      }
      default: {
        uint16_t h;
        std::memcpy(&h, p, 2);
        return static_cast<Acc>(c->dtype == v1::DTYPE_F16 ? SondeHalfToFloat(h)
                                                          : SondeBf16ToFloat(h));
      }
    }
  }
  const unsigned char* AtByte(uint64_t byte) const {
    return reinterpret_cast<const unsigned char*>(c->bytes.data()) + begin * size + byte;
  }
  Raw LoadVector(uint64_t v) const {
    Raw r;
    std::memcpy(r.bytes, AtByte(v * 16), 16);
    return r;
  }
  Acc Unpack(const Raw& r, int k) const { return Decode(r.bytes + k * size); }
  Acc Load(uint64_t i) const { return Decode(AtByte(i * size)); }
  HostSource At(uint64_t i) const { return HostSource{c, begin + i, size}; }
};

// Counts every element the walk hands to `each`, as the kernel's
// HistogramCounting does on the device.
struct HostHistogram {
  HistogramParams params;
  std::vector<uint64_t> counts;
  explicit HostHistogram(const HistogramSpecHD& spec)
      : params(MakeHistogramParams(spec)), counts(params.count, 0) {}
  void operator()(float x) { Count(HistogramBinF32(params, x)); }
  void operator()(double x) { Count(HistogramBinF64(params, x)); }
  void Count(uint32_t bin) {
    if (bin < params.count) ++counts[bin];
  }
};

size_t ElementSize(v1::DType d) {
  return d == v1::DTYPE_F64 ? 8 : d == v1::DTYPE_F32 ? 4 : 2;
}

// `base`: the tensor's address modulo 16 (0 as allocated; the size of an
// element for a view one element in).
template <typename Acc>
StatsAccumulator EmulateChunk(const ConformanceCase& c, const KernelChunk& chunk, uint64_t base,
                              HostHistogram& each) {
  const size_t size = ElementSize(c.dtype);
  const HostSource<Acc> src{&c, chunk.begin, size};
  const double shift = ChunkShift(src.Load(0));
  const uint64_t head = ChunkHead(base + chunk.begin * size, size, chunk.count);
  std::vector<ChunkPartial<Acc>> threads(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads[t].Reset();
    if (size == 8) {
      FoldChunkThread<Acc, 2>(threads[t], src, chunk.count, t, head, shift, each);
    } else if (size == 4) {
      FoldChunkThread<Acc, 4>(threads[t], src, chunk.count, t, head, shift, each);
    } else {
      FoldChunkThread<Acc, 8>(threads[t], src, chunk.count, t, head, shift, each);
    }
  }
  for (int warp = 0; warp < kThreads / 32; ++warp) {
    ChunkPartial<Acc>* lanes = &threads[warp * 32];
    for (int offset = 16; offset > 0; offset >>= 1) {
      for (int lane = 0; lane + offset < 32; ++lane) lanes[lane].Merge(lanes[lane + offset]);
    }
  }
  ChunkPartial<Acc> block = threads[0];
  for (int warp = 1; warp < kThreads / 32; ++warp) block.Merge(threads[warp * 32]);
  return FinishChunk(block, chunk.count, shift);
}

// `base`: the tensor's address modulo 16, as for EmulateChunk.
StatsAccumulator EmulateTensor(const ConformanceCase& c, uint64_t base = 0,
                               uint64_t chunk_elements = kDefaultChunkElements,
                               HostHistogram* histogram = nullptr) {
  HostHistogram unused(DefaultExponentialSpec());
  HostHistogram& each = histogram != nullptr ? *histogram : unused;
  KernelTensor t;
  t.count = c.count;
  t.dtype = static_cast<int32_t>(c.dtype);
  const BatchPlan plan = PlanBatch({t}, chunk_elements, 0);
  std::vector<StatsAccumulator> partials;
  for (const KernelChunk& chunk : plan.chunks) {
    partials.push_back(c.dtype == v1::DTYPE_F64 ? EmulateChunk<double>(c, chunk, base, each)
                                                : EmulateChunk<float>(c, chunk, base, each));
  }
  const uint32_t chunks = plan.tensors[0].chunk_count;
  std::vector<StatsAccumulator> acc(kMergeThreads);
  for (uint32_t th = 0; th < kMergeThreads; ++th) {
    for (uint32_t i = th; i < chunks; i += kMergeThreads) StatsMerge(acc[th], partials[i]);
  }
  for (int stride = kMergeThreads / 2; stride > 0; stride >>= 1) {
    for (int th = 0; th < stride; ++th) StatsMerge(acc[th], acc[th + stride]);
  }
  return acc[0];
}

TEST(KernelEmulationTest, MatchesTheCpuPathOnEveryConformanceCase) {
  const std::vector<ConformanceCase> cases = ConformanceCases();
  ASSERT_GT(cases.size(), 40u);
  for (const ConformanceCase& c : cases) {
    StatsAccumulator cpu;
    AccumulateStatistics(cpu, c.bytes.data(), c.dtype, c.count);
    const StatsAccumulator emulated = EmulateTensor(c);
    const absl::Status same = CompareRecords(emulated, cpu, c.dtype);
    EXPECT_TRUE(same.ok()) << c.name << ": " << same;
  }
}

TEST(KernelEmulationTest, ViewsAtAnOffsetMatchToo) {
  // One element in (a view): a few elements one at a time up to the first
  // 16-byte boundary, vectors after it. One byte in (no tensor is, but the
  // kernel must not read vectors there): every element one at a time.
  for (const ConformanceCase& c : ConformanceCases()) {
    if (c.count < 1000) continue;
    StatsAccumulator cpu;
    AccumulateStatistics(cpu, c.bytes.data(), c.dtype, c.count);
    for (const uint64_t base : {uint64_t{ElementSize(c.dtype)}, uint64_t{1}}) {
      const absl::Status same = CompareRecords(EmulateTensor(c, base), cpu, c.dtype);
      EXPECT_TRUE(same.ok()) << c.name << " at +" << base << ": " << same;
    }
  }
}

TEST(ChunkHeadTest, ElementsUpToTheFirst16ByteBoundary) {
  EXPECT_EQ(ChunkHead(4096, 4, 100), 0u);
  EXPECT_EQ(ChunkHead(4100, 4, 100), 3u);  // 4100, 4104, 4108, then 4112
  EXPECT_EQ(ChunkHead(4098, 2, 100), 7u);
  EXPECT_EQ(ChunkHead(4104, 8, 100), 1u);
  EXPECT_EQ(ChunkHead(4100, 4, 2), 2u);    // a chunk shorter than its head
  EXPECT_EQ(ChunkHead(4097, 4, 100), 100u);  // not even element-aligned
}

TEST(KernelEmulationTest, OddChunkSizesMixVectorAndScalarChunks) {
  // 1001-element chunks start at every offset from a 16-byte line that
  // the dtype allows, each with its own head of single elements.
  for (const ConformanceCase& c : ConformanceCases()) {
    if (c.count < 60000 || c.count > 400000) continue;
    StatsAccumulator cpu;
    AccumulateStatistics(cpu, c.bytes.data(), c.dtype, c.count);
    const absl::Status same = CompareRecords(EmulateTensor(c, 0, 1001), cpu, c.dtype);
    EXPECT_TRUE(same.ok()) << c.name << ": " << same;
  }
}

TEST(KernelEmulationTest, EveryElementReachesTheHistogramOnce) {
  // As allocated and one element in (a head of single elements, vectors,
  // a tail), for both histogram kinds: the counts equal the CPU path's.
  HistogramSpecHD fixed;
  fixed.kind = kHistogramFixed;
  fixed.lo = -3;
  fixed.hi = 3;
  fixed.bins = 61;
  for (const HistogramSpecHD& spec : {DefaultExponentialSpec(), fixed}) {
    for (const ConformanceCase& c : ConformanceCases()) {
      for (const uint64_t base : {uint64_t{0}, uint64_t{ElementSize(c.dtype)}}) {
        HostHistogram emulated(spec);
        EmulateTensor(c, base, kDefaultChunkElements, &emulated);
        HistogramCounts cpu = HistogramCounts::Empty(spec);
        AccumulateHistogramScalar(cpu, c.bytes.data(), c.dtype, c.count);
        EXPECT_EQ(emulated.counts, cpu.counts) << c.name << " at +" << base;
      }
    }
  }
}

TEST(AddGroupTest, OrdinaryGroupsFoldInFloatAndTheRestElementByElement) {
  auto folds_in_float = [](std::vector<float> v) {
    float x[kGroup];
    for (int i = 0; i < kGroup; ++i) x[i] = v[i % v.size()];
    ChunkPartial<float> s;
    s.Reset();
    return AddGroup(s, x, 0.0);
  };
  EXPECT_TRUE(folds_in_float({0.5f, -1.25f, 3.0f, 1e-3f}));
  EXPECT_TRUE(folds_in_float({0.0f}));             // all zero
  EXPECT_TRUE(folds_in_float({0.3f}));             // all equal
  EXPECT_TRUE(folds_in_float({1e4f, 1e4f + 1e-3f}));  // large offset
  EXPECT_TRUE(folds_in_float({1e17f, -2.5f, 0.0f}));
  EXPECT_FALSE(folds_in_float({1.0f, NAN}));
  EXPECT_FALSE(folds_in_float({1.0f, INFINITY}));
  EXPECT_FALSE(folds_in_float({3e38f, 1.0f}));     // squares overflow float
  EXPECT_FALSE(folds_in_float({1e-25f, -2e-25f}));  // squares underflow float
  EXPECT_FALSE(folds_in_float({1e-40f, 0.0f}));    // denormals
}

TEST(AddGroupTest, FloatAndElementFoldsAgree) {
  // The same groups through both paths give the same record within the
  // conformance tolerances, for data far from the shift and near it.
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (double offset : {0.0, 1e4, -3e6}) {
    for (double shift_from : {0.0, 1.0}) {
      ChunkPartial<float> fast;
      ChunkPartial<float> slow;
      fast.Reset();
      slow.Reset();
      const double shift = shift_from == 0.0 ? 0.0 : static_cast<float>(offset + 5.0);
      uint64_t n = 0;
      for (int g = 0; g < 200; ++g) {
        float x[kGroup];
        for (float& v : x) v = static_cast<float>(offset + normal(rng));
        ASSERT_TRUE(AddGroup(fast, x, shift));
        for (float v : x) slow.Add(v, shift);
        n += kGroup;
      }
      const StatsAccumulator a = FinishChunk(fast, n, shift);
      const StatsAccumulator b = FinishChunk(slow, n, shift);
      const absl::Status same = CompareRecords(a, b, v1::DTYPE_F32);
      EXPECT_TRUE(same.ok()) << "offset " << offset << " shift " << shift << ": " << same;
    }
  }
}

TEST(KernelEmulationTest, ShiftKeepsVarianceOfLargeOffsetDataAccurate) {
  // 1e6 + small noise in F64: a naive E[x^2] - E[x]^2 would lose every digit.
  ConformanceCase c{"offset", v1::DTYPE_F64, 200000, {}};
  double sum = 0;
  std::vector<double> v;
  for (uint64_t i = 0; i < c.count; ++i) {
    v.push_back(1e6 + ((i * 7919) % 1000) * 1e-6);
    sum += v.back();
  }
  c.bytes.assign(reinterpret_cast<const char*>(v.data()), v.size() * 8);
  const double mean = sum / c.count;
  double m2 = 0;
  for (double x : v) m2 += (x - mean) * (x - mean);
  const StatsAccumulator emulated = EmulateTensor(c);
  EXPECT_NEAR(emulated.m2, m2, 1e-6 * m2);
}

TEST(MultiTensorPlanTest, ChunksTileEveryTensorInOrder) {
  std::vector<KernelTensor> tensors(5);
  const uint64_t counts[] = {0, 1, 100, 65536, 65537 * 3};
  for (int i = 0; i < 5; ++i) {
    tensors[i].count = counts[i];
    tensors[i].histogram = i % 2;
  }
  const BatchPlan plan = PlanBatch(tensors, 65536, 515);
  uint32_t next_chunk = 0;
  uint64_t hist = 0;
  for (uint32_t t = 0; t < 5; ++t) {
    const KernelTensor& k = plan.tensors[t];
    EXPECT_EQ(k.first_chunk, next_chunk);
    uint64_t covered = 0;
    for (uint32_t c = k.first_chunk; c < k.first_chunk + k.chunk_count; ++c) {
      EXPECT_EQ(plan.chunks[c].tensor, t);
      EXPECT_EQ(plan.chunks[c].begin, covered);
      EXPECT_GT(plan.chunks[c].count, 0u);
      EXPECT_LE(plan.chunks[c].count, 65536u);
      covered += plan.chunks[c].count;
    }
    EXPECT_EQ(covered, counts[t]);
    next_chunk += k.chunk_count;
    if (k.histogram) {
      EXPECT_EQ(k.hist_offset, hist);
      hist += 515;
    }
  }
  EXPECT_EQ(plan.chunks.size(), next_chunk);
  EXPECT_EQ(plan.histogram_counters, hist);
  EXPECT_EQ(plan.tensors[0].chunk_count, 0u);
  EXPECT_EQ(plan.tensors[4].chunk_count, 4u);
}

TEST(MultiTensorPlanTest, LargeTensorsGetLargerChunksNotMoreThanTheCap) {
  std::vector<KernelTensor> tensors(3);
  tensors[0].count = kDefaultChunkElements * kMaxChunksPerTensor;      // exactly the cap
  tensors[1].count = kDefaultChunkElements * kMaxChunksPerTensor + 1;  // one over
  tensors[2].count = uint64_t{1} << 28;                                // 1 GiB of F32
  const BatchPlan plan = PlanBatch(tensors, kDefaultChunkElements, 0);
  EXPECT_EQ(plan.tensors[0].chunk_count, kMaxChunksPerTensor);
  EXPECT_EQ(plan.chunks[0].count, kDefaultChunkElements);
  EXPECT_LE(plan.tensors[1].chunk_count, kMaxChunksPerTensor);
  EXPECT_EQ(plan.chunks[plan.tensors[1].first_chunk].count, 2 * kDefaultChunkElements);
  EXPECT_EQ(plan.tensors[2].chunk_count, kMaxChunksPerTensor);
  EXPECT_EQ(plan.chunks[plan.tensors[2].first_chunk].count, uint64_t{1} << 17);
  DeviceStatsOptions options;
  EXPECT_EQ(options.chunk_elements, kDefaultChunkElements);  // one default, two spellings
  for (const KernelTensor& t : plan.tensors) EXPECT_EQ(StatsChunks(t.count, options), t.chunk_count);
}

}  // namespace
}  // namespace sonde
