#include "client/profiler/proc_stats.h"

#include <unistd.h>

#include <fstream>
#include <random>
#include <string>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace sonde::profiler {
namespace {

using ::sonde::testing::IsOk;
using ::sonde::testing::StatusIs;
using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::Key;

// Linux 6.x: ten columns (guest, guest_nice last), then intr, ctxt, ...
constexpr char kStatModern[] =
    "cpu  2382874 10 365885 2198221 51990 7 8167 9809 1200 3\n"
    "cpu0 1110826 4 178512 1196913 12418 3 3463 5008 600 1\n"
    "cpu1 1272047 6 187373 1001307 39572 4 4704 4801 600 2\n"
    "intr 27186091 0 0 0 0 13 0 5039\n"
    "ctxt 45709537\n"
    "btime 1700000000\n"
    "processes 1234\n";

// Linux 2.4: user nice system idle only.
constexpr char kStat24[] =
    "cpu  100 2 30 900\n"
    "cpu0 100 2 30 900\n"
    "page 5741 1808\n";

// Linux 2.6.0 to 2.6.10: seven columns, no steal.
constexpr char kStat26[] =
    "cpu  100 2 30 900 40 5 6\n"
    "cpu0 50 1 15 450 20 2 3\n"
    "cpu1 50 1 15 450 20 3 3\n";

TEST(ParseProcStat, ReadsEightColumnsAndIgnoresGuestWhichUserAlreadyCounts) {
  auto stat = ParseProcStat(kStatModern);
  ASSERT_THAT(stat, IsOk());
  EXPECT_EQ(stat->total.user, 2382874u);
  EXPECT_EQ(stat->total.nice, 10u);
  EXPECT_EQ(stat->total.system, 365885u);
  EXPECT_EQ(stat->total.idle, 2198221u);
  EXPECT_EQ(stat->total.iowait, 51990u);
  EXPECT_EQ(stat->total.irq, 7u);
  EXPECT_EQ(stat->total.softirq, 8167u);
  EXPECT_EQ(stat->total.steal, 9809u);
  EXPECT_THAT(stat->cores, ElementsAre(Key(0), Key(1)));
  EXPECT_EQ(stat->cores.at(1).iowait, 39572u);
}

TEST(ParseProcStat, OldKernelsMissingColumnsReadAsZero) {
  auto old = ParseProcStat(kStat24);
  ASSERT_THAT(old, IsOk());
  EXPECT_EQ(old->total.idle, 900u);
  EXPECT_EQ(old->total.iowait, 0u);
  EXPECT_EQ(old->total.steal, 0u);
  EXPECT_THAT(old->cores, ElementsAre(Key(0)));

  auto seven = ParseProcStat(kStat26);
  ASSERT_THAT(seven, IsOk());
  EXPECT_EQ(seven->total.softirq, 6u);
  EXPECT_EQ(seven->total.steal, 0u);
  EXPECT_EQ(seven->cores.at(1).irq, 3u);
}

TEST(ParseProcStat, OfflineCoresAreAbsentNotRenumbered) {
  auto stat = ParseProcStat(
      "cpu  10 0 10 80 0 0 0 0\n"
      "cpu0 5 0 5 40 0 0 0 0\n"
      "cpu3 5 0 5 40 0 0 0 0\n");
  ASSERT_THAT(stat, IsOk());
  EXPECT_THAT(stat->cores, ElementsAre(Key(0), Key(3)));
}

TEST(ParseProcStat, RejectsTextWithoutTheCpuLineOrWithBadColumns) {
  EXPECT_THAT(ParseProcStat(""), StatusIs(absl::StatusCode::kInvalidArgument, "no 'cpu' line"));
  EXPECT_THAT(ParseProcStat("intr 1 2 3\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "no 'cpu' line"));
  EXPECT_THAT(ParseProcStat("cpu  1 2 3\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "3 columns, expected at least 4"));
  EXPECT_THAT(ParseProcStat("cpu  1 2 x 4\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "column 3 'x' is not a number"));
  EXPECT_THAT(ParseProcStat("cpu  1 2 3 4\ncpuX 1 2 3 4\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "'cpuX' is not cpu<N>"));
}

CpuJiffies Jiffies(uint64_t user, uint64_t system, uint64_t idle, uint64_t iowait) {
  CpuJiffies j;
  j.user = user;
  j.system = system;
  j.idle = idle;
  j.iowait = iowait;
  return j;
}

TEST(CpuUsageBetween, BusyAndIowaitAsShareOfAllTicksThatPassed) {
  CpuJiffies before = Jiffies(100, 50, 1000, 10);
  CpuJiffies after = Jiffies(130, 60, 1050, 20);  // +30 user +10 system +50 idle +10 iowait
  after.irq = 5;
  after.softirq = 3;
  after.steal = 2;
  after.nice = 0;
  auto usage = CpuUsageBetween(before, after);
  ASSERT_TRUE(usage.has_value());
  // busy 30 + 10 + 5 + 3 + 2 = 50 of 110 ticks; iowait 10 of 110.
  EXPECT_THAT(usage->util_percent, DoubleNear(100.0 * 50 / 110, 1e-9));
  EXPECT_THAT(usage->iowait_percent, DoubleNear(100.0 * 10 / 110, 1e-9));
}

TEST(CpuUsageBetween, NoTicksBetweenReadingsReportsNothing) {
  const CpuJiffies same = Jiffies(100, 50, 1000, 10);
  EXPECT_FALSE(CpuUsageBetween(same, same).has_value());
}

TEST(CpuUsageBetween, BusyCounterGoingBackwardsReportsNothingRatherThanNonsense) {
  // A core unplugged and back with fresh counters, or a 32-bit counter that wrapped.
  EXPECT_FALSE(CpuUsageBetween(Jiffies(5000, 50, 1000, 10), Jiffies(20, 2, 90, 1)).has_value());
  EXPECT_FALSE(
      CpuUsageBetween(Jiffies(4294967290u, 50, 1000, 0), Jiffies(3, 60, 1100, 0)).has_value());
}

TEST(CpuUsageBetween, IowaitOrIdleSteppingBackCountsAsZero) {
  // NO_HZ kernels may report iowait (and rarely idle) a little lower than before.
  auto usage = CpuUsageBetween(Jiffies(100, 0, 1000, 50), Jiffies(150, 0, 1050, 45));
  ASSERT_TRUE(usage.has_value());
  EXPECT_THAT(usage->util_percent, DoubleNear(50.0, 1e-9));
  EXPECT_THAT(usage->iowait_percent, DoubleNear(0.0, 1e-9));
  auto idle_back = CpuUsageBetween(Jiffies(100, 0, 1000, 0), Jiffies(110, 0, 998, 0));
  ASSERT_TRUE(idle_back.has_value());
  EXPECT_THAT(idle_back->util_percent, DoubleNear(100.0, 1e-9));
}

TEST(CpuUsageBetween, StaysWithinZeroAndHundredWhateverTheCounters) {
  std::mt19937_64 random(7);
  std::uniform_int_distribution<uint64_t> value(0, 1000);
  for (int i = 0; i < 10000; ++i) {
    CpuJiffies a, b;
    for (CpuJiffies* j : {&a, &b}) {
      j->user = value(random);
      j->nice = value(random);
      j->system = value(random);
      j->idle = value(random);
      j->iowait = value(random);
      j->irq = value(random);
      j->softirq = value(random);
      j->steal = value(random);
    }
    if (auto usage = CpuUsageBetween(a, b)) {
      EXPECT_GE(usage->util_percent, 0.0);
      EXPECT_LE(usage->util_percent, 100.0);
      EXPECT_GE(usage->iowait_percent, 0.0);
      EXPECT_LE(usage->iowait_percent, 100.0);
      EXPECT_LE(usage->util_percent + usage->iowait_percent, 100.0 + 1e-9);
    }
  }
}

TEST(CpuUsageBetween, CoresThatWentOfflineOrCameBackAreLeftOut) {
  auto before = ParseProcStat(
      "cpu  30 0 30 240 0 0 0 0\n"
      "cpu0 10 0 10 80 0 0 0 0\n"
      "cpu1 10 0 10 80 0 0 0 0\n"
      "cpu2 10 0 10 80 0 0 0 0\n");
  // cpu1 went offline; cpu3 came online; cpu2 is online but its counters froze.
  auto after = ParseProcStat(
      "cpu  70 0 40 290 0 0 0 0\n"
      "cpu0 40 0 20 90 0 0 0 0\n"
      "cpu2 10 0 10 80 0 0 0 0\n"
      "cpu3 5 0 5 10 0 0 0 0\n");
  ASSERT_THAT(before, IsOk());
  ASSERT_THAT(after, IsOk());
  const CpuUsageReport report = CpuUsageBetween(*before, *after);
  ASSERT_TRUE(report.total.has_value());
  EXPECT_THAT(report.total->util_percent, DoubleNear(100.0 * 50 / 100, 1e-9));
  EXPECT_THAT(report.cores, ElementsAre(Key(0)));
  EXPECT_THAT(report.cores.at(0).util_percent, DoubleNear(100.0 * 40 / 50, 1e-9));
}

TEST(ParseMeminfo, UsedIsTotalMinusAvailableInBytes) {
  auto info = ParseMeminfo(
      "MemTotal:       24684096 kB\n"
      "MemFree:        16318468 kB\n"
      "MemAvailable:   22973796 kB\n"
      "Buffers:           80320 kB\n"
      "Cached:          6426480 kB\n"
      "HugePages_Total:       0\n");
  ASSERT_THAT(info, IsOk());
  EXPECT_EQ(info->total_bytes, 24684096ull * 1024);
  EXPECT_EQ(info->available_bytes, 22973796ull * 1024);
  EXPECT_EQ(info->used_bytes(), (24684096ull - 22973796ull) * 1024);
}

TEST(ParseMeminfo, KernelsBeforeMemAvailableEstimateItFromFreeBuffersAndCache) {
  auto info = ParseMeminfo(
      "MemTotal:         1000 kB\n"
      "MemFree:           100 kB\n"
      "Buffers:            20 kB\n"
      "Cached:            300 kB\n"
      "SwapCached:         50 kB\n");
  ASSERT_THAT(info, IsOk());
  EXPECT_EQ(info->available_bytes, 420u * 1024);
  EXPECT_EQ(info->used_bytes(), 580u * 1024);
}

TEST(ParseMeminfo, RejectsTextWithoutTotalOrWithoutAvailable) {
  EXPECT_THAT(ParseMeminfo("MemFree: 1 kB\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "no MemTotal"));
  EXPECT_THAT(ParseMeminfo("MemTotal: 1 kB\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "neither MemAvailable nor MemFree"));
  EXPECT_THAT(ParseMeminfo("MemTotal: lots\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "has no number"));
}

constexpr char kNetDev[] =
    "Inter-|   Receive                                                |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs "
    "drop fifo colls carrier compressed\n"
    "    lo: 109977396362 7104667    0    0    0     0          0         0 109977396362 "
    "7104667    0    0    0     0       0          0\n"
    "  eth0: 155598711    3706    0    0    0     0          0         0   166332    1987    0 "
    "   0    0     0       0          0\n"
    "  ifb0:       0       0    0    0    0     0          0         0        0       0    0 "
    "   0    0     0       0          0\n";

TEST(ParseNetDev, ReadsEveryInterfaceButLoopback) {
  auto bytes = ParseNetDev(kNetDev);
  ASSERT_THAT(bytes, IsOk());
  EXPECT_THAT(*bytes, ElementsAre(Key("eth0"), Key("ifb0")));
  EXPECT_EQ(bytes->at("eth0").rx, 155598711u);
  EXPECT_EQ(bytes->at("eth0").tx, 166332u);
}

TEST(ParseNetDev, OldKernelsWithoutSpaceAfterTheColon) {
  auto bytes = ParseNetDev(
      "Inter-|   Receive |  Transmit\n"
      " face |bytes    packets|bytes    packets\n"
      "  eth0:1234567890 5 0 0 0 0 0 0 987654321 7 0 0 0 0 0 0\n");
  ASSERT_THAT(bytes, IsOk());
  EXPECT_EQ(bytes->at("eth0").rx, 1234567890u);
  EXPECT_EQ(bytes->at("eth0").tx, 987654321u);
}

TEST(ParseNetDev, RejectsLinesWithTooFewCounters) {
  EXPECT_THAT(ParseNetDev("  eth0: 1 2 3\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "expected at least 9 counters"));
}

TEST(NetBytesBetween, SumsRisesAndIgnoresResetsAndInterfacesThatCameOrWent) {
  const NetDevBytes before = {{"eth0", {1000, 500}}, {"eth1", {9000, 9000}}, {"gone", {1, 1}}};
  const NetDevBytes after = {{"eth0", {1600, 700}}, {"eth1", {10, 9500}}, {"new0", {50, 50}}};
  const InterfaceBytes moved = NetBytesBetween(before, after);
  EXPECT_EQ(moved.rx, 600u);       // eth1's rx counter restarted: nothing
  EXPECT_EQ(moved.tx, 200u + 500u);
}

TEST(ParseVmRssBytes, ReadsKilobytesFromStatus) {
  EXPECT_THAT(ParseVmRssBytes("Name:\tx\nVmPeak:\t  9000 kB\nVmRSS:\t    1964 kB\nThreads: 1\n"),
              IsOk());
  EXPECT_EQ(*ParseVmRssBytes("VmRSS:\t    1964 kB\n"), 1964u * 1024);
  EXPECT_THAT(ParseVmRssBytes("Name:\tkthreadd\nState:\tS\n"),
              StatusIs(absl::StatusCode::kNotFound, "no VmRSS"));
}

TEST(ReadProcFile, ReadsFilesLargerThanItsFirstBufferAndNamesMissingOnes) {
  sonde::testing::TempDir dir;
  const std::string path = dir.Sub("big");
  const std::string text(100000, 'x');
  std::ofstream(path) << text;
  std::string out = "old";
  ASSERT_THAT(ReadProcFile(path, out), IsOk());
  EXPECT_EQ(out, text);
  EXPECT_THAT(ReadProcFile(dir.Sub("missing"), out),
              StatusIs(absl::StatusCode::kNotFound, "cannot open " + dir.Sub("missing")));
}

TEST(RealProc, ThisMachinesFilesParseWithinSaneRanges) {
  std::string text;
  ASSERT_THAT(ReadProcFile("/proc/stat", text), IsOk());
  auto stat = ParseProcStat(text);
  ASSERT_THAT(stat, IsOk());
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  EXPECT_GE(static_cast<long>(stat->cores.size()), 1);
  EXPECT_LE(static_cast<long>(stat->cores.size()), std::max(online, 1L) * 2);
  EXPECT_GT(stat->total.user + stat->total.system + stat->total.idle, 0u);

  ASSERT_THAT(ReadProcFile("/proc/meminfo", text), IsOk());
  auto mem = ParseMeminfo(text);
  ASSERT_THAT(mem, IsOk());
  EXPECT_GE(mem->total_bytes, 64ull << 20);
  EXPECT_LE(mem->total_bytes, 64ull << 40);
  EXPECT_GT(mem->used_bytes(), 0u);
  EXPECT_LT(mem->used_bytes(), mem->total_bytes);

  ASSERT_THAT(ReadProcFile("/proc/net/dev", text), IsOk());
  auto net = ParseNetDev(text);
  ASSERT_THAT(net, IsOk());
  EXPECT_EQ(net->count("lo"), 0u);

  ASSERT_THAT(ReadProcFile("/proc/self/status", text), IsOk());
  auto rss = ParseVmRssBytes(text);
  ASSERT_THAT(rss, IsOk());
  EXPECT_GE(*rss, 1ull << 20);
  EXPECT_LT(*rss, mem->total_bytes);
}

TEST(ProcessStart, StartTicksAreField22CountedAfterTheCommandName) {
  // A command name with spaces and a ')' of its own.
  constexpr char kPidStat[] =
      "4242 (python3 (x) y) S 1 4242 4242 0 -1 4194304 100 0 0 0 5 3 0 0 20 0 4 0 "
      "123456 10000000 2000 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
  auto ticks = ParseStartTicks(kPidStat);
  ASSERT_THAT(ticks, IsOk());
  EXPECT_EQ(*ticks, 123456u);
  EXPECT_THAT(ParseStartTicks("4242 (short) S 1 2 3"),
              StatusIs(absl::StatusCode::kInvalidArgument, "no starttime"));
  EXPECT_THAT(ParseStartTicks("no parenthesis"), StatusIs(absl::StatusCode::kInvalidArgument, "no ')'"));
}

TEST(ProcessStart, BootTimeComesFromTheBtimeLine) {
  auto boot = ParseBootTime(kStatModern);
  ASSERT_THAT(boot, IsOk());
  EXPECT_EQ(*boot, 1700000000);
  EXPECT_THAT(ParseBootTime(kStat24), StatusIs(absl::StatusCode::kNotFound, "btime"));
}

TEST(ProcessStart, ThisProcessStartedAfterBootAndBeforeNow) {
  std::string stat;
  ASSERT_THAT(ReadProcFile("/proc/stat", stat), IsOk());
  auto boot = ParseBootTime(stat);
  ASSERT_THAT(boot, IsOk());
  auto started = ProcessStartTime();
  ASSERT_THAT(started, IsOk());
  EXPECT_GE(*started, absl::FromUnixSeconds(*boot));
  EXPECT_LE(*started, absl::Now() + absl::Seconds(1));
}

}  // namespace
}  // namespace sonde::profiler
