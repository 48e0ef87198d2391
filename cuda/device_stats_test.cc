// The device path against the CPU path. Cases that need a GPU skip with the
// reason where none is usable (no CUDA in the build, no driver, no device).
#include "cuda/device_stats.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/conformance.h"
#include "cuda/engine_contract.h"
#include "math/float16_math.h"
#include "stats/histogram.h"
#include "stats/statistics.h"
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

// Device memory written on a stream of its own (the "producer").
class CudaMemory final : public ContractMemory {
 public:
  CudaMemory() { cudaStreamCreate(&stream_); }
  ~CudaMemory() override {
    cudaStreamSynchronize(stream_);
    for (void* p : buffers_) cudaFree(p);
    cudaStreamDestroy(stream_);
  }
  const void* Upload(const std::string& bytes) override {
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<size_t>(bytes.size(), 1)) != cudaSuccess) return nullptr;
    cudaMemcpy(p, bytes.data(), bytes.size(), cudaMemcpyHostToDevice);
    buffers_.push_back(p);
    return p;
  }
  void Overwrite(const void* at, const std::string& bytes) override {
    sources_.push_back(std::make_unique<std::string>(bytes));
    cudaMemcpyAsync(const_cast<void*>(at), sources_.back()->data(), bytes.size(),
                    cudaMemcpyHostToDevice, stream_);
  }
  void Fill(const void* at, int value, size_t bytes) override {
    cudaMemsetAsync(const_cast<void*>(at), value, bytes, stream_);
  }
  void* producer_stream() override { return stream_; }
  void Sync() override { cudaStreamSynchronize(stream_); }

 private:
  cudaStream_t stream_ = nullptr;
  std::vector<void*> buffers_;
  std::vector<std::unique_ptr<std::string>> sources_;
};

class GpuContractTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status probe = DeviceStats::Probe(0);
    if (!probe.ok()) GTEST_SKIP() << "no GPU: " << probe.message();
  }
  ContractTarget target() {
    ContractTarget t;
    t.engine = [](const DeviceStatsOptions& o) { return DeviceStats::Create(o); };
    t.memory = [] { return std::make_unique<CudaMemory>(); };
    return t;
  }
};

SONDE_ENGINE_CONTRACT_TESTS(GpuContractTest)

TEST_F(GpuContractTest, AutomaticSnapshotMemoryIsAnEighthOfFreeMemoryAtMost4GiB) {
  absl::StatusOr<std::unique_ptr<DeviceStats>> engine = DeviceStats::Create({});
  ASSERT_TRUE(engine.ok()) << engine.status();
  size_t free = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  EXPECT_GT((*engine)->snapshot_capacity(), 0u);
  EXPECT_LE((*engine)->snapshot_capacity(), std::min<uint64_t>(total / 8, uint64_t{4} << 30));
  std::printf("device %s: snapshot memory %.1f MiB of %.1f GiB free\n",
              (*engine)->DeviceName().c_str(), (*engine)->snapshot_capacity() / 1048576.0,
              free / 1073741824.0);
}

#else

TEST(GpuTest, SkippedWithoutCuda) {
  GTEST_SKIP() << "this build has no CUDA support; the GPU cases are not compiled";
}

#endif  // SONDE_HAVE_CUDA

}  // namespace
}  // namespace sonde
