#include "client/spool/spool.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace sonde::spool {
namespace {

namespace fs = std::filesystem;

v1::Hello MakeHello(const std::string& job, int worker, uint64_t client_id) {
  v1::Hello h;
  h.set_job(job);
  h.set_worker(worker);
  h.set_world_size(worker + 1);
  h.set_client_id(client_id);
  return h;
}

std::vector<v1::ClientMessage> Step(int64_t step, size_t payload) {
  std::vector<v1::ClientMessage> out(2);
  out[0].set_seq(7);  // not kept: numbered again when sent
  out[0].mutable_chunk()->set_tensor_name("w");
  out[0].mutable_chunk()->set_step(step);
  out[0].mutable_chunk()->set_payload(std::string(payload, static_cast<char>('a' + step % 26)));
  out[1].mutable_step_end()->set_step(step);
  out[1].mutable_step_end()->set_tensor_count(1);
  return out;
}

size_t CountFiles(const std::string& dir) {
  size_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) n += e.is_regular_file();
  return n;
}

TEST(Spool, SegmentsReadBackAsWritten) {
  testing::TempDir dir;
  auto spool = Spool::Create(dir.path(), MakeHello("j", 0, 0xabc), "127.0.0.1:1", 1 << 20);
  SONDE_ASSERT_OK(spool.status());
  EXPECT_EQ((*spool)->path(), dir.path() + "/j/0-0000000000000abc");
  SONDE_ASSERT_OK((*spool)->Write(1, Step(0, 100)));
  SONDE_ASSERT_OK((*spool)->Write(2, Step(1, 200)));
  EXPECT_EQ((*spool)->segments(), 2u);
  auto back = (*spool)->Read(2);
  SONDE_ASSERT_OK(back.status());
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[0].chunk().payload(), std::string(200, 'b'));
  EXPECT_EQ((*back)[1].step_end().step(), 1);
  // Nothing half-written is left behind.
  for (const auto& e : fs::directory_iterator((*spool)->path())) {
    EXPECT_NE(e.path().extension(), ".tmp") << e.path();
  }
}

TEST(Spool, AcknowledgedSegmentsGoAndAnEmptySpoolLeavesNothing) {
  testing::TempDir dir;
  {
    auto spool = Spool::Create(dir.path(), MakeHello("j", 0, 1), "c:1", 1 << 20);
    SONDE_ASSERT_OK(spool.status());
    SONDE_ASSERT_OK((*spool)->Write(1, Step(0, 10)));
    const uint64_t bytes = (*spool)->bytes();
    EXPECT_GT(bytes, 10u);
    (*spool)->Remove(1);
    EXPECT_EQ((*spool)->bytes(), 0u);
    EXPECT_TRUE(absl::IsNotFound((*spool)->Read(1).status()));
  }
  EXPECT_EQ(CountFiles(dir.path()), 0u);
  EXPECT_FALSE(fs::exists(dir.path() + "/j"));
}

TEST(Spool, TheLimitRefusesWithoutWriting) {
  testing::TempDir dir;
  auto spool = Spool::Create(dir.path(), MakeHello("j", 0, 1), "c:1", 1000);
  SONDE_ASSERT_OK(spool.status());
  SONDE_ASSERT_OK((*spool)->Write(1, Step(0, 500)));
  absl::Status s = (*spool)->Write(2, Step(1, 500));
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_NE(s.message().find("limit of 1000"), std::string::npos) << s;
  EXPECT_EQ((*spool)->segments(), 1u);
  EXPECT_TRUE(absl::IsNotFound((*spool)->Read(2).status()));
}

TEST(Spool, ALiveSpoolIsNotLeftAndAGoneOneIs) {
  testing::TempDir dir;
  auto live = Spool::Create(dir.path(), MakeHello("live", 0, 1), "c:1", 1 << 20);
  SONDE_ASSERT_OK(live.status());
  SONDE_ASSERT_OK((*live)->Write(1, Step(0, 10)));
  std::string gone_path;
  {
    auto gone = Spool::Create(dir.path(), MakeHello("gone", 2, 9), "host:7070", 1 << 20);
    SONDE_ASSERT_OK(gone.status());
    SONDE_ASSERT_OK((*gone)->Write(3, Step(0, 10)));
    SONDE_ASSERT_OK((*gone)->Write(4, Step(1, 10)));
    gone_path = (*gone)->path();
  }  // its client is gone: the segments stay
  std::vector<LeftSpool> left = FindLeft(dir.path());
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].path, gone_path);
  EXPECT_EQ(left[0].hello.job(), "gone");
  EXPECT_EQ(left[0].hello.worker(), 2);
  EXPECT_EQ(left[0].hello.client_id(), 9u);
  EXPECT_EQ(left[0].collector, "host:7070");
  EXPECT_EQ(left[0].segments, (std::vector<uint64_t>{3, 4}));
  EXPECT_GT(left[0].bytes, 20u);
  // One upload at a time: a second lock is refused while the first is held.
  auto lock = LockLeft(gone_path);
  SONDE_ASSERT_OK(lock.status());
  EXPECT_TRUE(absl::IsUnavailable(LockLeft(gone_path).status()));
  EXPECT_TRUE(FindLeft(dir.path()).empty());
  ::close(*lock);
  auto read = ReadSegment(gone_path, 4);
  SONDE_ASSERT_OK(read.status());
  EXPECT_EQ((*read)[1].step_end().step(), 1);
  RemoveLeft(gone_path);
  EXPECT_FALSE(fs::exists(dir.path() + "/gone"));
  EXPECT_TRUE(FindLeft(dir.path()).empty());
  EXPECT_TRUE(FindLeft(dir.Sub("absent")).empty());
}

TEST(Spool, ADamagedSegmentIsDataLossNeverGarbage) {
  testing::TempDir dir;
  auto spool = Spool::Create(dir.path(), MakeHello("j", 0, 1), "c:1", 1 << 20);
  SONDE_ASSERT_OK(spool.status());
  SONDE_ASSERT_OK((*spool)->Write(1, Step(0, 300)));
  const std::string file = (*spool)->path() + "/00000000000000000001.seg";
  ASSERT_TRUE(fs::exists(file));
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('#');
  }
  EXPECT_TRUE(absl::IsDataLoss((*spool)->Read(1).status()));
  fs::resize_file(file, 50);
  EXPECT_TRUE(absl::IsDataLoss((*spool)->Read(1).status()));
}

TEST(Spool, ASecondClientCannotTakeALiveSpool) {
  testing::TempDir dir;
  auto first = Spool::Create(dir.path(), MakeHello("j", 0, 5), "c:1", 1 << 20);
  SONDE_ASSERT_OK(first.status());
  auto second = Spool::Create(dir.path(), MakeHello("j", 0, 5), "c:1", 1 << 20);
  EXPECT_TRUE(absl::IsUnavailable(second.status())) << second.status();
}

TEST(Spool, ADirectoryThatCannotBeMadeIsAClearError) {
  testing::TempDir dir;
  // A regular file where a directory should be: refused whoever runs it
  // (root included, whom permissions would not stop).
  std::ofstream(dir.Sub("file")) << "x";
  auto spool = Spool::Create(dir.Sub("file") + "/spool", MakeHello("j", 0, 1), "c:1", 1 << 20);
  ASSERT_FALSE(spool.ok());
  EXPECT_TRUE(absl::IsInternal(spool.status())) << spool.status();
  EXPECT_NE(spool.status().message().find("cannot create the spool directory"),
            std::string::npos)
      << spool.status();
}

TEST(Spool, TheDefaultDirectoryFollowsTheEnvironment) {
  ::setenv("SONDE_SPOOL_DIR", "/x/spool", 1);
  EXPECT_EQ(DefaultDir(), "/x/spool");
  ::unsetenv("SONDE_SPOOL_DIR");
  ::setenv("TEST_TMPDIR", "/t", 1);
  EXPECT_EQ(DefaultDir(), "/t/sonde-spool");
  ::unsetenv("TEST_TMPDIR");
  ::setenv("XDG_CACHE_HOME", "/cache", 1);
  EXPECT_EQ(DefaultDir(), "/cache/sonde/spool");
  ::unsetenv("XDG_CACHE_HOME");
  ::setenv("HOME", "/home/u", 1);
  EXPECT_EQ(DefaultDir(), "/home/u/.cache/sonde/spool");
}

}  // namespace
}  // namespace sonde::spool
