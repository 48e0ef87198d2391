// Profiler rules end to end: a real training loop with a real Hook streams
// its step timings (measured with the real clock) to an in-process
// collector; StepOutlier judges them as they arrive, its verdict is read
// back through the Query service, and its StopTraining reaches the hook
// while training still runs. MaxInitializationTime judges the process's
// real start time, read from /proc.

#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/hook.h"
#include "client/query_client.h"
#include "gtest/gtest.h"
#include "tests/testing/in_process_collector.h"
#include "tests/testing/status_matchers.h"

namespace sonde {
namespace {

using ::sonde::testing::InProcessCollector;
using ::testing::HasSubstr;

HookOptions Options(const std::string& address, const std::string& job) {
  HookOptions o;
  o.collector = address;
  o.job = job;
  o.config.save_config = SaveConfig::Every(1);
  o.close_timeout = absl::Seconds(60);
  return o;
}

// Trains until the hook is told to stop or `max_steps` pass. Each step
// sleeps `step_ms` (10 x longer at the steps `slow` says) and its STEP
// event, timed with the real clock, goes to the collector in batches of 10
// steps. Returns the number of steps run.
int Train(Hook& hook, int max_steps, int step_ms, const std::function<bool(int)>& slow) {
  v1::ProfileBatch batch;
  int step = 0;
  for (; step < max_steps && !hook.should_stop(); ++step) {
    hook.StartStep();
    const absl::Time start = absl::Now();
    std::this_thread::sleep_for(std::chrono::milliseconds(slow(step) ? 10 * step_ms : step_ms));
    SONDE_EXPECT_OK(hook.SaveScalar("loss", 1.0 / (step + 1), {"losses"}));
    v1::TraceEvent* e = batch.add_events();
    e->set_kind(v1::TraceEvent::KIND_STEP);
    e->set_mode(v1::MODE_TRAIN);
    e->set_step(step);
    e->set_mode_step(step);
    e->set_start_unix_micros(absl::ToUnixMicros(start));
    e->set_end_unix_micros(absl::ToUnixMicros(absl::Now()));
    if (batch.events_size() == 10) {
      EXPECT_TRUE(hook.SaveProfile(std::move(batch)));
      batch = v1::ProfileBatch();
    }
  }
  if (batch.events_size() > 0) {
    EXPECT_TRUE(hook.SaveProfile(std::move(batch)));
  }
  return step;
}

const v1::RuleResult* Find(const std::vector<v1::RuleResult>& results, const std::string& rule) {
  for (const auto& r : results) {
    if (r.rule() == rule) return &r;
  }
  return nullptr;
}

TEST(ProfilerRules, StepOutlierFindsSlowStepsOfARealLoopAndStopsIt) {
  InProcessCollector collector("StepOutlier(actions=StopTraining)");
  auto hook = Hook::Create(Options(collector.address(), "stalls"));
  SONDE_ASSERT_OK(hook);
  // Steps 105, 115, ..., 205 take 50 ms instead of 5: the 11th outlier
  // (more than n_outliers=10) is step 205.
  const int steps = Train(**hook, 400, 5, [](int s) { return s >= 105 && s % 10 == 5; });
  EXPECT_TRUE((*hook)->should_stop());
  EXPECT_GT(steps, 205);
  EXPECT_LT(steps, 400);  // stopped by the verdict, not by the end of the loop
  SONDE_ASSERT_OK((*hook)->Close());

  auto q = QueryClient::Connect(collector.address());
  auto results = q->WaitForRuleVerdicts("stalls", absl::Seconds(60));
  SONDE_ASSERT_OK(results);
  const v1::RuleResult* r = Find(*results, "StepOutlier");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), v1::RULE_STATUS_ISSUES_FOUND) << r->message();
  EXPECT_GE(r->observed(), 11);
  EXPECT_THAT(r->message(), HasSubstr("worker 0, TRAIN steps:"));
  EXPECT_THAT(r->message(), HasSubstr("105, 115, 125"));
  EXPECT_THAT(r->message(), HasSubstr("more than n_outliers=10"));
  ASSERT_EQ(r->actions_taken_size(), 1);
  EXPECT_EQ(r->actions_taken(0), "StopTraining");
  EXPECT_GT(r->datapoints(), 200);
}

TEST(ProfilerRules, StepOutlierStaysQuietOnAnEvenLoop) {
  InProcessCollector collector("StepOutlier(actions=StopTraining)");
  auto hook = Hook::Create(Options(collector.address(), "even"));
  SONDE_ASSERT_OK(hook);
  const int steps = Train(**hook, 150, 5, [](int) { return false; });
  EXPECT_EQ(steps, 150);
  EXPECT_FALSE((*hook)->should_stop());
  SONDE_ASSERT_OK((*hook)->Close());

  auto q = QueryClient::Connect(collector.address());
  auto results = q->WaitForRuleVerdicts("even", absl::Seconds(60));
  SONDE_ASSERT_OK(results);
  const v1::RuleResult* r = Find(*results, "StepOutlier");
  ASSERT_NE(r, nullptr);
  // A scheduler hiccup of 10x the step on a loaded machine would be an
  // outlier; ten of them in 150 steps would be a broken machine.
  EXPECT_EQ(r->status(), v1::RULE_STATUS_NO_ISSUES_FOUND) << r->message();
  EXPECT_EQ(r->datapoints(), 150);
}

// When this process started, from /proc: its start time in clock ticks
// after boot (field 22 of /proc/self/stat) plus the boot time (btime).
absl::Time ProcessStart() {
  std::ifstream stat("/proc/self/stat");
  std::string line;
  std::getline(stat, line);
  // Fields after the command name, which may hold spaces, in parentheses.
  std::vector<std::string> fields = absl::StrSplit(line.substr(line.rfind(')') + 2), ' ');
  int64_t ticks = 0;
  EXPECT_TRUE(fields.size() > 19 && absl::SimpleAtoi(fields[19], &ticks)) << line;
  std::ifstream proc_stat("/proc/stat");
  int64_t btime = 0;
  for (std::string l; std::getline(proc_stat, l);) {
    if (l.rfind("btime ", 0) == 0) {
      EXPECT_TRUE(absl::SimpleAtoi(l.substr(6), &btime)) << l;
    }
  }
  EXPECT_GT(btime, 0);
  return absl::FromUnixSeconds(btime) +
         absl::Seconds(static_cast<double>(ticks) / sysconf(_SC_CLK_TCK));
}

// Sends the KIND_INIT event of this process (from its real start until now)
// and trains until stopped or `max_steps`.
int InitThenTrain(Hook& hook, int max_steps) {
  v1::ProfileBatch init;
  v1::TraceEvent* e = init.add_events();
  e->set_kind(v1::TraceEvent::KIND_INIT);
  e->set_step(-1);
  e->set_start_unix_micros(absl::ToUnixMicros(ProcessStart()));
  e->set_end_unix_micros(absl::ToUnixMicros(absl::Now()));
  EXPECT_GT(e->end_unix_micros(), e->start_unix_micros());
  EXPECT_TRUE(hook.SaveProfile(std::move(init)));
  return Train(hook, max_steps, 5, [](int) { return false; });
}

TEST(ProfilerRules, MaxInitializationTimeJudgesTheRealProcessStartAndStopsTraining) {
  // This process started more than 0.06 s (0.001 minutes) before its first step.
  InProcessCollector collector("MaxInitializationTime(threshold=0.001,actions=StopTraining)");
  HookOptions options = Options(collector.address(), "slow-start");
  absl::Notification stopped;
  options.on_stop = [&stopped](const v1::Action&) {
    if (!stopped.HasBeenNotified()) stopped.Notify();
  };
  auto hook = Hook::Create(options);
  SONDE_ASSERT_OK(hook);
  const int steps = InitThenTrain(**hook, 100000);
  EXPECT_TRUE(stopped.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_LT(steps, 100000);
  SONDE_ASSERT_OK((*hook)->Close());

  auto results = QueryClient::Connect(collector.address())
                     ->WaitForRuleVerdicts("slow-start", absl::Seconds(60));
  SONDE_ASSERT_OK(results);
  const v1::RuleResult* r = Find(*results, "MaxInitializationTime");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), v1::RULE_STATUS_ISSUES_FOUND) << r->message();
  EXPECT_THAT(r->message(), HasSubstr("worker 0: initialisation (process start to first step) "
                                      "took "));
  EXPECT_THAT(r->message(), HasSubstr("more than threshold=0.001 minutes"));
  EXPECT_GT(r->observed(), 0.001);
  EXPECT_LT(r->observed(), 60);  // a test process, not an hour old
}

TEST(ProfilerRules, MaxInitializationTimeIsQuietForAQuickStart) {
  InProcessCollector collector("MaxInitializationTime(actions=StopTraining)");
  auto hook = Hook::Create(Options(collector.address(), "quick-start"));
  SONDE_ASSERT_OK(hook);
  EXPECT_EQ(InitThenTrain(**hook, 20), 20);
  SONDE_ASSERT_OK((*hook)->Close());
  auto results = QueryClient::Connect(collector.address())
                     ->WaitForRuleVerdicts("quick-start", absl::Seconds(60));
  SONDE_ASSERT_OK(results);
  const v1::RuleResult* r = Find(*results, "MaxInitializationTime");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), v1::RULE_STATUS_NO_ISSUES_FOUND) << r->message();
}

}  // namespace
}  // namespace sonde
