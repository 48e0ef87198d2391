#include "server/step_assembler.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace sonde::server {
namespace {

v1::StepInfo Step(int64_t step) {
  v1::StepInfo s;
  s.set_step(step);
  s.set_mode(v1::MODE_TRAIN);
  s.set_mode_step(step);
  return s;
}

// Records what is handed on: "step[missing...]".
struct Handed {
  std::vector<std::string> steps;
  StepAssembler::Deliver deliver() {
    return [this](rules::StepData d) {
      std::string s = std::to_string(d.step);
      for (int32_t w : d.missing_workers) s += "-" + std::to_string(w);
      steps.push_back(s);
    };
  }
};

// Commits `worker`'s part of `step` (one tensor) as the registry does.
void Commit(StepAssembler& a, int32_t worker, int64_t step, Handed& h, absl::Time now) {
  if (rules::StepData* part = a.PartOf(Step(step), now); part != nullptr) {
    v1::TensorRecord r;
    r.set_worker(worker);
    part->tensors.push_back(r);
    part->values.push_back(nullptr);
  }
  a.Committed(worker, step, h.deliver());
}

TEST(StepAssembler, AStepGoesOnOnceEveryConnectedWorkerHasIt) {
  StepAssembler a;
  Handed h;
  const absl::Time t0 = absl::Now();
  a.Attach(0, -1);
  a.Attach(1, -1);
  Commit(a, 0, 0, h, t0);
  Commit(a, 0, 1, h, t0);
  EXPECT_TRUE(h.steps.empty());
  EXPECT_EQ(a.pending(), 2u);
  Commit(a, 1, 0, h, t0);
  EXPECT_EQ(h.steps, (std::vector<std::string>{"0"}));
  Commit(a, 1, 1, h, t0);
  EXPECT_EQ(h.steps, (std::vector<std::string>{"0", "1"}));
  EXPECT_EQ(a.delivered_through(), 1);
  EXPECT_EQ(a.pending(), 0u);
}

TEST(StepAssembler, AWorkerThatLeavesNoLongerHoldsStepsBack) {
  StepAssembler a;
  Handed h;
  a.Attach(0, -1);
  a.Attach(1, -1);
  Commit(a, 0, 0, h, absl::Now());
  a.Detach(1, h.deliver());
  EXPECT_EQ(h.steps, (std::vector<std::string>{"0-1"}));  // without worker 1's part
}

TEST(StepAssembler, TheStepWaitHandsOnWhatArrivedNamingWhoIsMissing) {
  StepAssembler a;
  Handed h;
  const absl::Time t0 = absl::Now();
  a.Attach(0, -1);
  a.Attach(1, -1);
  a.Attach(2, -1);
  Commit(a, 0, 0, h, t0);
  Commit(a, 1, 0, h, t0);
  Commit(a, 0, 1, h, t0 + absl::Seconds(5));
  a.DeliverOverdue(t0 + absl::Seconds(9), absl::Seconds(10), h.deliver());
  EXPECT_TRUE(h.steps.empty());  // not overdue yet
  a.DeliverOverdue(t0 + absl::Seconds(10), absl::Seconds(10), h.deliver());
  EXPECT_EQ(h.steps, (std::vector<std::string>{"0-2"}));  // step 1 waits on
  // The late worker's part is stored, not judged again.
  EXPECT_EQ(a.PartOf(Step(0), t0), nullptr);
  Commit(a, 2, 0, h, t0 + absl::Seconds(11));
  EXPECT_EQ(h.steps.size(), 1u);
  a.DeliverOverdue(t0 + absl::Seconds(15), absl::Seconds(10), h.deliver());
  EXPECT_EQ(h.steps, (std::vector<std::string>{"0-2", "1-1-2"}));
}

TEST(StepAssembler, AtTheEndEverythingPendingGoesInOrder) {
  StepAssembler a;
  Handed h;
  a.Attach(0, -1);
  a.Attach(1, -1);
  Commit(a, 0, 2, h, absl::Now());
  Commit(a, 0, 3, h, absl::Now());
  a.DeliverAll(h.deliver());
  EXPECT_EQ(h.steps, (std::vector<std::string>{"2-1", "3-1"}));  // worker 1 sent neither
}

// A worker whose step was lost (its end dropped on the client) commits the
// next one: the lost step is handed on as the others' steps complete, and
// names it, as ListSteps does, instead of passing for whole.
TEST(StepAssembler, AStepAWorkerSkippedNamesItWhenHandedOn) {
  StepAssembler a;
  Handed h;
  const absl::Time t0 = absl::Now();
  a.Attach(0, -1);
  a.Attach(1, -1);
  Commit(a, 0, 0, h, t0);
  Commit(a, 1, 0, h, t0);
  Commit(a, 0, 1, h, t0);
  Commit(a, 0, 2, h, t0);
  Commit(a, 1, 2, h, t0);  // worker 1 never sends step 1
  EXPECT_EQ(h.steps, (std::vector<std::string>{"0", "1-1", "2"}));
  // So does the step wait.
  Commit(a, 1, 3, h, t0);
  a.DeliverOverdue(t0 + absl::Seconds(10), absl::Seconds(5), h.deliver());
  EXPECT_EQ(h.steps, (std::vector<std::string>{"0", "1-1", "2", "3-0"}));
}

TEST(StepAssembler, ARestoreGoesOnWhereTheLastCollectorStopped) {
  StepAssembler a;
  Handed h;
  std::map<int64_t, rules::StepData> pending;
  pending[5].step = 5;
  a.Restore(std::move(pending), 4, absl::Now());
  EXPECT_EQ(a.delivered_through(), 4);
  EXPECT_EQ(a.PartOf(Step(3), absl::Now()), nullptr);  // judged before the restart
  a.Attach(0, 4);
  a.Attach(1, 5);
  Commit(a, 0, 5, h, absl::Now());
  EXPECT_EQ(h.steps, (std::vector<std::string>{"5"}));
  a.Clear();
  EXPECT_EQ(a.delivered_through(), -1);
  EXPECT_EQ(a.pending(), 0u);
}

}  // namespace
}  // namespace sonde::server
