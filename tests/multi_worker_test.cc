// Jobs of several workers end when all world_size workers have ended, also
// across collector restarts, and steps name the workers they miss (issue
// 16, item 3). Before, a job finished once every worker that had joined
// since the collector started had ended, and the others were then refused.
#include <map>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "client/hook.h"
#include "client/query_client.h"
#include "gtest/gtest.h"
#include "tests/testing/in_process_collector.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/wait.h"

namespace sonde {
namespace {

using ::sonde::testing::InProcessCollector;

std::unique_ptr<Hook> Worker(const std::string& address, const std::string& job, int worker) {
  HookOptions o;
  o.collector = address;
  o.job = job;
  o.worker = worker;
  o.world_size = 2;
  o.config.save_config = SaveConfig::Every(1);
  o.close_timeout = absl::Seconds(30);
  auto hook = Hook::Create(o);
  EXPECT_TRUE(hook.ok()) << hook.status();
  return hook.ok() ? std::move(*hook) : nullptr;
}

void Steps(Hook& hook, int from, int to) {
  for (int step = from; step < to; ++step) {
    hook.StartStep();
    SONDE_EXPECT_OK(hook.SaveScalar("loss", 1.0 / (step + 1), {"losses"}));
    hook.EndStep();
  }
  SONDE_EXPECT_OK(hook.Flush(absl::Seconds(30)));
}

v1::JobInfo Job(const std::string& address, const std::string& name) {
  auto q = QueryClient::Connect(address);
  auto job = q->GetJob(name);
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? *job : v1::JobInfo();
}

TEST(MultiWorker, AJobEndsOnlyWhenEveryWorkerHasEnded) {
  InProcessCollector collector;
  // Worker 0 runs and ends before worker 1 has even said hello.
  auto w0 = Worker(collector.address(), "two", 0);
  ASSERT_NE(w0, nullptr);
  Steps(*w0, 0, 3);
  SONDE_ASSERT_OK(w0->Close());
  EXPECT_EQ(Job(collector.address(), "two").status(), v1::JOB_STATUS_DISCONNECTED);
  auto w1 = Worker(collector.address(), "two", 1);
  ASSERT_NE(w1, nullptr);
  Steps(*w1, 0, 3);
  v1::JobInfo info = Job(collector.address(), "two");
  EXPECT_EQ(info.status(), v1::JOB_STATUS_RUNNING);
  EXPECT_EQ(std::vector<int32_t>(info.ended_workers().begin(), info.ended_workers().end()),
            std::vector<int32_t>{0});
  Steps(*w1, 3, 6);  // worker 1 goes on: stored, not refused
  SONDE_ASSERT_OK(w1->Close());
  info = Job(collector.address(), "two");
  EXPECT_EQ(info.status(), v1::JOB_STATUS_FINISHED);
  EXPECT_EQ(info.worker_last_step().at(1), 5);
  // Steps 3..5 have only worker 1: not complete, worker 0 named as missing.
  auto steps = QueryClient::Connect(collector.address())->ListSteps("two");
  SONDE_ASSERT_OK(steps);
  ASSERT_EQ(steps->size(), 6u);
  for (const v1::StepInfo& s : *steps) {
    if (s.step() < 3) {
      EXPECT_TRUE(s.complete()) << s.step();
      EXPECT_EQ(s.missing_workers_size(), 0) << s.step();
    } else {
      EXPECT_FALSE(s.complete()) << s.step();
      ASSERT_EQ(s.missing_workers_size(), 1) << s.step();
      EXPECT_EQ(s.missing_workers(0), 0);
    }
  }
  // A watch of the ended job reads its stored steps: they name worker 0 as
  // missing too.
  std::map<int64_t, std::vector<int32_t>> watched;
  SONDE_ASSERT_OK(QueryClient::Connect(collector.address())
                      ->WatchSteps(
                          "two", 0,
                          [&](const v1::CompletedStep& s) {
                            watched[s.step()].assign(s.missing_workers().begin(),
                                                     s.missing_workers().end());
                            return true;
                          },
                          absl::Seconds(30)));
  ASSERT_EQ(watched.size(), 6u);
  for (const auto& [step, missing] : watched) {
    EXPECT_EQ(missing, step < 3 ? std::vector<int32_t>{} : std::vector<int32_t>{0}) << step;
  }
}

TEST(MultiWorker, WhoEndedSurvivesARestart) {
  InProcessCollector collector;
  auto w0 = Worker(collector.address(), "restart", 0);
  auto w1 = Worker(collector.address(), "restart", 1);
  ASSERT_NE(w0, nullptr);
  ASSERT_NE(w1, nullptr);
  Steps(*w0, 0, 2);
  Steps(*w1, 0, 2);
  SONDE_ASSERT_OK(w0->Close());
  collector.RestartInPlace();
  // Worker 1 reconnects first after the restart and goes on: its steps are
  // stored, and its end finishes the job (worker 0's end was stored).
  Steps(*w1, 2, 5);
  EXPECT_EQ(Job(collector.address(), "restart").status(), v1::JOB_STATUS_RUNNING);
  SONDE_ASSERT_OK(w1->Close());
  const v1::JobInfo info = Job(collector.address(), "restart");
  EXPECT_EQ(info.status(), v1::JOB_STATUS_FINISHED);
  EXPECT_EQ(info.worker_last_step().at(1), 4);
  EXPECT_EQ(w1->counters().steps_dropped, 0u);
  EXPECT_EQ(w1->counters().tensors_dropped, 0u);
}

TEST(MultiWorker, ARestartedCollectorDoesNotEndTheJobWhenTheFirstWorkerBackEnds) {
  InProcessCollector collector;
  auto w0 = Worker(collector.address(), "first-back", 0);
  auto w1 = Worker(collector.address(), "first-back", 1);
  ASSERT_NE(w0, nullptr);
  ASSERT_NE(w1, nullptr);
  Steps(*w0, 0, 2);
  Steps(*w1, 0, 2);
  collector.RestartInPlace();
  Steps(*w0, 2, 3);
  SONDE_ASSERT_OK(w0->Close());  // back first, ends first
  EXPECT_NE(Job(collector.address(), "first-back").status(), v1::JOB_STATUS_FINISHED);
  Steps(*w1, 2, 6);  // not refused
  SONDE_ASSERT_OK(w1->Close());
  const v1::JobInfo info = Job(collector.address(), "first-back");
  EXPECT_EQ(info.status(), v1::JOB_STATUS_FINISHED);
  EXPECT_EQ(info.worker_last_step().at(1), 5);
}

TEST(MultiWorker, AnOperatorTimeoutEndsAJobWhoseWorkerNeverEnds) {
  InProcessCollector collector("", server::IngestLimits(), [](server::CollectorOptions& o) {
    o.worker_end_timeout = absl::Milliseconds(300);
  });
  auto w0 = Worker(collector.address(), "crashed", 0);
  ASSERT_NE(w0, nullptr);
  Steps(*w0, 0, 2);
  SONDE_ASSERT_OK(w0->Close());  // worker 1 never comes (it crashed before its hello)
  EXPECT_EQ(Job(collector.address(), "crashed").status(), v1::JOB_STATUS_DISCONNECTED);
  v1::JobInfo info;
  sonde::testing::WaitUntil([&] {
    info = Job(collector.address(), "crashed");
    return info.status() == v1::JOB_STATUS_FINISHED;
  });
  EXPECT_EQ(info.status(), v1::JOB_STATUS_FINISHED);
  EXPECT_NE(info.end_reason().find("workers 1 never sent their job end"), std::string::npos)
      << info.end_reason();
}

// The same for a job whose workers were gone when the collector restarted:
// no hello ever comes for it, and the timeout still ends it, rules
// included.
TEST(MultiWorker, TheTimeoutAlsoEndsAJobLeftDisconnectedByAnEarlierCollector) {
  InProcessCollector collector("LossNotDecreasing", server::IngestLimits(),
                               [](server::CollectorOptions& o) {
                                 o.worker_end_timeout = absl::Milliseconds(300);
                               });
  auto w0 = Worker(collector.address(), "orphaned", 0);
  ASSERT_NE(w0, nullptr);
  Steps(*w0, 0, 3);
  SONDE_ASSERT_OK(w0->Close());  // worker 1 never comes
  collector.Restart();  // before the timeout: the new collector never sees a hello
  v1::JobInfo info;
  sonde::testing::WaitUntil([&] {
    info = Job(collector.address(), "orphaned");
    return info.status() == v1::JOB_STATUS_FINISHED;
  });
  EXPECT_EQ(info.status(), v1::JOB_STATUS_FINISHED);
  EXPECT_NE(info.end_reason().find("workers 1 never sent their job end"), std::string::npos)
      << info.end_reason();
  EXPECT_NE(info.end_reason().find("since the collector started"), std::string::npos);
  // Its rule judged the end of training (from the replayed steps).
  auto verdicts = QueryClient::Connect(collector.address())
                      ->WaitForRuleVerdicts("orphaned", absl::Seconds(20));
  SONDE_ASSERT_OK(verdicts);
  ASSERT_EQ(verdicts->size(), 1u);
  EXPECT_NE((*verdicts)[0].status(), v1::RULE_STATUS_IN_PROGRESS);
}

// A second client for a worker whose owner is only briefly away (issue 16,
// item 4): before, it was accepted, stored a far-away step, and the owner's
// resent steps were then acknowledged as duplicates and lost without a
// trace. Now the second client is refused while the owner's lease holds,
// the owner's steps are all stored, and what the second client could not
// store is counted on its side.
TEST(MultiWorker, ASecondClientCannotSwallowAWorkersSteps) {
  InProcessCollector collector;
  HookOptions o;
  o.collector = collector.address();
  o.job = "owned";
  o.config.save_config = SaveConfig::Every(1);
  o.close_timeout = absl::Seconds(30);
  auto owner = Hook::Create(o);
  SONDE_ASSERT_OK(owner);
  for (int step = 0; step < 10; ++step) {
    (*owner)->StartStep();
    SONDE_EXPECT_OK((*owner)->SaveScalar("loss", step, {"losses"}));
  }
  SONDE_ASSERT_OK((*owner)->Flush(absl::Seconds(30)));
  // An outage: the owner's stream is cut; another client says hello for the
  // same worker while the owner is away.
  collector.RestartInPlace();
  o.close_timeout = absl::Seconds(3);
  auto intruder = Hook::Create(o);
  SONDE_ASSERT_OK(intruder);
  (*intruder)->StartStep();
  SONDE_EXPECT_OK((*intruder)->SaveScalar("loss", -1.0, {"losses"}));
  EXPECT_FALSE((*intruder)->WaitUntilConnected(absl::Milliseconds(500)).ok());
  // The owner comes back and goes on: every one of its steps is stored.
  for (int step = 10; step < 30; ++step) {
    (*owner)->StartStep();
    SONDE_EXPECT_OK((*owner)->SaveScalar("loss", step, {"losses"}));
  }
  SONDE_ASSERT_OK((*owner)->Close());
  EXPECT_EQ((*owner)->counters().tensors_dropped, 0u);
  EXPECT_EQ((*owner)->counters().steps_dropped, 0u);
  auto q = QueryClient::Connect(collector.address());
  auto series = q->ReadSeries("owned", "loss");
  SONDE_ASSERT_OK(series);
  ASSERT_EQ(series->size(), 30u);
  for (size_t i = 0; i < series->size(); ++i) {
    EXPECT_EQ((*series)[i].step(), static_cast<int64_t>(i));
    EXPECT_EQ((*series)[i].statistics().max(), static_cast<double>(i));
  }
  // The intruder never got in (the job has finished by now): its step is
  // counted as lost, and Close says so.
  EXPECT_FALSE((*intruder)->Close().ok());
  EXPECT_EQ((*intruder)->counters().tensors_dropped, 1u);
  EXPECT_EQ((*intruder)->counters().steps_dropped, 1u);
}

}  // namespace
}  // namespace sonde
