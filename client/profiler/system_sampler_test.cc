#include "client/profiler/system_sampler.h"

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/profiler/fake_nvml.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace sonde::profiler {
namespace {

using ::sonde::testing::IsOk;
using ::sonde::testing::StatusIs;
using ::testing::DoubleEq;
using ::testing::Le;
using ::testing::Optional;

// What a sampler delivered, for a test to wait on.
class Received {
 public:
  SystemSampler::Callback Callback() {
    return [this](const SystemSample& s) {
      absl::MutexLock lock(&mu_);
      samples_.push_back(s);
    };
  }
  // Waits (generously: the machine is shared) until `n` samples have come.
  bool WaitFor(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return samples_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(60));
  }
  std::vector<SystemSample> samples() const {
    absl::MutexLock lock(&mu_);
    return samples_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<SystemSample> samples_ ABSL_GUARDED_BY(mu_);
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

SystemSamplerOptions Every(absl::Duration interval) {
  SystemSamplerOptions options;
  options.interval = interval;
  options.collection.groups.gpu = false;
  return options;
}

TEST(SystemSampler, RefusesIntervalsOutside100MillisecondsTo60Seconds) {
  Received received;
  EXPECT_THAT(SystemSampler::Start(Every(absl::Milliseconds(99)), received.Callback()),
              StatusIs(absl::StatusCode::kInvalidArgument, "99ms is outside 100ms to 1m"));
  EXPECT_THAT(SystemSampler::Start(Every(absl::Seconds(61)), received.Callback()),
              StatusIs(absl::StatusCode::kInvalidArgument, "1m1s is outside"));
  EXPECT_THAT(SystemSampler::Start(Every(absl::Seconds(1)), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, "needs a callback"));
  EXPECT_THAT(SystemSampler::Start(Every(absl::Milliseconds(100)), received.Callback()), IsOk());
  EXPECT_THAT(SystemSampler::Start(Every(absl::Seconds(60)), received.Callback()), IsOk());
}

TEST(SystemSampler, DefaultIntervalIsHalfASecond) {
  EXPECT_EQ(SystemSamplerOptions().interval, absl::Milliseconds(500));
}

TEST(SystemSampler, StopReturnsPromptlyMidWaitAndNoCallbackFollows) {
  Received received;
  auto sampler = SystemSampler::Start(Every(absl::Seconds(60)), received.Callback());
  ASSERT_THAT(sampler, IsOk());
  const absl::Time start = absl::Now();
  (*sampler)->Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));  // a 60 s wait cut short
  EXPECT_TRUE(received.samples().empty());
  (*sampler)->Stop();  // idempotent
  EXPECT_EQ((*sampler)->cost().samples, 0);
}

TEST(SystemSampler, ABusyCoreShowsInTotalAndPerCoreUtilisation) {
  std::atomic<bool> spin{true};
  std::thread spinner([&] {
    volatile uint64_t x = 0;
    while (spin.load(std::memory_order_relaxed)) x = x + 1;
  });
  Received received;
  auto sampler = SystemSampler::Start(Every(absl::Milliseconds(100)), received.Callback());
  ASSERT_THAT(sampler, IsOk());
  const bool got = received.WaitFor(10);
  (*sampler)->Stop();
  spin = false;
  spinner.join();
  ASSERT_TRUE(got);

  // One core's worth of spinning on a 2-core machine that others share too:
  // at least ~half of all CPU time is busy, and the cores' utilisations add
  // up to most of a core, whichever core the spinner ran on.
  std::vector<double> total, core_sum;
  for (const SystemSample& s : received.samples()) {
    if (auto util = s.Find("cpu.util_percent")) total.push_back(*util);
    double sum = 0;
    for (int core = 0; core < 1024; ++core) {
      sum += s.Find("cpu." + std::to_string(core) + ".util_percent").value_or(0);
    }
    core_sum.push_back(sum);
  }
  ASSERT_GE(total.size(), 8u);
  EXPECT_GE(Median(total), 100.0 / std::max(2u, std::thread::hardware_concurrency()) * 0.7);
  EXPECT_GE(Median(core_sum), 70.0);
  for (double t : total) EXPECT_LE(t, 100.0);
}

TEST(SystemSampler, TimestampsIncreaseAtRoughlyTheInterval) {
  Received received;
  auto sampler = SystemSampler::Start(Every(absl::Milliseconds(100)), received.Callback());
  ASSERT_THAT(sampler, IsOk());
  ASSERT_TRUE(received.WaitFor(8));
  (*sampler)->Stop();
  const std::vector<SystemSample> samples = received.samples();
  std::vector<double> gaps_ms;
  for (size_t i = 1; i < samples.size(); ++i) {
    EXPECT_GT(samples[i].timestamp_us, samples[i - 1].timestamp_us);
    gaps_ms.push_back((samples[i].timestamp_us - samples[i - 1].timestamp_us) / 1000.0);
  }
  EXPECT_GE(Median(gaps_ms), 50.0);
  EXPECT_LE(Median(gaps_ms), 300.0);
  const SamplerCost cost = (*sampler)->cost();
  EXPECT_EQ(cost.samples, static_cast<int64_t>(samples.size()));
  EXPECT_GT(cost.collect_cpu_seconds, 0.0);
  EXPECT_GE(cost.thread_cpu_seconds, cost.collect_cpu_seconds);
  EXPECT_THAT(samples.back().Find("profiler.cpu_seconds"),
              Optional(Le(cost.collect_cpu_seconds)));
}

TEST(SystemSampler, FakeNvmlsTwoGpusArriveInSamples) {
  SystemSamplerOptions options = Every(absl::Milliseconds(100));
  options.collection.groups.gpu = true;
  options.collection.nvml_library = fake_nvml::LibraryPath();
  Received received;
  auto sampler = SystemSampler::Start(options, received.Callback());
  ASSERT_THAT(sampler, IsOk());
  ASSERT_TRUE(received.WaitFor(1));
  (*sampler)->Stop();
  const SystemSample sample = received.samples().front();
  for (int i = 0; i < fake_nvml::kGpus; ++i) {
    SCOPED_TRACE(i);
    const fake_nvml::FakeGpu& want = fake_nvml::kReadings[i];
    const std::string gpu = "gpu." + std::to_string(i) + ".";
    EXPECT_THAT(sample.Find(gpu + "util_percent"), Optional(DoubleEq(want.util_percent)));
    EXPECT_THAT(sample.Find(gpu + "memory_util_percent"),
                Optional(DoubleEq(want.memory_util_percent)));
    EXPECT_THAT(sample.Find(gpu + "memory_used_bytes"),
                Optional(DoubleEq(static_cast<double>(want.memory_used_bytes))));
    EXPECT_THAT(sample.Find(gpu + "memory_total_bytes"),
                Optional(DoubleEq(static_cast<double>(want.memory_total_bytes))));
    EXPECT_THAT(sample.Find(gpu + "temperature_c"), Optional(DoubleEq(want.temperature_c)));
    EXPECT_THAT(sample.Find(gpu + "power_w"), Optional(DoubleEq(want.power_mw / 1000.0)));
  }
  EXPECT_EQ(sample.Find("gpu.2.util_percent"), std::nullopt);
}

}  // namespace
}  // namespace sonde::profiler
