// The training benchmark's loop and checks on the emulated engine: every
// mode stores what it must and the checks find it, so a GPU run's checks
// can be trusted. (Its times mean nothing here.)
#include "tests/bench/training_bench.h"

#include <algorithm>

#include "gtest/gtest.h"

namespace sonde::bench {
namespace {

BenchOptions Small() {
  BenchOptions o;
  o.emulate = true;
  o.layers = 6;
  o.rows = 48;
  o.cols = 256;
  o.compute_ms = 1;
  o.rounds = 2;
  o.steps_per_round = 6;
  o.modes = *ParseModes("none,stats,stats_hist,values4");
  return o;
}

TEST(TrainingBench, EveryModeStoresWhatItMustOnTheEmulatedEngine) {
  auto report = RunTrainingBench(Small());
  ASSERT_TRUE(report.ok()) << report.status();
  const std::string text = FormatReport(*report);
  EXPECT_TRUE(report->ok()) << text;
  EXPECT_NE(text.find("checks passed"), std::string::npos) << text;
  ASSERT_EQ(report->modes.size(), 4u);
  EXPECT_EQ(report->tensors, 12);
  for (const ModeResult& m : report->modes) {
    EXPECT_EQ(m.step_ms.size(), 12u) << m.mode.name;
    ASSERT_EQ(m.host.size(), m.step_ms.size()) << m.mode.name;
    if (!m.mode.hook) continue;
    for (const StepHostTimes& t : m.host) {
      EXPECT_GT(t.save_weights_us, 0) << m.mode.name;  // the hook's calls were timed
      // Work on the thread, at most its wall time (clocks of 1 us and less).
      EXPECT_GE(t.save_weights_cpu_us, 0) << m.mode.name;
      EXPECT_LE(t.save_weights_cpu_us, t.save_weights_us + 2) << m.mode.name;
      EXPECT_LT(t.save_weights_us + t.save_grads_us + t.end_step_us + t.sync_us,
                *std::max_element(m.step_ms.begin(), m.step_ms.end()) * 1000 + 1)
          << m.mode.name;  // parts of a step, not more
    }
    // The device path's time split: parts of the enqueues, which are parts
    // of the saves.
    double saves_us = 0;
    for (const StepHostTimes& t : m.host) saves_us += t.save_weights_us + t.save_grads_us;
    EXPECT_GT(m.enqueue_us, 0) << m.mode.name;
    EXPECT_LE(m.enqueue_us, saves_us / m.host.size() + 1) << m.mode.name;
    EXPECT_GE(m.engine_us, 0) << m.mode.name;
    EXPECT_GE(m.handover_us, 0) << m.mode.name;
    EXPECT_LE(m.engine_us + m.handover_us, m.enqueue_us + 1) << m.mode.name;
    EXPECT_GT(m.saved_steps_expected, 0) << m.mode.name;
    EXPECT_EQ(m.saved_steps_complete, m.saved_steps_expected) << m.mode.name;
    EXPECT_EQ(m.verified_tensors, 2 * 5) << m.mode.name;  // 5 sampled, weight and gradient
  }
  // values4: steps 0..17 in 3 rounds of 6, then 18 and 19 up to the
  // verification step 20: saves at 0, 4, 8, 12, 16, 20.
  EXPECT_EQ(report->modes[3].saved_steps_expected, 6);
  EXPECT_EQ(report->modes[3].verify_step, 20);
}

TEST(TrainingBench, DeferredModesStoreWhatTheyMustToo) {
  BenchOptions o = Small();
  o.modes = *ParseModes("none,stats_deferred,values4_deferred");
  auto report = RunTrainingBench(o);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->ok()) << FormatReport(*report);
  for (const ModeResult& m : report->modes) {
    if (!m.mode.hook) continue;
    EXPECT_TRUE(m.mode.deferred) << m.mode.name;
    EXPECT_EQ(m.saved_steps_complete, m.saved_steps_expected) << m.mode.name;
  }
}

TEST(TrainingBench, ModesAreCheckedAndTheBaselineComesFirst) {
  EXPECT_FALSE(ParseModes("none,none_deferred").ok());
  EXPECT_FALSE(ParseModes("none,fast_deferred").ok());
  EXPECT_FALSE(ParseModes("stats,none").ok());
  EXPECT_FALSE(ParseModes("none,fast").ok());
  EXPECT_FALSE(ParseModes("none,values0").ok());
  auto modes = ParseModes("none,values100");
  ASSERT_TRUE(modes.ok());
  EXPECT_EQ((*modes)[1].interval, 100);
  EXPECT_TRUE((*modes)[1].values);
}

}  // namespace
}  // namespace sonde::bench
