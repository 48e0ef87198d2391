// Each profiler rule through a real RuleRunner: a recorded series that shows
// the rule's problem fires with the numbers seen, a healthy one stays quiet
// and ends NoIssuesFound. This machine has no GPU: every GPU series here is
// a synthetic recording (shaped like nvidia-smi's utilisation of a real
// stalled or healthy job), and says so.
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "rules/builtin_rules.h"
#include "rules/rule_config.h"
#include "rules/rule_runner.h"
#include "tests/testing/status_matchers.h"

namespace sonde::rules {
namespace {

using ::sonde::testing::StatusIs;
using ::testing::HasSubstr;

class RecordingSink : public RuleSink {
 public:
  void OnResult(const v1::RuleResult& r) override {
    absl::MutexLock lock(&mu);
    if (!first_issue.has_value() && r.status() == v1::RULE_STATUS_ISSUES_FOUND) first_issue = r;
  }
  void OnAction(const v1::Action& a) override {
    absl::MutexLock lock(&mu);
    actions.push_back(a);
  }
  absl::Mutex mu;
  std::vector<v1::Action> actions ABSL_GUARDED_BY(mu);
  std::optional<v1::RuleResult> first_issue ABSL_GUARDED_BY(mu);
};

constexpr int64_t kStart = 1700000000000000;  // unix micros of the recordings

struct Judged {
  v1::RuleResult result;  // the verdict when the rule first fired, else the final one
  v1::RuleResult final;   // after the end of training (profiler rules keep judging)
  std::vector<v1::Action> actions;
};

// Runs the rule of `flag` (--rules syntax) over `batches` (worker, batch),
// then the end of training, and returns its verdicts.
Judged Judge(const std::string& flag, const std::vector<std::pair<int32_t, v1::ProfileBatch>>& batches) {
  static const std::unique_ptr<RuleFactory> factory = BuiltinRuleFactory();
  auto specs = ParseRuleFlag(flag);
  EXPECT_TRUE(specs.ok()) << specs.status();
  ThreadPool pool(2, 64);
  RecordingSink sink;
  auto runner = RuleRunner::Create("job", *specs, {}, *factory, &pool, &sink);
  EXPECT_TRUE(runner.ok()) << runner.status();
  if (!runner.ok()) return {};
  for (const auto& [worker, batch] : batches) (*runner)->SubmitProfile(worker, batch);
  (*runner)->SubmitJobEnd();
  (*runner)->Drain();
  Judged out;
  out.final = (*runner)->Results().at(0);
  absl::MutexLock lock(&sink.mu);
  out.result = sink.first_issue.value_or(out.final);
  out.actions = sink.actions;
  return out;
}

// A deterministic jitter in [-1, 1].
double Jitter(int i) { return std::sin(i * 12.9898) ; }

v1::TraceEvent StepEvent(int64_t step, int64_t start, int64_t micros, v1::Mode mode = v1::MODE_TRAIN) {
  v1::TraceEvent e;
  e.set_kind(v1::TraceEvent::KIND_STEP);
  e.set_mode(mode);
  e.set_step(step);
  e.set_mode_step(step);
  e.set_start_unix_micros(start);
  e.set_end_unix_micros(start + micros);
  return e;
}

// Step events of `n` steps of about `ms` ms (+-10%), sent in batches of 20;
// steps in `slow` take 10x longer.
std::vector<std::pair<int32_t, v1::ProfileBatch>> StepRecording(int n, double ms,
                                                                 const std::set<int>& slow) {
  std::vector<std::pair<int32_t, v1::ProfileBatch>> out;
  int64_t t = kStart;
  for (int s = 0; s < n; ++s) {
    if (s % 20 == 0) out.emplace_back(0, v1::ProfileBatch());
    double d = ms * (1 + 0.1 * Jitter(s));
    if (slow.count(s) > 0) d *= 10;
    const int64_t micros = static_cast<int64_t>(d * 1000);
    *out.back().second.add_events() = StepEvent(s, t, micros);
    t += micros;
  }
  return out;
}

TEST(StepOutlier, FiresWhenMoreThanNOutliersStepsTakeTenTimesLonger) {
  std::set<int> slow;
  for (int s = 105; s < 160; s += 5) slow.insert(s);  // 11 slow steps: 105 ... 155
  Judged j = Judge("StepOutlier(actions=StopTraining)", StepRecording(200, 20, slow));
  EXPECT_EQ(j.result.status(), v1::RULE_STATUS_ISSUES_FOUND) << j.result.message();
  EXPECT_EQ(j.result.observed(), 11);
  EXPECT_EQ(j.result.threshold(), 10);
  EXPECT_THAT(j.result.message(), HasSubstr("worker 0, TRAIN steps: 11 of the last 160"));
  EXPECT_THAT(j.result.message(), HasSubstr("outlier steps 105, 110, 115"));
  EXPECT_EQ(j.result.datapoints(), 160);  // judged on the batch that held the 11th
  EXPECT_EQ(slow.count(static_cast<int>(j.result.step())), 1u) << j.result.step();  // the longest
  EXPECT_EQ(j.result.times_triggered(), 1);
  // It kept judging: the batches of steps 160..199 still had 11 outliers
  // among the last steps, and the final verdict says so.
  EXPECT_EQ(j.final.status(), v1::RULE_STATUS_ISSUES_FOUND);
  EXPECT_EQ(j.final.datapoints(), 200);
  EXPECT_EQ(j.final.times_triggered(), 3);  // batches ending at steps 159, 179, 199
  EXPECT_THAT(j.final.message(), HasSubstr("11 of the last 200"));
  ASSERT_EQ(j.actions.size(), 1u);  // acted once
  EXPECT_EQ(j.actions[0].type(), v1::ACTION_STOP_TRAINING);
}

TEST(StepOutlier, TenOutliersAreToleratedAndSteadyStepsStayQuiet) {
  std::set<int> slow;
  for (int s = 105; s < 155; s += 5) slow.insert(s);  // 10: not more than n_outliers
  Judged j = Judge("StepOutlier", StepRecording(300, 20, slow));
  EXPECT_EQ(j.result.status(), v1::RULE_STATUS_NO_ISSUES_FOUND) << j.result.message();
  EXPECT_EQ(j.result.datapoints(), 300);
  EXPECT_EQ(Judge("StepOutlier", StepRecording(300, 20, {})).result.status(),
            v1::RULE_STATUS_NO_ISSUES_FOUND);
}

TEST(StepOutlier, JudgesNothingBeforeMoreThan100StepsAndOnlyItsMode) {
  // 30 slow steps among 100: too few steps to judge.
  std::set<int> slow;
  for (int s = 0; s < 100; s += 3) slow.insert(s);
  EXPECT_EQ(Judge("StepOutlier(n_outliers=0)", StepRecording(100, 20, slow)).result.status(),
            v1::RULE_STATUS_NO_ISSUES_FOUND);
  slow = {150};
  EXPECT_EQ(Judge("StepOutlier(n_outliers=0)", StepRecording(200, 20, slow)).result.status(),
            v1::RULE_STATUS_ISSUES_FOUND);
  EXPECT_EQ(Judge("StepOutlier(n_outliers=0,mode=EVAL)", StepRecording(200, 20, slow))
                .result.status(),
            v1::RULE_STATUS_NO_ISSUES_FOUND);
}

using Metrics = std::vector<std::pair<std::string, double>>;

// `n` metric snapshots one second apart, `metrics(i)` the samples of the
// i-th, sent in batches of 50 (the hook's default flush) by `worker`.
std::vector<std::pair<int32_t, v1::ProfileBatch>> SystemRecording(
    int n, const std::function<Metrics(int)>& metrics, int32_t worker = 0) {
  std::vector<std::pair<int32_t, v1::ProfileBatch>> out;
  for (int i = 0; i < n; ++i) {
    if (i % 50 == 0) out.emplace_back(worker, v1::ProfileBatch());
    v1::MetricSnapshot* s = out.back().second.add_snapshots();
    s->set_unix_micros(kStart + int64_t{i} * 1000000);
    for (const auto& [name, value] : metrics(i)) {
      v1::MetricSample* m = s->add_samples();
      m->set_name(name);
      m->set_value(value);
    }
  }
  return out;
}

// Four cores and two GPUs; `busy_core` is core 2's utilisation.
Metrics Machine(double gpu0, double gpu1, double busy_core, double iowait = 1) {
  return {{"cpu.util_percent", (3 * 30 + busy_core) / 4},
          {"cpu.0.util_percent", 30},
          {"cpu.1.util_percent", 30},
          {"cpu.2.util_percent", busy_core},
          {"cpu.3.util_percent", 30},
          {"cpu.iowait_percent", iowait},
          {"gpu.0.util_percent", gpu0},
          {"gpu.1.util_percent", gpu1}};
}

// Synthetic GPU recording: in 7 of every 10 snapshots GPU 0 idles at 3%
// while core 2 is pegged at 97% (a single-threaded input pipeline).
TEST(CPUBottleneck, FiresWhenMostSnapshotsHaveAnIdleGpuAndABusyCore) {
  Judged j = Judge("CPUBottleneck", SystemRecording(1200, [](int i) {
                     return i % 10 < 7 ? Machine(3, 80, 97) : Machine(85, 80, 40);
                   }));
  EXPECT_EQ(j.result.status(), v1::RULE_STATUS_ISSUES_FOUND) << j.result.message();
  // Judged first on the batch that passed patience=1000: snapshots 0..1049.
  EXPECT_THAT(j.result.message(),
              HasSubstr("worker 0: 735 of 1050 system snapshots (70%) had a GPU below "
                        "gpu_threshold=10% while a CPU core was above cpu_threshold=90%"));
  EXPECT_THAT(j.result.message(), HasSubstr("last: GPU 0 at 3% while CPU core 2 at 97%"));
  EXPECT_DOUBLE_EQ(j.result.observed(), 70);
  EXPECT_EQ(j.result.threshold(), 50);
  EXPECT_EQ(j.result.datapoints(), 1050);
}

TEST(CPUBottleneck, BusyCpuWithBusyGpusOrNoGpusAtAllIsHealthy) {
  // Synthetic GPU recording: both GPUs at 80-90% while a core is pegged.
  EXPECT_EQ(Judge("CPUBottleneck", SystemRecording(1500, [](int i) {
                    return Machine(85 + 5 * Jitter(i), 80, 97);
                  })).result.status(),
            v1::RULE_STATUS_NO_ISSUES_FOUND);
  // A CPU-only machine (like this one) sends no GPU metrics.
  EXPECT_EQ(Judge("CPUBottleneck", SystemRecording(1500, [](int) {
                    return Metrics{{"cpu.0.util_percent", 99}};
                  })).result.status(),
            v1::RULE_STATUS_NO_ISSUES_FOUND);
  // Bottlenecks, but not more than patience snapshots yet.
  EXPECT_EQ(Judge("CPUBottleneck", SystemRecording(1000, [](int) { return Machine(3, 3, 97); }))
                .result.status(),
            v1::RULE_STATUS_NO_ISSUES_FOUND);
}

// Synthetic GPU recording: 6 in 10 snapshots wait on I/O at 65% with both
// GPUs idle.
TEST(IOBottleneck, FiresWhenGpusIdleWhileTheCpuWaitsForIo) {
  Judged j = Judge("IOBottleneck(patience=500)", SystemRecording(800, [](int i) {
                     return i % 10 < 6 ? Machine(2, 4, 20, 65) : Machine(90, 90, 40, 5);
                   }));
  EXPECT_EQ(j.result.status(), v1::RULE_STATUS_ISSUES_FOUND) << j.result.message();
  EXPECT_THAT(j.result.message(),
              HasSubstr("worker 0: 330 of 550 system snapshots (60%) had a GPU below "
                        "gpu_threshold=10% while I/O wait was above io_threshold=50%"));
  EXPECT_THAT(j.result.message(), HasSubstr("last: GPU 0 at 2% while I/O wait at 65%"));
}

TEST(IOBottleneck, HighIoWaitWithBusyGpusIsHealthy) {
  EXPECT_EQ(Judge("IOBottleneck", SystemRecording(1500, [](int i) {
                    return Machine(90, 88 + Jitter(i), 30, 70);
                  })).result.status(),
            v1::RULE_STATUS_NO_ISSUES_FOUND);
}

// Synthetic GPU recording: GPU 1 idles around 30% (a small batch), GPU 0
// is busy.
TEST(LowGPUUtilization, FiresOnAnUnderUsedGpuOnceItHasSentMoreThanPatienceValues) {
  Judged j = Judge("LowGPUUtilization(actions=StopTraining)", SystemRecording(1200, [](int i) {
                     return Machine(90, 30 + 10 * Jitter(i), 40);
                   }));
  EXPECT_EQ(j.result.status(), v1::RULE_STATUS_ISSUES_FOUND) << j.result.message();
  EXPECT_THAT(j.result.message(), HasSubstr("worker 0 GPU 1: p95 utilisation 39."));
  EXPECT_THAT(j.result.message(),
              HasSubstr("< threshold_p95=70% (under-utilised) over the last 500 of 1050 values"));
  EXPECT_GT(j.result.observed(), 38);
  EXPECT_LT(j.result.observed(), 40);
  EXPECT_EQ(j.actions.size(), 1u);
}

// Synthetic GPU recording: busy at 95% but every tenth sample drops to 0
// (waiting on a synchronisation).
TEST(LowGPUUtilization, FiresOnAFluctuatingGpu) {
  Judged j = Judge("LowGPUUtilization(patience=100,window=100)", SystemRecording(300, [](int i) {
                     return Machine(i % 10 == 0 ? 0 : 95, 90, 40);
                   }));
  EXPECT_EQ(j.result.status(), v1::RULE_STATUS_ISSUES_FOUND) << j.result.message();
  EXPECT_THAT(j.result.message(),
              HasSubstr("worker 0 GPU 0: p95 utilisation 95% > threshold_p95=70% but p5 0% < "
                        "threshold_p5=10% (fluctuating) over the last 100 of 150 values"));
}

TEST(LowGPUUtilization, BusyGpusAndTheFirstPatienceValuesAreQuiet) {
  EXPECT_EQ(Judge("LowGPUUtilization", SystemRecording(2000, [](int i) {
                    return Machine(85 + 10 * Jitter(i), 80 + 5 * Jitter(i + 7), 40);
                  })).result.status(),
            v1::RULE_STATUS_NO_ISSUES_FOUND);
  // Idle while initialising: the first 1000 values are not judged.
  EXPECT_EQ(Judge("LowGPUUtilization", SystemRecording(1000, [](int) { return Machine(0, 0, 10); }))
                .result.status(),
            v1::RULE_STATUS_NO_ISSUES_FOUND);
}

Metrics GpuMemory(double percent) {
  return {{"gpu.0.memory_used_bytes", percent / 100 * 16e9}, {"gpu.0.memory_total_bytes", 16e9}};
}

// Synthetic GPU recording: memory steady at 30%, then at snapshot 1100 a
// jump to 95% (a cache of activations kept across steps).
TEST(GPUMemoryIncrease, FiresWhenTheMovingAverageJumps) {
  Judged j = Judge("GPUMemoryIncrease", SystemRecording(1300, [](int i) {
                     return GpuMemory(i < 1100 ? 30 + 0.5 * Jitter(i) : 95);
                   }));
  EXPECT_EQ(j.result.status(), v1::RULE_STATUS_ISSUES_FOUND) << j.result.message();
  EXPECT_THAT(j.result.message(), HasSubstr("worker 0 GPU 0: memory in use 95%"));
  EXPECT_THAT(j.result.message(), HasSubstr("more than increase=5"));
  EXPECT_NEAR(j.result.observed(), 6.5, 0.1);  // (95 - ~30) / window
  EXPECT_EQ(j.result.datapoints(), 1150);       // the batch of snapshot 1100
}

TEST(GPUMemoryIncrease, SteadyOrSlowlyGrowingMemoryIsQuiet) {
  EXPECT_EQ(Judge("GPUMemoryIncrease", SystemRecording(2000, [](int i) {
                    return GpuMemory(30 + 0.03 * i + Jitter(i));
                  })).result.status(),
            v1::RULE_STATUS_NO_ISSUES_FOUND);
  // NVML's memory utilisation when used/total are not sent.
  EXPECT_EQ(Judge("GPUMemoryIncrease(patience=0)", SystemRecording(200, [](int) {
                    return Metrics{{"gpu.0.memory_util_percent", 40}};
                  })).result.status(),
            v1::RULE_STATUS_NO_ISSUES_FOUND);
}

v1::ProfileBatch InitBatch(double minutes) {
  v1::ProfileBatch b;
  v1::TraceEvent* e = b.add_events();
  e->set_kind(v1::TraceEvent::KIND_INIT);
  e->set_step(-1);
  e->set_start_unix_micros(kStart);
  e->set_end_unix_micros(kStart + static_cast<int64_t>(minutes * 60e6));
  *b.add_events() = StepEvent(0, e->end_unix_micros(), 100000);
  return b;
}

TEST(MaxInitializationTime, FiresOnALongInitEvent) {
  Judged j = Judge("MaxInitializationTime", {{1, InitBatch(25)}});
  EXPECT_EQ(j.result.status(), v1::RULE_STATUS_ISSUES_FOUND) << j.result.message();
  EXPECT_EQ(j.result.message(),
            "worker 1: initialisation (process start to first step) took 25 minutes, more than "
            "threshold=20 minutes");
  EXPECT_EQ(j.result.worker(), 1);
  EXPECT_DOUBLE_EQ(j.result.observed(), 25);
}

TEST(MaxInitializationTime, FiresWhileStillWaitingForTheFirstStep) {
  // System metrics, no step yet: 127 snapshots 1 s apart span 126 s...
  auto batches = SystemRecording(127, [](int) { return Metrics{{"cpu.util_percent", 100}}; });
  Judged j = Judge("MaxInitializationTime", batches);
  // ...10 s apart, 21 minutes.
  for (auto& [w, b] : batches) {
    for (auto& s : *b.mutable_snapshots()) {
      s.set_unix_micros(kStart + (s.unix_micros() - kStart) * 10);
    }
  }
  EXPECT_EQ(j.result.status(), v1::RULE_STATUS_NO_ISSUES_FOUND);  // 126 s
  j = Judge("MaxInitializationTime", batches);
  EXPECT_EQ(j.result.status(), v1::RULE_STATUS_ISSUES_FOUND);
  EXPECT_EQ(j.result.message(),
            "no training step yet 21 minutes after the first profiler data, more than "
            "threshold=20 minutes");
}

TEST(MaxInitializationTime, AQuickStartIsHealthyHoweverLongTheJob) {
  std::vector<std::pair<int32_t, v1::ProfileBatch>> batches = {{0, InitBatch(2)}};
  for (auto& b : SystemRecording(2000, [](int) { return Metrics{{"cpu.util_percent", 50}}; })) {
    batches.push_back(b);
  }
  EXPECT_EQ(Judge("MaxInitializationTime", batches).result.status(),
            v1::RULE_STATUS_NO_ISSUES_FOUND);
}

Metrics With(Metrics a, const Metrics& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Synthetic GPU recording: a small batch leaves CPU (~37%), GPU 0 (~35%)
// and its memory (20%) all idle.
TEST(BatchSize, FiresWhenCpuGpuAndGpuMemoryAreAllUnderUsed) {
  Judged j = Judge("BatchSize", SystemRecording(1200, [](int i) {
                     return With(Machine(35 + 10 * Jitter(i), 35, 60), GpuMemory(20));
                   }));
  EXPECT_EQ(j.result.status(), v1::RULE_STATUS_ISSUES_FOUND) << j.result.message();
  EXPECT_THAT(j.result.message(),
              HasSubstr("worker 0 GPU 0 over the last 500 values: p95 utilisation 44."));
  EXPECT_THAT(j.result.message(),
              HasSubstr("p95 memory in use 20% < gpu_memory_threshold_p95=70%, and p95 CPU "
                        "utilisation 37.5% < cpu_threshold_p95=70%"));
  EXPECT_EQ(j.result.datapoints(), 1050);
}

TEST(BatchSize, ABusyGpuIsHealthy) {
  EXPECT_EQ(Judge("BatchSize", SystemRecording(2000, [](int i) {
                    return With(Machine(90 + 5 * Jitter(i), 85, 60), GpuMemory(20));
                  })).result.status(),
            v1::RULE_STATUS_NO_ISSUES_FOUND);
}

// Synthetic GPU recording: GPU 0 does all the work, GPU 1 waits.
TEST(LoadBalancing, FiresWhenTwoGpusOfAWorkerAreLoadedDifferently) {
  Judged j = Judge("LoadBalancing", SystemRecording(1200, [](int i) {
                     return Machine(90 + 5 * Jitter(i), 20 + 5 * Jitter(i + 3), 40);
                   }));
  EXPECT_EQ(j.result.status(), v1::RULE_STATUS_ISSUES_FOUND) << j.result.message();
  EXPECT_THAT(j.result.message(), HasSubstr("worker 0: utilisation of GPU 0 (mean 90"));
  EXPECT_THAT(j.result.message(),
              HasSubstr("over 1050 values) differ by a Jensen-Shannon distance of 0.833, more "
                        "than threshold=0.5"));
}

TEST(LoadBalancing, EquallyLoadedGpusAreHealthy) {
  EXPECT_EQ(Judge("LoadBalancing", SystemRecording(2000, [](int i) {
                    return Machine(85 + 10 * Jitter(i), 85 + 10 * Jitter(i + 5), 40);
                  })).result.status(),
            v1::RULE_STATUS_NO_ISSUES_FOUND);
}

Metrics Loaders(double n) { return With(Machine(90, 90, 40), {{"framework.dataloader_workers", n}}); }

TEST(Dataloader, FiresOnTooFewOrTooManyLoadersForTheCores) {
  Judged j = Judge("Dataloader", SystemRecording(100, [](int) { return Loaders(1); }));
  EXPECT_EQ(j.result.status(), v1::RULE_STATUS_ISSUES_FOUND);
  EXPECT_EQ(j.result.message(),
            "worker 0: a median of 1 data-loader processes for 4 CPU cores, fewer than "
            "min_threshold=70% of the cores (2.8)");
  j = Judge("Dataloader", SystemRecording(100, [](int) { return Loaders(12); }));
  EXPECT_EQ(j.result.status(), v1::RULE_STATUS_ISSUES_FOUND);
  EXPECT_EQ(j.result.message(),
            "worker 0: a median of 12 data-loader processes for 4 CPU cores, more than "
            "max_threshold=200% of the cores (8)");
  EXPECT_THAT(j.result.suggestion(), HasSubstr("fewer data-loader processes"));
}

TEST(Dataloader, EnoughLoadersOrNoCountIsHealthy) {
  EXPECT_EQ(Judge("Dataloader", SystemRecording(100, [](int) { return Loaders(4); }))
                .result.status(),
            v1::RULE_STATUS_NO_ISSUES_FOUND);
  EXPECT_EQ(Judge("Dataloader", SystemRecording(100, [](int) { return Machine(90, 90, 40); }))
                .result.status(),
            v1::RULE_STATUS_NO_ISSUES_FOUND);
}

TEST(OverallSystemUsage, NeverFindsAnIssue) {
  Judged j = Judge("OverallSystemUsage", SystemRecording(300, [](int) {
                     return Machine(0, 100, 100, 100);
                   }));
  EXPECT_EQ(j.result.status(), v1::RULE_STATUS_NO_ISSUES_FOUND);
  EXPECT_EQ(j.result.datapoints(), 300);
  // Its verdict carries the summary.
  EXPECT_THAT(j.result.message(), HasSubstr("worker 0: CPU p50"));
}

// Synthetic GPU recording (GPU 1 idles) with step events whose steps
// 105, 115, ... take 10x longer, both from worker 0.
std::vector<std::pair<int32_t, v1::ProfileBatch>> TroubledJob() {
  auto batches = SystemRecording(1200, [](int i) {
    return With(Machine(90, 30 + 10 * Jitter(i), 40),
                {{"memory.used_bytes", 8e9}, {"memory.total_bytes", 32e9}});
  });
  std::set<int> slow;
  for (int s = 105; s < 300; s += 10) slow.insert(s);
  for (auto& b : StepRecording(300, 20, slow)) batches.push_back(b);
  return batches;
}

TEST(ProfilerReport, ReportsEveryRuleThatTriggeredAtTheEndWithTheSystemUsage) {
  Judged j = Judge("ProfilerReport", TroubledJob());
  EXPECT_EQ(j.result.status(), v1::RULE_STATUS_ISSUES_FOUND) << j.result.message();
  EXPECT_EQ(j.result.observed(), 3);
  EXPECT_THAT(j.result.message(), HasSubstr("3 of 9 profiler rules triggered: LoadBalancing ("));
  EXPECT_THAT(j.result.message(), HasSubstr("LowGPUUtilization (worker 0 GPU 1: p95"));
  EXPECT_THAT(j.result.message(), HasSubstr("StepOutlier (worker 0, TRAIN steps: 12 of the last 220"));
  EXPECT_THAT(j.result.message(),
              HasSubstr("System usage: worker 0: CPU p50 32.5% p95 32.5% max 32.5%, GPU 0 p50 "
                        "90% p95 90% max 90%, GPU 1 p50"));
  EXPECT_THAT(j.result.message(), HasSubstr("memory p50 25% p95 25% max 25%"));
  EXPECT_EQ(j.result.datapoints(), 1500);  // every snapshot and event, none skipped
}

TEST(ProfilerReport, TakesOverridesAsRuleUnderscoreParameter) {
  // Raising LowGPUUtilization's threshold away and StepOutlier's tolerance
  // leaves LoadBalancing alone.
  Judged j = Judge(
      "ProfilerReport(LowGPUUtilization_threshold_p95=20,StepOutlier_n_outliers=50,"
      "LowGPUUtilization_threshold_p5=0)",
      TroubledJob());
  EXPECT_EQ(j.result.status(), v1::RULE_STATUS_ISSUES_FOUND);
  EXPECT_THAT(j.result.message(), HasSubstr("1 of 9 profiler rules triggered: LoadBalancing"));
  auto factory = BuiltinRuleFactory();
  auto specs = ParseRuleFlag("ProfilerReport(Nope_threshold=1)");
  ASSERT_TRUE(specs.ok());
  EXPECT_THAT(factory->Create((*specs)[0]),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown parameter 'Nope_threshold'"));
  specs = ParseRuleFlag("ProfilerReport(StepOutlier_nope=1)");
  EXPECT_THAT(factory->Create((*specs)[0]),
              StatusIs(absl::StatusCode::kInvalidArgument, "StepOutlier: unknown parameter 'nope'"));
}

TEST(ProfilerReport, AHealthyJobHasNoIssues) {
  // Steps first: 25 minutes of snapshots without a step would be a slow start.
  auto batches = StepRecording(300, 20, {});
  for (auto& b : SystemRecording(1500, [](int i) {
         return With(Machine(85 + 10 * Jitter(i), 85 + 10 * Jitter(i + 5), 40), GpuMemory(60));
       })) {
    batches.push_back(b);
  }
  Judged j = Judge("ProfilerReport", batches);
  EXPECT_EQ(j.result.status(), v1::RULE_STATUS_NO_ISSUES_FOUND) << j.result.message();
  // Counted in profiler data points, with the system usage it saw.
  EXPECT_THAT(j.result.message(), HasSubstr("no issues found in 1800 profiler data points; "
                                            "worker 0: CPU p50"));
}

TEST(ProfilerRules, CatalogueHasSageMakersParametersAndEveryDefaultIsAccepted) {
  using Params = std::vector<std::pair<std::string, std::string>>;
  const std::string scan = "60000000";
  const std::map<std::string, Params> expected = {
      {"StepOutlier",
       {{"stddev", "3"}, {"mode", "None"}, {"n_outliers", "10"}, {"scan_interval_us", scan}}},
      {"CPUBottleneck",
       {{"threshold", "50"}, {"gpu_threshold", "10"}, {"cpu_threshold", "90"},
        {"patience", "1000"}, {"scan_interval_us", scan}}},
      {"IOBottleneck",
       {{"threshold", "50"}, {"gpu_threshold", "10"}, {"io_threshold", "50"},
        {"patience", "1000"}, {"scan_interval_us", scan}}},
      {"LowGPUUtilization",
       {{"threshold_p95", "70"}, {"threshold_p5", "10"}, {"window", "500"},
        {"patience", "1000"}, {"scan_interval_us", scan}}},
      {"GPUMemoryIncrease",
       {{"increase", "5"}, {"patience", "1000"}, {"window", "10"}, {"scan_interval_us", scan}}},
      {"MaxInitializationTime", {{"threshold", "20"}, {"scan_interval_us", scan}}},
      {"BatchSize",
       {{"cpu_threshold_p95", "70"}, {"gpu_threshold_p95", "70"},
        {"gpu_memory_threshold_p95", "70"}, {"patience", "1000"}, {"window", "500"},
        {"scan_interval_us", scan}}},
      {"LoadBalancing", {{"threshold", "0.5"}, {"patience", "1000"}, {"scan_interval_us", scan}}},
      {"Dataloader",
       {{"min_threshold", "70"}, {"max_threshold", "200"}, {"patience", "10"},
        {"scan_interval_us", scan}}},
      {"OverallSystemUsage", {{"scan_interval_us", scan}}},
      {"ProfilerReport", {{"scan_interval_us", scan}}},
  };
  auto factory = BuiltinRuleFactory();
  for (const auto& [type, params] : expected) {
    SCOPED_TRACE(type);
    const RuleInfo* info = factory->Find(type);
    ASSERT_NE(info, nullptr);
    Params actual;
    for (const RuleParameterInfo& p : info->parameters) {
      actual.emplace_back(p.name, p.default_value);
      EXPECT_FALSE(p.description.empty()) << p.name;
    }
    EXPECT_EQ(actual, params);
    EXPECT_FALSE(info->description.empty());
    EXPECT_FALSE(info->suggestion.empty());
    v1::RuleSpec spec;
    spec.set_rule_type(type);
    for (const auto& [name, value] : params) (*spec.mutable_parameters())[name] = value;
    auto rule = factory->Create(spec);
    ASSERT_TRUE(rule.ok()) << rule.status();
    EXPECT_TRUE((*rule)->WantsProfile());
  }
}

TEST(ProfilerRules, BadParametersNameTheRuleAndTheParameter) {
  auto factory = BuiltinRuleFactory();
  auto specs = ParseRuleFlag("StepOutlier(mode=SIDEWAYS)");
  ASSERT_TRUE(specs.ok());
  EXPECT_THAT(factory->Create((*specs)[0]),
              StatusIs(absl::StatusCode::kInvalidArgument, "StepOutlier"));
  specs = ParseRuleFlag("StepOutlier(stddev=-1)");
  EXPECT_THAT(factory->Create((*specs)[0]),
              StatusIs(absl::StatusCode::kInvalidArgument, "stddev"));
  specs = ParseRuleFlag("Dataloader(min_threshold=300)");
  EXPECT_THAT(factory->Create((*specs)[0]),
              StatusIs(absl::StatusCode::kInvalidArgument, "max_threshold=200 is below"));
  specs = ParseRuleFlag("StepOutlier(scan_interval_us=0)");
  EXPECT_THAT(factory->Create((*specs)[0]),
              StatusIs(absl::StatusCode::kInvalidArgument, "scan_interval_us"));
}

TEST(ProfilerRules, WindowsAboveTheLimitAreRefused) {
  auto factory = BuiltinRuleFactory();
  for (const std::string type : {"LowGPUUtilization", "GPUMemoryIncrease", "BatchSize"}) {
    SCOPED_TRACE(type);
    v1::RuleSpec spec;
    spec.set_rule_type(type);
    (*spec.mutable_parameters())["window"] = "100001";
    EXPECT_THAT(factory->Create(spec),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         type + ": parameter window=100001 is above the limit of 100000"));
    (*spec.mutable_parameters())["window"] = "100000";
    EXPECT_TRUE(factory->Create(spec).ok());
  }
}

TEST(StepOutlier, StepsOfExactlyEqualDurationHaveNoOutliers) {
  // The running sums must not make a spread out of rounding.
  std::vector<std::pair<int32_t, v1::ProfileBatch>> batches;
  int64_t t = kStart;
  for (int s = 0; s < 400; ++s) {
    if (s % 20 == 0) batches.emplace_back(0, v1::ProfileBatch());
    *batches.back().second.add_events() = StepEvent(s, t, 33333);
    t += 33333;
  }
  EXPECT_EQ(Judge("StepOutlier(n_outliers=0)", batches).result.status(),
            v1::RULE_STATUS_NO_ISSUES_FOUND);
}

}  // namespace
}  // namespace sonde::rules
