#include "client/value_spill.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace sonde {
namespace {

using ::sonde::testing::IsOk;
using ::sonde::testing::StatusIs;
using ::sonde::testing::TempDir;

std::string Bytes(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 31 + seed * 7);
  return s;
}

TEST(ValueSpill, RecordsReadBackInAnyOrderAndTheFileEmptiesWhenAllAreReleased) {
  TempDir dir;
  auto spill = ValueSpill::Create(dir.path(), 1 << 20);
  ASSERT_THAT(spill, IsOk());
  ValueSpill& s = **spill;
  std::vector<ValueSpill::Record> records;
  for (int i = 0; i < 6; ++i) {
    auto r = s.Write(Bytes(1000 + i, i).data(), 1000 + i);
    ASSERT_THAT(r, IsOk());
    records.push_back(*r);
  }
  EXPECT_EQ(s.live_records(), 6u);
  EXPECT_EQ(s.file_bytes(), 6 * 1000u + 15);
  // The file never shows in the directory: it is unlinked at creation.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  for (int i : {5, 0, 3, 1, 4, 2}) {
    std::string back(records[i].bytes, '\0');
    SONDE_ASSERT_OK(s.Read(records[i], back.data()));
    EXPECT_EQ(back, Bytes(1000 + i, i)) << i;
    s.Release(records[i]);
  }
  EXPECT_EQ(s.live_records(), 0u);
  EXPECT_EQ(s.file_bytes(), 0u);  // truncated: the disk space is back
  // And it is used again from the start.
  auto again = s.Write(Bytes(10, 9).data(), 10);
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(again->offset, 0u);
}

TEST(ValueSpill, ARecordPastTheLimitIsRefusedAndNothingStoredIsLost) {
  TempDir dir;
  auto spill = ValueSpill::Create(dir.path(), 4096);
  ASSERT_THAT(spill, IsOk());
  auto a = (*spill)->Write(Bytes(3000, 1).data(), 3000);
  ASSERT_THAT(a, IsOk());
  EXPECT_THAT((*spill)->Write(Bytes(2000, 2).data(), 2000),
              StatusIs(absl::StatusCode::kResourceExhausted, "limit of 4096 bytes"));
  std::string back(3000, '\0');
  SONDE_ASSERT_OK((*spill)->Read(*a, back.data()));
  EXPECT_EQ(back, Bytes(3000, 1));
  (*spill)->Release(*a);
  EXPECT_THAT((*spill)->Write(Bytes(2000, 2).data(), 2000), IsOk());  // room again
  EXPECT_EQ((*spill)->room(), 4096u - 2000u);
}

// Under steady use some record is always live, so the file is never
// truncated: released records must give their room back all the same.
TEST(ValueSpill, ReleasedRecordsGiveTheirRoomBackWhileOthersAreLive) {
  TempDir dir;
  auto spill = ValueSpill::Create(dir.path(), 8192);
  ASSERT_THAT(spill, IsOk());
  ValueSpill& s = **spill;
  auto older = s.Write(Bytes(3000, 0).data(), 3000);
  ASSERT_THAT(older, IsOk());
  for (int i = 1; i < 50; ++i) {  // 150 KB through an 8 KiB limit
    ASSERT_GE(s.room(), 3000u) << i << ": " << s.held_bytes() << " bytes held";
    auto newer = s.Write(Bytes(3000, i).data(), 3000);
    ASSERT_THAT(newer, IsOk());
    std::string back(3000, '\0');
    SONDE_ASSERT_OK(s.Read(*older, back.data()));
    EXPECT_EQ(back, Bytes(3000, i - 1));
    s.Release(*older);
    older = newer;
    EXPECT_EQ(s.live_records(), 1u);
    EXPECT_EQ(s.held_bytes(), 3000u);
  }
  EXPECT_GT(s.file_bytes(), 100000u);  // sparse: the holes hold nothing
  s.Release(*older);
  EXPECT_EQ(s.file_bytes(), 0u);
  EXPECT_EQ(s.held_bytes(), 0u);
}

// The open descriptor of this process's unlinked file in `dir`.
int OpenSpillOf(const std::string& dir) {
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (!ec && target.rfind(dir + "/sonde-values-", 0) == 0) {
      return open(e.path().c_str(), O_RDWR);
    }
  }
  return -1;
}

TEST(ValueSpill, ACorruptRecordIsDataLossNeverWrongValues) {
  TempDir dir;
  auto spill = ValueSpill::Create(dir.path(), 1 << 20);
  ASSERT_THAT(spill, IsOk());
  auto a = (*spill)->Write(Bytes(512, 1).data(), 512);
  auto b = (*spill)->Write(Bytes(512, 2).data(), 512);
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  const int fd = OpenSpillOf(dir.path());
  ASSERT_GE(fd, 0) << "the spill file is not among /proc/self/fd";
  const char flipped = static_cast<char>(~Bytes(512, 1)[100]);
  ASSERT_EQ(pwrite(fd, &flipped, 1, static_cast<off_t>(a->offset + 100)), 1);
  close(fd);
  std::string back(512, '\0');
  EXPECT_THAT((*spill)->Read(*a, back.data()),
              StatusIs(absl::StatusCode::kDataLoss, "fail their CRC"));
  SONDE_ASSERT_OK((*spill)->Read(*b, back.data()));  // its neighbour is intact
  EXPECT_EQ(back, Bytes(512, 2));
}

TEST(ValueSpill, ReadsRunBesideWrites) {
  TempDir dir;
  auto spill = ValueSpill::Create(dir.path(), 64 << 20);
  ASSERT_THAT(spill, IsOk());
  ValueSpill& s = **spill;
  constexpr int kRecords = 200;
  std::vector<ValueSpill::Record> records(kRecords);
  absl::Mutex mu;
  int written = 0;
  std::thread writer([&] {
    for (int i = 0; i < kRecords; ++i) {
      auto r = s.Write(Bytes(4096, i).data(), 4096);
      ASSERT_THAT(r, IsOk());
      absl::MutexLock lock(&mu);
      records[i] = *r;
      ++written;
    }
  });
  for (int i = 0; i < kRecords; ++i) {
    ValueSpill::Record r;
    {
      absl::MutexLock lock(&mu);
      auto ready = [&written, i]() { return written > i; };
      mu.Await(absl::Condition(&ready));
      r = records[i];
    }
    std::string back(4096, '\0');
    SONDE_ASSERT_OK(s.Read(r, back.data()));
    EXPECT_EQ(back, Bytes(4096, i)) << i;
    s.Release(r);
  }
  writer.join();
  EXPECT_EQ(s.live_records(), 0u);
}

TEST(ValueSpill, AMissingDirectoryIsCreated) {
  TempDir dir;
  const std::string nested = dir.path() + "/a/b";
  auto s = ValueSpill::Create(nested, 1 << 20);
  ASSERT_THAT(s, IsOk());
  EXPECT_TRUE(std::filesystem::is_directory(nested));
  EXPECT_TRUE(std::filesystem::is_empty(nested));  // unlinked
}

TEST(ValueSpill, ADirectoryThatCannotBeMadeIsUnavailable) {
  TempDir dir;
  const std::string file = dir.path() + "/plain-file";
  ASSERT_EQ(std::system(("touch " + file).c_str()), 0);
  // Under a regular file: refused even to root, which could make "/nonexistent".
  EXPECT_THAT(ValueSpill::Create(file + "/sonde", 1 << 20),
              StatusIs(absl::StatusCode::kUnavailable, "cannot create"));
}

}  // namespace
}  // namespace sonde
