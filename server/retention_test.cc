// The retention policy against a real Store and JobRegistry: which jobs a
// pass deletes (by age, by size, oldest first), which it never touches
// (running, disconnected, pending), and the thread that runs passes.
// Passes get `now` from the test, so nothing depends on the clock.
#include "server/retention.h"

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/thread_pool.h"
#include "gtest/gtest.h"
#include "rules/rule_factory.h"
#include "server/job_registry.h"
#include "storage/store.h"
#include "tests/testing/rocksdb_dump.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "rules/builtin_rules.h"

namespace sonde::server {
namespace {

using ::sonde::testing::IsOk;
using ::sonde::testing::StatusIs;
using ::sonde::testing::TempDir;

constexpr uint64_t kMiB = 1 << 20;
const absl::Time kNow = absl::FromUnixSeconds(1'800'000'000);

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(n, '\0');
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t v = rng();
    for (size_t j = 0; j < 8 && i + j < n; ++j) out[i + j] = static_cast<char>(v >> (8 * j));
  }
  return out;
}

// A store, and a registry over it, as the collector has them.
class RetentionTest : public ::testing::Test {
 protected:
  void SetUp() override { Open(); }
  void TearDown() override { Close(); }

  void Open() {
    storage::Store::Options o;
    o.path = dir_.Sub("db");
    auto store = storage::Store::Open(o);
    ASSERT_THAT(store, IsOk());
    store_ = std::move(*store);
    registry_ = std::make_unique<JobRegistry>(store_.get(), &pool_, factory_.get(),
                                              std::vector<v1::RuleSpec>());
  }
  void Close() {
    registry_.reset();
    store_.reset();
  }
  // Closing and opening again puts what the write-ahead log holds into SST
  // files, so sizes are those of files.
  void Reopen() {
    Close();
    Open();
  }

  // A job with the given status and end time, with `bytes` of tensor values
  // over two steps.
  uint64_t AddJob(const std::string& name, v1::JobStatus status, absl::Time start,
                  absl::Time end, size_t bytes = 4096) {
    v1::JobInfo info;
    info.set_job(name);
    info.set_world_size(1);
    auto created = store_->CreateJob(info);
    EXPECT_THAT(created, IsOk());
    info = *created;
    info.set_status(status);
    info.set_start_unix_micros(absl::ToUnixMicros(start));
    if (end != absl::InfinitePast()) info.set_end_unix_micros(absl::ToUnixMicros(end));
    for (int step = 0; step < 2; ++step) {
      storage::StepWrite w;
      w.job_id = info.job_id();
      w.step.set_step(step);
      w.step.set_mode(v1::MODE_TRAIN);
      w.step.set_mode_step(step);
      storage::TensorWrite t;
      t.record.set_tensor_name("w");
      t.record.set_mode(v1::MODE_TRAIN);
      t.record.set_mode_step(step);
      t.record.set_has_values(true);
      t.bytes = RandomBytes(bytes / 2, info.job_id() * 10 + step);
      w.tensors.push_back(std::move(t));
      info.set_last_step(step);
      w.job = info;
      EXPECT_THAT(store_->CommitStep(w), IsOk());
    }
    return info.job_id();
  }

  std::vector<std::string> JobNames() {
    std::vector<std::string> names;
    auto jobs = store_->ListJobs();
    EXPECT_THAT(jobs, IsOk());
    if (jobs.ok()) {
      for (const auto& j : *jobs) names.push_back(j.job());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  static std::vector<std::string> Names(const RetentionReport& r) {
    std::vector<std::string> names;
    for (const auto& d : r.deleted) names.push_back(d.name);
    return names;
  }

  // After Close(): no key of any of `ids` is left in any column family.
  void ExpectNothingLeftOf(const std::vector<uint64_t>& ids) {
    auto dump = ::sonde::testing::DumpDatabase(dir_.Sub("db"));
    ASSERT_THAT(dump, IsOk());
    for (const auto& [family, entries] : *dump) {
      for (const auto& [k, v] : entries) {
        auto owner = ::sonde::testing::KeyOwner(family, k, v);
        ASSERT_THAT(owner, IsOk());
        for (uint64_t id : ids) EXPECT_NE(*owner, id) << "job " << id << " left in " << family;
      }
    }
  }

  TempDir dir_;
  ThreadPool pool_{2, 64};
  std::unique_ptr<rules::RuleFactory> factory_ = rules::BuiltinRuleFactory();
  std::unique_ptr<storage::Store> store_;
  std::unique_ptr<JobRegistry> registry_;
};

TEST_F(RetentionTest, AgeDeletesOnlyJobsThatEndedLongerAgoAndNeverUnendedOnes) {
  const absl::Time month_ago = kNow - absl::Hours(24 * 30);
  const uint64_t finished = AddJob("finished-10d", v1::JOB_STATUS_FINISHED, month_ago,
                                   kNow - absl::Hours(24 * 10));
  const uint64_t stopped = AddJob("stopped-5d", v1::JOB_STATUS_STOPPED, month_ago,
                                  kNow - absl::Hours(24 * 5));
  AddJob("finished-1h", v1::JOB_STATUS_FINISHED, month_ago, kNow - absl::Hours(1));
  AddJob("running", v1::JOB_STATUS_RUNNING, month_ago, absl::InfinitePast());
  AddJob("disconnected", v1::JOB_STATUS_DISCONNECTED, month_ago, absl::InfinitePast());
  AddJob("pending", v1::JOB_STATUS_PENDING, month_ago, absl::InfinitePast());

  RetentionOptions options;
  options.max_age = absl::Hours(48);
  auto report = ApplyRetention(options, *store_, *registry_, kNow);
  ASSERT_THAT(report, IsOk());
  EXPECT_EQ(Names(*report), (std::vector<std::string>{"finished-10d", "stopped-5d"}));
  EXPECT_EQ(report->skipped, 0);
  EXPECT_FALSE(report->over_limit);
  EXPECT_EQ(JobNames(), (std::vector<std::string>{"disconnected", "finished-1h", "pending",
                                                   "running"}));
  // A second pass finds nothing more to do.
  report = ApplyRetention(options, *store_, *registry_, kNow);
  ASSERT_THAT(report, IsOk());
  EXPECT_TRUE(report->deleted.empty());
  Close();
  ExpectNothingLeftOf({finished, stopped});
}

TEST_F(RetentionTest, SizeDeletesTheJobsThatEndedFirstUntilUnderTheLimit) {
  const absl::Time start = kNow - absl::Hours(24);
  // Created in another order than they ended, so ids do not give the order.
  AddJob("ended-2h", v1::JOB_STATUS_FINISHED, start, kNow - absl::Hours(2), 4 * kMiB);
  AddJob("ended-4h", v1::JOB_STATUS_STOPPED, start, kNow - absl::Hours(4), 4 * kMiB);
  AddJob("ended-1h", v1::JOB_STATUS_FINISHED, start, kNow - absl::Hours(1), 4 * kMiB);
  AddJob("ended-3h", v1::JOB_STATUS_FINISHED, start, kNow - absl::Hours(3), 4 * kMiB);
  // The oldest and biggest, but running.
  const uint64_t running =
      AddJob("running", v1::JOB_STATUS_RUNNING, start - absl::Hours(24), absl::InfinitePast(),
             8 * kMiB);
  Reopen();
  auto size = store_->ApproximateSizeBytes();
  ASSERT_THAT(size, IsOk());
  ASSERT_GE(*size, 24 * kMiB);

  // 6 MiB over the limit: deleting the two jobs that ended first (8 MiB) is
  // needed and enough.
  RetentionOptions options;
  options.max_bytes = *size - 6 * kMiB;
  auto report = ApplyRetention(options, *store_, *registry_, kNow);
  ASSERT_THAT(report, IsOk());
  EXPECT_EQ(Names(*report), (std::vector<std::string>{"ended-4h", "ended-3h"}));
  EXPECT_FALSE(report->over_limit);
  EXPECT_EQ(report->bytes_before, *size);
  EXPECT_LE(report->bytes_after, *options.max_bytes);
  EXPECT_GE(report->bytes_before - report->bytes_after, 7 * kMiB);
  EXPECT_EQ(JobNames(), (std::vector<std::string>{"ended-1h", "ended-2h", "running"}));

  // A limit nothing can reach: every ended job goes, the running one stays.
  options.max_bytes = 1;
  report = ApplyRetention(options, *store_, *registry_, kNow);
  ASSERT_THAT(report, IsOk());
  EXPECT_EQ(Names(*report), (std::vector<std::string>{"ended-2h", "ended-1h"}));
  EXPECT_TRUE(report->over_limit);
  EXPECT_EQ(JobNames(), (std::vector<std::string>{"running"}));
  std::string values;
  ASSERT_THAT(store_->ReadTensor(running, v1::MODE_TRAIN, 1, "w", 0,
                                 [&](const v1::TensorRecord&, absl::string_view piece) {
                                   values.append(piece.data(), piece.size());
                                   return absl::OkStatus();
                                 }),
              IsOk());
  EXPECT_TRUE(values == RandomBytes(4 * kMiB, running * 10 + 1));
}

TEST_F(RetentionTest, AgeAndSizeTogether) {
  const absl::Time start = kNow - absl::Hours(24 * 30);
  AddJob("old", v1::JOB_STATUS_FINISHED, start, kNow - absl::Hours(24 * 20), kMiB);
  AddJob("middle", v1::JOB_STATUS_FINISHED, start, kNow - absl::Hours(24 * 2), kMiB);
  AddJob("new", v1::JOB_STATUS_FINISHED, start, kNow - absl::Hours(1), kMiB);
  RetentionOptions options;
  options.max_age = absl::Hours(24 * 7);
  options.max_bytes = 1;  // forces every ended job out, oldest first
  auto report = ApplyRetention(options, *store_, *registry_, kNow);
  ASSERT_THAT(report, IsOk());
  EXPECT_EQ(Names(*report), (std::vector<std::string>{"old", "middle", "new"}));
  EXPECT_TRUE(JobNames().empty());
}

TEST_F(RetentionTest, EraseJobRefusesUnknownJobs) {
  EXPECT_THAT(EraseJob("nobody", *store_, *registry_),
              StatusIs(absl::StatusCode::kNotFound, "nobody"));
  AddJob("done", v1::JOB_STATUS_FINISHED, kNow - absl::Hours(2), kNow - absl::Hours(1));
  auto erased = EraseJob("done", *store_, *registry_);
  ASSERT_THAT(erased, IsOk());
  EXPECT_EQ(erased->name, "done");
  EXPECT_THAT(EraseJob("done", *store_, *registry_),
              StatusIs(absl::StatusCode::kNotFound, "done"));
}

// Retention lists the ended jobs, then erases them one by one; a job
// deleted and created again under its name in between is another job and
// stays, however its times compare.
TEST_F(RetentionTest, AJobCreatedAgainUnderAListedNameIsNotErased) {
  AddJob("old", v1::JOB_STATUS_FINISHED, kNow - absl::Hours(50), kNow - absl::Hours(49));
  AddJob("older", v1::JOB_STATUS_FINISHED, kNow - absl::Hours(60), kNow - absl::Hours(59));
  uint64_t fresh = 0;
  RetentionOptions options;
  options.max_age = absl::Hours(24);
  int calls = 0;
  auto report = ApplyRetention(options, *store_, *registry_, kNow, [&]() {
    if (++calls == 2) {  // after "older" went, before "old" goes
      EXPECT_THAT(EraseJob("old", *store_, *registry_), IsOk());
      fresh = AddJob("old", v1::JOB_STATUS_FINISHED, kNow - absl::Hours(2), kNow - absl::Hours(1));
    }
    return false;
  });
  ASSERT_THAT(report, IsOk());
  EXPECT_EQ(Names(*report), (std::vector<std::string>{"older"}));
  EXPECT_EQ(report->skipped, 1u);
  EXPECT_EQ(JobNames(), (std::vector<std::string>{"old"}));
  auto kept = store_->GetJob("old");
  ASSERT_THAT(kept, IsOk());
  EXPECT_EQ(kept->job_id(), fresh);
  EXPECT_THAT(EraseJob("old", *store_, *registry_, fresh + 1),
              StatusIs(absl::StatusCode::kNotFound, "created since"));
}

TEST_F(RetentionTest, BadOptionsAreRefused) {
  RetentionOptions options;
  options.max_age = absl::ZeroDuration();
  EXPECT_THAT(ValidateRetentionOptions(options),
              StatusIs(absl::StatusCode::kInvalidArgument, "max_age"));
  options.max_age.reset();
  options.max_bytes = 0;
  EXPECT_THAT(ValidateRetentionOptions(options),
              StatusIs(absl::StatusCode::kInvalidArgument, "max_bytes"));
  options.max_bytes = 1;
  options.interval = absl::ZeroDuration();
  EXPECT_THAT(RetentionThread::Start(options, store_.get(), registry_.get()),
              StatusIs(absl::StatusCode::kInvalidArgument, "interval"));
  options.interval = absl::Seconds(1);
  SONDE_EXPECT_OK(ValidateRetentionOptions(options));
  EXPECT_FALSE(RetentionOptions().enabled());
}

TEST_F(RetentionTest, ThreadAppliesThePolicyWhenItStarts) {
  const absl::Time now = absl::Now();
  AddJob("last-month", v1::JOB_STATUS_FINISHED, now - absl::Hours(24 * 40),
         now - absl::Hours(24 * 30));
  AddJob("today", v1::JOB_STATUS_FINISHED, now - absl::Hours(2), now - absl::Hours(1));
  absl::Notification passed;
  std::vector<std::string> deleted;
  RetentionOptions options;
  options.max_age = absl::Hours(24 * 7);
  options.interval = absl::Hours(1);  // only the first pass runs in this test
  options.on_pass = [&](const absl::StatusOr<RetentionReport>& report) {
    EXPECT_THAT(report, IsOk());
    if (report.ok() && !passed.HasBeenNotified()) {
      deleted = Names(*report);
      passed.Notify();
    }
  };
  auto thread = RetentionThread::Start(options, store_.get(), registry_.get());
  ASSERT_THAT(thread, IsOk());
  passed.WaitForNotification();
  thread->reset();  // stops without waiting for the next interval
  EXPECT_EQ(deleted, (std::vector<std::string>{"last-month"}));
  EXPECT_EQ(JobNames(), (std::vector<std::string>{"today"}));
}

}  // namespace
}  // namespace sonde::server
