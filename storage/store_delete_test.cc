// Deleting jobs from the store: every key goes, in every column family;
// other jobs stay bit-exact; the disk space comes back; a deletion a crash
// interrupted finishes when the store opens again. What is on disk is read
// with RocksDB directly (tests/testing/rocksdb_dump.h), not through Store.
#include <filesystem>
#include <iostream>
#include <random>
#include <set>
#include <string>

#include "gtest/gtest.h"
#include "storage/store.h"
#include "tests/testing/rocksdb_dump.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace sonde::storage {
namespace {

using ::sonde::testing::DatabaseDump;
using ::sonde::testing::DumpDatabase;
using ::sonde::testing::IsOk;
using ::sonde::testing::KeyOwner;
using ::sonde::testing::KeysOfJob;
using ::sonde::testing::StatusIs;
using ::sonde::testing::TempDir;

const char* const kFamilies[] = {"jobs", "stats", "series", "payloads", "rules", "profile"};

std::unique_ptr<Store> OpenStore(const std::string& path, uint64_t piece = 1000) {
  Store::Options o;
  o.path = path;
  o.payload_piece_bytes = piece;
  auto s = Store::Open(o);
  EXPECT_THAT(s, IsOk());
  return s.ok() ? std::move(*s) : nullptr;
}

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(n, '\0');
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t v = rng();
    for (size_t j = 0; j < 8 && i + j < n; ++j) out[i + j] = static_cast<char>(v >> (8 * j));
  }
  return out;
}

// A job with `steps` steps of `workers` workers, two tensors each (one with
// `bytes` raw bytes in several pieces, one statistics only), a finished
// record, a rule result and a rule state.
uint64_t WriteJob(Store& store, const std::string& name, int steps, int workers, size_t bytes,
                  uint64_t seed) {
  v1::JobInfo info;
  info.set_job(name);
  info.set_world_size(workers);
  auto created = store.CreateJob(info);
  EXPECT_THAT(created, IsOk());
  const uint64_t id = created->job_id();
  for (int step = 0; step < steps; ++step) {
    for (int worker = 0; worker < workers; ++worker) {
      StepWrite w;
      w.job_id = id;
      w.worker = worker;
      w.step.set_step(step);
      w.step.set_mode(v1::MODE_TRAIN);
      w.step.set_mode_step(step);
      TensorWrite values;
      values.record.set_tensor_name("fc.weight");
      values.record.set_step(step);
      values.record.set_mode(v1::MODE_TRAIN);
      values.record.set_mode_step(step);
      values.record.set_dtype(v1::DTYPE_U8);
      values.record.add_shape(static_cast<int64_t>(bytes));
      values.record.set_has_values(true);
      values.bytes = RandomBytes(bytes, seed * 1000 + step * 10 + worker);
      w.tensors.push_back(values);
      TensorWrite loss;
      loss.record.set_tensor_name("loss");
      loss.record.set_step(step);
      loss.record.set_mode(v1::MODE_TRAIN);
      loss.record.set_mode_step(step);
      loss.record.mutable_statistics()->set_mean(1.0 / (step + 1));
      w.tensors.push_back(loss);
      info = *created;
      info.set_status(v1::JOB_STATUS_FINISHED);
      info.set_last_step(step);
      w.job = info;
      EXPECT_THAT(store.CommitStep(w), IsOk());
    }
  }
  v1::RuleResult result;
  result.set_job(name);
  result.set_rule("LossNotDecreasing");
  result.set_status(v1::RULE_STATUS_NO_ISSUES_FOUND);
  EXPECT_THAT(store.PutRuleResult(id, result, std::string("cursor")), IsOk());
  v1::ProfileBatch profile;
  for (int i = 0; i < 3; ++i) {
    v1::MetricSnapshot* snapshot = profile.add_snapshots();
    snapshot->set_unix_micros(1000 * i + static_cast<int64_t>(seed));
    v1::MetricSample* sample = snapshot->add_samples();
    sample->set_name("cpu.util");
    sample->set_value(10.0 * i);
  }
  v1::TraceEvent* event = profile.add_events();
  event->set_kind(v1::TraceEvent::KIND_STEP);
  event->set_start_unix_micros(5);
  event->set_end_unix_micros(9);
  EXPECT_THAT(store.WriteProfile(id, 0, profile), IsOk());
  return id;
}

DatabaseDump Dump(const std::string& path) {
  auto dump = DumpDatabase(path);
  EXPECT_THAT(dump, IsOk());
  return dump.ok() ? *dump : DatabaseDump();
}

// Fails the test for every key of an unknown shape, and for every key of
// `job_id`.
void ExpectNoKeyOf(const DatabaseDump& dump, uint64_t job_id) {
  size_t keys = 0;
  for (const auto& [family, entries] : dump) {
    for (const auto& [k, v] : entries) {
      ++keys;
      auto owner = KeyOwner(family, k, v);
      ASSERT_THAT(owner, IsOk());
      EXPECT_NE(*owner, job_id) << "a key of deleted job " << job_id << " is left in "
                                << family;
    }
  }
  EXPECT_GT(keys, 0u);
}

void ExpectKeysInEveryFamily(const DatabaseDump& job_keys) {
  for (const char* family : kFamilies) {
    auto it = job_keys.find(family);
    EXPECT_TRUE(it != job_keys.end() && !it->second.empty()) << "no keys in " << family;
  }
}

uint64_t SstBytes(const std::string& path) {
  uint64_t total = 0;
  for (const auto& entry : std::filesystem::directory_iterator(path)) {
    if (entry.path().extension() == ".sst") total += entry.file_size();
  }
  return total;
}

TEST(StoreDelete, RemovesEveryKeyOfTheJobInEveryFamilyAndLeavesOthersBitExact) {
  TempDir dir;
  const std::string path = dir.Sub("db");
  uint64_t a, b, c;
  {
    auto store = OpenStore(path);
    a = WriteJob(*store, "alpha", 3, 2, 2500, 1);
    b = WriteJob(*store, "beta", 4, 2, 2500, 2);
    c = WriteJob(*store, "gamma", 3, 1, 2500, 3);
  }
  const DatabaseDump before = Dump(path);
  ExpectKeysInEveryFamily(KeysOfJob(before, b));
  {
    auto store = OpenStore(path);
    auto deleted = store->DeleteJob("beta");
    ASSERT_THAT(deleted, IsOk());
    EXPECT_EQ(deleted->job_id, b);
    EXPECT_EQ(deleted->name, "beta");
    EXPECT_GT(deleted->approximate_bytes, 0u);
    EXPECT_THAT(store->GetJob("beta"), StatusIs(absl::StatusCode::kNotFound, "beta"));
    EXPECT_THAT(store->DeleteJob("beta"), StatusIs(absl::StatusCode::kNotFound, "beta"));
    auto jobs = store->ListJobs();
    ASSERT_THAT(jobs, IsOk());
    std::set<std::string> names;
    for (const auto& j : *jobs) names.insert(j.job());
    EXPECT_EQ(names, (std::set<std::string>{"alpha", "gamma"}));
    EXPECT_TRUE(store->ListSteps(b, v1::MODE_UNSPECIFIED)->empty());
    EXPECT_TRUE(store->ListTensors(b)->empty());
    EXPECT_TRUE(store->RuleResults(b)->empty());
    EXPECT_EQ(*store->RuleState(b, "LossNotDecreasing"), std::nullopt);
  }
  const DatabaseDump after = Dump(path);
  ExpectNoKeyOf(after, b);
  // Other jobs: the same keys with the same bytes, in every family.
  for (uint64_t other : {a, c}) {
    const DatabaseDump want = KeysOfJob(before, other);
    ExpectKeysInEveryFamily(want);
    EXPECT_TRUE(KeysOfJob(after, other) == want) << "job " << other << " changed";
  }
  EXPECT_EQ(after.at("jobs").at("I"), before.at("jobs").at("I"));  // ids are never reused
}

TEST(StoreDelete, NameCanBeReusedAndGetsANewId) {
  TempDir dir;
  auto store = OpenStore(dir.path());
  const uint64_t old_id = WriteJob(*store, "run", 2, 1, 100, 1);
  ASSERT_THAT(store->DeleteJob("run"), IsOk());
  v1::JobInfo fresh;
  fresh.set_job("run");
  auto created = store->CreateJob(fresh);
  ASSERT_THAT(created, IsOk());
  EXPECT_NE(created->job_id(), old_id);
  EXPECT_EQ(created->status(), v1::JOB_STATUS_UNSPECIFIED);  // not the old record
  EXPECT_TRUE(store->ListSteps(created->job_id(), v1::MODE_UNSPECIFIED)->empty());
  EXPECT_TRUE(store->ListTensors(created->job_id())->empty());
  EXPECT_EQ(store->GetJob("run")->job_id(), created->job_id());
}

TEST(StoreDelete, GivesTheDiskSpaceBack) {
  TempDir dir;
  const std::string path = dir.Sub("db");
  constexpr size_t kMiB = 1 << 20;
  std::string small_values;
  {
    auto store = OpenStore(path, kMiB);
    WriteJob(*store, "big", 16, 1, kMiB, 7);  // 16 MiB of incompressible values
    WriteJob(*store, "small", 1, 1, kMiB, 8);
  }
  // Reopening flushes what the write-ahead log holds into SST files.
  auto store = OpenStore(path, kMiB);
  auto size_before = store->ApproximateSizeBytes();
  ASSERT_THAT(size_before, IsOk());
  const uint64_t sst_before = SstBytes(path);
  EXPECT_GE(sst_before, 17 * kMiB);
  auto deleted = store->DeleteJob("big");
  ASSERT_THAT(deleted, IsOk());
  // The estimate of what the job took is within 10% of its 16 MiB.
  EXPECT_GE(deleted->approximate_bytes, 16 * kMiB * 9 / 10);
  EXPECT_LE(deleted->approximate_bytes, 16 * kMiB * 11 / 10);
  auto size_after = store->ApproximateSizeBytes();
  ASSERT_THAT(size_after, IsOk());
  EXPECT_GE(*size_before - *size_after, 15 * kMiB)
      << "before " << *size_before << " after " << *size_after;
  auto small = store->GetJob("small");
  ASSERT_THAT(small, IsOk());
  std::string read;
  ASSERT_THAT(store->ReadTensor(small->job_id(), v1::MODE_TRAIN, 0, "fc.weight", 0,
                                [&](const v1::TensorRecord&, absl::string_view piece) {
                                  read.append(piece.data(), piece.size());
                                  return absl::OkStatus();
                                }),
              IsOk());
  EXPECT_TRUE(read == RandomBytes(kMiB, 8 * 1000)) << "the other job's values changed";
  store.reset();  // closing deletes obsolete files
  const uint64_t sst_after = SstBytes(path);
  EXPECT_GE(sst_before - std::min(sst_before, sst_after), 15 * kMiB)
      << "SST files: " << sst_before << " bytes before, " << sst_after << " after";
  EXPECT_LE(sst_after, 2 * kMiB);
  std::cout << "deleting 16 MiB of 17: approximate size " << *size_before << " -> "
            << *size_after << " bytes, SST files " << sst_before << " -> " << sst_after
            << " bytes, the job's estimate " << deleted->approximate_bytes << " bytes\n";
}

// The first step done, then the process "crashes" (the store closes without
// the second): the job is already invisible, its data still on disk under
// a marker; opening the store finishes the deletion.
TEST(StoreDelete, DeletionInterruptedAfterMarkingFinishesOnOpen) {
  TempDir dir;
  const std::string path = dir.Sub("db");
  uint64_t a, b;
  {
    auto store = OpenStore(path);
    a = WriteJob(*store, "keep", 2, 2, 3000, 1);
    b = WriteJob(*store, "drop", 3, 2, 3000, 2);
    auto marked = store->MarkJobDeleted("drop");
    ASSERT_THAT(marked, IsOk());
    EXPECT_EQ(marked->job_id, b);
    EXPECT_THAT(store->GetJob("drop"), StatusIs(absl::StatusCode::kNotFound, "drop"));
    EXPECT_EQ(store->ListJobs()->size(), 1u);
  }
  const DatabaseDump midway = Dump(path);
  const DatabaseDump drop_keys = KeysOfJob(midway, b);
  // No name and no record any more, a marker, and the data still there.
  EXPECT_EQ(midway.at("jobs").count(JobNameKey("drop")), 0u);
  EXPECT_EQ(midway.at("jobs").count(JobInfoKey(b)), 0u);
  EXPECT_EQ(midway.at("jobs").at(DeletingJobKey(b)), "drop");
  for (const char* family : {"stats", "series", "payloads", "rules"}) {
    EXPECT_FALSE(drop_keys.at(family).empty()) << family;
  }
  const DatabaseDump keep_keys = KeysOfJob(midway, a);
  {
    auto store = OpenStore(path);  // finishes the deletion
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->GetJob("keep")->job_id(), a);
    EXPECT_THAT(store->PurgeDeletedJobs(), IsOk());
    EXPECT_TRUE(store->PurgeDeletedJobs()->jobs.empty());  // nothing left to do
  }
  const DatabaseDump after = Dump(path);
  ExpectNoKeyOf(after, b);
  EXPECT_TRUE(KeysOfJob(after, a) == keep_keys);
}

TEST(StoreDelete, PurgeRemovesEveryMarkedJobAtOnce) {
  TempDir dir;
  const std::string path = dir.Sub("db");
  uint64_t ids[4];
  {
    auto store = OpenStore(path);
    for (int i = 0; i < 4; ++i) {
      ids[i] = WriteJob(*store, "job" + std::to_string(i), 2, 1, 1500, i);
    }
    ASSERT_THAT(store->MarkJobDeleted("job0"), IsOk());
    ASSERT_THAT(store->MarkJobDeleted("job2"), IsOk());
    auto purged = store->PurgeDeletedJobs();
    ASSERT_THAT(purged, IsOk());
    SONDE_EXPECT_OK(purged->compaction);
    std::set<uint64_t> purged_ids;
    for (const DeletedJob& j : purged->jobs) purged_ids.insert(j.job_id);
    EXPECT_EQ(purged_ids, (std::set<uint64_t>{ids[0], ids[2]}));
  }
  const DatabaseDump after = Dump(path);
  ExpectNoKeyOf(after, ids[0]);
  ExpectNoKeyOf(after, ids[2]);
  ExpectKeysInEveryFamily(KeysOfJob(after, ids[1]));
  ExpectKeysInEveryFamily(KeysOfJob(after, ids[3]));
}

TEST(StoreDelete, UnknownOrBadNameIsRefused) {
  TempDir dir;
  auto store = OpenStore(dir.path());
  EXPECT_THAT(store->DeleteJob("nobody"), StatusIs(absl::StatusCode::kNotFound, "nobody"));
  EXPECT_THAT(store->MarkJobDeleted(""), StatusIs(absl::StatusCode::kInvalidArgument, "empty"));
}

}  // namespace
}  // namespace sonde::storage
