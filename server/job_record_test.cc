#include "server/job_record.h"

#include <optional>
#include <string>
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


v1::RuleSpec Spec(const std::string& type, const std::string& name = "") {
  v1::RuleSpec s;
  s.set_rule_type(type);
  s.set_name(name);
  return s;
}

TEST(JobRecord, AJobsOwnRuleReplacesTheDefaultOfItsName) {
  google::protobuf::RepeatedPtrField<v1::RuleSpec> own;
  *own.Add() = Spec("LossNotDecreasing");
  *own.Add() = Spec("ExplodingTensor", "strict");
  std::vector<std::string> warnings;
  const std::vector<v1::RuleSpec> rules = RulesForJob(
      {Spec("ExplodingTensor"), Spec("LossNotDecreasing")}, own, &warnings);
  ASSERT_EQ(rules.size(), 3u);
  EXPECT_EQ(rules[0].rule_type(), "ExplodingTensor");  // default kept: "strict" is another name
  EXPECT_EQ(rules[1].rule_type(), "LossNotDecreasing");
  EXPECT_EQ(rules[1].name(), "");
  EXPECT_EQ(rules[2].name(), "strict");
  EXPECT_EQ(warnings, (std::vector<std::string>{
                          "rule 'LossNotDecreasing': this job's spec replaces the collector's "
                          "default"}));
}

TEST(JobRecord, ARegisteredJobStartsWithItsRulesFirst) {
  v1::JobInfo registered;
  registered.set_job_id(7);
  registered.set_status(v1::JOB_STATUS_PENDING);
  *registered.add_rules() = Spec("ExplodingTensor", "ExplodingTensor");
  v1::JobInfo fresh;
  fresh.set_status(v1::JOB_STATUS_RUNNING);
  *fresh.add_rules() = Spec("LossNotDecreasing", "LossNotDecreasing");
  *fresh.add_rules() = Spec("ExplodingTensor", "ExplodingTensor");  // taken by the registered
  const v1::JobInfo started = StartRegistered(registered, fresh);
  EXPECT_EQ(started.job_id(), 7u);
  EXPECT_EQ(started.status(), v1::JOB_STATUS_RUNNING);
  ASSERT_EQ(started.rules_size(), 2);
  EXPECT_EQ(started.rules(0).name(), "ExplodingTensor");
  EXPECT_EQ(started.rules(1).name(), "LossNotDecreasing");
}

TEST(JobRecord, AStopDecidedBeforeARestartIsFoundInTheResults) {
  v1::RuleResult quiet;
  quiet.set_rule("A");
  quiet.set_status(v1::RULE_STATUS_ISSUES_FOUND);
  quiet.add_actions_taken("Log");
  v1::RuleResult stopper;
  stopper.set_rule("B");
  stopper.set_status(v1::RULE_STATUS_ISSUES_FOUND);
  stopper.set_step(12);
  stopper.set_message("NaN");
  stopper.add_actions_taken("StopTraining");
  EXPECT_FALSE(StopDecided({quiet}).has_value());
  const std::optional<v1::Action> stop = StopDecided({quiet, stopper});
  ASSERT_TRUE(stop.has_value());
  EXPECT_EQ(stop->type(), v1::ACTION_STOP_TRAINING);
  EXPECT_EQ(stop->rule(), "B");
  EXPECT_EQ(stop->step(), 12);
  EXPECT_EQ(stop->reason(), "NaN");
  EXPECT_EQ(stop->verdict().rule(), "B");
}

TEST(JobRecord, AWorkerThatComesBackRunsAgain) {
  v1::JobInfo info;
  info.set_status(v1::JOB_STATUS_FINISHED);
  info.set_end_unix_micros(5);
  info.add_workers(1);
  info.add_ended_workers(0);
  info.add_ended_workers(1);
  AttachWorker(info, 0, 99);
  EXPECT_EQ(std::vector<int32_t>(info.workers().begin(), info.workers().end()),
            (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(std::vector<int32_t>(info.ended_workers().begin(), info.ended_workers().end()),
            (std::vector<int32_t>{1}));
  EXPECT_EQ(info.worker_client_id().at(0), 99u);
  EXPECT_EQ(info.status(), v1::JOB_STATUS_RUNNING);
  EXPECT_EQ(info.end_unix_micros(), 0);
  EXPECT_EQ(WorkerLastStep(info, 0), -1);
  (*info.mutable_worker_last_step())[0] = 4;
  EXPECT_EQ(WorkerLastStep(info, 0), 4);
}

TEST(JobRecord, TheClientWhoseEndWasCountedStaysEndedWhenItComesBackToResendIt) {
  v1::JobInfo info;
  info.set_world_size(2);
  AttachWorker(info, 0, 7);
  AddWorkerEnd(info, 0, "finished", 2);
  AttachWorker(info, 0, 7);  // reconnects to resend the job end it was not told was stored
  AddWorkerEnd(info, 0, "finished", 2);
  EXPECT_EQ(info.steps_dropped(), 2u);
  EXPECT_EQ(std::vector<int32_t>(info.ended_workers().begin(), info.ended_workers().end()),
            (std::vector<int32_t>{0}));
  // A client without an id cannot be told from a new one: it runs again.
  AttachWorker(info, 0, 0);
  EXPECT_EQ(info.ended_workers_size(), 0);
  AddWorkerEnd(info, 0, "finished", 1);
  // Another client is a new session: it runs again, and its end counts.
  AttachWorker(info, 0, 8);
  EXPECT_EQ(info.ended_workers_size(), 0);
  AddWorkerEnd(info, 0, "finished", 1);
  EXPECT_EQ(info.steps_dropped(), 4u);
}

TEST(JobRecord, HellosAreCheckedBeforeAnyJobSeesThem) {
  v1::Hello hello;
  hello.set_job("j");
  hello.set_world_size(2);
  hello.set_worker(1);
  EXPECT_TRUE(ValidateHello(hello).ok());
  hello.set_worker(2);
  EXPECT_EQ(ValidateHello(hello).message(), "worker 2 is outside world_size 2");
  hello.set_worker(0);
  hello.set_world_size(0);
  EXPECT_EQ(ValidateHello(hello).message(), "world_size must be 1 to 65536, got 0");
  hello.set_world_size(2);
  hello.set_job("");
  EXPECT_FALSE(ValidateHello(hello).ok());

  hello.set_job("j");
  v1::JobInfo info;
  info.set_world_size(2);
  info.set_status(v1::JOB_STATUS_DISCONNECTED);
  EXPECT_TRUE(CheckJoinable(info, hello).ok());
  info.set_world_size(4);
  EXPECT_EQ(CheckJoinable(info, hello).message(), "job 'j' has world_size 4, hello says 2");
  info.set_status(v1::JOB_STATUS_STOPPED);
  EXPECT_EQ(CheckJoinable(info, hello).message(),
            "job 'j' has already finished; use a new job name");
}

}  // namespace
TEST(JobRecord, CopyForWorkerHoldsThatWorkersEntriesOnlyAndLeavesTheRecord) {
  v1::JobInfo info;
  info.set_job("many");
  info.set_last_step(7);
  for (int32_t w = 0; w < 3; ++w) {
    (*info.mutable_worker_last_step())[w] = w;
    (*info.mutable_worker_client_id())[w] = 10 + w;
    info.add_workers(w);
  }
  info.add_ended_workers(1);
  const std::string before = info.SerializeAsString();
  v1::JobInfo one = CopyForWorker(info, 1);
  EXPECT_EQ(info.SerializeAsString(), before);
  EXPECT_EQ(one.job(), "many");
  EXPECT_EQ(one.last_step(), 7);
  ASSERT_EQ(one.worker_last_step().size(), 1u);
  EXPECT_EQ(one.worker_last_step().at(1), 1);
  ASSERT_EQ(one.worker_client_id().size(), 1u);
  EXPECT_EQ(one.worker_client_id().at(1), 11u);
  ASSERT_EQ(one.workers_size(), 1);
  EXPECT_EQ(one.workers(0), 1);
  ASSERT_EQ(one.ended_workers_size(), 1);
  v1::JobInfo none = CopyForWorker(info, -1);
  EXPECT_TRUE(none.worker_last_step().empty());
  EXPECT_TRUE(none.worker_client_id().empty());
  EXPECT_EQ(none.workers_size(), 0);
  EXPECT_EQ(none.ended_workers_size(), 0);
  // A step's fields taken back merge that worker's entry alone.
  AddStep(one, 1, [] {
    v1::StepInfo s;
    s.set_step(8);
    s.set_mode(v1::MODE_TRAIN);
    s.set_mode_step(8);
    return s;
  }(), 0);
  TakeStepFields(one, info);
  EXPECT_EQ(info.worker_last_step().at(1), 8);
  EXPECT_EQ(info.worker_last_step().at(2), 2);
  EXPECT_EQ(info.last_step(), 8);
}

}  // namespace sonde::server
