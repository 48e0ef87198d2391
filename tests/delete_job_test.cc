// Deleting jobs end to end: the real collector (RocksDB in a temporary
// directory, gRPC on a loopback port) fed by the real hook, the DeleteJob
// RPC through the real query client, and the retention thread of a
// collector started with a policy. What is left on disk is read with
// RocksDB directly once the collector has stopped.
#include <algorithm>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/hook.h"
#include "client/query_client.h"
#include "gtest/gtest.h"
#include "server/collector.h"
#include "tests/testing/in_process_collector.h"
#include "tests/testing/rocksdb_dump.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace sonde {
namespace {

using ::sonde::testing::InProcessCollector;
using ::sonde::testing::IsOk;
using ::sonde::testing::StatusIs;

HookOptions Options(const std::string& address, const std::string& job) {
  HookOptions o;
  o.collector = address;
  o.job = job;
  o.config.save_config = SaveConfig::Every(1);
  o.config.include_collections = {"weights", "losses"};
  o.close_timeout = absl::Seconds(20);
  return o;
}

// Saves `steps` steps of a 1000-float weight and a loss.
void Train(Hook& hook, int steps, float scale) {
  hook.SetMode(v1::MODE_TRAIN);
  for (int step = 0; step < steps; ++step) {
    hook.StartStep();
    std::vector<float> w(1000);
    for (size_t i = 0; i < w.size(); ++i) w[i] = scale * (step + 1) * (static_cast<float>(i) - 500);
    ASSERT_THAT(hook.SaveTensor("fc.weight", HostTensor(w.data(), {1000}), {"weights"}), IsOk());
    ASSERT_THAT(hook.SaveScalar("loss", 10.0 / (step + 1), {"losses"}), IsOk());
  }
}

// Runs a whole job: connect, train, close.
void RunJob(const std::string& address, const std::string& job, int steps, float scale) {
  auto hook = Hook::Create(Options(address, job));
  ASSERT_THAT(hook, IsOk());
  ASSERT_THAT((*hook)->WaitUntilConnected(absl::Seconds(20)), IsOk());
  Train(**hook, steps, scale);
  ASSERT_THAT((*hook)->Close(), IsOk());
}

// Returns once the collector no longer counts the job as live (its streams
// are gone and its rules have judged everything): WatchRuleResults ends then.
void WaitUntilNotLive(QueryClient& q, const std::string& job) {
  EXPECT_THAT(q.WatchRuleResults(
                  job, [](const v1::RuleResult&) { return true; }, absl::Seconds(30)),
              IsOk());
}

// Everything the query service tells about a job, serialized, to compare
// before and after another job's deletion.
std::vector<std::string> Snapshot(QueryClient& q, const std::string& job) {
  std::vector<std::string> out;
  auto info = q.GetJob(job);
  EXPECT_THAT(info, IsOk());
  if (!info.ok()) return out;
  out.push_back(info->SerializeAsString());
  auto tensors = q.ListTensors(job);
  EXPECT_THAT(tensors, IsOk());
  for (const auto& t : *tensors) out.push_back(t.SerializeAsString());
  auto steps = q.ListSteps(job);
  EXPECT_THAT(steps, IsOk());
  for (const auto& s : *steps) {
    out.push_back(s.SerializeAsString());
    auto value = q.ReadTensor(job, "fc.weight", s.step());
    EXPECT_THAT(value, IsOk());
    if (value.ok()) out.push_back(value->header.SerializeAsString() + value->bytes);
  }
  for (const char* tensor : {"fc.weight", "loss"}) {
    auto series = q.ReadSeries(job, tensor);
    EXPECT_THAT(series, IsOk());
    for (const auto& p : *series) out.push_back(p.SerializeAsString());
  }
  auto rules = q.RuleResults(job);
  EXPECT_THAT(rules, IsOk());
  for (auto r : *rules) out.push_back(r.SerializeAsString());
  return out;
}

void ExpectNothingLeftOnDisk(const std::string& data_dir, uint64_t job_id) {
  auto dump = ::sonde::testing::DumpDatabase(data_dir);
  ASSERT_THAT(dump, IsOk());
  size_t keys = 0;
  for (const auto& [family, entries] : *dump) {
    for (const auto& [k, v] : entries) {
      ++keys;
      auto owner = ::sonde::testing::KeyOwner(family, k, v);
      ASSERT_THAT(owner, IsOk());
      EXPECT_NE(*owner, job_id) << "a key of deleted job " << job_id << " is left in " << family;
    }
  }
  EXPECT_GT(keys, 0u);
}

TEST(DeleteJob, RemovesTheJobAndLeavesOthersExactlyAsTheyWere) {
  InProcessCollector collector("LossNotDecreasing");
  RunJob(collector.address(), "doomed", 6, 1.0f);
  RunJob(collector.address(), "kept", 4, 2.0f);
  auto q = QueryClient::Connect(collector.address());
  WaitUntilNotLive(*q, "doomed");
  WaitUntilNotLive(*q, "kept");
  const std::vector<std::string> kept_before = Snapshot(*q, "kept");
  ASSERT_GT(kept_before.size(), 10u);
  auto doomed = q->GetJob("doomed");
  ASSERT_THAT(doomed, IsOk());
  ASSERT_FALSE(q->RuleResults("doomed")->empty());  // there is something in every family

  auto deleted = q->DeleteJob("doomed");
  ASSERT_THAT(deleted, IsOk());
  EXPECT_EQ(deleted->job_id(), doomed->job_id());
  EXPECT_GT(deleted->approximate_bytes(), 0u);
  std::cout << "deleted 'doomed' (6 steps of 4000 bytes of values): approximate_bytes "
            << deleted->approximate_bytes() << "\n";
  EXPECT_THAT(q->GetJob("doomed"), StatusIs(absl::StatusCode::kNotFound, "doomed"));
  EXPECT_THAT(q->ListSteps("doomed"), StatusIs(absl::StatusCode::kNotFound, "doomed"));
  EXPECT_THAT(q->RuleResults("doomed"), StatusIs(absl::StatusCode::kNotFound, "doomed"));
  auto jobs = q->ListJobs();
  ASSERT_THAT(jobs, IsOk());
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].job(), "kept");
  EXPECT_TRUE(Snapshot(*q, "kept") == kept_before) << "the other job changed";

  EXPECT_THAT(q->DeleteJob("doomed"), StatusIs(absl::StatusCode::kNotFound, "doomed"));
  EXPECT_THAT(q->DeleteJob(""), StatusIs(absl::StatusCode::kInvalidArgument, "no job"));
  collector.Stop();
  ExpectNothingLeftOnDisk(collector.data_dir(), doomed->job_id());
}

TEST(DeleteJob, RefusedWhileTheJobIsLiveThenAllowedOnceItEnds) {
  InProcessCollector collector;
  auto q = QueryClient::Connect(collector.address());
  auto hook = Hook::Create(Options(collector.address(), "live"));
  ASSERT_THAT(hook, IsOk());
  ASSERT_THAT((*hook)->WaitUntilConnected(absl::Seconds(20)), IsOk());
  Train(**hook, 3, 1.0f);
  ASSERT_THAT((*hook)->Flush(absl::Seconds(20)), IsOk());
  EXPECT_THAT(q->DeleteJob("live"), StatusIs(absl::StatusCode::kFailedPrecondition, "live"));
  // Refusing touched nothing: the job goes on and keeps what it stored.
  EXPECT_EQ(q->ListSteps("live")->size(), 3u);
  Train(**hook, 2, 1.0f);
  ASSERT_THAT((*hook)->Close(), IsOk());
  EXPECT_EQ(q->ListSteps("live")->size(), 5u);
  WaitUntilNotLive(*q, "live");
  EXPECT_THAT(q->DeleteJob("live"), IsOk());
  EXPECT_THAT(q->GetJob("live"), StatusIs(absl::StatusCode::kNotFound, "live"));
}

// Without the registry forgetting the job, the second hello would be told
// the job "has already finished".
TEST(DeleteJob, TheNameCanBeReusedForAFreshJob) {
  InProcessCollector collector;
  auto q = QueryClient::Connect(collector.address());
  RunJob(collector.address(), "again", 5, 1.0f);
  WaitUntilNotLive(*q, "again");
  auto first = q->GetJob("again");
  ASSERT_THAT(first, IsOk());
  ASSERT_THAT(q->DeleteJob("again"), IsOk());

  RunJob(collector.address(), "again", 2, 3.0f);
  auto second = q->GetJob("again");
  ASSERT_THAT(second, IsOk());
  EXPECT_NE(second->job_id(), first->job_id());
  EXPECT_EQ(second->status(), v1::JOB_STATUS_FINISHED);
  auto steps = q->ListSteps("again");
  ASSERT_THAT(steps, IsOk());
  ASSERT_EQ(steps->size(), 2u);  // only the new job's
  auto value = q->ReadTensor("again", "fc.weight", 1);
  ASSERT_THAT(value, IsOk());
  std::vector<float> w(1000);
  ASSERT_EQ(value->bytes.size(), w.size() * sizeof(float));
  std::memcpy(w.data(), value->bytes.data(), value->bytes.size());
  EXPECT_EQ(w[0], 3.0f * 2 * -500);  // the new run's values
  // And the same name can be deleted again after a collector restart.
  WaitUntilNotLive(*q, "again");
  collector.Restart();
  q = QueryClient::Connect(collector.address());
  EXPECT_THAT(q->DeleteJob("again"), IsOk());
  EXPECT_TRUE(q->ListJobs()->empty());
}

// A collector started with a policy: every pass at a 10 ms interval would
// delete any ended job, yet the job that streams is kept through several
// passes; once it ends, a pass deletes it.
TEST(Retention, TheCollectorsThreadDeletesEndedJobsAndNeverARunningOne) {
  ::sonde::testing::TempDir dir;
  absl::Mutex mu;
  int passes = 0;
  std::vector<std::string> deleted;
  server::CollectorOptions options;
  options.listen = "127.0.0.1:0";
  options.data_dir = dir.Sub("db");
  options.retention.max_age = absl::Microseconds(1);
  options.retention.max_bytes = 1;
  options.retention.interval = absl::Milliseconds(10);
  options.retention.on_pass = [&](const absl::StatusOr<server::RetentionReport>& report) {
    EXPECT_THAT(report, IsOk());
    absl::MutexLock lock(&mu);
    ++passes;
    if (report.ok()) {
      for (const auto& d : report->deleted) deleted.push_back(d.name);
    }
  };
  auto collector = server::Collector::Start(options);
  ASSERT_THAT(collector, IsOk());
  auto q = QueryClient::Connect((*collector)->address());

  RunJob((*collector)->address(), "short", 2, 1.0f);
  auto hook = Hook::Create(Options((*collector)->address(), "running"));
  ASSERT_THAT(hook, IsOk());
  ASSERT_THAT((*hook)->WaitUntilConnected(absl::Seconds(20)), IsOk());
  Train(**hook, 3, 1.0f);
  ASSERT_THAT((*hook)->Flush(absl::Seconds(20)), IsOk());
  {
    absl::MutexLock lock(&mu);
    // "short" goes; then three more full passes with "running" stored.
    auto short_gone = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return std::find(deleted.begin(), deleted.end(), "short") != deleted.end();
    };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&short_gone), absl::Seconds(60)));
    const int seen = passes;
    auto three_more = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return passes >= seen + 3; };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&three_more), absl::Seconds(60)));
    EXPECT_EQ(std::count(deleted.begin(), deleted.end(), "running"), 0);
  }
  EXPECT_EQ(q->ListSteps("running")->size(), 3u);
  Train(**hook, 1, 1.0f);
  ASSERT_THAT((*hook)->Close(), IsOk());
  {
    absl::MutexLock lock(&mu);
    auto running_gone = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return std::find(deleted.begin(), deleted.end(), "running") != deleted.end();
    };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&running_gone), absl::Seconds(60)));
  }
  EXPECT_THAT(q->GetJob("running"), StatusIs(absl::StatusCode::kNotFound, "running"));
  EXPECT_TRUE(q->ListJobs()->empty());
  (*collector)->Shutdown();
}

}  // namespace
}  // namespace sonde
