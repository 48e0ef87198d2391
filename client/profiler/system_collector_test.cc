#include "client/profiler/system_collector.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "client/profiler/fake_nvml.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace sonde::profiler {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::DoubleEq;
using ::testing::DoubleNear;
using ::testing::Field;
using ::testing::Ge;
using ::testing::Gt;
using ::testing::Le;
using ::testing::Not;
using ::testing::Optional;

constexpr int kGpuIsLost = 15;  // NVML_ERROR_GPU_IS_LOST

SystemCollectorOptions WithoutGpus() {
  SystemCollectorOptions options;
  options.groups.gpu = false;
  return options;
}

auto HasPoint(const std::string& name) {
  return Contains(Field(&MetricPoint::name, name));
}

void Write(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
}

TEST(SystemCollector, FirstSampleHasLevelsTheSecondAddsRates) {
  SystemCollector collector(WithoutGpus());
  const SystemSample first = collector.Collect();
  EXPECT_THAT(first.points, HasPoint("memory.used_bytes"));
  EXPECT_THAT(first.points, HasPoint("memory.total_bytes"));
  EXPECT_THAT(first.points, HasPoint("process.rss_bytes"));
  EXPECT_THAT(first.points, HasPoint("profiler.cpu_seconds"));
  EXPECT_THAT(first.points, Not(HasPoint("cpu.util_percent")));
  EXPECT_THAT(first.points, Not(HasPoint("network.rx_bytes_per_s")));

  const SystemSample second = collector.Collect();
  EXPECT_GE(second.timestamp_us, first.timestamp_us);
  // Two readings close together may see no tick; the ones present are sane.
  for (const char* name : {"cpu.util_percent", "cpu.iowait_percent", "cpu.0.util_percent"}) {
    if (auto v = second.Find(name)) {
      EXPECT_THAT(*v, AllOf(Ge(0.0), Le(100.0))) << name;
    }
  }
  EXPECT_THAT(second.Find("network.rx_bytes_per_s"), Optional(Ge(0.0)));
  EXPECT_THAT(second.Find("network.tx_bytes_per_s"), Optional(Ge(0.0)));
  EXPECT_THAT(second.Find("process.rss_bytes"), Optional(Gt(1e6)));
  EXPECT_THAT(second.Find("memory.used_bytes"),
              Optional(AllOf(Gt(0.0), Le(*second.Find("memory.total_bytes")))));
  EXPECT_EQ(second.Find("gpu.0.util_percent"), std::nullopt);
}

TEST(SystemCollector, UtilisationFromTwoReadingsOfFixtureFiles) {
  sonde::testing::TempDir proc;
  SystemCollectorOptions options = WithoutGpus();
  options.proc_root = proc.path();
  Write(proc.Sub("stat"), "cpu  100 0 100 800 0 0 0 0\ncpu0 50 0 50 400 0 0 0 0\n"
                          "cpu1 50 0 50 400 0 0 0 0\n");
  Write(proc.Sub("net/dev"), "  eth0: 1000 0 0 0 0 0 0 0 2000 0 0 0 0 0 0 0\n");
  SystemCollector collector(options);
  collector.Collect();
  // cpu0 fully busy for 100 ticks, cpu1 idle; 30 iowait ticks on cpu1.
  Write(proc.Sub("stat"), "cpu  200 0 100 870 30 0 0 0\ncpu0 150 0 50 400 0 0 0 0\n"
                          "cpu1 50 0 50 470 30 0 0 0\n");
  Write(proc.Sub("net/dev"), "  eth0: 5000 0 0 0 0 0 0 0 2500 0 0 0 0 0 0 0\n");
  const SystemSample sample = collector.Collect();
  EXPECT_THAT(sample.Find("cpu.util_percent"), Optional(DoubleNear(50.0, 1e-9)));
  EXPECT_THAT(sample.Find("cpu.iowait_percent"), Optional(DoubleNear(15.0, 1e-9)));
  EXPECT_THAT(sample.Find("cpu.0.util_percent"), Optional(DoubleNear(100.0, 1e-9)));
  EXPECT_THAT(sample.Find("cpu.1.util_percent"), Optional(DoubleNear(0.0, 1e-9)));
  EXPECT_THAT(sample.Find("network.rx_bytes_per_s"), Optional(Gt(0.0)));
  EXPECT_THAT(sample.Find("network.tx_bytes_per_s"), Optional(Gt(0.0)));
  // No meminfo or self/status under this root: those groups are left out.
  EXPECT_THAT(sample.points, Not(HasPoint("memory.used_bytes")));
  EXPECT_THAT(sample.points, Not(HasPoint("process.rss_bytes")));
}

TEST(SystemCollector, AMalformedFileLeavesOutItsGroupOnlyAndRecoversLater) {
  sonde::testing::TempDir proc;
  SystemCollectorOptions options = WithoutGpus();
  options.proc_root = proc.path();
  Write(proc.Sub("stat"), "garbage\n");
  Write(proc.Sub("meminfo"), "MemTotal: 1000 kB\nMemAvailable: 400 kB\n");
  SystemCollector collector(options);
  for (int i = 0; i < 3; ++i) {
    const SystemSample sample = collector.Collect();
    EXPECT_THAT(sample.points, Not(HasPoint("cpu.util_percent")));
    EXPECT_THAT(sample.Find("memory.used_bytes"), Optional(DoubleEq(600.0 * 1024)));
  }
  Write(proc.Sub("stat"), "cpu  100 0 0 100 0 0 0 0\n");
  collector.Collect();
  Write(proc.Sub("stat"), "cpu  150 0 0 150 0 0 0 0\n");
  EXPECT_THAT(collector.Collect().Find("cpu.util_percent"), Optional(DoubleNear(50.0, 1e-9)));
}

TEST(SystemCollector, GroupsSwitchedOffAreNeitherReadNorReported) {
  SystemCollectorOptions options;
  options.groups = {};
  options.groups.cpu = false;
  options.groups.network = false;
  options.groups.process = false;
  options.groups.gpu = false;
  options.groups.own_cost = false;
  options.nvml_library = fake_nvml::LibraryPath();  // not loaded: gpu is off
  SystemCollector collector(options);
  EXPECT_EQ(collector.gpu_count(), 0);
  collector.Collect();
  const SystemSample sample = collector.Collect();
  ASSERT_EQ(sample.points.size(), 2u);
  EXPECT_EQ(sample.points[0].name, "memory.used_bytes");
  EXPECT_EQ(sample.points[1].name, "memory.total_bytes");
}

TEST(SystemCollector, OwnCostIsCumulativeCpuTimeOfCollect) {
  SystemCollector collector(WithoutGpus());
  double last = 0;
  for (int i = 0; i < 5; ++i) {
    const SystemSample sample = collector.Collect();
    auto cost = sample.Find("profiler.cpu_seconds");
    ASSERT_TRUE(cost.has_value());
    EXPECT_GE(*cost, last);
    EXPECT_DOUBLE_EQ(*cost, collector.cpu_seconds());
    last = *cost;
  }
  EXPECT_GT(last, 0.0);
  EXPECT_LT(last, 1.0);
}

TEST(SystemCollector, AGpuLostMidRunDropsOnlyItsReadingsUntilItAnswersAgain) {
  fake_nvml::Control control;
  ASSERT_TRUE(control.loaded());
  SystemCollectorOptions options;
  options.nvml_library = fake_nvml::LibraryPath();
  SystemCollector collector(options);
  ASSERT_EQ(collector.gpu_count(), fake_nvml::kGpus);
  collector.Collect();
  for (int field = fake_nvml::kUtil; field <= fake_nvml::kPower; ++field) {
    control.FailField(1, static_cast<fake_nvml::Field>(field), kGpuIsLost);
  }
  for (int i = 0; i < 3; ++i) {
    const SystemSample sample = collector.Collect();
    EXPECT_THAT(sample.points, Not(HasPoint("gpu.1.util_percent")));
    EXPECT_THAT(sample.points, Not(HasPoint("gpu.1.power_w")));
    EXPECT_THAT(sample.points, HasPoint("gpu.0.power_w"));
    EXPECT_THAT(sample.points, HasPoint("memory.used_bytes"));
  }
  control.FailField(1, fake_nvml::kPower, 0);
  const SystemSample healed = collector.Collect();
  EXPECT_THAT(healed.Find("gpu.1.power_w"),
              Optional(DoubleEq(fake_nvml::kReadings[1].power_mw / 1000.0)));
  EXPECT_THAT(healed.points, Not(HasPoint("gpu.1.temperature_c")));
}

}  // namespace
}  // namespace sonde::profiler
