// The durable spool end to end: a real hook, a real collector over real
// sockets, real files, a real kill -9 and the real `sonde sync`.
//
// What is checked each time: every step the client completed is stored
// exactly once (one worker per step, bit-exact values), whatever happened
// to the process or the collector in between, and nothing is dropped.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/hook.h"
#include "client/query_client.h"
#include "client/spool/spool.h"
#include "client/spool/upload.h"
#include "gtest/gtest.h"
#include "server/collector.h"
#include "tests/testing/collector_later.h"
#include "tests/testing/free_address.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace sonde {
namespace {

namespace fs = std::filesystem;
using ::sonde::testing::CollectorLater;
using ::sonde::testing::IsOk;
using ::sonde::testing::TempDir;

std::vector<float> StepValues(int64_t step, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(step) * 1000.0f + i * 0.25f;
  return v;
}

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

std::string Runfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir ? srcdir : ".", "/", workspace ? workspace : "sonde", "/", path);
}

HookOptions Options(const std::string& address, const std::string& job,
                    const std::string& spool_dir) {
  HookOptions o;
  o.collector = address;
  o.job = job;
  o.spool_dir = spool_dir;
  o.upload_left_spools = false;
  o.config.save_config = SaveConfig::Every(1);
  o.config.include_collections = {"weights", "losses"};
  o.close_timeout = absl::Seconds(1);
  return o;
}

void SaveSteps(Hook& hook, int64_t from, int64_t to, size_t n) {
  for (int64_t step = from; step < to; ++step) {
    hook.StartStep();
    const std::vector<float> w = StepValues(step, n);
    SONDE_ASSERT_OK(hook.SaveTensor("w", HostTensor(w.data(), {static_cast<int64_t>(n)}),
                                    {"weights"}));
    SONDE_ASSERT_OK(hook.SaveScalar("loss", static_cast<double>(step), {"losses"}));
  }
  hook.EndStep();
}

// Steps [0, steps) are stored once each, "w" bit-exact.
void ExpectStoredOnce(QueryClient& q, const std::string& job, int64_t steps, size_t n) {
  auto listed = q.ListSteps(job);
  ASSERT_THAT(listed, IsOk());
  ASSERT_EQ(static_cast<int64_t>(listed->size()), steps);
  for (int64_t step = 0; step < steps; ++step) {
    EXPECT_EQ((*listed)[step].step(), step);
    EXPECT_EQ((*listed)[step].workers_size(), 1);
    auto w = q.ReadTensor(job, "w", step);
    ASSERT_THAT(w, IsOk()) << "step " << step;
    EXPECT_EQ(w->bytes, Bytes(StepValues(step, n))) << "step " << step;
  }
}

size_t SegmentFiles(const std::string& dir) {
  size_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    n += e.path().extension() == ".seg";
  }
  return n;
}

// Runs a command; its exit status and stdout.
int RunCommand(const std::string& command, std::string* out) {
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out->append(buf, n);
  const int status = ::pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A hook that saves steps [0, steps) of `job` while its collector is down
// and closes (the close runs out of time): what it leaves is its spool.
// Its counters after the close.
Hook::Counters SaveWhileDown(const std::string& address, const std::string& job,
                             const std::string& spool_dir, int64_t steps, size_t floats) {
  auto hook = Hook::Create(Options(address, job, spool_dir));
  EXPECT_TRUE(hook.ok()) << hook.status();
  if (!hook.ok()) return Hook::Counters();
  SaveSteps(**hook, 0, steps, floats);
  const absl::Status closed = (*hook)->Close();
  EXPECT_TRUE(absl::IsDeadlineExceeded(closed)) << closed;
  return (*hook)->counters();
}

// Waits (30 s at most) until the sender has moved `entries` entries into
// the spool.
void WaitUntilSpooled(Hook& hook, int64_t entries) {
  sonde::testing::WaitUntil(
      [&] { return hook.counters().entries_spooled >= static_cast<uint64_t>(entries); });
}

TEST(Spool, ACollectorDownForTheWholeRunLosesNothing) {
  CollectorLater collector;
  TempDir spool;
  constexpr int64_t kSteps = 12;
  constexpr size_t kFloats = 5000;
  {
    const Hook::Counters c =
        SaveWhileDown(collector.address(), "down", spool.path(), kSteps, kFloats);
    EXPECT_EQ(c.steps_left_in_spool, static_cast<uint64_t>(kSteps));
    EXPECT_EQ(c.tensors_dropped, 0u);
    EXPECT_EQ(c.steps_dropped, 0u);
    EXPECT_EQ(c.spool_refused, 0u);
  }
  // Every step and the job end, on disk past the client.
  EXPECT_EQ(SegmentFiles(spool.path()), static_cast<size_t>(kSteps) + 1);
  std::vector<spool::LeftSpool> left = spool::FindLeft(spool.path());
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].hello.job(), "down");
  EXPECT_EQ(left[0].collector, collector.address());

  collector.Start();
  spool::UploadResult result;
  SONDE_ASSERT_OK(spool::Upload(left[0], spool::UploadOptions(), &result));
  EXPECT_EQ(result.steps_stored, static_cast<uint64_t>(kSteps));
  EXPECT_EQ(result.steps_duplicate, 0u);
  EXPECT_TRUE(result.removed);
  EXPECT_TRUE(spool::FindLeft(spool.path()).empty());
  EXPECT_EQ(SegmentFiles(spool.path()), 0u);

  auto q = QueryClient::Connect(collector.address());
  ASSERT_NE(q, nullptr);
  ExpectStoredOnce(*q, "down", kSteps, kFloats);
  auto job = q->GetJob("down");
  SONDE_ASSERT_OK(job);
  EXPECT_EQ(job->status(), v1::JOB_STATUS_FINISHED);  // the spooled job end
  EXPECT_EQ(job->tensors_dropped(), 0u);
}

TEST(Spool, ADamagedEntryFailsTheUploadAndStaysWhileTheRestIsStored) {
  CollectorLater collector;
  TempDir spool;
  constexpr int64_t kSteps = 6;
  constexpr size_t kFloats = 500;
  SaveWhileDown(collector.address(), "damaged", spool.path(), kSteps, kFloats);
  std::vector<spool::LeftSpool> left = spool::FindLeft(spool.path());
  ASSERT_EQ(left.size(), 1u);
  ASSERT_GE(left[0].segments.size(), 3u);
  // Flip one byte inside the third entry (step 2).
  const std::string damaged =
      absl::StrCat(left[0].path, "/", absl::StrFormat("%020d", left[0].segments[2]), ".seg");
  ASSERT_TRUE(fs::exists(damaged)) << damaged;
  {
    std::fstream f(damaged, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(60);
    f.put('#');
  }

  collector.Start();
  spool::UploadResult result;
  const absl::Status s = spool::Upload(left[0], spool::UploadOptions(), &result);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("1 of the spool's entries are damaged"), std::string::npos) << s;
  EXPECT_EQ(result.segments_damaged, 1u);
  EXPECT_EQ(result.steps_stored, static_cast<uint64_t>(kSteps - 1));
  EXPECT_FALSE(result.removed);
  // Only the damaged entry is left, for inspection.
  EXPECT_TRUE(fs::exists(damaged));
  EXPECT_EQ(SegmentFiles(spool.path()), 1u);

  auto q = QueryClient::Connect(collector.address());
  ASSERT_NE(q, nullptr);
  auto listed = q->ListSteps("damaged");
  ASSERT_THAT(listed, IsOk());
  ASSERT_EQ(listed->size(), static_cast<size_t>(kSteps - 1));
  for (const v1::StepInfo& step : *listed) EXPECT_NE(step.step(), 2);
  // The job end that followed carries the damaged entry as a dropped step.
  auto job = q->GetJob("damaged");
  SONDE_ASSERT_OK(job);
  EXPECT_EQ(job->status(), v1::JOB_STATUS_FINISHED);
  EXPECT_EQ(job->steps_dropped(), 1u);
}

TEST(Spool, KillDashNineThenSondeSyncStoresEveryCompletedStepOnce) {
  CollectorLater collector;
  TempDir spool;
  constexpr int kSteps = 15;
  constexpr int kFloats = 3000;
  std::string out;
  const int rc = RunCommand(absl::StrCat(Runfile("tests/testing/spool_writer"),
                                  " --collector=", collector.address(), " --spool_dir=",
                                  spool.path(), " --job=killed --steps=", kSteps,
                                  " --floats=", kFloats, " 2>/dev/null; echo exit=$?"),
                     &out);
  ASSERT_EQ(rc, 0);
  // 128 + SIGKILL: the process died without closing anything.
  EXPECT_NE(out.find("spooled " + std::to_string(kSteps)), std::string::npos) << out;
  EXPECT_NE(out.find("exit=137"), std::string::npos) << out;
  ASSERT_EQ(SegmentFiles(spool.path()), static_cast<size_t>(kSteps));

  // Keep a copy, to upload the same steps a second time below.
  TempDir copy;
  fs::copy(spool.path(), copy.Sub("spool"), fs::copy_options::recursive);

  collector.Start();
  const std::string sync = absl::StrCat(Runfile("client/sonde"), " sync ", spool.path());
  out.clear();
  ASSERT_EQ(RunCommand(sync, &out), 0) << out;
  EXPECT_NE(out.find("job killed worker 0 -> " + collector.address()), std::string::npos) << out;
  EXPECT_NE(out.find(absl::StrCat(kSteps, " steps stored, 0 already stored; spool removed")),
            std::string::npos)
      << out;
  EXPECT_EQ(SegmentFiles(spool.path()), 0u);
  out.clear();
  ASSERT_EQ(RunCommand(sync, &out), 0) << out;  // nothing left: nothing done
  EXPECT_NE(out.find("0 spools in"), std::string::npos) << out;

  auto q = QueryClient::Connect(collector.address());
  ASSERT_NE(q, nullptr);
  ExpectStoredOnce(*q, "killed", kSteps, kFloats);
  auto job = q->GetJob("killed");
  SONDE_ASSERT_OK(job);
  EXPECT_NE(job->status(), v1::JOB_STATUS_FINISHED);  // left open for a restarted run

  // The same spool again (as if the first upload's acks had been lost): the
  // collector has every step, acknowledges them as duplicates and stores
  // nothing twice; --end_jobs then ends the killed client's job.
  out.clear();
  ASSERT_EQ(RunCommand(absl::StrCat(sync.substr(0, sync.rfind(' ')), " ", copy.Sub("spool"),
                             " --end_jobs --json"),
                &out),
            0)
      << out;
  EXPECT_NE(out.find("\"steps_already_stored\": " + std::to_string(kSteps)), std::string::npos)
      << out;
  EXPECT_NE(out.find("\"steps_stored\": 0"), std::string::npos) << out;
  ExpectStoredOnce(*q, "killed", kSteps, kFloats);
  job = q->GetJob("killed");
  SONDE_ASSERT_OK(job);
  EXPECT_EQ(job->status(), v1::JOB_STATUS_FINISHED);
}

TEST(Spool, MemoryStaysBoundedWhileDisconnectedAndSpooledStepsGoOutFromDisk) {
  CollectorLater collector;
  TempDir spool;
  constexpr uint64_t kBudget = 256 << 10;
  constexpr int64_t kSteps = 40;
  constexpr size_t kFloats = 8192;  // 32 KiB a step: 5x the budget in all
  HookOptions o = Options(collector.address(), "bounded", spool.path());
  o.max_queue_bytes = kBudget;
  o.close_timeout = absl::Seconds(60);
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  SaveSteps(**hook, 0, kSteps, kFloats);
  // The sender moves the steps into the spool and out of memory.
  WaitUntilSpooled(**hook, kSteps);
  Hook::Counters c = (*hook)->counters();
  EXPECT_EQ(c.entries_spooled, static_cast<uint64_t>(kSteps));
  EXPECT_LE(c.memory_bytes, kBudget);
  EXPECT_GE(c.spool_bytes, kSteps * kFloats * sizeof(float));
  EXPECT_EQ(c.tensors_dropped, 0u);

  collector.Start();
  SONDE_ASSERT_OK((*hook)->Close());
  c = (*hook)->counters();
  EXPECT_EQ(c.tensors_dropped, 0u);
  EXPECT_EQ(c.steps_left_in_spool, 0u);
  EXPECT_EQ(c.spool_bytes, 0u);
  hook->reset();
  EXPECT_EQ(SegmentFiles(spool.path()), 0u);
  EXPECT_TRUE(spool::FindLeft(spool.path()).empty());
  auto q = QueryClient::Connect(collector.address());
  ASSERT_NE(q, nullptr);
  ExpectStoredOnce(*q, "bounded", kSteps, kFloats);
}

// A spooled step that cannot be read back when it is due again is a
// counted gap at the client and at the collector, never a silent one.
TEST(Spool, ASpooledStepThatCannotBeReadBackIsACountedGap) {
  CollectorLater collector;
  TempDir spool;
  constexpr int64_t kSteps = 12;
  constexpr size_t kFloats = 8192;
  HookOptions o = Options(collector.address(), "unreadable", spool.path());
  o.max_queue_bytes = 64 << 10;
  o.close_timeout = absl::Seconds(60);
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  SaveSteps(**hook, 0, kSteps, kFloats);
  WaitUntilSpooled(**hook, kSteps);
  ASSERT_EQ((*hook)->counters().entries_spooled, static_cast<uint64_t>(kSteps));
  // Every spooled step is out of memory; damage the last step's entry.
  std::vector<std::string> segments;
  for (const auto& e : fs::recursive_directory_iterator(spool.path())) {
    if (e.path().extension() == ".seg") segments.push_back(e.path().string());
  }
  std::sort(segments.begin(), segments.end());
  ASSERT_EQ(segments.size(), static_cast<size_t>(kSteps));
  {
    std::fstream f(segments.back(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(60);
    f.put('#');
  }

  collector.Start();
  SONDE_ASSERT_OK((*hook)->Close());
  const Hook::Counters c = (*hook)->counters();
  EXPECT_EQ(c.steps_dropped, 1u);
  EXPECT_EQ(c.tensors_dropped, 2u);  // its weight and its loss
  EXPECT_EQ(c.steps_left_in_spool, 0u);
  hook->reset();
  EXPECT_EQ(SegmentFiles(spool.path()), 0u);

  auto q = QueryClient::Connect(collector.address());
  ASSERT_NE(q, nullptr);
  auto listed = q->ListSteps("unreadable");
  ASSERT_THAT(listed, IsOk());
  EXPECT_EQ(listed->size(), static_cast<size_t>(kSteps - 1));
  auto job = q->GetJob("unreadable");
  SONDE_ASSERT_OK(job);
  EXPECT_EQ(job->steps_dropped(), 1u);  // the gap reached the collector
}

TEST(Spool, AHealthyRunLeavesNothingOnDisk) {
  CollectorLater collector;
  collector.Start();
  TempDir spool;
  auto hook = Hook::Create(Options(collector.address(), "healthy", spool.path()));
  SONDE_ASSERT_OK(hook);
  SaveSteps(**hook, 0, 20, 1000);
  SONDE_ASSERT_OK((*hook)->Close());
  EXPECT_GE((*hook)->counters().entries_spooled, 20u);
  EXPECT_EQ((*hook)->counters().spool_bytes, 0u);
  hook->reset();
  std::error_code ec;
  EXPECT_TRUE(fs::is_empty(spool.path(), ec)) << "the spool directory should be empty";
}

TEST(Spool, PastItsLimitStepsAreKeptInMemoryAndCountedWhenLost) {
  CollectorLater collector;
  TempDir spool;
  constexpr int64_t kSteps = 10;
  constexpr size_t kFloats = 25000;  // 100 KB a step
  HookOptions o = Options(collector.address(), "limited", spool.path());
  o.max_spool_bytes = 450 << 10;  // room for 4 steps
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  SaveSteps(**hook, 0, kSteps, kFloats);
  EXPECT_FALSE((*hook)->Close().ok());
  const Hook::Counters c = (*hook)->counters();
  EXPECT_EQ(c.steps_left_in_spool, 4u);
  EXPECT_GT(c.spool_refused, 0u);
  // The rest is lost, and says so.
  EXPECT_EQ(c.steps_dropped, static_cast<uint64_t>(kSteps) - 4);
  hook->reset();

  collector.Start();
  std::vector<spool::LeftSpool> left = spool::FindLeft(spool.path());
  ASSERT_EQ(left.size(), 1u);
  spool::UploadResult result;
  SONDE_ASSERT_OK(spool::Upload(left[0], spool::UploadOptions(), &result));
  EXPECT_EQ(result.steps_stored, 4u);
  auto q = QueryClient::Connect(collector.address());
  ASSERT_NE(q, nullptr);
  ExpectStoredOnce(*q, "limited", 4, kFloats);
}

TEST(Spool, TheNextHookUploadsWhatAnEarlierOneLeftForItsCollector) {
  CollectorLater collector;
  TempDir spool;
  {
    auto hook = Hook::Create(Options(collector.address(), "earlier", spool.path()));
    SONDE_ASSERT_OK(hook);
    SaveSteps(**hook, 0, 6, 500);
    EXPECT_FALSE((*hook)->Close().ok());
  }
  // A spool for another collector stays where it is.
  {
    const ::sonde::testing::ReservedLoopbackAddress elsewhere;
    auto other = Hook::Create(Options(elsewhere.address(), "elsewhere", spool.path()));
    SONDE_ASSERT_OK(other);
    SaveSteps(**other, 0, 2, 10);
    EXPECT_FALSE((*other)->Close().ok());
  }
  ASSERT_EQ(spool::FindLeft(spool.path()).size(), 2u);
  collector.Start();
  HookOptions o = Options(collector.address(), "later", spool.path());
  o.upload_left_spools = true;
  o.close_timeout = absl::Seconds(30);
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  sonde::testing::WaitUntil([&] { return (*hook)->counters().left_spools_uploaded >= 1; });
  EXPECT_EQ((*hook)->counters().left_spools_uploaded, 1u);
  EXPECT_EQ((*hook)->counters().left_steps_uploaded, 6u);
  SaveSteps(**hook, 0, 3, 10);
  SONDE_ASSERT_OK((*hook)->Close());
  auto q = QueryClient::Connect(collector.address());
  ASSERT_NE(q, nullptr);
  ExpectStoredOnce(*q, "earlier", 6, 500);
  std::vector<spool::LeftSpool> left = spool::FindLeft(spool.path());
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].hello.job(), "elsewhere");
}

TEST(Spool, NoSpoolWhenItsDirectoryIsEmptyOrUnusable) {
  CollectorLater collector;
  collector.Start();
  TempDir dir;
  for (const std::string& spool_dir : {std::string(), dir.Sub("file")}) {
    if (!spool_dir.empty()) {
      std::FILE* f = std::fopen(spool_dir.c_str(), "w");  // a file, not a directory
      ASSERT_NE(f, nullptr);
      std::fclose(f);
    }
    auto hook = Hook::Create(Options(collector.address(), "nospool" + std::to_string(spool_dir.size()),
                                     spool_dir));
    SONDE_ASSERT_OK(hook);
    SaveSteps(**hook, 0, 3, 10);
    SONDE_ASSERT_OK((*hook)->Close());  // training and streaming as before
    EXPECT_EQ((*hook)->counters().entries_spooled, 0u);
  }
}

}  // namespace
}  // namespace sonde
