// The device path against the CPU path. Cases that need a GPU skip with the
// reason where none is usable (no CUDA in the build, no driver, no device).
#include "cuda/device_stats.h"

#include <cstring>
#include <string>
#include <vector>

#include "cuda/conformance.h"
#include "cuda/float16_math.h"
#include "cuda/histogram.h"
#include "cuda/statistics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#ifdef SONDE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace sonde {
namespace {

TEST(DeviceStatsTest, ProbeAndCreateAgreeAndExplainThemselves) {
  const absl::Status probe = DeviceStats::Probe(0);
  absl::StatusOr<std::unique_ptr<DeviceStats>> engine = DeviceStats::Create({});
  EXPECT_EQ(probe.ok(), engine.ok());
  if (!probe.ok()) {
    EXPECT_EQ(probe.code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(std::string(probe.message()), testing::HasSubstr("CPU"));
    EXPECT_EQ(engine.status().code(), absl::StatusCode::kUnavailable);
  }
}

TEST(DeviceStatsTest, NoSuchDeviceIsUnavailable) {
  const absl::Status probe = DeviceStats::Probe(1 << 20);
  EXPECT_EQ(probe.code(), absl::StatusCode::kUnavailable) << probe;
}

#ifdef SONDE_HAVE_CUDA

// Device memory for a test, freed at scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::string& bytes) {
    if (!bytes.empty() && cudaMalloc(&ptr_, bytes.size()) == cudaSuccess) {
      cudaMemcpy(ptr_, bytes.data(), bytes.size(), cudaMemcpyHostToDevice);
    }
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  const void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

class GpuTest : public testing::Test {
 protected:
  void SetUp() override {
    const absl::Status probe = DeviceStats::Probe(0);
    if (!probe.ok()) GTEST_SKIP() << "no GPU: " << probe.message();
    absl::StatusOr<std::unique_ptr<DeviceStats>> engine = DeviceStats::Create({});
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
  }
  std::vector<DeviceCompletion> Wait() {
    EXPECT_TRUE(engine_->Drain().ok());
    return engine_->Collect();
  }
  std::unique_ptr<DeviceStats> engine_;
};

TEST_F(GpuTest, EveryConformanceCaseMatchesTheCpuInOneBatch) {
  const std::vector<ConformanceCase> cases = ConformanceCases();
  std::vector<std::unique_ptr<DeviceBuffer>> buffers;
  std::vector<DeviceTensorRef> refs;
  for (const ConformanceCase& c : cases) {
    buffers.push_back(std::make_unique<DeviceBuffer>(c.bytes));
    refs.push_back({buffers.back()->get(), c.dtype, c.count, true});
  }
  DeviceStatsOptions options;
  options.slot_bytes = 64u << 20;
  absl::StatusOr<std::unique_ptr<DeviceStats>> engine = DeviceStats::Create(options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  absl::StatusOr<uint64_t> ticket = (*engine)->EnqueueStats(refs, nullptr);
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  EXPECT_LE((*engine)->LastBatchLaunches(), 2);
  ASSERT_TRUE((*engine)->Drain().ok());
  std::vector<DeviceCompletion> done = (*engine)->Collect();
  ASSERT_EQ(done.size(), 1u);
  ASSERT_TRUE(done[0].status.ok()) << done[0].status;
  ASSERT_EQ(done[0].stats.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    StatsAccumulator cpu;
    AccumulateStatistics(cpu, cases[i].bytes.data(), cases[i].dtype, cases[i].count);
    EXPECT_TRUE(CompareRecords(done[0].stats[i], cpu, cases[i].dtype).ok())
        << cases[i].name << ": " << CompareRecords(done[0].stats[i], cpu, cases[i].dtype);
    HistogramCounts hist = HistogramCounts::Empty(options.histogram);
    AccumulateHistogramScalar(hist, cases[i].bytes.data(), cases[i].dtype, cases[i].count);
    EXPECT_TRUE(CompareHistograms(done[0].histograms[i], hist).ok()) << cases[i].name;
  }
}

TEST_F(GpuTest, WorkIsOrderedAfterTheProducerStream) {
  cudaStream_t producer;
  ASSERT_EQ(cudaStreamCreate(&producer), cudaSuccess);
  std::vector<float> values(1 << 20, 2.0f);
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, values.size() * 4), cudaSuccess);
  // The producer writes the tensor; the statistics must see the write.
  ASSERT_EQ(cudaMemcpyAsync(d, values.data(), values.size() * 4, cudaMemcpyHostToDevice, producer),
            cudaSuccess);
  DeviceTensorRef ref{d, v1::DTYPE_F32, values.size(), false};
  ASSERT_TRUE(engine_->EnqueueStats({&ref, 1}, producer).ok());
  ASSERT_EQ(cudaStreamSynchronize(producer), cudaSuccess);
  std::vector<DeviceCompletion> done = Wait();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].stats[0].count, values.size());
  EXPECT_EQ(done[0].stats[0].min, 2.0);
  EXPECT_DOUBLE_EQ(done[0].stats[0].sum, 2.0 * values.size());
  cudaFree(d);
  cudaStreamDestroy(producer);
}

TEST_F(GpuTest, CopiesConvertLikeTheCpu) {
  std::vector<float> values;
  for (int i = 0; i < 100000; ++i) values.push_back((i - 50000) * 0.37f + 1e-6f * i);
  std::string bytes(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  DeviceBuffer buffer(bytes);
  DeviceTensorRef ref{buffer.get(), v1::DTYPE_F32, values.size(), false};
  for (v1::DType to : {v1::DTYPE_F32, v1::DTYPE_F16, v1::DTYPE_BF16}) {
    ASSERT_TRUE(engine_->EnqueueCopy(ref, to, nullptr).ok());
    std::vector<DeviceCompletion> done = Wait();
    ASSERT_EQ(done.size(), 1u);
    ASSERT_TRUE(done[0].status.ok()) << done[0].status;
    EXPECT_EQ(done[0].copy_dtype, to);
    if (to == v1::DTYPE_F32) {
      EXPECT_EQ(done[0].bytes, bytes);
      continue;
    }
    ASSERT_EQ(done[0].bytes.size(), values.size() * 2);
    for (size_t i = 0; i < values.size(); ++i) {
      uint16_t got;
      std::memcpy(&got, &done[0].bytes[2 * i], 2);
      const uint16_t want =
          to == v1::DTYPE_F16 ? SondeFloatToHalf(values[i]) : SondeFloatToBf16(values[i]);
      ASSERT_EQ(got, want) << "element " << i;
    }
  }
}

TEST_F(GpuTest, RefusesRatherThanBlocksWhenSlotsAreFull) {
  std::vector<float> values(1 << 16, 1.0f);
  DeviceBuffer buffer(std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
  DeviceTensorRef ref{buffer.get(), v1::DTYPE_F32, values.size(), true};
  int accepted = 0, refused = 0;
  for (int i = 0; i < 64; ++i) {
    absl::StatusOr<uint64_t> t = engine_->EnqueueStats({&ref, 1}, nullptr);
    if (t.ok()) {
      ++accepted;
    } else {
      EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted);
      ++refused;
    }
  }
  EXPECT_GE(accepted, 1);
  EXPECT_EQ(static_cast<int>(Wait().size()), accepted);
}

#else

TEST(GpuTest, SkippedWithoutCuda) {
  GTEST_SKIP() << "this build has no CUDA support; the GPU cases are not compiled";
}

#endif  // SONDE_HAVE_CUDA

}  // namespace
}  // namespace sonde
