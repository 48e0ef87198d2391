#include "common/metrics/process_metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sonde::metrics {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;

TEST(ProcessMetrics, ResidentMemoryIsPositiveAndAtMostVirtual) {
  auto rss = ResidentMemoryBytes();
  auto virt = VirtualMemoryBytes();
  ASSERT_TRUE(rss.has_value());
  ASSERT_TRUE(virt.has_value());
  EXPECT_GT(*rss, 0u);
  EXPECT_LE(*rss, *virt);
}

TEST(ProcessMetrics, OpenFdsCountsAFileWeOpen) {
  auto before = OpenFileDescriptors();
  ASSERT_TRUE(before.has_value());
  const int fd = open("/proc/self/statm", O_RDONLY);
  ASSERT_GE(fd, 0);
  auto during = OpenFileDescriptors();
  close(fd);
  ASSERT_TRUE(during.has_value());
  EXPECT_EQ(*during, *before + 1);
  EXPECT_EQ(*OpenFileDescriptors(), *before);
}

TEST(ProcessMetrics, RegistersTheStandardNames) {
  Registry r;
  std::vector<Registration> regs = RegisterProcessMetrics(r);
  const std::string text = RenderText(r.Collect());
  EXPECT_THAT(text, ContainsRegex("\nprocess_resident_memory_bytes [1-9][0-9]*\n"));
  EXPECT_THAT(text, ContainsRegex("\nprocess_virtual_memory_bytes [1-9][0-9]*\n"));
  EXPECT_THAT(text, ContainsRegex("\nprocess_open_fds [1-9][0-9]*\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE process_cpu_seconds_total counter\n"));
  EXPECT_THAT(text, ContainsRegex("\nprocess_start_time_seconds 1[0-9]{9}"));
  regs.clear();
  EXPECT_EQ(RenderText(r.Collect()), "");
}

}  // namespace
}  // namespace sonde::metrics
