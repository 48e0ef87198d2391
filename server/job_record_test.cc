#include "server/job_record.h"

#include <vector>

#include "gtest/gtest.h"

namespace sonde::server {
namespace {

v1::StepInfo Step(int64_t step, v1::Mode mode, int64_t mode_step, uint32_t tensors_dropped = 0,
                  uint32_t values_dropped = 0) {
  v1::StepInfo s;
  s.set_step(step);
  s.set_mode(mode);
  s.set_mode_step(mode_step);
  s.set_tensors_dropped(tensors_dropped);
  s.set_values_dropped(values_dropped);
  return s;
}

TEST(JobRecord, StepsCountPerModeAndPerWorker) {
  v1::JobInfo info;
  info.set_last_step(-1);
  AddStep(info, 0, Step(0, v1::MODE_TRAIN, 0), 0);
  AddStep(info, 0, Step(1, v1::MODE_TRAIN, 1, /*tensors_dropped=*/2), 0);
  AddStep(info, 1, Step(1, v1::MODE_TRAIN, 1), /*steps_dropped=*/3);  // a second worker, same step
  AddStep(info, 0, Step(2, v1::MODE_EVAL, 0, 0, /*values_dropped=*/5), 0);
  ASSERT_EQ(info.modes_size(), 2);
  EXPECT_EQ(info.modes(0).mode(), v1::MODE_TRAIN);
  EXPECT_EQ(info.modes(0).first_step(), 0);
  EXPECT_EQ(info.modes(0).last_step(), 1);
  EXPECT_EQ(info.modes(0).step_count(), 2);  // worker 1's step 1 is not a new step
  EXPECT_EQ(info.modes(1).mode(), v1::MODE_EVAL);
  EXPECT_EQ(info.modes(1).step_count(), 1);
  EXPECT_EQ(info.last_step(), 2);
  EXPECT_EQ(info.worker_last_step().at(0), 2);
  EXPECT_EQ(info.worker_last_step().at(1), 1);
  EXPECT_EQ(info.tensors_dropped(), 2u);
  EXPECT_EQ(info.values_dropped(), 5u);
  EXPECT_EQ(info.steps_dropped(), 3u);
}

TEST(JobRecord, AnEarlierModeStepMovesTheFirstStepBack) {
  v1::JobInfo info;
  AddStep(info, 0, Step(5, v1::MODE_TRAIN, 5), 0);
  AddStep(info, 1, Step(3, v1::MODE_TRAIN, 3), 0);  // a late worker
  EXPECT_EQ(info.modes(0).first_step(), 3);
  EXPECT_EQ(info.modes(0).last_step(), 5);
  EXPECT_EQ(info.last_step(), 5);
}

TEST(JobRecord, AResendIsRecognisedPerWorker) {
  v1::JobInfo info;
  AddStep(info, 0, Step(4, v1::MODE_TRAIN, 4), 0);
  EXPECT_TRUE(StepStoredAlready(info, 0, 4));
  EXPECT_TRUE(StepStoredAlready(info, 0, 2));
  EXPECT_FALSE(StepStoredAlready(info, 0, 5));
  EXPECT_FALSE(StepStoredAlready(info, 1, 4));  // another worker's step 4 is new
}

TEST(JobRecord, TakingStepFieldsKeepsTheRest) {
  v1::JobInfo committed;
  AddStep(committed, 0, Step(1, v1::MODE_TRAIN, 1, 1), 2);
  v1::JobInfo live;
  live.set_status(v1::JOB_STATUS_DISCONNECTED);
  live.add_workers(0);
  TakeStepFields(committed, live);
  EXPECT_EQ(live.status(), v1::JOB_STATUS_DISCONNECTED);
  EXPECT_EQ(live.workers_size(), 1);
  EXPECT_EQ(live.last_step(), 1);
  EXPECT_EQ(live.modes_size(), 1);
  EXPECT_EQ(live.tensors_dropped(), 1u);
  EXPECT_EQ(live.steps_dropped(), 2u);
}

TEST(JobRecord, WorkerEndsAreCountedOnceAndEndTheJobWhenAllHave) {
  v1::JobInfo info;
  info.set_world_size(3);
  AddWorkerEnd(info, 2, "", 0);
  AddWorkerEnd(info, 0, "done", 4);
  AddWorkerEnd(info, 2, "", 0);  // again
  EXPECT_EQ(std::vector<int32_t>(info.ended_workers().begin(), info.ended_workers().end()),
            (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(info.end_reason(), "done");
  EXPECT_EQ(info.steps_dropped(), 4u);
  EXPECT_FALSE(AllWorkersEnded(info));
  EXPECT_EQ(MissingWorkers(info.ended_workers(), info.world_size()), (std::vector<int32_t>{1}));
  AddWorkerEnd(info, 1, "", 0);
  EXPECT_TRUE(AllWorkersEnded(info));
  EXPECT_TRUE(MissingWorkers(info.ended_workers(), info.world_size()).empty());
}

TEST(JobRecord, AJobOfWorldSizeZeroEndsWithItsOneWorker) {
  v1::JobInfo info;
  EXPECT_FALSE(AllWorkersEnded(info));
  AddWorkerEnd(info, 0, "", 0);
  EXPECT_TRUE(AllWorkersEnded(info));
}

TEST(JobRecord, FinishedMeansFinishedOrStopped) {
  EXPECT_TRUE(IsFinished(v1::JOB_STATUS_FINISHED));
  EXPECT_TRUE(IsFinished(v1::JOB_STATUS_STOPPED));
  EXPECT_FALSE(IsFinished(v1::JOB_STATUS_RUNNING));
  EXPECT_FALSE(IsFinished(v1::JOB_STATUS_DISCONNECTED));
  EXPECT_FALSE(IsFinished(v1::JOB_STATUS_PENDING));
}

}  // namespace
}  // namespace sonde::server
