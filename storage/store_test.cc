#include "storage/store.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "storage/keys.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace sonde::storage {
namespace {

using ::sonde::testing::StatusIs;
using ::sonde::testing::TempDir;

std::unique_ptr<Store> OpenStore(const std::string& path, uint64_t piece = 1 << 20) {
  Store::Options o;
  o.path = path;
  o.payload_piece_bytes = piece;
  auto s = Store::Open(o);
  EXPECT_THAT(s, ::sonde::testing::IsOk());
  return s.ok() ? std::move(*s) : nullptr;
}

TensorWrite Tensor(const std::string& name, int64_t step, std::string bytes) {
  TensorWrite t;
  t.record.set_tensor_name(name);
  t.record.set_step(step);
  t.record.set_mode(v1::MODE_TRAIN);
  t.record.set_mode_step(step);
  t.record.set_dtype(v1::DTYPE_U8);
  t.record.add_shape(static_cast<int64_t>(bytes.size()));
  t.record.add_collections("weights");
  t.record.mutable_statistics()->set_count(bytes.size());
  t.record.mutable_statistics()->set_mean(static_cast<double>(step));
  t.record.set_has_values(true);
  t.bytes = std::move(bytes);
  return t;
}

StepWrite Step(uint64_t job_id, int64_t step, int32_t worker = 0) {
  StepWrite w;
  w.job_id = job_id;
  w.worker = worker;
  w.step.set_step(step);
  w.step.set_mode(v1::MODE_TRAIN);
  w.step.set_mode_step(step);
  w.step.set_duration_seconds(0.5);
  return w;
}

std::string ReadAll(Store& store, uint64_t job, int64_t step, const std::string& name,
                    int32_t worker = 0) {
  std::string out;
  auto r = store.ReadTensor(job, v1::MODE_TRAIN, step, name, worker,
                            [&](const v1::TensorRecord&, absl::string_view piece) {
                              out.append(piece.data(), piece.size());
                              return absl::OkStatus();
                            });
  EXPECT_THAT(r, ::sonde::testing::IsOk());
  return out;
}

TEST(Store, CreateJobAssignsIdsOnceAndKeepsExisting) {
  TempDir dir;
  auto store = OpenStore(dir.path());
  v1::JobInfo a;
  a.set_job("alpha");
  auto first = store->CreateJob(a);
  SONDE_ASSERT_OK(first);
  EXPECT_EQ(first->job_id(), 1u);
  a.set_world_size(8);
  auto again = store->CreateJob(a);
  SONDE_ASSERT_OK(again);
  EXPECT_EQ(again->job_id(), 1u);
  EXPECT_EQ(again->world_size(), 0);  // existing record untouched
  v1::JobInfo b;
  b.set_job("beta");
  EXPECT_EQ(store->CreateJob(b)->job_id(), 2u);
  EXPECT_EQ(store->ListJobs()->size(), 2u);
  EXPECT_THAT(store->GetJob("gamma"), StatusIs(absl::StatusCode::kNotFound, "gamma"));
  v1::JobInfo bad;
  EXPECT_THAT(store->CreateJob(bad), StatusIs(absl::StatusCode::kInvalidArgument, "empty"));
}

TEST(Store, CommittedStepReadsBackBitExactAcrossPieces) {
  TempDir dir;
  auto store = OpenStore(dir.path(), /*piece=*/1000);
  v1::JobInfo job;
  job.set_job("j");
  const uint64_t id = store->CreateJob(job)->job_id();
  std::string big(4321, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 13);
  StepWrite w = Step(id, 5);
  w.tensors.push_back(Tensor("fc1.weight", 5, big));
  w.tensors.push_back(Tensor("fc1.bias", 5, "abc"));
  SONDE_ASSERT_OK(store->CommitStep(w));
  EXPECT_EQ(ReadAll(*store, id, 5, "fc1.weight"), big);
  EXPECT_EQ(ReadAll(*store, id, 5, "fc1.bias"), "abc");
  auto records = store->TensorsAtStep(id, v1::MODE_TRAIN, 5);
  SONDE_ASSERT_OK(records);
  ASSERT_EQ(records->size(), 2u);
  EXPECT_EQ((*records)[0].tensor_name(), "fc1.bias");  // name order within a step
  EXPECT_EQ((*records)[1].chunk_count(), 5u);          // 4321 bytes in 1000-byte pieces
  EXPECT_THAT(store->ReadTensor(id, v1::MODE_TRAIN, 6, "fc1.weight", 0,
                                [](const v1::TensorRecord&, absl::string_view) { return absl::OkStatus(); }),
              StatusIs(absl::StatusCode::kNotFound, "fc1.weight"));
}

TEST(Store, SummaryOnlyTensorHasNoPayload) {
  TempDir dir;
  auto store = OpenStore(dir.path());
  StepWrite w = Step(1, 0);
  TensorWrite t = Tensor("loss", 0, "");
  t.record.set_has_values(false);
  w.tensors.push_back(t);
  SONDE_ASSERT_OK(store->CommitStep(w));
  int pieces = 0;
  auto r = store->ReadTensor(1, v1::MODE_TRAIN, 0, "loss", 0, [&](const v1::TensorRecord&, absl::string_view) {
    ++pieces;
    return absl::OkStatus();
  });
  SONDE_ASSERT_OK(r);
  EXPECT_FALSE(r->has_values());
  EXPECT_EQ(pieces, 0);
}

TEST(Store, SeriesIsARangeOverStepsForOneTensorOnly) {
  TempDir dir;
  auto store = OpenStore(dir.path());
  for (int64_t step = 0; step < 20; ++step) {
    StepWrite w = Step(1, step);
    w.tensors.push_back(Tensor("fc1", step, "x"));
    w.tensors.push_back(Tensor("fc10", step, "y"));
    SONDE_ASSERT_OK(store->CommitStep(w));
  }
  auto points = store->ReadSeries(1, "fc1", v1::MODE_TRAIN, 5, 9, -1);
  SONDE_ASSERT_OK(points);
  ASSERT_EQ(points->size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ((*points)[i].step(), 5 + i);
    EXPECT_EQ((*points)[i].statistics().mean(), 5.0 + i);
  }
  auto all = store->ReadSeries(1, "fc1", v1::MODE_UNSPECIFIED, 0, -1, -1);
  EXPECT_EQ(all->size(), 20u);
  auto steps = store->ListSteps(1, v1::MODE_TRAIN);
  ASSERT_EQ(steps->size(), 20u);
  EXPECT_EQ((*steps)[19].tensor_count(), 0u);
  EXPECT_EQ(store->ListTensors(1)->size(), 2u);
}

TEST(Store, StepsAreWalkedFromAStepAndStopWhenAsked) {
  TempDir dir;
  auto store = OpenStore(dir.path());
  // Global steps 0-9 in TRAIN (mode steps 0-9) and 10-14 in EVAL (mode
  // steps 0-4), two workers each; then job 2.
  for (int64_t step = 0; step < 15; ++step) {
    for (int32_t worker : {0, 1}) {
      StepWrite w = Step(1, step, worker);
      if (step >= 10) {
        w.step.set_mode(v1::MODE_EVAL);
        w.step.set_mode_step(step - 10);
      }
      w.step.set_tensor_count(1 + worker);
      SONDE_ASSERT_OK(store->CommitStep(w));
    }
  }
  SONDE_ASSERT_OK(store->CommitStep(Step(2, 0)));
  auto walk = [&](v1::Mode mode, int64_t start, size_t most) {
    std::vector<std::pair<int64_t, int64_t>> seen;  // (global, mode) steps
    SONDE_EXPECT_OK(store->ForEachStep(1, mode, start, [&](v1::StepInfo& s) {
      EXPECT_EQ(s.workers_size(), 2) << s.step();  // merged
      EXPECT_EQ(s.tensor_count(), 3u) << s.step();
      seen.emplace_back(s.step(), s.mode_step());
      return seen.size() < most;
    }));
    return seen;
  };
  using Seen = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(walk(v1::MODE_UNSPECIFIED, 8, 4), (Seen{{8, 8}, {9, 9}, {10, 0}, {11, 1}}));
  EXPECT_EQ(walk(v1::MODE_EVAL, 3, 100), (Seen{{13, 3}, {14, 4}}));
  EXPECT_EQ(walk(v1::MODE_TRAIN, 9, 100), (Seen{{9, 9}}));
  EXPECT_TRUE(walk(v1::MODE_UNSPECIFIED, 15, 100).empty());  // nothing of job 2
  auto all = store->ListSteps(1, v1::MODE_UNSPECIFIED);
  SONDE_ASSERT_OK(all);
  ASSERT_EQ(all->size(), 15u);
  for (int64_t step = 0; step < 15; ++step) EXPECT_EQ((*all)[step].step(), step);
}

TEST(Store, TensorNamesAreWalkedInByteOrderFromAfterAName) {
  TempDir dir;
  auto store = OpenStore(dir.path());
  StepWrite w = Step(1, 0);
  // Names that are prefixes of one another, and a job after this one.
  for (const char* name : {"ab", "a", "a/b", "b", "a0"}) w.tensors.push_back(Tensor(name, 0, "x"));
  SONDE_ASSERT_OK(store->CommitStep(w));
  StepWrite other = Step(2, 0);
  other.tensors.push_back(Tensor("0", 0, "x"));
  SONDE_ASSERT_OK(store->CommitStep(other));
  auto walk = [&](absl::string_view after, size_t most) {
    std::vector<std::string> names;
    SONDE_EXPECT_OK(store->ForEachTensor(1, after, [&](v1::TensorInfo& t) {
      names.push_back(t.name());
      return names.size() < most;
    }));
    return names;
  };
  EXPECT_EQ(walk("", 100), (std::vector<std::string>{"a", "a/b", "a0", "ab", "b"}));
  EXPECT_EQ(walk("a", 100), (std::vector<std::string>{"a/b", "a0", "ab", "b"}));
  EXPECT_EQ(walk("a0", 2), (std::vector<std::string>{"ab", "b"}));
  EXPECT_EQ(walk("aa", 100), (std::vector<std::string>{"ab", "b"}));  // not itself a name
  EXPECT_TRUE(walk("b", 100).empty());  // nothing of job 2
}

TEST(Store, WorkersOfOneStepAreKeptApartAndMergedInStepLists) {
  TempDir dir;
  auto store = OpenStore(dir.path());
  for (int32_t worker : {0, 1}) {
    StepWrite w = Step(1, 3, worker);
    w.step.set_duration_seconds(worker == 0 ? 0.5 : 2.0);
    w.tensors.push_back(Tensor("w", 3, worker == 0 ? "zero" : "one"));
    SONDE_ASSERT_OK(store->CommitStep(w));
  }
  EXPECT_EQ(ReadAll(*store, 1, 3, "w", 0), "zero");
  EXPECT_EQ(ReadAll(*store, 1, 3, "w", 1), "one");
  auto steps = store->ListSteps(1, v1::MODE_UNSPECIFIED);
  ASSERT_EQ(steps->size(), 1u);
  EXPECT_EQ((*steps)[0].workers_size(), 2);
  EXPECT_EQ((*steps)[0].duration_seconds(), 2.0);
  auto global = store->FindGlobalStep(1, 3);
  SONDE_ASSERT_OK(global);
  EXPECT_EQ(global->mode(), v1::MODE_TRAIN);
  EXPECT_THAT(store->FindGlobalStep(1, 4), StatusIs(absl::StatusCode::kNotFound, "4"));
  // Each worker's own entry, one point read.
  auto own = store->WorkerGlobalStepAt(1, 3, 1);
  SONDE_ASSERT_OK(own);
  ASSERT_TRUE(own->has_value());
  EXPECT_EQ((*own)->mode_step(), 3);
  EXPECT_EQ(std::vector<int32_t>((*own)->workers().begin(), (*own)->workers().end()),
            (std::vector<int32_t>{1}));
  EXPECT_EQ((*own)->duration_seconds(), 2.0);
  auto none = store->WorkerGlobalStepAt(1, 3, 2);
  SONDE_ASSERT_OK(none);
  EXPECT_FALSE(none->has_value());
}

// Each worker's progress is its own key: writing one worker's leaves the
// others' as they were, and every read has them all.
TEST(Store, AJobRecordWrittenForOneWorkerKeepsTheOthers) {
  TempDir dir;
  auto store = OpenStore(dir.path());
  v1::JobInfo job;
  job.set_job("many");
  job.set_world_size(3);
  auto created = store->CreateJob(job);
  SONDE_ASSERT_OK(created);
  v1::JobInfo all = *created;
  for (int32_t w = 0; w < 3; ++w) {
    (*all.mutable_worker_client_id())[w] = 100 + w;
    (*all.mutable_worker_last_step())[w] = 10 * w;
    all.add_workers(w);
  }
  all.add_ended_workers(2);
  SONDE_ASSERT_OK(store->PutJob(all));
  // A step of worker 1, its record naming worker 1 only.
  StepWrite w = Step(created->job_id(), 11, 1);
  v1::JobInfo one = all;
  one.clear_worker_client_id();
  one.clear_worker_last_step();
  one.clear_workers();
  one.clear_ended_workers();
  one.add_workers(1);  // each worker it names, whole
  (*one.mutable_worker_client_id())[1] = 101;
  (*one.mutable_worker_last_step())[1] = 11;
  one.set_last_step(20);
  w.job = one;
  SONDE_ASSERT_OK(store->CommitStep(w));
  // A status change naming no worker.
  v1::JobInfo none = one;
  none.clear_worker_client_id();
  none.clear_worker_last_step();
  none.clear_workers();
  none.set_status(v1::JOB_STATUS_DISCONNECTED);
  SONDE_ASSERT_OK(store->PutJob(none));
  for (const v1::JobInfo& read : {*store->GetJob("many"), store->ListJobs()->at(0)}) {
    EXPECT_EQ(read.status(), v1::JOB_STATUS_DISCONNECTED);
    EXPECT_EQ(read.last_step(), 20);
    ASSERT_EQ(read.worker_last_step().size(), 3u);
    EXPECT_EQ(read.worker_last_step().at(0), 0);
    EXPECT_EQ(read.worker_last_step().at(1), 11);
    EXPECT_EQ(read.worker_last_step().at(2), 20);
    ASSERT_EQ(read.worker_client_id().size(), 3u);
    EXPECT_EQ(read.worker_client_id().at(2), 102u);
    EXPECT_EQ(std::vector<int32_t>(read.workers().begin(), read.workers().end()),
              (std::vector<int32_t>{0, 1, 2}));
    EXPECT_EQ(std::vector<int32_t>(read.ended_workers().begin(), read.ended_workers().end()),
              (std::vector<int32_t>{2}));
  }
}

// A record stored before per-worker keys (every worker's entries in the
// record itself) is read whole, and a later write of one worker loses none
// of the others.
TEST(Store, ARecordOfTheFormerFormatKeepsEveryWorker) {
  TempDir dir;
  uint64_t id;
  {
    auto store = OpenStore(dir.path());
    v1::JobInfo job;
    job.set_job("former");
    id = store->CreateJob(job)->job_id();
  }
  {
    std::vector<std::string> names;
    ASSERT_TRUE(rocksdb::DB::ListColumnFamilies(rocksdb::DBOptions(), dir.path(), &names).ok());
    std::vector<rocksdb::ColumnFamilyDescriptor> families;
    for (const std::string& n : names) families.emplace_back(n, rocksdb::ColumnFamilyOptions());
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::DBOptions(), dir.path(), families, &handles, &raw).ok());
    v1::JobInfo old;
    old.set_job("former");
    old.set_job_id(id);
    for (int32_t w = 0; w < 2; ++w) {
      (*old.mutable_worker_last_step())[w] = 5 + w;
      (*old.mutable_worker_client_id())[w] = 70 + w;
      old.add_workers(w);
    }
    old.add_ended_workers(1);
    rocksdb::ColumnFamilyHandle* jobs = nullptr;
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] == "jobs") jobs = handles[i];
    }
    ASSERT_NE(jobs, nullptr);
    ASSERT_TRUE(raw->Put(rocksdb::WriteOptions(), jobs, JobInfoKey(id), old.SerializeAsString()).ok());
    for (auto* h : handles) raw->DestroyColumnFamilyHandle(h);
    delete raw;
  }
  auto store = OpenStore(dir.path());
  auto read = store->GetJob("former");
  SONDE_ASSERT_OK(read);
  ASSERT_EQ(read->worker_last_step().size(), 2u);
  StepWrite w = Step(id, 9, 0);
  v1::JobInfo one = *read;
  one.clear_worker_client_id();
  one.clear_worker_last_step();
  one.clear_workers();
  one.clear_ended_workers();
  (*one.mutable_worker_last_step())[0] = 9;
  (*one.mutable_worker_client_id())[0] = 70;  // a worker's entries are written whole
  one.add_workers(0);
  w.job = one;
  SONDE_ASSERT_OK(store->CommitStep(w));
  read = store->GetJob("former");
  SONDE_ASSERT_OK(read);
  EXPECT_EQ(read->worker_last_step().at(0), 9);
  EXPECT_EQ(read->worker_last_step().at(1), 6);
  EXPECT_EQ(read->worker_client_id().at(0), 70u);
  EXPECT_EQ(read->worker_client_id().at(1), 71u);
  EXPECT_EQ(read->workers_size(), 2);
  ASSERT_EQ(read->ended_workers_size(), 1);
  EXPECT_EQ(read->ended_workers(0), 1);
}

TEST(Store, DataSurvivesReopen) {
  TempDir dir;
  uint64_t id;
  {
    auto store = OpenStore(dir.path());
    v1::JobInfo job;
    job.set_job("persist");
    id = store->CreateJob(job)->job_id();
    StepWrite w = Step(id, 0);
    w.tensors.push_back(Tensor("w", 0, "payload"));
    SONDE_ASSERT_OK(store->CommitStep(w));
    v1::RuleResult r;
    r.set_rule("ExplodingTensor");
    r.set_status(v1::RULE_STATUS_ISSUES_FOUND);
    SONDE_ASSERT_OK(store->PutRuleResult(id, r, std::string("cursor=0")));
  }
  auto store = OpenStore(dir.path());
  EXPECT_EQ(store->GetJob("persist")->job_id(), id);
  EXPECT_EQ(ReadAll(*store, id, 0, "w"), "payload");
  auto rules = store->RuleResults(id);
  ASSERT_EQ(rules->size(), 1u);
  EXPECT_EQ((*rules)[0].status(), v1::RULE_STATUS_ISSUES_FOUND);
  EXPECT_EQ(**store->RuleState(id, "ExplodingTensor"), "cursor=0");
  EXPECT_FALSE(store->RuleState(id, "Other")->has_value());
  v1::JobInfo next;
  next.set_job("next");
  EXPECT_EQ(store->CreateJob(next)->job_id(), id + 1);  // ids are never reused
}

TEST(Store, RejectsBadNamesWithoutWritingAnything) {
  TempDir dir;
  auto store = OpenStore(dir.path());
  StepWrite w = Step(1, 0);
  w.tensors.push_back(Tensor("good", 0, "a"));
  w.tensors.push_back(Tensor(std::string("bad\0name", 8), 0, "b"));
  EXPECT_THAT(store->CommitStep(w), StatusIs(absl::StatusCode::kInvalidArgument, "NUL"));
  EXPECT_TRUE(store->TensorsAtStep(1, v1::MODE_TRAIN, 0)->empty());
}

TEST(Store, OpenFailsClearlyOnAnUnusablePath) {
  Store::Options o;
  o.path = "/proc/definitely/not/writable";
  EXPECT_FALSE(Store::Open(o).ok());
  o.path = "";
  EXPECT_THAT(Store::Open(o), StatusIs(absl::StatusCode::kInvalidArgument, "path"));
}

TEST(Store, MonitoringPropertiesComeFromOurFamiliesAndCache) {
  TempDir dir;
  Store::Options o;
  o.path = dir.Sub("db");
  o.block_cache_bytes = 3 << 20;
  auto store = Store::Open(o);
  ASSERT_THAT(store, ::sonde::testing::IsOk());
  auto job = (*store)->CreateJob([] {
    v1::JobInfo j;
    j.set_job("props");
    return j;
  }());
  ASSERT_THAT(job, ::sonde::testing::IsOk());
  ASSERT_THAT((*store)->CommitStep(Step(job->job_id(), 1)), ::sonde::testing::IsOk());

  auto memtables = (*store)->ColumnFamilyIntProperty("rocksdb.cur-size-all-mem-tables");
  ASSERT_EQ(memtables.size(), 6u);
  EXPECT_EQ(memtables[0].first, "jobs");
  EXPECT_EQ(memtables[4].first, "rules");
  EXPECT_EQ(memtables[5].first, "profile");
  uint64_t total = 0;
  for (const auto& [family, bytes] : memtables) total += bytes;
  EXPECT_GT(total, 0u);
  // The cache our families use, not the default family's.
  EXPECT_EQ((*store)->DbIntProperty("rocksdb.block-cache-capacity"), uint64_t{3} << 20);
  EXPECT_EQ((*store)->DbIntProperty("rocksdb.no-such-property"), std::nullopt);
  EXPECT_TRUE((*store)->ColumnFamilyIntProperty("rocksdb.no-such-property").empty());
}


v1::ProfileBatch Profile(int64_t t0, int count, double scale) {
  v1::ProfileBatch batch;
  for (int i = 0; i < count; ++i) {
    v1::MetricSnapshot* snapshot = batch.add_snapshots();
    snapshot->set_unix_micros(t0 + 500000 * i);
    for (const char* name : {"cpu.util", "gpu.0.util", "memory.used_bytes"}) {
      v1::MetricSample* sample = snapshot->add_samples();
      sample->set_name(name);
      sample->set_value(scale * i + (name[0] == 'g' ? 0.5 : 0.0));
    }
  }
  for (int i = 0; i < count; ++i) {
    v1::TraceEvent* step = batch.add_events();
    step->set_kind(v1::TraceEvent::KIND_STEP);
    step->set_mode(v1::MODE_TRAIN);
    step->set_step(i);
    step->set_mode_step(i);
    step->set_start_unix_micros(t0 + 500000 * i);
    step->set_end_unix_micros(t0 + 500000 * i + 400000);
    v1::TraceEvent* span = batch.add_events();
    span->set_kind(v1::TraceEvent::KIND_SPAN);
    span->set_name(i % 2 == 0 ? "augment" : "log");
    span->set_step(i);
    span->set_start_unix_micros(t0 + 500000 * i + 1000);
    span->set_end_unix_micros(t0 + 500000 * i + 2000);
  }
  return batch;
}

TEST(StoreProfile, MetricsAndEventsReadBackByWorkerNameKindAndTime) {
  TempDir dir;
  auto store = OpenStore(dir.Sub("db"));
  v1::JobInfo info;
  info.set_job("prof");
  auto job = store->CreateJob(info);
  ASSERT_THAT(job, ::sonde::testing::IsOk());
  const uint64_t id = job->job_id();
  const int64_t t0 = 1700000000000000;
  ASSERT_THAT(store->WriteProfile(id, 0, Profile(t0, 4, 10.0)), ::sonde::testing::IsOk());
  ASSERT_THAT(store->WriteProfile(id, 1, Profile(t0, 2, 100.0)), ::sonde::testing::IsOk());
  // Written again (a resend after a broken stream): stored once.
  ASSERT_THAT(store->WriteProfile(id, 0, Profile(t0, 4, 10.0)), ::sonde::testing::IsOk());

  auto names = store->ListMetrics(id);
  ASSERT_THAT(names, ::sonde::testing::IsOk());
  const std::vector<std::string> all = {"cpu.util", "gpu.0.util", "memory.used_bytes"};
  ASSERT_EQ(names->size(), 2u);
  EXPECT_EQ((*names)[0].first, 0);
  EXPECT_EQ((*names)[0].second, all);
  EXPECT_EQ((*names)[1].first, 1);

  auto cpu = store->ReadMetrics(id, {"cpu.util"}, nullptr, 0, 0, 0);
  ASSERT_THAT(cpu, ::sonde::testing::IsOk());
  ASSERT_EQ(cpu->size(), 1u);
  EXPECT_EQ((*cpu)[0].unix_micros_size(), 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ((*cpu)[0].unix_micros(i), t0 + 500000 * i);
    EXPECT_EQ((*cpu)[0].values(i), 10.0 * i);
  }
  // A time range [t0 + 0.5 s, t0 + 1.5 s) of every worker, by regex.
  auto gpu = store->ReadMetrics(id, {}, [](const std::string& n) { return n.rfind("gpu.", 0) == 0; },
                                -1, t0 + 500000, t0 + 1500000);
  ASSERT_THAT(gpu, ::sonde::testing::IsOk());
  ASSERT_EQ(gpu->size(), 2u);
  EXPECT_EQ((*gpu)[0].worker(), 0);
  EXPECT_EQ((*gpu)[0].values_size(), 2);
  EXPECT_EQ((*gpu)[0].values(0), 10.5);
  EXPECT_EQ((*gpu)[1].worker(), 1);
  EXPECT_EQ((*gpu)[1].values_size(), 1);
  EXPECT_EQ((*gpu)[1].values(0), 100.5);
  auto every = store->ReadMetrics(id, {}, nullptr, -1, 0, 0);
  ASSERT_THAT(every, ::sonde::testing::IsOk());
  EXPECT_EQ(every->size(), 6u);

  auto steps = store->ReadEvents(id, v1::TraceEvent::KIND_STEP, "", 0, 0, 0);
  ASSERT_THAT(steps, ::sonde::testing::IsOk());
  ASSERT_EQ(steps->size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ((*steps)[i].event().step(), i);
    EXPECT_EQ((*steps)[i].event().end_unix_micros() - (*steps)[i].event().start_unix_micros(),
              400000);
  }
  auto augment = store->ReadEvents(id, v1::TraceEvent::KIND_SPAN, "augment", -1, 0, 0);
  ASSERT_THAT(augment, ::sonde::testing::IsOk());
  EXPECT_EQ(augment->size(), 3u);  // worker 0: steps 0 and 2; worker 1: step 0
  auto late = store->ReadEvents(id, v1::TraceEvent::KIND_UNSPECIFIED, "", -1, t0 + 1000000, 0);
  ASSERT_THAT(late, ::sonde::testing::IsOk());
  EXPECT_EQ(late->size(), 4u);  // worker 0's steps 2 and 3, with a span each
}

TEST(StoreProfile, EventsOfOneNameAndStartButDifferentEndsAreBothKept) {
  TempDir dir;
  auto store = OpenStore(dir.Sub("db"));
  v1::ProfileBatch batch;
  for (int64_t end : {150, 170}) {
    v1::TraceEvent* e = batch.add_events();
    e->set_kind(v1::TraceEvent::KIND_SPAN);
    e->set_name("load");
    e->set_start_unix_micros(100);
    e->set_end_unix_micros(end);
  }
  ASSERT_THAT(store->WriteProfile(7, 0, batch), ::sonde::testing::IsOk());
  // A resend lands on the same keys.
  ASSERT_THAT(store->WriteProfile(7, 0, batch), ::sonde::testing::IsOk());
  auto events = store->ReadEvents(7, v1::TraceEvent::KIND_SPAN, "load", 0, 0, 0);
  ASSERT_THAT(events, ::sonde::testing::IsOk());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[0].event().end_unix_micros(), 150);
  EXPECT_EQ((*events)[1].event().end_unix_micros(), 170);
}

// A store with Profile(t0, count, 1.0) of workers 0 and 1 in job `job_id`.
std::unique_ptr<Store> StoreWithTwoWorkers(const TempDir& dir, uint64_t job_id, int64_t t0,
                                           int count) {
  auto store = OpenStore(dir.Sub("db"));
  for (int32_t worker : {0, 1}) {
    EXPECT_THAT(store->WriteProfile(job_id, worker, Profile(t0, count, 1.0)),
                ::sonde::testing::IsOk());
  }
  return store;
}

TEST(StoreProfile, NarrowEventReadsMatchTheFilteredFullScan) {
  TempDir dir;
  const int64_t t0 = 1700000000000000;
  auto store = StoreWithTwoWorkers(dir, 3, t0, 6);
  auto all = store->ReadEvents(3, v1::TraceEvent::KIND_UNSPECIFIED, "", -1, 0, 0);
  ASSERT_THAT(all, ::sonde::testing::IsOk());
  ASSERT_EQ(all->size(), 24u);
  const std::vector<v1::TraceEvent::Kind> kinds = {v1::TraceEvent::KIND_UNSPECIFIED,
                                                   v1::TraceEvent::KIND_STEP,
                                                   v1::TraceEvent::KIND_SPAN};
  for (int32_t worker : {-1, 0, 1}) {
    for (v1::TraceEvent::Kind kind : kinds) {
      for (const std::string name : {"", "augment", "log"}) {
        for (const auto& [start, end] : std::vector<std::pair<int64_t, int64_t>>{
                 {0, 0}, {t0 + 500000, 0}, {t0 + 500000, t0 + 2000000}, {t0 + 1000, t0 + 1001}}) {
          std::vector<std::string> expected;
          for (const v1::WorkerEvent& e : *all) {
            if (worker >= 0 && e.worker() != worker) continue;
            if (kind != v1::TraceEvent::KIND_UNSPECIFIED && e.event().kind() != kind) continue;
            if (!name.empty() && e.event().name() != name) continue;
            if (e.event().start_unix_micros() < start) continue;
            if (end > 0 && e.event().start_unix_micros() >= end) continue;
            expected.push_back(e.SerializeAsString());
          }
          auto got = store->ReadEvents(3, kind, name, worker, start, end);
          ASSERT_THAT(got, ::sonde::testing::IsOk());
          std::vector<std::string> actual;
          for (const v1::WorkerEvent& e : *got) actual.push_back(e.SerializeAsString());
          EXPECT_EQ(actual, expected) << "worker " << worker << " kind " << kind << " name '"
                                      << name << "' [" << start << ", " << end << ")";
        }
      }
    }
  }
}

TEST(StoreProfile, ReadsStopAtTheirLimitAndSayTheyWereTruncated) {
  TempDir dir;
  auto store = StoreWithTwoWorkers(dir, 5, 1700000000000000, 4);
  bool truncated = true;
  // 2 workers x 3 metrics x 4 points = 24.
  auto exact = store->ReadMetrics(5, {}, nullptr, -1, 0, 0, 24, &truncated);
  ASSERT_THAT(exact, ::sonde::testing::IsOk());
  EXPECT_FALSE(truncated);
  EXPECT_EQ(exact->size(), 6u);
  auto cut = store->ReadMetrics(5, {}, nullptr, -1, 0, 0, 6, &truncated);
  ASSERT_THAT(cut, ::sonde::testing::IsOk());
  EXPECT_TRUE(truncated);
  ASSERT_EQ(cut->size(), 2u);  // worker 0's cpu.util whole, then 2 points of gpu.0.util
  EXPECT_EQ((*cut)[0].values_size(), 4);
  EXPECT_EQ((*cut)[1].name(), "gpu.0.util");
  EXPECT_EQ((*cut)[1].values_size(), 2);
  // Per worker, only that worker's names are listed and read.
  auto one = store->ReadMetrics(5, {}, nullptr, 1, 0, 0, 0, &truncated);
  ASSERT_THAT(one, ::sonde::testing::IsOk());
  EXPECT_FALSE(truncated);
  ASSERT_EQ(one->size(), 3u);
  for (const v1::MetricSeries& m : *one) EXPECT_EQ(m.worker(), 1);
  auto listed = store->ListMetrics(5, 1);
  ASSERT_THAT(listed, ::sonde::testing::IsOk());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].first, 1);

  // 2 workers x 4 steps x (a step and a span) = 16 events.
  auto events = store->ReadEvents(5, v1::TraceEvent::KIND_UNSPECIFIED, "", -1, 0, 0, 16,
                                  &truncated);
  ASSERT_THAT(events, ::sonde::testing::IsOk());
  EXPECT_FALSE(truncated);
  EXPECT_EQ(events->size(), 16u);
  auto few = store->ReadEvents(5, v1::TraceEvent::KIND_UNSPECIFIED, "", -1, 0, 0, 5, &truncated);
  ASSERT_THAT(few, ::sonde::testing::IsOk());
  EXPECT_TRUE(truncated);
  ASSERT_EQ(few->size(), 5u);
  for (size_t i = 0; i < few->size(); ++i) {
    EXPECT_EQ((*few)[i].SerializeAsString(), (*events)[i].SerializeAsString());
  }
}

TEST(StoreProfile, BadNamesAreRefusedAndNothingOfTheBatchIsStored) {
  TempDir dir;
  auto store = OpenStore(dir.Sub("db"));
  v1::ProfileBatch batch = Profile(1, 2, 1.0);
  batch.mutable_snapshots(1)->mutable_samples(0)->set_name(std::string("bad\0name", 8));
  EXPECT_THAT(store->WriteProfile(7, 0, batch),
              StatusIs(absl::StatusCode::kInvalidArgument, "metric name"));
  auto names = store->ListMetrics(7);
  ASSERT_THAT(names, ::sonde::testing::IsOk());
  EXPECT_TRUE(names->empty());
}

}  // namespace
}  // namespace sonde::storage
