// The engine contract on the emulated engine (everywhere, CI included), and
// the emulator's own controls that tests above it rely on.
#include "cuda/emulated_device_stats.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "cuda/engine_contract.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace sonde {
namespace {

// Host memory: the emulator reads tensors at enqueue, so an overwrite after
// it cannot reach what was read (as the real engine's stream order ensures).
class HostMemory final : public ContractMemory {
 public:
  const void* Upload(const std::string& bytes) override {
    buffers_.push_back(std::make_unique<std::string>(bytes));
    return buffers_.back()->data();
  }
  void Overwrite(const void* at, const std::string& bytes) override {
    std::memcpy(const_cast<void*>(at), bytes.data(), bytes.size());
  }
  void Fill(const void* at, int value, size_t bytes) override {
    std::memset(const_cast<void*>(at), value, bytes);
  }
  void* producer_stream() override { return nullptr; }
  void Sync() override {}

 private:
  std::vector<std::unique_ptr<std::string>> buffers_;
};

class EmulatedContractTest : public ::testing::Test {
 protected:
  ContractTarget target() {
    ContractTarget t;
    t.engine = [](const DeviceStatsOptions& o) -> absl::StatusOr<std::unique_ptr<DeviceStats>> {
      auto e = EmulatedDeviceStats::Create(o, {absl::Microseconds(200), absl::Microseconds(20)});
      if (!e.ok()) return e.status();
      return std::unique_ptr<DeviceStats>(std::move(*e));
    };
    t.memory = [] { return std::make_unique<HostMemory>(); };
    return t;
  }
};

SONDE_ENGINE_CONTRACT_TESTS(EmulatedContractTest)

TEST(EmulatedDeviceStatsTest, PauseHoldsEveryCompletionAndLatencyIsKept) {
  DeviceStatsOptions o;
  o.ring_buffer_bytes = 4096;
  auto engine = EmulatedDeviceStats::Create(o, {absl::Milliseconds(20), absl::Milliseconds(1)});
  SONDE_ASSERT_OK(engine);
  std::vector<float> v(10000, 1.5f);  // 40,000 bytes: 10 pieces
  DeviceTensorRef ref{v.data(), v1::DTYPE_F32, v.size(), false};
  const absl::Time start = absl::Now();
  SONDE_ASSERT_OK((*engine)->EnqueueStats({&ref, 1}, nullptr));
  auto snap = (*engine)->EnqueueSnapshot(ref, v1::DTYPE_UNSPECIFIED, nullptr);
  SONDE_ASSERT_OK(snap);
  std::string out(40000, '\0');
  SONDE_ASSERT_OK((*engine)->Download(*snap, out.data()));
  EXPECT_TRUE((*engine)->Collect().empty());  // 20 ms and 10 ms to go
  (*engine)->Pause();
  absl::SleepFor(absl::Milliseconds(40));
  EXPECT_TRUE((*engine)->Collect().empty());
  EXPECT_EQ((*engine)->Drain().code(), absl::StatusCode::kFailedPrecondition);
  (*engine)->Resume();
  std::vector<DeviceCompletion> done = (*engine)->Collect();
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].kind, DeviceCompletion::kStats);
  EXPECT_EQ(done[1].kind, DeviceCompletion::kValues);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(20));
  EXPECT_EQ(std::memcmp(out.data(), v.data(), out.size()), 0);
  const EmulatedDeviceStats::Counters c = (*engine)->counters();
  EXPECT_EQ(c.batches, 1u);
  EXPECT_EQ(c.pieces, 10u);
  EXPECT_EQ(c.downloads, 1u);
  EXPECT_EQ(c.peak_snapshot_bytes, 40000u);
}

TEST(EmulatedDeviceStatsTest, InjectedFailuresReachTheirCompletion) {
  auto engine = EmulatedDeviceStats::Create(DeviceStatsOptions());
  SONDE_ASSERT_OK(engine);
  std::vector<float> v(100, 1.0f);
  DeviceTensorRef ref{v.data(), v1::DTYPE_F32, v.size(), false};
  (*engine)->FailNextStats(absl::UnavailableError("an illegal address"));
  (*engine)->FailNextDownload(absl::UnavailableError("a lost copy"));
  SONDE_ASSERT_OK((*engine)->EnqueueStats({&ref, 1}, nullptr));
  SONDE_ASSERT_OK((*engine)->EnqueueStats({&ref, 1}, nullptr));
  auto snap = (*engine)->EnqueueSnapshot(ref, v1::DTYPE_UNSPECIFIED, nullptr);
  SONDE_ASSERT_OK(snap);
  std::string out(400, '\0');
  SONDE_ASSERT_OK((*engine)->Download(*snap, out.data()));
  std::vector<DeviceCompletion> done = (*engine)->Collect();
  ASSERT_EQ(done.size(), 3u);
  EXPECT_EQ(done[0].status.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(done[0].stats.empty());
  EXPECT_TRUE(done[1].status.ok());
  EXPECT_EQ(done[1].stats[0].count, 100u);
  EXPECT_EQ(done[2].status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ((*engine)->snapshot_bytes_used(), 0u);
}

}  // namespace
}  // namespace sonde
