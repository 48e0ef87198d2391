#include "client/profiler/nvml.h"

#include <string>

#include "client/profiler/fake_nvml.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace sonde::profiler {
namespace {

using ::sonde::testing::IsOk;
using ::sonde::testing::StatusIs;
using ::testing::DoubleEq;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::Optional;

constexpr int kNotSupported = 3;  // NVML_ERROR_NOT_SUPPORTED

// The driver's library: where it loads, it reports its GPUs; where it does
// not (this project's machines), the reason is Unavailable and names it.
TEST(Nvml, LoadReportsGpusOrSaysUnavailableWhereThereIsNoDriver) {
  auto nvml = Nvml::Load();
  if (nvml.ok()) {
    EXPECT_GE((*nvml)->device_count(), 0);
    for (int i = 0; i < (*nvml)->device_count(); ++i) EXPECT_THAT((*nvml)->Read(i), IsOk());
  } else {
    EXPECT_THAT(nvml, StatusIs(absl::StatusCode::kUnavailable, "NVML (libnvidia-ml.so.1): "));
  }
}

TEST(Nvml, MissingLibraryIsUnavailableWithDlerrorsWords) {
  EXPECT_THAT(Nvml::LoadFrom("/nonexistent/libnvidia-ml.so.1"),
              StatusIs(absl::StatusCode::kUnavailable,
                       "/nonexistent/libnvidia-ml.so.1: cannot open shared object file"));
}

TEST(Nvml, LibraryWithoutNvmlsSymbolsIsUnavailableNamingTheSymbol) {
  EXPECT_THAT(Nvml::LoadFrom("libm.so.6"),
              StatusIs(absl::StatusCode::kUnavailable, "no symbol nvmlErrorString"));
}

TEST(Nvml, FakeLibrarysTwoGpusReadBackWithPowerInWatts) {
  auto nvml = Nvml::LoadFrom(fake_nvml::LibraryPath());
  ASSERT_THAT(nvml, IsOk());
  ASSERT_EQ((*nvml)->device_count(), fake_nvml::kGpus);
  for (int i = 0; i < fake_nvml::kGpus; ++i) {
    SCOPED_TRACE(i);
    const fake_nvml::FakeGpu& want = fake_nvml::kReadings[i];
    auto reading = (*nvml)->Read(i);
    ASSERT_THAT(reading, IsOk());
    EXPECT_THAT(reading->util_percent, Optional(DoubleEq(want.util_percent)));
    EXPECT_THAT(reading->memory_util_percent, Optional(DoubleEq(want.memory_util_percent)));
    EXPECT_THAT(reading->memory_used_bytes, Optional(want.memory_used_bytes));
    EXPECT_THAT(reading->memory_total_bytes, Optional(want.memory_total_bytes));
    EXPECT_THAT(reading->temperature_c, Optional(DoubleEq(want.temperature_c)));
    EXPECT_THAT(reading->power_w, Optional(DoubleEq(want.power_mw / 1000.0)));
    EXPECT_TRUE(reading->errors.empty());
  }
}

TEST(Nvml, AReadingNvmlRefusesIsEmptyAndNamedTheRestStays) {
  fake_nvml::Control control;
  ASSERT_TRUE(control.loaded());
  auto nvml = Nvml::LoadFrom(fake_nvml::LibraryPath());
  ASSERT_THAT(nvml, IsOk());
  control.FailField(1, fake_nvml::kPower, kNotSupported);
  auto reading = (*nvml)->Read(1);
  ASSERT_THAT(reading, IsOk());
  EXPECT_FALSE(reading->power_w.has_value());
  EXPECT_THAT(reading->errors, ElementsAre(AllOf(Field(&GpuFieldError::field, "power"),
                                                 Field(&GpuFieldError::message, "Not Supported"))));
  EXPECT_THAT(reading->temperature_c, Optional(DoubleEq(fake_nvml::kReadings[1].temperature_c)));
  auto other = (*nvml)->Read(0);
  ASSERT_THAT(other, IsOk());
  EXPECT_TRUE(other->power_w.has_value());
}

TEST(Nvml, GpuOutsideTheCountIsOutOfRange) {
  auto nvml = Nvml::LoadFrom(fake_nvml::LibraryPath());
  ASSERT_THAT(nvml, IsOk());
  EXPECT_THAT((*nvml)->Read(2), StatusIs(absl::StatusCode::kOutOfRange, "NVML saw 2"));
  EXPECT_THAT((*nvml)->Read(-1), StatusIs(absl::StatusCode::kOutOfRange, "GPU -1"));
}

TEST(Nvml, DestroyingItShutsNvmlDown) {
  fake_nvml::Control control;
  ASSERT_TRUE(control.loaded());
  ASSERT_EQ(control.LiveInits(), 0);
  {
    auto nvml = Nvml::LoadFrom(fake_nvml::LibraryPath());
    ASSERT_THAT(nvml, IsOk());
    EXPECT_EQ(control.LiveInits(), 1);
  }
  EXPECT_EQ(control.LiveInits(), 0);
}

}  // namespace
}  // namespace sonde::profiler
