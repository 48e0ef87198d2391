// Replays the statistics kernels on the CPU with the same host/device
// functions and the same order of operations (256 threads per chunk taking
// every 256th element, warp folds at offsets 16..1, warps folded in order,
// then the 64-thread merge of chunk records), and checks the result against
// the CPU path on every conformance case. A GPU run then only has to match
// this replay; gpu_check and device_stats_test check that where a GPU exists.
#include <cstring>
#include <vector>

#include "math/chunk_math.h"
#include "cuda/conformance.h"
#include "math/float16_math.h"
#include "cuda/multi_tensor.h"
#include "stats/statistics.h"
#include "gtest/gtest.h"

namespace sonde {
namespace {

constexpr int kThreads = 256;
constexpr int kMergeThreads = 64;

template <typename Acc>
Acc LoadElement(const ConformanceCase& c, uint64_t i) {
  switch (c.dtype) {
    case v1::DTYPE_F32: {
      float v;
      std::memcpy(&v, c.bytes.data() + 4 * i, 4);
      return static_cast<Acc>(v);
    }
    case v1::DTYPE_F64: {
      double v;
      std::memcpy(&v, c.bytes.data() + 8 * i, 8);
      return static_cast<Acc>(v);
    }
    default: {
      uint16_t h;
      std::memcpy(&h, c.bytes.data() + 2 * i, 2);
      return static_cast<Acc>(c.dtype == v1::DTYPE_F16 ? SondeHalfToFloat(h) : SondeBf16ToFloat(h));
    }
  }
}

template <typename Acc>
StatsAccumulator EmulateChunk(const ConformanceCase& c, const KernelChunk& chunk) {
  const double shift = ChunkShift(LoadElement<Acc>(c, chunk.begin));
  std::vector<ChunkPartial<Acc>> threads(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads[t].Reset();
    for (uint64_t i = t; i < chunk.count; i += kThreads) {
      threads[t].Add(LoadElement<Acc>(c, chunk.begin + i), shift);
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

StatsAccumulator EmulateTensor(const ConformanceCase& c) {
  const int32_t kernel_dtype = static_cast<int32_t>(c.dtype);
  KernelTensor t;
  t.count = c.count;
  t.dtype = kernel_dtype;
  const BatchPlan plan = PlanBatch({t}, kDefaultChunkElements, 0);
  std::vector<StatsAccumulator> partials;
  for (const KernelChunk& chunk : plan.chunks) {
    partials.push_back(c.dtype == v1::DTYPE_F64 ? EmulateChunk<double>(c, chunk)
                                                : EmulateChunk<float>(c, chunk));
  }
  const uint32_t chunks = plan.tensors[0].chunk_count;
  const uint32_t per = (chunks + kMergeThreads - 1) / kMergeThreads;
  std::vector<StatsAccumulator> acc(kMergeThreads);
  for (uint32_t th = 0; th < kMergeThreads; ++th) {
    for (uint32_t i = th * per; i < th * per + per && i < chunks; ++i) StatsMerge(acc[th], partials[i]);
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

}  // namespace
}  // namespace sonde
