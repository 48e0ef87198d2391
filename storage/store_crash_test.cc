// A real crash in the middle of deleting a job: a child process marks the
// job deleted and dies with _exit (no destructor, no close, no flush), as a
// kill -9 between the two steps would leave it. The next open finishes the
// deletion. Its own binary, so the fork happens before this process has
// started any RocksDB thread.
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"
#include "storage/store.h"
#include "tests/testing/rocksdb_dump.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace sonde::storage {
namespace {

using ::sonde::testing::DumpDatabase;
using ::sonde::testing::IsOk;
using ::sonde::testing::KeyOwner;
using ::sonde::testing::KeysOfJob;
using ::sonde::testing::TempDir;

// In the child: returns the exit code (0: the job was marked).
int WriteTwoJobsAndMarkOneDeleted(const std::string& path) {
  Store::Options o;
  o.path = path;
  o.payload_piece_bytes = 100;
  auto store = Store::Open(o);
  if (!store.ok()) return 10;
  for (const char* name : {"keep", "drop"}) {
    v1::JobInfo info;
    info.set_job(name);
    auto job = (*store)->CreateJob(info);
    if (!job.ok()) return 11;
    for (int step = 0; step < 3; ++step) {
      StepWrite w;
      w.job_id = job->job_id();
      w.step.set_step(step);
      w.step.set_mode(v1::MODE_TRAIN);
      w.step.set_mode_step(step);
      TensorWrite t;
      t.record.set_tensor_name("w");
      t.record.set_mode(v1::MODE_TRAIN);
      t.record.set_mode_step(step);
      t.record.set_has_values(true);
      t.bytes = std::string(250, static_cast<char>('a' + step));
      w.tensors.push_back(t);
      if (!(*store)->CommitStep(w).ok()) return 12;
    }
    v1::RuleResult r;
    r.set_rule("R1");
    r.set_status(v1::RULE_STATUS_NO_ISSUES_FOUND);
    if (!(*store)->PutRuleResult(job->job_id(), r, std::string("state")).ok()) return 13;
  }
  if (!(*store)->MarkJobDeleted("drop").ok()) return 14;
  store->release();  // never closed: the "crash" below leaves RocksDB as it is
  return 0;
}

TEST(StoreCrash, DeletionCutShortByAKillFinishesOnNextOpen) {
  TempDir dir;
  const std::string path = dir.Sub("db");
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(WriteTwoJobsAndMarkOneDeleted(path));
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);

  // Ids: "keep" is 1, "drop" is 2.
  auto midway = DumpDatabase(path);
  ASSERT_THAT(midway, IsOk());
  const auto drop_keys = KeysOfJob(*midway, 2);
  ASSERT_EQ(drop_keys.at("jobs").count(DeletingJobKey(2)), 1u);
  EXPECT_EQ(drop_keys.at("jobs").count(JobInfoKey(2)), 0u);
  EXPECT_EQ(midway->at("jobs").count(JobNameKey("drop")), 0u);
  EXPECT_EQ(drop_keys.at("payloads").size(), 9u);  // 3 steps x 3 pieces: still there
  const auto keep_keys = KeysOfJob(*midway, 1);

  {
    Store::Options o;
    o.path = path;
    auto store = Store::Open(o);
    ASSERT_THAT(store, IsOk());
    EXPECT_EQ((*store)->ListJobs()->size(), 1u);
    EXPECT_EQ((*store)->GetJob("keep")->job_id(), 1u);
  }
  auto after = DumpDatabase(path);
  ASSERT_THAT(after, IsOk());
  for (const auto& [family, entries] : *after) {
    for (const auto& [k, v] : entries) {
      auto owner = KeyOwner(family, k, v);
      ASSERT_THAT(owner, IsOk());
      EXPECT_NE(*owner, 2u) << "a key of the deleted job is left in " << family;
    }
  }
  EXPECT_TRUE(KeysOfJob(*after, 1) == keep_keys);
}

}  // namespace
}  // namespace sonde::storage
