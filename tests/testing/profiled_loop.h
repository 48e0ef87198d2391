// A profiled training loop made to fill a job report: the data that
// tests/report_test and tests/report_http_test render, produced the same way
// in both. The hook saves every step and profiles (system metrics from
// /proc every 100 ms); each train step waits 2 ms for data (a DataWait
// event), starts, works ~5 ms (~200 ms at kProfiledLoopSlowStep) and saves
// a decreasing loss. One loop per hook; nothing here is shared.
#ifndef SONDE_TESTS_TESTING_PROFILED_LOOP_H_
#define SONDE_TESTS_TESTING_PROFILED_LOOP_H_

#include <string>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/hook.h"

namespace sonde::testing {

// Enough for StepOutlier, which judges a mode only after 100 steps
// (smdebug's minimum).
inline constexpr int kProfiledLoopSteps = 110;
// The one slow step: the outlier a report lists first.
inline constexpr int kProfiledLoopSlowStep = 7;
// Rules whose results a report of this loop shows: a tensor rule on the
// loss, and StepOutlier told to fire on a single outlier (the slow step).
inline constexpr char kProfiledLoopRules[] = "LossNotDecreasing;StepOutlier(n_outliers=0)";

// The loop's hook options for `job` on the collector at `address`; a test
// adds what it needs (a token) before Hook::Create.
inline HookOptions ProfiledLoopOptions(const std::string& address, const std::string& job) {
  HookOptions o;
  o.collector = address;
  o.job = job;
  o.config.save_config = SaveConfig::Every(1);
  o.profiler.enabled = true;
  o.profiler.interval = absl::Milliseconds(100);
  return o;
}

// Runs `steps` train steps on `hook` and leaves it open (the caller may add
// to the job, then closes it). Returns the first failed SaveScalar's status.
inline absl::Status RunProfiledLoop(Hook& hook, int steps) {
  hook.SetMode(v1::MODE_TRAIN);
  for (int step = 0; step < steps; ++step) {
    {
      auto wait = hook.DataWait();
      absl::SleepFor(absl::Milliseconds(2));
    }
    hook.StartStep();
    absl::SleepFor(absl::Milliseconds(step == kProfiledLoopSlowStep ? 200 : 5));
    absl::Status saved = hook.SaveScalar("loss", 2.0 / (step + 1), {"losses"});
    if (!saved.ok()) return saved;
  }
  return absl::OkStatus();
}

}  // namespace sonde::testing

#endif  // SONDE_TESTS_TESTING_PROFILED_LOOP_H_
