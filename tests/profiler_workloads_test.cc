// Profiler rules on real workloads, end to end: a real Hook with the
// profiler on (system samples every 100 ms, from /proc) runs a real training
// loop (StartStep each iteration) made to show one rule's problem, streams to
// an in-process collector (real gRPC, real RocksDB) whose rules judge the
// data as it arrives, and the verdict is read back through the Query
// service. Each problem has a healthy twin that must stay quiet.
//
// What is real: CPU load (threads spinning on every core, seen in
// cpu.<i>.util_percent), I/O wait (threads writing with O_DIRECT|O_SYNC under
// TEST_TMPDIR, seen in cpu.iowait_percent), a quiet CPU (a sleeping loop),
// a memory leak (host buffers the loop keeps and touches; process.rss_bytes
// grows), the steps and their timings.
//
// What is played back: this machine has no GPU, so gpu.* metrics come from
// the fake NVML (client/profiler/fake_nvml.h), loaded by the hook's sampler
// through ProfilerOptions::nvml_library, the same dlopen path as the real
// libnvidia-ml.so.1. The loop sets its readings as it runs: scripted
// utilisation series (idle, under-used, fluctuating, busy; written for these
// tests, not captured from a GPU) and, for the leak, memory in use equal to
// the bytes the loop really holds.
//
// Rule parameters are smaller than SageMaker's defaults so that each case
// takes seconds: SageMaker's patience of 1000 snapshots (and windows of 500)
// at its 500 ms interval are minutes of training. Each case says what it
// changes. Waits are conditions with deadlines: a firing case trains until
// the verdict is IssuesFound; a healthy one until the collector has stored
// kHealthySnapshots samples (three times the patience), then ends the job and
// expects NoIssuesFound. Cases whose condition this shared 2-core machine
// may fail to produce (I/O wait hidden by other processes' CPU use, a CPU
// not quiet) check the stored metrics when the verdict does not come, and
// skip with the measured figures if the workload did not produce the
// problem; a rule that stays quiet on data that has it fails the test.

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/memory/memory.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/hook.h"
#include "client/profiler/fake_nvml.h"
#include "client/query_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/query.grpc.pb.h"
#include "tests/testing/in_process_collector.h"
#include "tests/testing/status_matchers.h"

namespace sonde {
namespace {

using ::sonde::profiler::fake_nvml::Control;
using ::sonde::testing::InProcessCollector;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr absl::Duration kInterval = absl::Milliseconds(100);
// Snapshots before a rule judges (SageMaker: 1000); 11 samples, 1.1 s.
constexpr int kPatience = 10;
// How much a healthy run sends before its job ends: the rule has judged
// twice its patience beyond it.
constexpr int kHealthySnapshots = 3 * kPatience;
// A firing case gives up after this (it takes 1-3 s when the rule works).
constexpr absl::Duration kFireDeadline = absl::Seconds(20);
// The same for the cases that depend on the machine (I/O wait, a quiet CPU)
// and skip when it does not oblige: shorter, so that a busy machine costs
// seconds, not minutes. 80 samples: patience is 10.
constexpr absl::Duration kMachineDeadline = absl::Seconds(8);
// One step of the loops: a data-starved or tiny-batch step mostly waits.
// Kept at 50 ms so that no run reaches the 100 steps StepOutlier needs
// before judging: ProfilerReport's verdicts name only the rules a case is
// about.
constexpr absl::Duration kStep = absl::Milliseconds(50);

// GPU utilisation series, one value per sampling interval, repeated.
// Scripted stand-ins for NVML traces (no GPU here).
// A GPU waiting for its input: a few percent.
const std::vector<unsigned> kIdleGpu = {0, 3, 1, 5, 0, 2, 7, 1, 0, 4};
// Under-used: busy a third of the time, never near full.
const std::vector<unsigned> kUnderusedGpu = {22, 35, 41, 18, 30, 27, 45, 33, 25, 38};
// Fluctuating: bursts of full load between idle gaps (a stalling pipeline).
const std::vector<unsigned> kFluctuatingGpu = {98, 0, 97, 2, 99, 1, 96, 0, 99, 3};
// Busy: a well-fed GPU.
const std::vector<unsigned> kBusyGpu = {92, 97, 88, 95, 99, 90, 94, 96, 91, 93};

constexpr unsigned long long kGiB = 1ull << 30;
constexpr unsigned long long kMiB = 1ull << 20;

unsigned At(const std::vector<unsigned>& series, absl::Duration elapsed) {
  return series[static_cast<size_t>(elapsed / kInterval) % series.size()];
}

// Sets one fake GPU: utilisation, and device memory `used` of `total`.
void SetGpu(Control& gpu, int index, unsigned util, unsigned long long used = 2 * kGiB,
            unsigned long long total = 16 * kGiB) {
  ASSERT_TRUE(gpu.SetReading(index, util, util / 3, used, total));
}

// Plays `series` on both fake GPUs at time `elapsed` of the run.
void PlayBoth(Control& gpu, const std::vector<unsigned>& series, absl::Duration elapsed) {
  SetGpu(gpu, 0, At(series, elapsed));
  SetGpu(gpu, 1, At(series, elapsed));
}

HookOptions Profiled(const std::string& address, const std::string& job) {
  HookOptions o;
  o.collector = address;
  o.job = job;
  o.close_timeout = absl::Seconds(60);
  o.profiler.enabled = true;
  o.profiler.interval = kInterval;
  o.profiler.nvml_library = profiler::fake_nvml::LibraryPath();
  return o;
}

// A training loop: StartStep, then `body(step, elapsed)`, the step's work,
// until `done()` (asked every 100 ms) says so or `limit` passes. Returns
// whether done() ended it.
bool Train(Hook& hook, absl::Duration limit,
           const std::function<void(int, absl::Duration)>& body,
           const std::function<bool()>& done) {
  const absl::Time start = absl::Now();
  absl::Time next_check = start;
  for (int step = 0;; ++step) {
    const absl::Time now = absl::Now();
    if (now >= next_check) {
      if (done()) return true;
      next_check = absl::Now() + absl::Milliseconds(100);
    }
    if (now - start > limit) return false;
    hook.StartStep();
    body(step, now - start);
  }
}

// The collector's view of a job through QueryClient: rule verdicts and
// stored metric series.
class Reader {
 public:
  Reader(const std::string& address, std::string job)
      : job_(std::move(job)), query_(QueryClient::Connect(address)) {}

  // The rule's current result, if the collector has one.
  std::optional<v1::RuleResult> Result(const std::string& rule) {
    auto results = query_->RuleResults(job_);
    if (!results.ok()) return std::nullopt;
    for (const v1::RuleResult& r : *results) {
      if (r.rule() == rule) return r;
    }
    return std::nullopt;
  }
  bool Fired(const std::string& rule) {
    auto r = Result(rule);
    return r.has_value() && r->status() == v1::RULE_STATUS_ISSUES_FOUND;
  }

  // Worker 0's stored values of `metric`, oldest first.
  std::vector<double> Metric(const std::string& metric) {
    auto read = query_->ReadMetrics(job_, {metric}, "", /*worker=*/0);
    if (!read.ok()) return {};
    for (const v1::MetricSeries& s : read->series) {
      if (s.name() == metric) return {s.values().begin(), s.values().end()};
    }
    return {};
  }
  bool Stored(const std::string& metric, size_t n) { return Metric(metric).size() >= n; }

  // Ends nothing: call after the hook closed. The final verdicts.
  std::vector<v1::RuleResult> Verdicts() {
    auto results = query_->WaitForRuleVerdicts(job_, absl::Seconds(60));
    EXPECT_TRUE(results.ok()) << results.status();
    return results.ok() ? *results : std::vector<v1::RuleResult>();
  }

 private:
  std::string job_;
  std::unique_ptr<QueryClient> query_;
};

const v1::RuleResult* Find(const std::vector<v1::RuleResult>& results, const std::string& rule) {
  for (const v1::RuleResult& r : results) {
    if (r.rule() == rule) return &r;
  }
  return nullptr;
}

// One case of a rule on a workload: its own collector judging with
// `rules`, the fake GPUs, and a profiled hook of job `job` whose training
// loop runs `step` each step (the step's work and the GPUs' readings
// `elapsed` into the run), then sleeps kStep. `step` also runs once before
// the hook starts, at elapsed zero, so the first sample has the case's
// readings. Load on the machine (spinners, writers) is the test's, started
// before the case and stopped before Close.
class ProfiledCase {
 public:
  using Step = std::function<void(Control& gpu, absl::Duration elapsed)>;

  static absl::StatusOr<std::unique_ptr<ProfiledCase>> Start(const std::string& rules,
                                                             const std::string& job, Step step) {
    auto c = absl::WrapUnique(new ProfiledCase(rules, job, std::move(step)));
    if (!c->gpu_.loaded()) {
      return absl::FailedPreconditionError(
          absl::StrCat("fake NVML not loaded from ", profiler::fake_nvml::LibraryPath()));
    }
    c->step_(c->gpu_, absl::ZeroDuration());
    auto hook = Hook::Create(Profiled(c->collector_.address(), job));
    if (!hook.ok()) return hook.status();
    c->hook_ = std::move(*hook);
    return c;
  }

  // Trains until `rule`'s verdict is IssuesFound or `deadline` passes;
  // whether it fired.
  bool TrainUntilFired(const std::string& rule, absl::Duration deadline) {
    return Train(*hook_, deadline, Body(), [&] { return reader_.Fired(rule); });
  }
  // Trains until the collector stored kHealthySnapshots values of `metric`
  // (30 s at most); whether it did.
  bool TrainUntilStored(const std::string& metric) {
    return Train(*hook_, absl::Seconds(30), Body(),
                 [&] { return reader_.Stored(metric, kHealthySnapshots); });
  }
  // Ends the job.
  absl::Status Close() { return hook_->Close(); }
  // After Close: every rule's final verdict.
  std::vector<v1::RuleResult> Verdicts() { return reader_.Verdicts(); }
  Reader& reader() { return reader_; }

 private:
  ProfiledCase(const std::string& rules, const std::string& job, Step step)
      : step_(std::move(step)), collector_(rules), reader_(collector_.address(), job) {}

  std::function<void(int, absl::Duration)> Body() {
    return [this](int, absl::Duration t) {
      step_(gpu_, t);
      absl::SleepFor(kStep);
    };
  }

  Step step_;
  Control gpu_;
  InProcessCollector collector_;
  Reader reader_;
  std::unique_ptr<Hook> hook_;
};

// `series` on both GPUs, as a case's step.
ProfiledCase::Step Both(const std::vector<unsigned>& series) {
  return [&series](Control& gpu, absl::Duration t) { PlayBoth(gpu, series, t); };
}

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

int Cores() { return std::max(1u, std::thread::hardware_concurrency()); }

// Threads that keep every core busy: a preprocessing pipeline hogging the
// CPU. They run at nice 19 (nice time is busy time in /proc/stat) so the
// loop, the sampler and the collector still get the CPU when they need it.
class Spinners {
 public:
  explicit Spinners(int n) {
    for (int i = 0; i < n; ++i) {
      threads_.emplace_back([this] {
        setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
        volatile uint64_t x = 0;
        while (!stop_.load(std::memory_order_relaxed)) {
          for (int k = 0; k < 100000; ++k) x = x + static_cast<uint64_t>(k);
        }
      });
    }
  }
  ~Spinners() { Stop(); }
  void Stop() {
    stop_ = true;
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

// Threads that write 4 KiB blocks to their own file under `dir`, each write
// waiting for the disk: O_DIRECT|O_SYNC, or write + fdatasync where the file
// system refuses O_DIRECT (e.g. tmpfs). A data pipeline bound by storage.
class DiskWriters {
 public:
  DiskWriters(const std::string& dir, int n) {
    for (int i = 0; i < n; ++i) {
      threads_.emplace_back([this, path = absl::StrCat(dir, "/writer-", i)] { Write(path); });
    }
  }
  ~DiskWriters() { Stop(); }
  void Stop() {
    stop_ = true;
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  int64_t writes() const { return writes_.load(); }
  bool direct() const { return direct_.load(); }
  std::string error() const {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

 private:
  void Write(const std::string& path) {
    constexpr size_t kBlock = 4096;
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_SYNC, 0600);
    const bool direct = fd >= 0;
    if (!direct) fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return Fail(absl::StrCat("open ", path, ": ", std::strerror(errno)));
    direct_ = direct;
    void* buffer = nullptr;
    if (posix_memalign(&buffer, kBlock, kBlock) != 0) {
      close(fd);
      return Fail("posix_memalign");
    }
    std::memset(buffer, 'x', kBlock);
    for (int64_t k = 0; !stop_.load(std::memory_order_relaxed); ++k) {
      const off_t at = static_cast<off_t>((k % 256) * kBlock);
      if (pwrite(fd, buffer, kBlock, at) != static_cast<ssize_t>(kBlock) ||
          (!direct && fdatasync(fd) != 0)) {
        Fail(absl::StrCat("write ", path, ": ", std::strerror(errno)));
        break;
      }
      ++writes_;
    }
    std::free(buffer);
    close(fd);
    unlink(path.c_str());
  }
  void Fail(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.empty()) error_ = why;
  }

  std::atomic<bool> stop_{false};
  std::atomic<int64_t> writes_{0};
  std::atomic<bool> direct_{false};
  mutable std::mutex mu_;
  std::string error_;
  std::vector<std::thread> threads_;
};

std::string TestTmpDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

// --- The hook's NVML and the fake's playback --------------------------------

TEST(ProfilerWorkloads, TheHookSamplesTheNvmlLibraryItIsGivenAndTheSeriesPlayed) {
  Control gpu;
  ASSERT_TRUE(gpu.loaded());
  EXPECT_FALSE(gpu.SetReading(2, 50, 0, 0, 1));      // no such GPU
  EXPECT_FALSE(gpu.SetReading(0, 101, 0, 0, 1));     // not a percentage
  EXPECT_FALSE(gpu.SetReading(0, 50, 0, 2, 1));      // more used than there is
  SetGpu(gpu, 0, 11, 3 * kGiB, 16 * kGiB);
  SetGpu(gpu, 1, 77);
  InProcessCollector collector;
  auto hook = Hook::Create(Profiled(collector.address(), "nvml-path"));
  SONDE_ASSERT_OK(hook);
  Reader reader(collector.address(), "nvml-path");
  EXPECT_TRUE(Train(
      **hook, absl::Seconds(30),
      [&](int step, absl::Duration) {
        if (step == 10) SetGpu(gpu, 0, 42, 5 * kGiB, 16 * kGiB);  // one change, mid-run
        absl::SleepFor(kStep);
      },
      [&] {
        const std::vector<double> util = reader.Metric("gpu.0.util_percent");
        return !util.empty() && util.back() == 42 && util.size() >= 3;
      }));
  SONDE_ASSERT_OK((*hook)->Close());
  const std::vector<double> util = reader.Metric("gpu.0.util_percent");
  ASSERT_FALSE(util.empty());
  EXPECT_EQ(util.front(), 11);
  EXPECT_EQ(util.back(), 42);
  EXPECT_EQ(reader.Metric("gpu.0.memory_used_bytes").back(), 5.0 * kGiB);
  EXPECT_EQ(reader.Metric("gpu.1.util_percent").back(), 77);
  // The fake's fixed readings stay where a test sets nothing.
  EXPECT_EQ(reader.Metric("gpu.1.temperature_c").back(),
            profiler::fake_nvml::kReadings[1].temperature_c);

  // A library that is not there: no gpu.* metric, everything else.
  HookOptions missing = Profiled(collector.address(), "no-nvml");
  missing.profiler.nvml_library = absl::StrCat(TestTmpDir(), "/no-such-libnvidia-ml.so.1");
  auto without = Hook::Create(missing);
  SONDE_ASSERT_OK(without);
  Reader no_gpu(collector.address(), "no-nvml");
  EXPECT_TRUE(Train(
      **without, absl::Seconds(30), [](int, absl::Duration) { absl::SleepFor(kStep); },
      [&] { return no_gpu.Stored("cpu.util_percent", 3); }));
  SONDE_ASSERT_OK((*without)->Close());
  EXPECT_TRUE(no_gpu.Metric("gpu.0.util_percent").empty());

  HookOptions empty = Profiled(collector.address(), "empty-nvml");
  empty.profiler.nvml_library = "";
  auto refused = Hook::Create(empty);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("nvml_library is empty"));
}

// --- CPUBottleneck (and ProfilerReport on the same run) ---------------------

// CPUBottleneck: patience=10 instead of 1000 (above); threshold,
// gpu_threshold and cpu_threshold keep SageMaker's 50, 10 and 90.
// ProfilerReport runs every profiler rule with its defaults except the two
// this run is made to trigger, given the same small patience (and
// LowGPUUtilization a window of 10 instead of 500).
constexpr char kCpuRules[] =
    "CPUBottleneck(patience=10);"
    "ProfilerReport(CPUBottleneck_patience=10,LowGPUUtilization_patience=10,"
    "LowGPUUtilization_window=10);"
    "OverallSystemUsage";

TEST(ProfilerWorkloads, CPUBottleneckFiresWhenBusyCoresStarveAnIdleGpu) {
  Spinners spinners(Cores());
  auto run = ProfiledCase::Start(kCpuRules, "cpu-bound", Both(kIdleGpu));  // input-starved steps
  SONDE_ASSERT_OK(run);
  const bool fired = (*run)->TrainUntilFired("CPUBottleneck", kFireDeadline);
  spinners.Stop();
  SONDE_ASSERT_OK((*run)->Close());
  EXPECT_TRUE(fired);

  const std::vector<v1::RuleResult> results = (*run)->Verdicts();
  const v1::RuleResult* r = Find(results, "CPUBottleneck");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), v1::RULE_STATUS_ISSUES_FOUND) << r->message();
  EXPECT_GT(r->observed(), 50);  // percent of snapshots that were bottlenecks
  EXPECT_EQ(r->threshold(), 50);
  EXPECT_THAT(r->message(), StartsWith("worker 0: "));
  EXPECT_THAT(r->message(), HasSubstr("had a GPU below gpu_threshold=10% while a CPU core was "
                                      "above cpu_threshold=90%, more than threshold=50%"));
  EXPECT_THAT(r->message(), HasSubstr("while CPU core "));
  EXPECT_GT(r->datapoints(), kPatience);

  // The report names the rules this run triggered: the busy CPU's and the
  // idle GPU's (p95 of a few percent, under threshold_p95=70).
  const v1::RuleResult* report = Find(results, "ProfilerReport");
  ASSERT_NE(report, nullptr);
  EXPECT_EQ(report->status(), v1::RULE_STATUS_ISSUES_FOUND) << report->message();
  EXPECT_EQ(report->observed(), 2) << report->message();
  EXPECT_THAT(report->message(), StartsWith("2 of 9 profiler rules triggered: CPUBottleneck ("));
  EXPECT_THAT(report->message(), HasSubstr("; LowGPUUtilization (worker 0 GPU "));
  EXPECT_THAT(report->message(), HasSubstr("(under-utilised)"));
  EXPECT_THAT(report->message(), HasSubstr(". System usage: worker 0: CPU p50 "));
  for (const char* quiet : {"BatchSize (", "Dataloader (", "GPUMemoryIncrease (",
                            "IOBottleneck (", "LoadBalancing (", "StepOutlier ("}) {
    EXPECT_THAT(report->message(), ::testing::Not(HasSubstr(quiet)));
  }
}

TEST(ProfilerWorkloads, CPUBottleneckIsQuietWhileTheGpuIsBusy) {
  // The same spinning CPU, but the GPU keeps up: no snapshot has an idle
  // GPU, so whatever the CPU does nothing is a bottleneck.
  Spinners spinners(Cores());
  auto run = ProfiledCase::Start(kCpuRules, "cpu-busy-gpu-busy", Both(kBusyGpu));
  SONDE_ASSERT_OK(run);
  EXPECT_TRUE((*run)->TrainUntilStored("gpu.0.util_percent"));
  spinners.Stop();
  SONDE_ASSERT_OK((*run)->Close());

  const std::vector<v1::RuleResult> results = (*run)->Verdicts();
  const v1::RuleResult* r = Find(results, "CPUBottleneck");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), v1::RULE_STATUS_NO_ISSUES_FOUND) << r->message();
  EXPECT_GE(r->datapoints(), kHealthySnapshots);
  const v1::RuleResult* report = Find(results, "ProfilerReport");
  ASSERT_NE(report, nullptr);
  EXPECT_EQ(report->status(), v1::RULE_STATUS_NO_ISSUES_FOUND) << report->message();
  // OverallSystemUsage summarises the run: the spinning CPU and the busy GPUs.
  const v1::RuleResult* usage = Find(results, "OverallSystemUsage");
  ASSERT_NE(usage, nullptr);
  EXPECT_EQ(usage->status(), v1::RULE_STATUS_NO_ISSUES_FOUND) << usage->message();
  EXPECT_THAT(usage->message(), HasSubstr("worker 0: CPU p50 "));
  EXPECT_THAT(usage->message(), HasSubstr("GPU 0 p50 "));
  EXPECT_THAT(usage->message(), HasSubstr("GPU 1 p50 "));
  EXPECT_THAT(usage->message(), HasSubstr("memory p50 "));
  // The cores really were busy: quiet because of the GPU, not the CPU.
  double busiest = 0;
  for (int core = 0; core < Cores(); ++core) {
    for (double v : (*run)->reader().Metric(absl::StrCat("cpu.", core, ".util_percent"))) {
      busiest = std::max(busiest, v);
    }
  }
  EXPECT_GT(busiest, 90);
}

// --- IOBottleneck -----------------------------------------------------------

// patience=10 instead of 1000; io_threshold=5 instead of 50: SageMaker's 50
// is half of every core waiting for I/O. On this 2-core machine one
// O_DIRECT|O_SYNC writer gave about 24% I/O wait of the whole machine and
// four about 52-55% (dd, 23 November 2026), and less while other processes
// use the CPU (a CPU that runs something is not idle, so not waiting for
// I/O). threshold and
// gpu_threshold keep 50 and 10.
constexpr char kIoRules[] = "IOBottleneck(patience=10,io_threshold=5)";
constexpr double kIoThreshold = 5;
constexpr int kWriters = 4;

TEST(ProfilerWorkloads, IOBottleneckFiresWhenWritersWaitOnTheDiskAndTheGpuIdles) {
  DiskWriters writers(TestTmpDir(), kWriters);
  auto run = ProfiledCase::Start(kIoRules, "io-bound", Both(kIdleGpu));
  SONDE_ASSERT_OK(run);
  const bool fired = (*run)->TrainUntilFired("IOBottleneck", kMachineDeadline);
  writers.Stop();
  SONDE_ASSERT_OK((*run)->Close());
  Reader& reader = (*run)->reader();
  ASSERT_EQ(writers.error(), "");
  EXPECT_GT(writers.writes(), 0);

  if (!fired) {
    // Did the workload produce I/O wait at all? The rule is right to be
    // quiet when fewer than half the snapshots had any above io_threshold.
    const std::vector<double> iowait = reader.Metric("cpu.iowait_percent");
    const std::vector<double> cpu = reader.Metric("cpu.util_percent");
    const auto above = std::count_if(iowait.begin(), iowait.end(),
                                     [](double v) { return v > kIoThreshold; });
    if (2 * above <= static_cast<long>(iowait.size())) {
      GTEST_SKIP() << absl::StrFormat(
          "%d %s writers under %s produced I/O wait above %g%% in only %d of %d snapshots "
          "(median %.3g%%, max %.3g%%; CPU busy median %.3g%%, which hides I/O wait); "
          "%d writes",
          kWriters, writers.direct() ? "O_DIRECT|O_SYNC" : "write+fdatasync", TestTmpDir(),
          kIoThreshold, above, iowait.size(), Quantile(iowait, 0.5), Quantile(iowait, 1),
          Quantile(cpu, 0.5), writers.writes());
    }
  }
  EXPECT_TRUE(fired);
  const std::vector<v1::RuleResult> results = (*run)->Verdicts();
  const v1::RuleResult* r = Find(results, "IOBottleneck");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), v1::RULE_STATUS_ISSUES_FOUND) << r->message();
  EXPECT_GT(r->observed(), 50);
  EXPECT_THAT(r->message(), HasSubstr("had a GPU below gpu_threshold=10% while I/O wait was "
                                      "above io_threshold=5%, more than threshold=50%"));
  EXPECT_THAT(r->message(), HasSubstr("while I/O wait at "));
}

TEST(ProfilerWorkloads, IOBottleneckIsQuietWithoutIo) {
  // The same idle GPU and loop, no writers.
  auto run = ProfiledCase::Start(kIoRules, "no-io", Both(kIdleGpu));
  SONDE_ASSERT_OK(run);
  EXPECT_TRUE((*run)->TrainUntilStored("cpu.iowait_percent"));
  SONDE_ASSERT_OK((*run)->Close());
  const std::vector<v1::RuleResult> results = (*run)->Verdicts();
  const v1::RuleResult* r = Find(results, "IOBottleneck");
  ASSERT_NE(r, nullptr);
  if (r->status() == v1::RULE_STATUS_ISSUES_FOUND) {
    // Other processes on a shared machine can wait for the disk too. The
    // rule is right when more than half the snapshots had I/O wait above
    // io_threshold; then this machine cannot show a quiet twin now.
    const std::vector<double> iowait = (*run)->reader().Metric("cpu.iowait_percent");
    const auto above = std::count_if(iowait.begin(), iowait.end(),
                                     [](double v) { return v > kIoThreshold; });
    if (2 * above > static_cast<long>(iowait.size())) {
      GTEST_SKIP() << absl::StrFormat(
          "without writers of ours, other I/O on the machine kept I/O wait above %g%% in %d "
          "of %d snapshots (median %.3g%%): the rule fired rightly",
          kIoThreshold, above, iowait.size(), Quantile(iowait, 0.5));
    }
  }
  EXPECT_EQ(r->status(), v1::RULE_STATUS_NO_ISSUES_FOUND) << r->message();
  EXPECT_GE(r->datapoints(), kHealthySnapshots);
}

// --- GPUMemoryIncrease ------------------------------------------------------

// A fake GPU of 128 MiB whose memory in use is what the loop holds on the
// host, 8 MiB to start with (the model).
constexpr unsigned long long kGpuMemory = 128 * kMiB;
constexpr unsigned long long kModelBytes = 8 * kMiB;
// Allocated (and touched) every step: 1.25 MiB per 50 ms step, about 2
// percentage points of the fake GPU per 100 ms sample.
constexpr size_t kStepBytes = 1280 * 1024;
// patience=10 instead of 1000; increase=0.5 instead of 5: the rule compares
// two moving averages of window=10 values one value apart, so it sees
// growth per sample, and SageMaker's 5 points per sample is a jump (50
// points within 10 samples). This leak grows about 2 points per sample.
constexpr char kMemoryRules[] = "GPUMemoryIncrease(patience=10,increase=0.5)";

TEST(ProfilerWorkloads, GPUMemoryIncreaseFiresOnAGrowingLeak) {
  std::vector<std::unique_ptr<char[]>> leaked;  // never freed while training
  unsigned long long held = 0;
  auto run = ProfiledCase::Start(kMemoryRules, "leak", [&](Control& gpu, absl::Duration t) {
    if (kModelBytes + held + kStepBytes <= kGpuMemory) {
      leaked.emplace_back(new char[kStepBytes]);
      std::memset(leaked.back().get(), 1, kStepBytes);  // resident, not just reserved
      held += kStepBytes;
    }
    SetGpu(gpu, 0, At(kBusyGpu, t), kModelBytes + held, kGpuMemory);
    SetGpu(gpu, 1, At(kBusyGpu, t), kModelBytes + held, kGpuMemory);
  });
  SONDE_ASSERT_OK(run);
  const bool fired = (*run)->TrainUntilFired("GPUMemoryIncrease", kFireDeadline);
  SONDE_ASSERT_OK((*run)->Close());
  EXPECT_TRUE(fired);

  const std::vector<v1::RuleResult> results = (*run)->Verdicts();
  const v1::RuleResult* r = Find(results, "GPUMemoryIncrease");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), v1::RULE_STATUS_ISSUES_FOUND) << r->message();
  EXPECT_GT(r->observed(), 0.5);  // percentage points per value
  EXPECT_LT(r->observed(), 20);
  EXPECT_THAT(r->message(), StartsWith("worker 0 GPU 0: memory in use "));
  EXPECT_THAT(r->message(), HasSubstr("moving average over window=10 values rose by"));
  EXPECT_THAT(r->message(), HasSubstr("more than increase=0.5"));
  // The leak was real: the process's resident memory grew with it.
  const std::vector<double> rss = (*run)->reader().Metric("process.rss_bytes");
  ASSERT_GE(rss.size(), 2u);
  EXPECT_GT(*std::max_element(rss.begin(), rss.end()) - rss.front(), 0.5 * held)
      << "held " << held << " bytes";
}

TEST(ProfilerWorkloads, GPUMemoryIncreaseIsQuietOnSteadyMemory) {
  // Each step allocates and touches the same amount, and frees the last
  // step's: what it holds does not grow.
  std::unique_ptr<char[]> batch;
  auto run = ProfiledCase::Start(kMemoryRules, "steady", [&](Control& gpu, absl::Duration t) {
    batch.reset(new char[kStepBytes]);
    std::memset(batch.get(), 1, kStepBytes);
    SetGpu(gpu, 0, At(kBusyGpu, t), kModelBytes + kStepBytes, kGpuMemory);
    SetGpu(gpu, 1, At(kBusyGpu, t), kModelBytes + kStepBytes, kGpuMemory);
  });
  SONDE_ASSERT_OK(run);
  EXPECT_TRUE((*run)->TrainUntilStored("gpu.0.memory_used_bytes"));
  SONDE_ASSERT_OK((*run)->Close());
  const std::vector<v1::RuleResult> results = (*run)->Verdicts();
  const v1::RuleResult* r = Find(results, "GPUMemoryIncrease");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), v1::RULE_STATUS_NO_ISSUES_FOUND) << r->message();
  EXPECT_GE(r->datapoints(), kHealthySnapshots);
}

// --- LowGPUUtilization ------------------------------------------------------

// patience=10 instead of 1000 and window=10 instead of 500 (above);
// threshold_p95 and threshold_p5 keep 70 and 10.
constexpr char kLowGpuRules[] = "LowGPUUtilization(patience=10,window=10)";

// A case whose step only plays GPU readings: trains until `rule` fires;
// its verdict after the job ended.
std::optional<v1::RuleResult> FireWithSeries(const std::string& rules, const std::string& rule,
                                             const std::string& job, ProfiledCase::Step play) {
  auto run = ProfiledCase::Start(rules, job, std::move(play));
  EXPECT_TRUE(run.ok()) << run.status();
  if (!run.ok()) return std::nullopt;
  const bool fired = (*run)->TrainUntilFired(rule, kFireDeadline);
  SONDE_EXPECT_OK((*run)->Close());
  EXPECT_TRUE(fired) << rule;
  const std::vector<v1::RuleResult> results = (*run)->Verdicts();
  const v1::RuleResult* r = Find(results, rule);
  if (r == nullptr) return std::nullopt;
  return *r;
}

// The same, training until kHealthySnapshots GPU samples are stored.
std::optional<v1::RuleResult> HealthyWithSeries(const std::string& rules, const std::string& rule,
                                                const std::string& job, ProfiledCase::Step play) {
  auto run = ProfiledCase::Start(rules, job, std::move(play));
  EXPECT_TRUE(run.ok()) << run.status();
  if (!run.ok()) return std::nullopt;
  EXPECT_TRUE((*run)->TrainUntilStored("gpu.1.util_percent"));
  SONDE_EXPECT_OK((*run)->Close());
  const std::vector<v1::RuleResult> results = (*run)->Verdicts();
  const v1::RuleResult* r = Find(results, rule);
  if (r == nullptr) return std::nullopt;
  return *r;
}

TEST(ProfilerWorkloads, LowGPUUtilizationFiresOnAnUnderusedGpu) {
  auto r = FireWithSeries(kLowGpuRules, "LowGPUUtilization", "underused", Both(kUnderusedGpu));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status(), v1::RULE_STATUS_ISSUES_FOUND) << r->message();
  EXPECT_LE(r->observed(), 45);  // p95 of the under-used series
  EXPECT_EQ(r->threshold(), 70);
  EXPECT_THAT(r->message(), StartsWith("worker 0 GPU 0: p95 utilisation "));
  EXPECT_THAT(r->message(), HasSubstr("< threshold_p95=70% (under-utilised) over the last 10 of "));
}

TEST(ProfilerWorkloads, LowGPUUtilizationFiresOnAFluctuatingGpu) {
  auto r = FireWithSeries(kLowGpuRules, "LowGPUUtilization", "fluctuating",
                          Both(kFluctuatingGpu));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status(), v1::RULE_STATUS_ISSUES_FOUND) << r->message();
  EXPECT_GT(r->observed(), 70);
  EXPECT_THAT(r->message(), HasSubstr("> threshold_p95=70% but p5 "));
  EXPECT_THAT(r->message(), HasSubstr("< threshold_p5=10% (fluctuating)"));
}

TEST(ProfilerWorkloads, LowGPUUtilizationIsQuietOnABusyGpu) {
  auto r = HealthyWithSeries(kLowGpuRules, "LowGPUUtilization", "busy", Both(kBusyGpu));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status(), v1::RULE_STATUS_NO_ISSUES_FOUND) << r->message();
  EXPECT_GE(r->datapoints(), kHealthySnapshots);
}

// --- BatchSize --------------------------------------------------------------

// patience=10 instead of 1000, window=10 instead of 500; the three p95
// thresholds keep 70.
constexpr char kBatchRules[] = "BatchSize(patience=10,window=10)";

TEST(ProfilerWorkloads, BatchSizeFiresWhenCpuAndGpuAreBothUnderused) {
  // A tiny batch: the loop sleeps through most of its step (a quiet CPU),
  // the GPU is under-used and holds 2 of its 16 GiB.
  auto run = ProfiledCase::Start(kBatchRules, "small-batch", Both(kUnderusedGpu));
  SONDE_ASSERT_OK(run);
  const bool fired = (*run)->TrainUntilFired("BatchSize", kMachineDeadline);
  SONDE_ASSERT_OK((*run)->Close());
  if (!fired) {
    // The CPU is the machine's, shared with whatever else runs here.
    const std::vector<double> cpu = (*run)->reader().Metric("cpu.util_percent");
    const std::vector<double> last(cpu.end() - std::min<size_t>(cpu.size(), 10), cpu.end());
    if (Quantile(last, 0.95) >= 70) {
      GTEST_SKIP() << absl::StrFormat(
          "the machine's CPU was not quiet: p95 %.3g%% over the last %d snapshots (median "
          "%.3g%% over %d), at or above cpu_threshold_p95=70%%; this loop only sleeps",
          Quantile(last, 0.95), last.size(), Quantile(cpu, 0.5), cpu.size());
    }
  }
  EXPECT_TRUE(fired);
  const std::vector<v1::RuleResult> results = (*run)->Verdicts();
  const v1::RuleResult* r = Find(results, "BatchSize");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), v1::RULE_STATUS_ISSUES_FOUND) << r->message();
  EXPECT_LE(r->observed(), 45);  // the GPU's p95
  EXPECT_THAT(r->message(), StartsWith("worker 0 GPU 0 over the last 10 values: p95 utilisation "));
  EXPECT_THAT(r->message(), HasSubstr("p95 memory in use 12.5% < gpu_memory_threshold_p95=70%"));
  EXPECT_THAT(r->message(), HasSubstr("< cpu_threshold_p95=70%"));
}

TEST(ProfilerWorkloads, BatchSizeIsQuietWhileTheGpuIsBusy) {
  // The same sleeping loop; the GPU is busy, so the batch is not too small
  // whatever the CPU does.
  auto r = HealthyWithSeries(kBatchRules, "BatchSize", "full-batch", Both(kBusyGpu));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status(), v1::RULE_STATUS_NO_ISSUES_FOUND) << r->message();
  EXPECT_GE(r->datapoints(), kHealthySnapshots);
}

// --- LoadBalancing ----------------------------------------------------------

// patience=10 instead of 1000; threshold keeps 0.5.
constexpr char kBalanceRules[] = "LoadBalancing(patience=10)";

TEST(ProfilerWorkloads, LoadBalancingFiresWhenOneGpuDoesTheWork) {
  auto r = FireWithSeries(kBalanceRules, "LoadBalancing", "unbalanced",
                          [](Control& gpu, absl::Duration t) {
                            SetGpu(gpu, 0, At(kBusyGpu, t));
                            SetGpu(gpu, 1, At(kUnderusedGpu, t));
                          });
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status(), v1::RULE_STATUS_ISSUES_FOUND) << r->message();
  EXPECT_GT(r->observed(), 0.5);  // disjoint histograms: sqrt(ln 2) = 0.83
  EXPECT_THAT(r->message(), StartsWith("worker 0: utilisation of GPU 0 (mean 9"));
  EXPECT_THAT(r->message(), HasSubstr("and GPU 1 (mean "));
  EXPECT_THAT(r->message(), HasSubstr("more than threshold=0.5"));
}

TEST(ProfilerWorkloads, LoadBalancingIsQuietWhenBothGpusShareTheWork) {
  auto r = HealthyWithSeries(kBalanceRules, "LoadBalancing", "balanced", Both(kBusyGpu));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status(), v1::RULE_STATUS_NO_ISSUES_FOUND) << r->message();
  EXPECT_GE(r->datapoints(), kHealthySnapshots);
}

}  // namespace
}  // namespace sonde
