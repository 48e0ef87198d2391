// The hook's device path and histograms, end to end through a real
// collector: device tensors where no GPU is usable are refused with a clear
// status while training and host tensors go on; histograms of collections
// with save_histogram arrive, merge-ready, equal to the CPU reference; and,
// where a GPU exists, device tensors are stored with the same statistics
// and values as the CPU computes (skipped here otherwise).
#include <cstring>
#include <string>
#include <vector>

#include "client/hook.h"
#include "client/query_client.h"
#include "cuda/conformance.h"
#include "cuda/device_stats.h"
#include "stats/histogram.h"
#include "stats/statistics.h"
#include "gtest/gtest.h"
#include "tests/testing/in_process_collector.h"
#include "tests/testing/status_matchers.h"

#ifdef SONDE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace sonde {
namespace {

using ::sonde::testing::InProcessCollector;

HookOptions Options(const std::string& address, const std::string& job) {
  HookOptions o;
  o.collector = address;
  o.job = job;
  o.config.save_config = SaveConfig::Every(1);
  o.config.include_collections = {"weights", "biases", "gradients", "losses"};
  CollectionConfig weights;
  weights.name = "weights";
  weights.save_histogram = true;
  o.config.collections.push_back(weights);
  o.close_timeout = absl::Seconds(20);
  return o;
}

std::vector<float> Values(size_t n, float offset) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = offset + 0.001f * static_cast<float>(i % 977) - 0.4f;
  v[n / 2] = std::numeric_limits<float>::quiet_NaN();
  v[n / 3] = -std::numeric_limits<float>::infinity();
  return v;
}

TEST(DevicePath, DeviceTensorsWithoutAGpuAreRefusedAndTrainingGoesOn) {
  if (DeviceStats::Probe(0).ok()) GTEST_SKIP() << "a GPU is present; this case is for machines without";
  InProcessCollector collector("");
  auto hook = Hook::Create(Options(collector.address(), "nogpu"));
  SONDE_ASSERT_OK(hook);
  std::vector<float> w = Values(1000, 0);
  for (int step = 0; step < 3; ++step) {
    (*hook)->StartStep();
    // A pointer that is not device memory: the hook must not touch it.
    const absl::Status s = (*hook)->SaveTensor(
        "fc.weight", CudaTensor(w.data(), v1::DTYPE_F32, {1000}, 0, nullptr));
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_NE(std::string(s.message()).find("CPU"), std::string::npos) << s;
    // Integer device tensors are refused before any device work.
    const absl::Status ints = (*hook)->SaveTensor(
        "fc.index", CudaTensor(w.data(), v1::DTYPE_I32, {1000}, 0, nullptr));
    EXPECT_EQ(ints.code(), absl::StatusCode::kInvalidArgument) << ints;
    EXPECT_NE(std::string(ints.message()).find("F32, F16, BF16 or F64"), std::string::npos) << ints;
    SONDE_EXPECT_OK((*hook)->SaveTensor("fc.bias", HostTensor(w.data(), {1000})));
    SONDE_EXPECT_OK((*hook)->SaveScalar("CrossEntropyLoss_output_0", 1.0 / (step + 1)));
    (*hook)->EndStep();
  }
  SONDE_ASSERT_OK((*hook)->Close());
  // Refused is not silent: each device tensor is counted and shown as a gap.
  EXPECT_EQ((*hook)->counters().tensors_dropped, 3u);
  auto q = QueryClient::Connect(collector.address());
  auto tensors = q->ListTensors("nogpu");
  SONDE_ASSERT_OK(tensors);
  std::vector<std::string> names;
  for (const auto& t : *tensors) names.push_back(t.name());
  EXPECT_EQ(std::count(names.begin(), names.end(), "fc.weight"), 0);
  EXPECT_EQ(std::count(names.begin(), names.end(), "fc.bias"), 1);
  auto steps = q->ListSteps("nogpu");
  SONDE_ASSERT_OK(steps);
  ASSERT_EQ(steps->size(), 3u);
  for (const v1::StepInfo& s : *steps) {
    EXPECT_EQ(s.tensors_dropped(), 1u);
    EXPECT_FALSE(s.complete());
  }
}

TEST(DevicePath, HistogramsOfSaveHistogramCollectionsMatchTheCpuReference) {
  InProcessCollector collector("");
  auto hook = Hook::Create(Options(collector.address(), "hist"));
  SONDE_ASSERT_OK(hook);
  std::vector<std::vector<float>> saved;
  for (int step = 0; step < 3; ++step) {
    (*hook)->StartStep();
    saved.push_back(Values(5000, step * 10.0f));
    SONDE_EXPECT_OK((*hook)->SaveTensor("fc.weight", HostTensor(saved.back().data(), {50, 100})));
    SONDE_EXPECT_OK((*hook)->SaveTensor("gradient/fc.weight",
                                        HostTensor(saved.back().data(), {50, 100})));
    (*hook)->EndStep();
  }
  SONDE_ASSERT_OK((*hook)->Close());
  auto q = QueryClient::Connect(collector.address());
  auto series = q->ReadSeries("hist", "fc.weight");
  SONDE_ASSERT_OK(series);
  ASSERT_EQ(series->size(), 3u);
  for (size_t step = 0; step < 3; ++step) {
    const v1::SeriesPoint& p = (*series)[step];
    ASSERT_TRUE(p.has_histogram()) << "step " << step;
    HistogramCounts want = HistogramCounts::Empty(DefaultExponentialSpec());
    AccumulateHistogramScalar(want, saved[step].data(), v1::DTYPE_F32, saved[step].size());
    auto got = FromProto(p.histogram());
    SONDE_ASSERT_OK(got);
    EXPECT_EQ(got->counts, want.counts);
    EXPECT_EQ(got->nan_count, 1u);
    EXPECT_EQ(got->neg_inf_count, 1u);
    EXPECT_EQ(got->finite_total(), p.statistics().finite_count());
  }
  // Histograms from different steps merge exactly.
  auto a = FromProto((*series)[0].histogram());
  auto b = FromProto((*series)[1].histogram());
  SONDE_ASSERT_OK(a);
  SONDE_ASSERT_OK(b);
  SONDE_EXPECT_OK(MergeInto(*a, *b));
  EXPECT_EQ(a->finite_total(), 2 * (5000u - 2));
  // Only collections that ask get histograms.
  auto gradients = q->ReadSeries("hist", "gradient/fc.weight");
  SONDE_ASSERT_OK(gradients);
  ASSERT_FALSE(gradients->empty());
  EXPECT_FALSE((*gradients)[0].has_histogram());
  // The first chunk of a read carries the histogram too.
  auto value = q->ReadTensor("hist", "fc.weight", 2);
  SONDE_ASSERT_OK(value);
  EXPECT_TRUE(value->header.has_histogram());
}

#ifdef SONDE_HAVE_CUDA
TEST(DevicePath, DeviceTensorsMatchTheCpuPathBitForBit) {
  const absl::Status probe = DeviceStats::Probe(0);
  if (!probe.ok()) GTEST_SKIP() << "no GPU: " << probe.message();
  InProcessCollector collector("");
  HookOptions o = Options(collector.address(), "gpu");
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  std::vector<float> w = Values(300000, 1.0f);
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, w.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d, w.data(), w.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  (*hook)->StartStep();
  SONDE_ASSERT_OK((*hook)->SaveTensors({
      {"fc.weight", CudaTensor(d, v1::DTYPE_F32, {300, 1000}), {}},
      {"gradient/fc.weight", CudaTensor(d, v1::DTYPE_F32, {300, 1000}), {}},
  }));
  (*hook)->EndStep();
  SONDE_ASSERT_OK((*hook)->Close());
  cudaFree(d);
  auto q = QueryClient::Connect(collector.address());
  auto value = q->ReadTensor("gpu", "fc.weight", 0);
  SONDE_ASSERT_OK(value);
  EXPECT_EQ(value->bytes, std::string(reinterpret_cast<const char*>(w.data()), w.size() * 4));
  StatsAccumulator cpu;
  AccumulateStatistics(cpu, w.data(), v1::DTYPE_F32, w.size());
  SONDE_EXPECT_OK(CompareRecords(FromProto(value->header.statistics()), cpu, v1::DTYPE_F32));
  ASSERT_TRUE(value->header.has_histogram());
}

// On the GPU: a tensor larger than the whole pinned ring travels in pieces,
// and training overwriting it right after the save (on its stream) cannot
// reach what is stored.
TEST(DevicePath, ALargeTensorOverwrittenRightAfterItsSaveArrivesAsSaved) {
  const absl::Status probe = DeviceStats::Probe(0);
  if (!probe.ok()) GTEST_SKIP() << "no GPU: " << probe.message();
  InProcessCollector collector("");
  HookOptions o = Options(collector.address(), "gpu-large");
  o.max_queue_bytes = 64 << 20;
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  std::vector<float> w = Values(24 << 20, 3.0f);  // 96 MiB: three times the ring
  void* d = nullptr;
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d, w.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d, w.data(), w.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  (*hook)->StartStep();
  SONDE_ASSERT_OK((*hook)->SaveTensors(
      {{"big.weight", CudaTensor(d, v1::DTYPE_F32, {24, 1 << 20}, 0, stream), {}}}));
  ASSERT_EQ(cudaMemsetAsync(d, 0, w.size() * 4, stream), cudaSuccess);  // training goes on
  (*hook)->EndStep();
  SONDE_ASSERT_OK((*hook)->Close());
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaFree(d);
  cudaStreamDestroy(stream);
  EXPECT_EQ((*hook)->counters().values_dropped, 0u);
  auto q = QueryClient::Connect(collector.address());
  auto value = q->ReadTensor("gpu-large", "big.weight", 0);
  SONDE_ASSERT_OK(value);
  EXPECT_TRUE(value->bytes == std::string(reinterpret_cast<const char*>(w.data()), w.size() * 4));
}
#endif

}  // namespace
}  // namespace sonde
