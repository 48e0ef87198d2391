#include "client/spill_file.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "client/spill_budget.h"
#include "client/value_spill.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace sonde {
namespace {

using ::sonde::testing::IsOk;
using ::sonde::testing::StatusIs;
using ::sonde::testing::TempDir;

SpillRecord Tensor(const std::string& name, int64_t step, size_t bytes) {
  SpillRecord r;
  r.tensor.name = name;
  r.tensor.collections = {"weights", "rule:x"};
  r.tensor.dtype = v1::DTYPE_F32;
  r.tensor.shape = {static_cast<int64_t>(bytes / 4)};
  r.tensor.step = step;
  r.tensor.mode = v1::MODE_EVAL;
  r.tensor.mode_step = step / 2;
  r.tensor.send_values = step % 2 == 0;
  r.tensor.histogram = true;
  r.tensor.histogram_spec = ExponentialSpec(-8, 8, 2);
  r.tensor.bytes.resize(bytes);
  for (size_t i = 0; i < bytes; ++i) r.tensor.bytes[i] = static_cast<char>(i * 7 + step);
  return r;
}

SpillRecord StepEnd(int64_t step) {
  SpillRecord r;
  r.is_step_end = true;
  r.step_end.set_step(step);
  r.step_end.set_tensors_dropped(3);
  return r;
}

TEST(SpillFile, RecordsComeBackInOrderAndIntactAndTheFileEmptiesWhenDrained) {
  TempDir dir;
  auto file = SpillFile::Create(dir.path(), 1 << 20);
  ASSERT_THAT(file, IsOk());
  SpillFile& f = **file;
  for (int step = 0; step < 5; ++step) {
    SONDE_ASSERT_OK(f.Append(Tensor("w", step, 1000 + step)));
    SONDE_ASSERT_OK(f.Append(StepEnd(step)));
  }
  EXPECT_EQ(f.records(), 10u);
  EXPECT_GT(f.file_bytes(), 5000u);
  for (int step = 0; step < 5; ++step) {
    EXPECT_GT(f.NextSize(), 1000u);
    EXPECT_FALSE(f.NextIsStepEnd());
    auto t = f.ReadNext();
    ASSERT_THAT(t, IsOk());
    const SpillRecord want = Tensor("w", step, 1000 + step);
    EXPECT_FALSE(t->is_step_end);
    EXPECT_EQ(t->tensor.name, want.tensor.name);
    EXPECT_EQ(t->tensor.collections, want.tensor.collections);
    EXPECT_EQ(t->tensor.dtype, want.tensor.dtype);
    EXPECT_EQ(t->tensor.shape, want.tensor.shape);
    EXPECT_EQ(t->tensor.step, step);
    EXPECT_EQ(t->tensor.mode, v1::MODE_EVAL);
    EXPECT_EQ(t->tensor.mode_step, step / 2);
    EXPECT_EQ(t->tensor.send_values, want.tensor.send_values);
    EXPECT_TRUE(t->tensor.histogram);
    EXPECT_EQ(t->tensor.histogram_spec.kind, want.tensor.histogram_spec.kind);
    EXPECT_EQ(t->tensor.histogram_spec.min_exponent, -8);
    EXPECT_EQ(t->tensor.bytes, want.tensor.bytes);
    EXPECT_TRUE(f.NextIsStepEnd());
    auto e = f.ReadNext();
    ASSERT_THAT(e, IsOk());
    EXPECT_TRUE(e->is_step_end);
    EXPECT_EQ(e->step_end.step(), step);
    EXPECT_EQ(e->step_end.tensors_dropped(), 3u);
  }
  EXPECT_EQ(f.records(), 0u);
  EXPECT_FALSE(f.NextIsStepEnd());
  EXPECT_EQ(f.file_bytes(), 0u);  // truncated: the disk space is back
  EXPECT_THAT(f.ReadNext(), StatusIs(absl::StatusCode::kFailedPrecondition, "no spilled"));
  // It is usable again after draining.
  SONDE_ASSERT_OK(f.Append(StepEnd(9)));
  auto again = f.ReadNext();
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(again->step_end.step(), 9);
}

TEST(SpillFile, TheFileIsUnlinkedAtOnce) {
  TempDir dir;
  auto file = SpillFile::Create(dir.path(), 1 << 20);
  ASSERT_THAT(file, IsOk());
  SONDE_ASSERT_OK((*file)->Append(Tensor("w", 0, 4096)));
  EXPECT_EQ(std::system(("test -z \"$(ls -A " + dir.path() + ")\"").c_str()), 0);
}

TEST(SpillFile, AppendPastTheLimitIsResourceExhaustedAndLeavesEarlierRecords) {
  TempDir dir;
  auto file = SpillFile::Create(dir.path(), 3000);
  ASSERT_THAT(file, IsOk());
  SONDE_ASSERT_OK((*file)->Append(Tensor("a", 0, 2000)));
  EXPECT_THAT((*file)->Append(Tensor("b", 1, 2000)),
              StatusIs(absl::StatusCode::kResourceExhausted, "limit"));
  EXPECT_EQ((*file)->records(), 1u);
  auto a = (*file)->ReadNext();
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(a->tensor.name, "a");
}

TEST(SpillFile, AReadRecordGivesItsSpaceBackBeforeTheFileDrains) {
  // A collector that keeps pace with a spilling hook never lets the file
  // drain; what it has read must not count against the limit.
  TempDir dir;
  auto budget = std::make_shared<SpillBudget>(10000);
  auto file = SpillFile::Create(dir.path(), budget);
  ASSERT_THAT(file, IsOk());
  int next = 0;
  for (; next < 3; ++next) SONDE_ASSERT_OK((*file)->Append(Tensor("t", next, 3000)));
  const uint64_t one = (*file)->NextSize();
  EXPECT_EQ(budget->held(), 3 * one);
  EXPECT_THAT((*file)->Append(Tensor("t", next, 3000)),
              StatusIs(absl::StatusCode::kResourceExhausted, "limit of 10000 bytes"));
  for (int round = 0; round < 20; ++round) {  // 60 KB through a 10 KB limit
    auto r = (*file)->ReadNext();
    ASSERT_THAT(r, IsOk());
    EXPECT_EQ(r->tensor.step, round);
    EXPECT_EQ(budget->held(), 2 * one);
    SONDE_ASSERT_OK((*file)->Append(Tensor("t", next++, 3000)));
    EXPECT_EQ((*file)->records(), 3u);
  }
  while ((*file)->records() > 0) ASSERT_THAT((*file)->ReadNext(), IsOk());
  EXPECT_EQ(budget->held(), 0u);
  EXPECT_EQ((*file)->file_bytes(), 0u);
}

TEST(SpillFile, SharesOneLimitWithTheDeviceValuesSpill) {
  // max_spill_bytes bounds both of a hook's spill files together.
  TempDir dir;
  auto budget = std::make_shared<SpillBudget>(10000);
  auto file = SpillFile::Create(dir.path(), budget);
  auto values = ValueSpill::Create(dir.path(), budget);
  ASSERT_THAT(file, IsOk());
  ASSERT_THAT(values, IsOk());
  const std::string bytes(6000, 'v');
  auto held = (*values)->Write(bytes.data(), bytes.size());
  ASSERT_THAT(held, IsOk());
  EXPECT_EQ(budget->held(), 6000u);
  EXPECT_THAT((*file)->Append(Tensor("big", 0, 5000)),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "the spill files would pass their limit of 10000 bytes"));
  SONDE_ASSERT_OK((*file)->Append(Tensor("small", 0, 2000)));
  const uint64_t queued = budget->held() - 6000;
  EXPECT_GT(queued, 2000u);
  EXPECT_EQ((*file)->file_bytes(), queued);
  EXPECT_THAT((*values)->Write(bytes.data(), 4000),
              StatusIs(absl::StatusCode::kResourceExhausted, "limit of 10000 bytes"));
  EXPECT_EQ((*values)->room(), 10000u - 6000u - queued);
  // Space one gives back, the other may take.
  (*values)->Release(*held);
  EXPECT_EQ(budget->held(), queued);
  SONDE_ASSERT_OK((*file)->Append(Tensor("big", 1, 5000)));
  ASSERT_THAT((*file)->ReadNext(), IsOk());
  ASSERT_THAT((*file)->ReadNext(), IsOk());  // drained: truncated
  EXPECT_EQ(budget->held(), 0u);
  ASSERT_THAT((*values)->Write(bytes.data(), bytes.size()), IsOk());
  values->reset();  // a closed file holds nothing
  EXPECT_EQ(budget->held(), 0u);
}

TEST(SpillFile, DeviceTensorsAreRefused) {
  TempDir dir;
  auto file = SpillFile::Create(dir.path(), 1 << 20);
  ASSERT_THAT(file, IsOk());
  SpillRecord r = Tensor("d", 0, 16);
  r.tensor.pending = std::make_shared<PendingDeviceTensor>();
  EXPECT_THAT((*file)->Append(r), StatusIs(absl::StatusCode::kInvalidArgument, "device"));
}

TEST(SpillFile, AMissingDirectoryIsCreated) {
  TempDir dir;
  const std::string nested = dir.path() + "/a/b";
  auto file = SpillFile::Create(nested, 1 << 20);
  ASSERT_THAT(file, IsOk());
  SONDE_ASSERT_OK((*file)->Append(Tensor("w", 0, 4096)));
  EXPECT_TRUE(std::filesystem::is_directory(nested));
  EXPECT_TRUE(std::filesystem::is_empty(nested));  // unlinked
}

TEST(SpillFile, ADirectoryThatCannotBeMadeIsUnavailable) {
  TempDir dir;
  const std::string file = dir.path() + "/plain-file";
  ASSERT_EQ(std::system(("touch " + file).c_str()), 0);
  // Under a regular file: refused even to root, which could make "/nonexistent".
  EXPECT_THAT(SpillFile::Create(file + "/sonde", 1 << 20).status(),
              StatusIs(absl::StatusCode::kUnavailable, "cannot create"));
}

}  // namespace
}  // namespace sonde
