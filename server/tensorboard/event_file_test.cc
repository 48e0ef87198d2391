#include "server/tensorboard/event_file.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/tensorboard/progress.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace sonde::server::tensorboard {
namespace {

using ::sonde::testing::IsOk;
using ::sonde::testing::StatusIs;
using ::sonde::testing::TempDir;

std::string Contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(EventFile, NamedForTensorBoardAndOpensWithTheFileVersion) {
  TempDir dir;
  const absl::Time now = absl::FromUnixSeconds(1700000000);
  auto file = EventFile::Create(dir.Sub("job/train"), now);
  ASSERT_THAT(file, IsOk());
  const std::string name = std::filesystem::path((*file)->path()).filename();
  EXPECT_EQ(name.rfind("events.out.tfevents.1700000000.", 0), 0u) << name;
  const std::string bytes = Contents((*file)->path());
  EXPECT_EQ(bytes.size(), (*file)->size());
  EXPECT_NE(bytes.find("brain.Event:2"), std::string::npos);
}

TEST(EventFile, SameSecondGetsANameThatSortsAfter) {
  TempDir dir;
  const absl::Time now = absl::FromUnixSeconds(1700000000);
  auto first = EventFile::Create(dir.path(), now);
  auto second = EventFile::Create(dir.path(), now);
  ASSERT_THAT(first, IsOk());
  ASSERT_THAT(second, IsOk());
  EXPECT_NE((*first)->path(), (*second)->path());
  EXPECT_LT((*first)->path(), (*second)->path());
}

TEST(EventFile, FlushWritesBufferedEventsAndTruncateCutsBack) {
  TempDir dir;
  auto file = EventFile::Create(dir.path(), absl::Now());
  ASSERT_THAT(file, IsOk());
  const uint64_t header = (*file)->size();
  tfevents::Event e;
  e.set_step(7);
  e.mutable_summary()->add_value()->set_tag("loss");
  (*file)->Append(e);
  EXPECT_GT((*file)->buffered(), 0u);
  EXPECT_EQ(Contents((*file)->path()).size(), header);  // not yet written
  ASSERT_THAT((*file)->Flush(), IsOk());
  EXPECT_EQ((*file)->buffered(), 0u);
  EXPECT_GT((*file)->size(), header);
  EXPECT_EQ(Contents((*file)->path()).size(), (*file)->size());
  ASSERT_THAT(TruncateEventFile((*file)->path(), header), IsOk());
  EXPECT_EQ(Contents((*file)->path()).size(), header);
  // Not longer, or missing: nothing to do.
  EXPECT_THAT(TruncateEventFile((*file)->path(), header + 100), IsOk());
  EXPECT_EQ(Contents((*file)->path()).size(), header);
  EXPECT_THAT(TruncateEventFile(dir.Sub("missing"), 0), IsOk());
}

TEST(EventFile, UnwritableDirectoryIsAnError) {
  TempDir dir;
  std::ofstream(dir.Sub("plain")) << "a file, not a directory";
  EXPECT_FALSE(EventFile::Create(dir.Sub("plain/run"), absl::Now()).ok());
}

TEST(ExportProgress, RoundTripsAndIsAbsentAtFirst) {
  TempDir dir;
  auto none = ReadExportProgress(dir.path());
  ASSERT_THAT(none, IsOk());
  EXPECT_FALSE(none->has_value());
  ExportProgress p;
  p.job_id = 42;
  p.exported_through = 1234;
  p.files["train/events.out.tfevents.1.host"] = 99;
  p.files["worker_1/eval/events.out.tfevents.2.host.1"] = 12345678901;
  ASSERT_THAT(WriteExportProgress(dir.path(), p), IsOk());
  auto read = ReadExportProgress(dir.path());
  ASSERT_THAT(read, IsOk());
  ASSERT_TRUE(read->has_value());
  EXPECT_EQ((*read)->job_id, 42u);
  EXPECT_EQ((*read)->exported_through, 1234);
  EXPECT_EQ((*read)->files, p.files);
  EXPECT_FALSE(std::filesystem::exists(dir.Sub(".sonde-tensorboard-progress.tmp")));
}

TEST(ExportProgress, DamagedRecordIsDataLoss) {
  TempDir dir;
  const std::string path = dir.Sub(".sonde-tensorboard-progress");
  std::ofstream(path) << "sonde-tensorboard-progress v1\njob_id 3\nexported_through x\n";
  EXPECT_THAT(ReadExportProgress(dir.path()), StatusIs(absl::StatusCode::kDataLoss, "bad step"));
  std::ofstream(path, std::ios::trunc)
      << "sonde-tensorboard-progress v1\njob_id 3\nexported_through 5\nfile ../escape 10\n";
  EXPECT_THAT(ReadExportProgress(dir.path()),
              StatusIs(absl::StatusCode::kDataLoss, "bad file path"));
  std::ofstream(path, std::ios::trunc) << "sonde-tensorboard-progress v1\njob_id 3\n";
  EXPECT_THAT(ReadExportProgress(dir.path()), StatusIs(absl::StatusCode::kDataLoss, "incomplete"));
}

}  // namespace
}  // namespace sonde::server::tensorboard
