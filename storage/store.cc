#include "storage/store.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "rocksdb/write_buffer_manager.h"
#include "rocksdb/table.h"
#include "rocksdb/cache.h"
#include "rocksdb/write_batch.h"
#include "storage/keys.h"
#include "common/names.h"

namespace sonde::storage {
namespace {

const char* const kFamilyNames[] = {"jobs", "stats", "series", "payloads", "rules", "profile"};
constexpr char kNextJobIdKey[] = "I";

// The one place rocksdb::Status becomes absl::Status; codes chosen on purpose.
absl::Status FromRocks(const rocksdb::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, ": ", s.ToString());
  if (s.IsNotFound()) return absl::NotFoundError(msg);
  if (s.IsCorruption()) return absl::DataLossError(msg);
  if (s.IsIOError()) {
    if (s.subcode() == rocksdb::Status::kNoSpace) return absl::ResourceExhaustedError(msg);
    return absl::UnavailableError(msg);
  }
  if (s.IsBusy() || s.IsTimedOut() || s.IsTryAgain()) return absl::UnavailableError(msg);
  if (s.IsInvalidArgument()) return absl::InvalidArgumentError(msg);
  return absl::InternalError(msg);
}

template <typename Message>
absl::StatusOr<Message> Parse(absl::string_view bytes, absl::string_view what) {
  Message m;
  if (!m.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::DataLossError(absl::StrCat("cannot parse stored ", what));
  }
  return m;
}

std::string EncodeU64(uint64_t v) {
  std::string s;
  AppendU64(s, v);
  return s;
}

void MergeStepInfo(v1::StepInfo& into, const v1::StepInfo& w) {
  for (int32_t worker : w.workers()) into.add_workers(worker);
  into.set_duration_seconds(std::max(into.duration_seconds(), w.duration_seconds()));
  into.set_tensor_count(into.tensor_count() + w.tensor_count());
  into.set_tensors_dropped(into.tensors_dropped() + w.tensors_dropped());
  into.set_values_dropped(into.values_dropped() + w.values_dropped());
}

}  // namespace

uint8_t ModeKeyByte(v1::Mode mode) {
  return static_cast<uint8_t>(mode == v1::MODE_UNSPECIFIED ? v1::MODE_GLOBAL : mode);
}

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const Options& options) {
  if (options.path.empty()) return absl::InvalidArgumentError("store path is empty");
  if (options.payload_piece_bytes == 0) {
    return absl::InvalidArgumentError("payload_piece_bytes must be positive");
  }
  rocksdb::DBOptions db_options;
  db_options.create_if_missing = true;
  db_options.create_missing_column_families = true;
  db_options.IncreaseParallelism(2);
  db_options.max_background_jobs = 2;
  db_options.write_buffer_manager =
      std::make_shared<rocksdb::WriteBufferManager>(options.memtable_bytes);

  rocksdb::ColumnFamilyOptions cf_options;
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = rocksdb::NewLRUCache(options.block_cache_bytes);
  cf_options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  // Per family: memtables of a quarter of the budget (RocksDB's default
  // here is 128 MiB each, up to 6 of them, per family).
  cf_options.OptimizeLevelStyleCompaction(options.memtable_bytes);
  cf_options.write_buffer_size = std::max<uint64_t>(options.memtable_bytes / 4, 4 << 20);
  cf_options.max_write_buffer_number = 3;

  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  families.emplace_back(rocksdb::kDefaultColumnFamilyName, cf_options);
  for (const char* name : kFamilyNames) families.emplace_back(name, cf_options);

  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  SONDE_RETURN_IF_ERROR(FromRocks(
      rocksdb::DB::Open(db_options, options.path, families, &handles, &raw),
      absl::StrCat("opening RocksDB at '", options.path, "'")));
  std::unique_ptr<rocksdb::DB> db(raw);
  // handles[0] is "default", which Sonde does not use.
  db->DestroyColumnFamilyHandle(handles[0]);
  handles.erase(handles.begin());
  std::unique_ptr<Store> store(new Store(options, std::move(db), std::move(handles)));
  // Finish deletions a crash interrupted (see MarkJobDeleted).
  auto purged = store->PurgeDeletedJobs();
  if (!purged.ok()) return purged.status();
  SONDE_RETURN_IF_ERROR(store->SplitFormerRecords());
  return store;
}

Store::Store(const Options& options, std::unique_ptr<rocksdb::DB> db,
             std::vector<rocksdb::ColumnFamilyHandle*> handles)
    : options_(options), db_(std::move(db)), handles_(std::move(handles)) {}

Store::~Store() {
  if (db_ == nullptr) return;
  db_->FlushWAL(/*sync=*/true).PermitUncheckedError();
  for (auto* h : handles_) db_->DestroyColumnFamilyHandle(h);
  db_->Close().PermitUncheckedError();
}

absl::Status Store::ScanPrefix(
    Family family, absl::string_view prefix,
    const std::function<absl::Status(absl::string_view, absl::string_view)>& fn) {
  rocksdb::ReadOptions ro;
  const std::string end = PrefixEnd(prefix);
  rocksdb::Slice upper(end);
  if (!end.empty()) ro.iterate_upper_bound = &upper;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, handles_[family]));
  for (it->Seek(rocksdb::Slice(prefix.data(), prefix.size())); it->Valid(); it->Next()) {
    const rocksdb::Slice k = it->key();
    if (!k.starts_with(rocksdb::Slice(prefix.data(), prefix.size()))) break;
    SONDE_RETURN_IF_ERROR(fn(absl::string_view(k.data(), k.size()),
                             absl::string_view(it->value().data(), it->value().size())));
  }
  return FromRocks(it->status(), "scanning");
}

namespace {

// The job record without its per-worker maps, and one key per worker the
// maps name (see Store's class comment).
void PutJobRecord(rocksdb::WriteBatch& batch, rocksdb::ColumnFamilyHandle* jobs,
                  const v1::JobInfo& info) {
  std::map<int32_t, v1::WorkerProgress> workers;
  for (const auto& [w, step] : info.worker_last_step()) {
    workers[w].set_committed(true);
    workers[w].set_last_step(step);
  }
  for (const auto& [w, client] : info.worker_client_id()) {
    workers[w].set_attached(true);
    workers[w].set_client_id(client);
  }
  for (int32_t w : info.workers()) workers[w].set_joined(true);
  for (int32_t w : info.ended_workers()) workers[w].set_ended(true);
  for (const auto& [w, progress] : workers) {
    batch.Put(jobs, WorkerProgressKey(info.job_id(), w), progress.SerializeAsString());
  }
  v1::JobInfo record = info;  // small: the per-worker fields go
  record.clear_worker_last_step();
  record.clear_worker_client_id();
  record.clear_workers();
  record.clear_ended_workers();
  batch.Put(jobs, JobInfoKey(info.job_id()), record.SerializeAsString());
}

}  // namespace

absl::Status Store::AddWorkerProgress(v1::JobInfo& info) {
  // A record of the former format lists workers itself.
  std::set<int32_t> joined(info.workers().begin(), info.workers().end());
  std::set<int32_t> ended(info.ended_workers().begin(), info.ended_workers().end());
  SONDE_RETURN_IF_ERROR(ScanPrefix(kJobs, WorkerProgressPrefix(info.job_id()),
                    [&](absl::string_view key, absl::string_view value) {
                      key.remove_prefix(WorkerProgressPrefix(info.job_id()).size());
                      SONDE_ASSIGN_OR_RETURN(int32_t worker, ConsumeI32(key));
                      SONDE_ASSIGN_OR_RETURN(auto progress,
                                             Parse<v1::WorkerProgress>(value, "worker progress"));
                      if (progress.committed()) {
                        (*info.mutable_worker_last_step())[worker] = progress.last_step();
                      }
                      if (progress.attached()) {
                        (*info.mutable_worker_client_id())[worker] = progress.client_id();
                      }
                      if (progress.joined()) joined.insert(worker);
                      if (progress.ended()) ended.insert(worker);
                      return absl::OkStatus();
                    }));
  // Sorted, as the registry keeps them.
  info.mutable_workers()->Assign(joined.begin(), joined.end());
  info.mutable_ended_workers()->Assign(ended.begin(), ended.end());
  return absl::OkStatus();
}

absl::StatusOr<v1::JobInfo> Store::ReadJobRecord(absl::string_view bytes) {
  SONDE_ASSIGN_OR_RETURN(v1::JobInfo job, Parse<v1::JobInfo>(bytes, "job record"));
  SONDE_RETURN_IF_ERROR(AddWorkerProgress(job));
  return job;
}

absl::Status Store::SplitFormerRecords() {
  // A record stored before per-worker keys existed holds every worker's
  // entries itself: stored again, split, before anyone writes single
  // workers (which would lose the others'). At open, so nothing else
  // writes meanwhile.
  std::vector<std::string> former;
  SONDE_RETURN_IF_ERROR(ScanPrefix(
      kJobs, JobInfoPrefix(), [&](absl::string_view, absl::string_view value) {
        SONDE_ASSIGN_OR_RETURN(auto job, Parse<v1::JobInfo>(value, "job record"));
        if (!job.worker_last_step().empty() || !job.worker_client_id().empty() ||
            !job.workers().empty() || !job.ended_workers().empty()) {
          former.emplace_back(value);
        }
        return absl::OkStatus();
      }));
  for (const std::string& bytes : former) {
    SONDE_ASSIGN_OR_RETURN(v1::JobInfo job, ReadJobRecord(bytes));
    rocksdb::WriteBatch batch;
    PutJobRecord(batch, handles_[kJobs], job);
    rocksdb::WriteOptions wo;
    wo.sync = options_.sync_writes;
    SONDE_RETURN_IF_ERROR(FromRocks(db_->Write(wo, &batch), "splitting a job record"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::JobInfo> Store::CreateJob(const v1::JobInfo& info) {
  SONDE_RETURN_IF_ERROR(ValidateDataName("job name", info.job()));
  absl::MutexLock lock(&create_mu_);
  auto existing = GetJob(info.job());
  if (existing.ok() || existing.status().code() != absl::StatusCode::kNotFound) {
    return existing;
  }
  std::string next;
  uint64_t id = 1;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), handles_[kJobs], kNextJobIdKey, &next);
  if (s.ok()) {
    absl::string_view v(next);
    SONDE_ASSIGN_OR_RETURN(id, ConsumeU64(v));
  } else if (!s.IsNotFound()) {
    return FromRocks(s, "reading the next job id");
  }
  v1::JobInfo stored = info;
  stored.set_job_id(id);
  rocksdb::WriteBatch batch;
  batch.Put(handles_[kJobs], kNextJobIdKey, EncodeU64(id + 1));
  batch.Put(handles_[kJobs], JobNameKey(info.job()), EncodeU64(id));
  PutJobRecord(batch, handles_[kJobs], stored);
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync_writes;
  SONDE_RETURN_IF_ERROR(FromRocks(db_->Write(wo, &batch), "creating job"));
  return stored;
}

absl::StatusOr<v1::JobInfo> Store::GetJob(absl::string_view name) {
  std::string id_bytes;
  rocksdb::Status s =
      db_->Get(rocksdb::ReadOptions(), handles_[kJobs], JobNameKey(name), &id_bytes);
  if (s.IsNotFound()) return absl::NotFoundError(absl::StrCat("no job named '", name, "'"));
  SONDE_RETURN_IF_ERROR(FromRocks(s, "reading job id"));
  absl::string_view v(id_bytes);
  SONDE_ASSIGN_OR_RETURN(uint64_t id, ConsumeU64(v));
  std::string info;
  SONDE_RETURN_IF_ERROR(FromRocks(
      db_->Get(rocksdb::ReadOptions(), handles_[kJobs], JobInfoKey(id), &info),
      absl::StrCat("reading job '", name, "'")));
  return ReadJobRecord(info);
}

absl::StatusOr<std::vector<v1::JobInfo>> Store::ListJobs() {
  std::vector<v1::JobInfo> jobs;
  std::vector<std::string> records;
  SONDE_RETURN_IF_ERROR(ScanPrefix(
      kJobs, JobInfoPrefix(), [&](absl::string_view, absl::string_view value) {
        records.emplace_back(value);
        return absl::OkStatus();
      }));
  for (const std::string& record : records) {
    SONDE_ASSIGN_OR_RETURN(v1::JobInfo job, ReadJobRecord(record));
    jobs.push_back(std::move(job));
  }
  return jobs;
}

absl::Status Store::PutJob(const v1::JobInfo& info) {
  if (info.job_id() == 0) return absl::InvalidArgumentError("job record has no id");
  rocksdb::WriteBatch batch;
  PutJobRecord(batch, handles_[kJobs], info);
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync_writes;
  return FromRocks(db_->Write(wo, &batch), "writing job record");
}

absl::Status Store::CommitStep(const StepWrite& w) {
  rocksdb::WriteBatch batch;
  const uint8_t mode = ModeKeyByte(w.step.mode());
  const int64_t mode_step = w.step.mode_step();
  for (const TensorWrite& t : w.tensors) {
    SONDE_RETURN_IF_ERROR(ValidateDataName("tensor name", t.record.tensor_name()));
    TensorKey key{w.job_id, mode, mode_step, t.record.tensor_name(), w.worker};
    v1::TensorRecord record = t.record;
    record.set_worker(w.worker);
    uint32_t pieces = 0;
    if (record.has_values()) {
      record.set_total_bytes(t.bytes.size());
      for (uint64_t off = 0; off < t.bytes.size() || pieces == 0;
           off += options_.payload_piece_bytes) {
        const uint64_t n = std::min<uint64_t>(options_.payload_piece_bytes,
                                              t.bytes.size() - off);
        batch.Put(handles_[kPayloads], PayloadKey(key, pieces),
                  rocksdb::Slice(t.bytes.data() + off, n));
        ++pieces;
        if (t.bytes.empty()) break;
      }
    }
    record.set_chunk_count(pieces);
    batch.Put(handles_[kStats], StatsKey(key), record.SerializeAsString());
    v1::SeriesPoint point;
    point.set_step(record.step());
    point.set_mode(record.mode());
    point.set_mode_step(record.mode_step());
    point.set_worker(w.worker);
    *point.mutable_statistics() = record.statistics();
    if (record.has_histogram()) *point.mutable_histogram() = record.histogram();
    batch.Put(handles_[kSeries], SeriesKey(key), point.SerializeAsString());
    v1::TensorInfo info;
    info.set_name(record.tensor_name());
    *info.mutable_collections() = record.collections();
    info.set_dtype(record.dtype());
    *info.mutable_shape() = record.shape();
    batch.Put(handles_[kJobs], TensorNameKey(w.job_id, record.tensor_name()),
              info.SerializeAsString());
  }
  v1::StepInfo step = w.step;
  step.clear_workers();
  step.add_workers(w.worker);
  const std::string step_bytes = step.SerializeAsString();
  batch.Put(handles_[kJobs], StepKey(w.job_id, mode, mode_step, w.worker), step_bytes);
  batch.Put(handles_[kJobs], GlobalStepKey(w.job_id, step.step(), w.worker), step_bytes);
  if (w.job.has_value()) PutJobRecord(batch, handles_[kJobs], *w.job);
  if (w.log_position.has_value()) {
    batch.Put(handles_[kJobs], LogPositionKey(w.log_position->partition),
              w.log_position->position.SerializeAsString());
  }
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync_writes;
  return FromRocks(db_->Write(wo, &batch),
                   absl::StrCat("committing step ", step.step()));
}

absl::StatusOr<v1::LogPosition> Store::GetLogPosition(uint32_t partition) {
  std::string bytes;
  rocksdb::Status s =
      db_->Get(rocksdb::ReadOptions(), handles_[kJobs], LogPositionKey(partition), &bytes);
  v1::LogPosition position;
  if (s.IsNotFound()) return position;
  SONDE_RETURN_IF_ERROR(FromRocks(s, "reading a log position"));
  if (!position.ParseFromString(bytes)) {
    return absl::DataLossError(absl::StrCat("log position of partition ", partition,
                                            " does not parse"));
  }
  return position;
}

absl::Status Store::PutLogPosition(uint32_t partition, const v1::LogPosition& position) {
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync_writes;
  return FromRocks(db_->Put(wo, handles_[kJobs], LogPositionKey(partition),
                            position.SerializeAsString()),
                   "writing a log position");
}

absl::StatusOr<std::vector<v1::StepInfo>> Store::ListSteps(uint64_t job_id, v1::Mode mode) {
  std::vector<v1::StepInfo> steps;
  SONDE_RETURN_IF_ERROR(ForEachStep(job_id, mode, 0, [&](v1::StepInfo& s) {
    steps.push_back(std::move(s));
    return true;
  }));
  return steps;
}

absl::Status Store::ForEachStep(uint64_t job_id, v1::Mode mode, int64_t start,
                                const std::function<bool(v1::StepInfo&)>& fn) {
  const bool every_mode = mode == v1::MODE_UNSPECIFIED;
  // Every mode: the global step index, whose entries (one per worker) of
  // one global step are merged by mode and mode step, in mode order. One
  // mode: its own index, entries of one mode step merged.
  const std::string prefix =
      every_mode ? GlobalStepsPrefix(job_id) : StepPrefix(job_id, ModeKeyByte(mode));
  std::string seek = prefix;
  AppendI64(seek, std::max<int64_t>(start, 0));
  const std::string end = PrefixEnd(prefix);
  rocksdb::ReadOptions ro;
  rocksdb::Slice upper(end);
  if (!end.empty()) ro.iterate_upper_bound = &upper;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, handles_[kJobs]));
  // The entries of the step being read, by (mode, mode step).
  std::map<std::pair<int, int64_t>, v1::StepInfo> open;
  int64_t open_number = -1;
  bool stopped = false;
  auto flush = [&] {
    for (auto& [key, info] : open) {
      if (!stopped && !fn(info)) stopped = true;
    }
    open.clear();
  };
  for (it->Seek(seek); it->Valid() && !stopped; it->Next()) {
    SONDE_ASSIGN_OR_RETURN(
        auto s, Parse<v1::StepInfo>(absl::string_view(it->value().data(), it->value().size()),
                                    "step"));
    const int64_t number = every_mode ? s.step() : s.mode_step();
    if (number != open_number) {
      flush();
      open_number = number;
    }
    auto [at, added] = open.try_emplace({static_cast<int>(s.mode()), s.mode_step()});
    if (added) {
      at->second = std::move(s);
    } else {
      MergeStepInfo(at->second, s);
    }
  }
  SONDE_RETURN_IF_ERROR(FromRocks(it->status(), "scanning steps"));
  flush();
  return absl::OkStatus();
}

absl::StatusOr<v1::StepInfo> Store::FindGlobalStep(uint64_t job_id, int64_t step) {
  std::optional<v1::StepInfo> found;
  SONDE_RETURN_IF_ERROR(ScanPrefix(
      kJobs, GlobalStepPrefix(job_id, step), [&](absl::string_view, absl::string_view value) {
        SONDE_ASSIGN_OR_RETURN(auto s, Parse<v1::StepInfo>(value, "step"));
        if (found.has_value()) {
          MergeStepInfo(*found, s);
        } else {
          found = std::move(s);
        }
        return absl::OkStatus();
      }));
  if (!found.has_value()) {
    return absl::NotFoundError(absl::StrCat("no data stored at global step ", step));
  }
  return *found;
}

absl::StatusOr<std::optional<v1::StepInfo>> Store::WorkerStepAt(uint64_t job_id, v1::Mode mode,
                                                                int64_t mode_step,
                                                                int32_t worker) {
  std::string bytes;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), handles_[kJobs],
                               StepKey(job_id, ModeKeyByte(mode), mode_step, worker), &bytes);
  if (s.IsNotFound()) return std::optional<v1::StepInfo>();
  SONDE_RETURN_IF_ERROR(FromRocks(s, "reading a step"));
  SONDE_ASSIGN_OR_RETURN(v1::StepInfo step, Parse<v1::StepInfo>(bytes, "step"));
  return std::optional<v1::StepInfo>(std::move(step));
}

absl::StatusOr<std::optional<v1::StepInfo>> Store::WorkerGlobalStepAt(uint64_t job_id,
                                                                      int64_t step,
                                                                      int32_t worker) {
  std::string bytes;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), handles_[kJobs],
                               GlobalStepKey(job_id, step, worker), &bytes);
  if (s.IsNotFound()) return std::optional<v1::StepInfo>();
  SONDE_RETURN_IF_ERROR(FromRocks(s, "reading a global step"));
  SONDE_ASSIGN_OR_RETURN(v1::StepInfo info, Parse<v1::StepInfo>(bytes, "step"));
  return std::optional<v1::StepInfo>(std::move(info));
}

absl::StatusOr<std::vector<v1::TensorRecord>> Store::TensorsAtStep(uint64_t job_id,
                                                                   v1::Mode mode,
                                                                   int64_t mode_step) {
  std::vector<v1::TensorRecord> records;
  SONDE_RETURN_IF_ERROR(ScanPrefix(
      kStats, StatsStepPrefix(job_id, ModeKeyByte(mode), mode_step),
      [&](absl::string_view, absl::string_view value) {
        SONDE_ASSIGN_OR_RETURN(auto r, Parse<v1::TensorRecord>(value, "tensor record"));
        records.push_back(std::move(r));
        return absl::OkStatus();
      }));
  return records;
}

absl::StatusOr<std::vector<v1::TensorInfo>> Store::ListTensors(uint64_t job_id) {
  std::vector<v1::TensorInfo> out;
  SONDE_RETURN_IF_ERROR(ScanPrefix(
      kJobs, TensorNamePrefix(job_id), [&](absl::string_view, absl::string_view value) {
        SONDE_ASSIGN_OR_RETURN(auto t, Parse<v1::TensorInfo>(value, "tensor info"));
        out.push_back(std::move(t));
        return absl::OkStatus();
      }));
  return out;
}

absl::Status Store::ForEachTensor(uint64_t job_id, absl::string_view start_after,
                                  const std::function<bool(v1::TensorInfo&)>& fn) {
  const std::string prefix = TensorNamePrefix(job_id);
  const std::string end = PrefixEnd(prefix);
  // A name's key ends in '\0', so "name\0" sorts before every longer name
  // that starts with it: seek just past it.
  std::string start = prefix;
  if (!start_after.empty()) {
    start = TensorNameKey(job_id, start_after);
    start.push_back('\0');
  }
  rocksdb::ReadOptions ro;
  rocksdb::Slice upper(end);
  if (!end.empty()) ro.iterate_upper_bound = &upper;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, handles_[kJobs]));
  for (it->Seek(start); it->Valid(); it->Next()) {
    SONDE_ASSIGN_OR_RETURN(
        auto t, Parse<v1::TensorInfo>(
                    absl::string_view(it->value().data(), it->value().size()), "tensor info"));
    if (!fn(t)) break;
  }
  return FromRocks(it->status(), "scanning tensor names");
}

absl::StatusOr<v1::TensorRecord> Store::ReadTensor(
    uint64_t job_id, v1::Mode mode, int64_t mode_step, absl::string_view name,
    int32_t worker, const PieceFn& on_piece) {
  SONDE_RETURN_IF_ERROR(ValidateDataName("tensor name", name));
  TensorKey key{job_id, ModeKeyByte(mode), mode_step, std::string(name), worker};
  // One snapshot so the record and its pieces come from the same commit.
  const rocksdb::Snapshot* snapshot = db_->GetSnapshot();
  struct Release {
    rocksdb::DB* db;
    const rocksdb::Snapshot* s;
    ~Release() { db->ReleaseSnapshot(s); }
  } release{db_.get(), snapshot};
  rocksdb::ReadOptions ro;
  ro.snapshot = snapshot;
  std::string value;
  rocksdb::Status s = db_->Get(ro, handles_[kStats], StatsKey(key), &value);
  if (s.IsNotFound()) {
    return absl::NotFoundError(absl::StrCat("tensor '", name, "' has no data at ",
                                            v1::Mode_Name(mode), " step ", mode_step,
                                            " of worker ", worker));
  }
  SONDE_RETURN_IF_ERROR(FromRocks(s, "reading tensor record"));
  SONDE_ASSIGN_OR_RETURN(auto record, Parse<v1::TensorRecord>(value, "tensor record"));
  if (!record.has_values()) return record;
  uint64_t bytes = 0;
  for (uint32_t piece = 0; piece < record.chunk_count(); ++piece) {
    std::string data;
    rocksdb::Status ps = db_->Get(ro, handles_[kPayloads], PayloadKey(key, piece), &data);
    if (ps.IsNotFound()) {
      return absl::DataLossError(absl::StrCat("tensor '", name, "': piece ", piece, " of ",
                                              record.chunk_count(), " is missing"));
    }
    SONDE_RETURN_IF_ERROR(FromRocks(ps, "reading tensor values"));
    bytes += data.size();
    SONDE_RETURN_IF_ERROR(on_piece(record, data));
  }
  if (bytes != record.total_bytes()) {
    return absl::DataLossError(absl::StrCat("tensor '", name, "': stored ", bytes,
                                            " bytes, record says ", record.total_bytes()));
  }
  return record;
}

absl::StatusOr<std::vector<v1::SeriesPoint>> Store::ReadSeries(
    uint64_t job_id, absl::string_view name, v1::Mode mode, int64_t from, int64_t to,
    int32_t worker) {
  SONDE_RETURN_IF_ERROR(ValidateDataName("tensor name", name));
  std::vector<v1::SeriesPoint> points;
  auto scan_mode = [&](uint8_t m) -> absl::Status {
    return ForEachSeriesPoint(job_id, name, static_cast<v1::Mode>(m), from, to, worker,
                              [&](v1::SeriesPoint& p) {
                                points.push_back(std::move(p));
                                return true;
                              });
  };
  if (mode == v1::MODE_UNSPECIFIED) {
    for (int m = v1::MODE_TRAIN; m <= v1::MODE_GLOBAL; ++m) {
      SONDE_RETURN_IF_ERROR(scan_mode(static_cast<uint8_t>(m)));
    }
    std::stable_sort(points.begin(), points.end(),
                     [](const v1::SeriesPoint& a, const v1::SeriesPoint& b) {
                       return a.step() < b.step();
                     });
  } else {
    SONDE_RETURN_IF_ERROR(scan_mode(ModeKeyByte(mode)));
  }
  return points;
}

absl::Status Store::ForEachSeriesPoint(uint64_t job_id, absl::string_view name, v1::Mode mode,
                                       int64_t from, int64_t to, int32_t worker,
                                       const std::function<bool(v1::SeriesPoint&)>& fn) {
  SONDE_RETURN_IF_ERROR(ValidateDataName("tensor name", name));
  const uint8_t m = ModeKeyByte(mode);
  rocksdb::ReadOptions ro;
  const std::string start = SeriesSeek(job_id, name, m, from);
  const std::string end =
      to >= 0 ? SeriesSeek(job_id, name, m, to) : PrefixEnd(SeriesPrefix(job_id, name, m));
  rocksdb::Slice upper(end);
  ro.iterate_upper_bound = &upper;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, handles_[kSeries]));
  for (it->Seek(start); it->Valid(); it->Next()) {
    SONDE_ASSIGN_OR_RETURN(
        auto p, Parse<v1::SeriesPoint>(absl::string_view(it->value().data(), it->value().size()),
                                       "series"));
    if (worker >= 0 && p.worker() != worker) continue;
    if (!fn(p)) break;
  }
  return FromRocks(it->status(), "scanning series");
}

absl::Status Store::WriteProfile(uint64_t job_id, int32_t worker, const v1::ProfileBatch& batch) {
  rocksdb::WriteBatch wb;
  rocksdb::ColumnFamilyHandle* family = handles_[kProfile];
  // A batch repeats each metric name in every snapshot: each distinct name
  // is checked and gets its name key once, below, before anything is written.
  std::set<absl::string_view> names;
  for (const v1::MetricSnapshot& snapshot : batch.snapshots()) {
    for (const v1::MetricSample& sample : snapshot.samples()) {
      uint64_t bits;
      const double value = sample.value();
      std::memcpy(&bits, &value, sizeof bits);
      std::string encoded;
      AppendU64(encoded, bits);
      SONDE_RETURN_IF_ERROR(FromRocks(
          wb.Put(family, MetricKey(job_id, worker, sample.name(), snapshot.unix_micros()),
                 encoded),
          "batching a metric"));
      names.insert(sample.name());
    }
  }
  for (absl::string_view name : names) {
    SONDE_RETURN_IF_ERROR(ValidateDataName("metric name", name));
    SONDE_RETURN_IF_ERROR(
        FromRocks(wb.Put(family, MetricNameKey(job_id, worker, name), ""), "batching a name"));
  }
  for (const v1::TraceEvent& event : batch.events()) {
    if (!event.name().empty()) SONDE_RETURN_IF_ERROR(ValidateDataName("event name", event.name()));
    SONDE_RETURN_IF_ERROR(FromRocks(
        wb.Put(family,
               EventKey(job_id, worker, static_cast<uint8_t>(event.kind()), event.name(),
                        event.start_unix_micros(), event.end_unix_micros()),
               event.SerializeAsString()),
        "batching an event"));
  }
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync_writes;
  return FromRocks(db_->Write(wo, &wb), "writing profiler data");
}

absl::StatusOr<std::vector<std::pair<int32_t, std::vector<std::string>>>> Store::ListMetrics(
    uint64_t job_id, int32_t worker_only) {
  std::map<int32_t, std::vector<std::string>> by_worker;
  const std::string job_prefix = MetricNamePrefix(job_id);
  const std::string prefix =
      worker_only >= 0 ? MetricNamePrefix(job_id, worker_only) : job_prefix;
  SONDE_RETURN_IF_ERROR(ScanPrefix(kProfile, prefix, [&](absl::string_view key, absl::string_view) {
    key.remove_prefix(job_prefix.size());
    SONDE_ASSIGN_OR_RETURN(int32_t worker, ConsumeI32(key));
    SONDE_ASSIGN_OR_RETURN(std::string name, ConsumeName(key));
    by_worker[worker].push_back(std::move(name));  // keys come sorted by name
    return absl::OkStatus();
  }));
  return std::vector<std::pair<int32_t, std::vector<std::string>>>(by_worker.begin(),
                                                                   by_worker.end());
}

absl::StatusOr<std::vector<v1::MetricSeries>> Store::ReadMetrics(
    uint64_t job_id, const std::vector<std::string>& names,
    const std::function<bool(const std::string&)>& keep, int32_t worker, int64_t start,
    int64_t end, size_t max_points, bool* truncated) {
  if (truncated != nullptr) *truncated = false;
  SONDE_ASSIGN_OR_RETURN(auto listed, ListMetrics(job_id, worker));
  const std::set<std::string> wanted(names.begin(), names.end());
  std::vector<v1::MetricSeries> out;
  size_t points = 0;
  for (const auto& [w, worker_names] : listed) {
    for (const std::string& name : worker_names) {
      const bool all = wanted.empty() && !keep;
      if (!all && wanted.count(name) == 0 && !(keep && keep(name))) continue;
      v1::MetricSeries series;
      series.set_name(name);
      series.set_worker(w);
      rocksdb::ReadOptions ro;
      const std::string from = MetricKey(job_id, w, name, start);
      const std::string to = end > 0 ? MetricKey(job_id, w, name, end)
                                     : PrefixEnd(MetricSeriesPrefix(job_id, w, name));
      rocksdb::Slice upper(to);
      ro.iterate_upper_bound = &upper;
      std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, handles_[kProfile]));
      const size_t prefix_size = from.size() - 8;
      for (it->Seek(from); it->Valid(); it->Next()) {
        if (max_points > 0 && points == max_points) {
          if (truncated != nullptr) *truncated = true;
          if (series.unix_micros_size() > 0) out.push_back(std::move(series));
          return out;
        }
        ++points;
        absl::string_view key(it->key().data(), it->key().size());
        absl::string_view value(it->value().data(), it->value().size());
        key.remove_prefix(prefix_size);
        SONDE_ASSIGN_OR_RETURN(int64_t micros, ConsumeI64(key));
        SONDE_ASSIGN_OR_RETURN(uint64_t bits, ConsumeU64(value));
        double v;
        std::memcpy(&v, &bits, sizeof v);
        series.add_unix_micros(micros);
        series.add_values(v);
      }
      SONDE_RETURN_IF_ERROR(FromRocks(it->status(), "scanning metrics"));
      out.push_back(std::move(series));
    }
  }
  return out;
}

absl::StatusOr<std::vector<v1::WorkerEvent>> Store::ReadEvents(uint64_t job_id,
                                                               v1::TraceEvent::Kind kind,
                                                               absl::string_view name,
                                                               int32_t worker, int64_t start,
                                                               int64_t end, size_t max_events,
                                                               bool* truncated) {
  if (truncated != nullptr) *truncated = false;
  const bool any_kind = kind == v1::TraceEvent::KIND_UNSPECIFIED;
  // The key is 'E' job worker kind name 0x00 start end: the prefix narrows
  // as far as the request fixes its parts in that order; the rest (and the
  // times) are filtered from the key, so only matching values are parsed.
  const std::string job_prefix = EventPrefix(job_id);
  std::string prefix = job_prefix;
  bool full = false;  // worker, kind and name all fixed: keys run in start order
  if (worker >= 0) {
    AppendI32(prefix, worker);
    if (!any_kind) {
      prefix.push_back(static_cast<char>(kind));
      if (!name.empty()) {
        prefix.append(name.data(), name.size());
        prefix.push_back('\0');
        full = true;
      }
    }
  }
  std::string from = prefix;
  std::string to = PrefixEnd(prefix);
  if (full) {
    AppendI64(from, start);
    if (end > 0) {
      to = prefix;
      AppendI64(to, end);
    }
  }
  rocksdb::ReadOptions ro;
  rocksdb::Slice upper(to);
  if (!to.empty()) ro.iterate_upper_bound = &upper;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, handles_[kProfile]));
  std::vector<v1::WorkerEvent> out;
  for (it->Seek(from); it->Valid(); it->Next()) {
    absl::string_view key(it->key().data(), it->key().size());
    if (!absl::StartsWith(key, prefix)) break;
    key.remove_prefix(job_prefix.size());
    SONDE_ASSIGN_OR_RETURN(EventKeyParts k, DecodeEventKey(key));
    if (!any_kind && k.kind != kind) continue;
    if (!name.empty() && k.name != name) continue;
    if (k.start_micros < start || (end > 0 && k.start_micros >= end)) continue;
    if (max_events > 0 && out.size() == max_events) {
      if (truncated != nullptr) *truncated = true;
      return out;
    }
    SONDE_ASSIGN_OR_RETURN(
        v1::TraceEvent event,
        Parse<v1::TraceEvent>(absl::string_view(it->value().data(), it->value().size()),
                              "event"));
    v1::WorkerEvent& e = out.emplace_back();
    e.set_worker(k.worker);
    *e.mutable_event() = std::move(event);
  }
  SONDE_RETURN_IF_ERROR(FromRocks(it->status(), "scanning events"));
  return out;
}

absl::Status Store::PutRuleResult(uint64_t job_id, const v1::RuleResult& result,
                                  std::optional<std::string> state) {
  SONDE_RETURN_IF_ERROR(ValidateDataName("rule name", result.rule()));
  rocksdb::WriteBatch batch;
  batch.Put(handles_[kRules], RuleResultKey(job_id, result.rule()),
            result.SerializeAsString());
  if (state.has_value()) {
    batch.Put(handles_[kRules], RuleStateKey(job_id, result.rule()), *state);
  }
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync_writes;
  return FromRocks(db_->Write(wo, &batch), "writing rule result");
}

absl::StatusOr<std::vector<v1::RuleResult>> Store::RuleResults(uint64_t job_id) {
  std::vector<v1::RuleResult> out;
  SONDE_RETURN_IF_ERROR(ScanPrefix(
      kRules, RuleResultPrefix(job_id), [&](absl::string_view, absl::string_view value) {
        SONDE_ASSIGN_OR_RETURN(auto r, Parse<v1::RuleResult>(value, "rule result"));
        out.push_back(std::move(r));
        return absl::OkStatus();
      }));
  return out;
}

absl::StatusOr<std::optional<std::string>> Store::RuleState(uint64_t job_id,
                                                            absl::string_view rule) {
  std::string value;
  rocksdb::Status s =
      db_->Get(rocksdb::ReadOptions(), handles_[kRules], RuleStateKey(job_id, rule), &value);
  if (s.IsNotFound()) return std::optional<std::string>();
  SONDE_RETURN_IF_ERROR(FromRocks(s, "reading rule state"));
  return std::optional<std::string>(std::move(value));
}

std::vector<Store::Range> Store::JobRanges(uint64_t job_id) {
  const JobKeyPrefixes p = JobKeyPrefixesOf(job_id);
  std::vector<Range> ranges;
  auto add = [&ranges](Family family, const std::string& prefix) {
    ranges.push_back({family, prefix, PrefixEnd(prefix)});
  };
  for (const std::string& prefix : p.jobs) add(kJobs, prefix);
  add(kStats, p.stats);
  add(kSeries, p.series);
  add(kPayloads, p.payloads);
  for (const std::string& prefix : p.rules) add(kRules, prefix);
  for (const std::string& prefix : p.profile) add(kProfile, prefix);
  return ranges;
}

absl::StatusOr<uint64_t> Store::ApproximateJobBytes(uint64_t job_id) {
  rocksdb::SizeApproximationOptions options;
  options.include_memtables = true;
  options.include_files = true;
  uint64_t total = 0;
  for (const Range& r : JobRanges(job_id)) {
    const rocksdb::Range range(r.begin, r.end);
    uint64_t size = 0;
    SONDE_RETURN_IF_ERROR(FromRocks(
        db_->GetApproximateSizes(options, handles_[r.family], &range, 1, &size),
        "estimating a job's size"));
    total += size;
  }
  return total;
}

absl::StatusOr<uint64_t> Store::ApproximateSizeBytes() {
  uint64_t total = 0;
  for (rocksdb::ColumnFamilyHandle* h : handles_) {
    for (const std::string& property : {rocksdb::DB::Properties::kLiveSstFilesSize,
                                        rocksdb::DB::Properties::kCurSizeAllMemTables}) {
      uint64_t v = 0;
      if (!db_->GetIntProperty(h, property, &v)) {
        return absl::InternalError(absl::StrCat("RocksDB has no property ", property));
      }
      total += v;
    }
  }
  return total;
}

std::vector<std::pair<std::string, uint64_t>> Store::ColumnFamilyIntProperty(
    absl::string_view property) {
  std::vector<std::pair<std::string, uint64_t>> out;
  const rocksdb::Slice name(property.data(), property.size());
  for (int f = 0; f < kNumFamilies; ++f) {
    uint64_t v = 0;
    if (db_->GetIntProperty(handles_[f], name, &v)) out.emplace_back(kFamilyNames[f], v);
  }
  return out;
}

std::optional<uint64_t> Store::DbIntProperty(absl::string_view property) {
  uint64_t v = 0;
  // Our families share one block cache and one DB; the default family's
  // options (and its cache) are not ours, so ask through one of ours.
  if (!db_->GetIntProperty(handles_[kJobs], rocksdb::Slice(property.data(), property.size()),
                           &v)) {
    return std::nullopt;
  }
  return v;
}

absl::StatusOr<DeletedJob> Store::MarkJobDeleted(absl::string_view name) {
  SONDE_RETURN_IF_ERROR(ValidateDataName("job name", name));
  absl::MutexLock lock(&create_mu_);
  SONDE_ASSIGN_OR_RETURN(v1::JobInfo info, GetJob(name));
  DeletedJob deleted;
  deleted.name = std::string(name);
  deleted.job_id = info.job_id();
  SONDE_ASSIGN_OR_RETURN(deleted.approximate_bytes, ApproximateJobBytes(info.job_id()));
  rocksdb::WriteBatch batch;
  batch.Delete(handles_[kJobs], JobNameKey(name));
  batch.Delete(handles_[kJobs], JobInfoKey(info.job_id()));
  batch.Put(handles_[kJobs], DeletingJobKey(info.job_id()),
            rocksdb::Slice(name.data(), name.size()));
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync_writes;
  SONDE_RETURN_IF_ERROR(FromRocks(db_->Write(wo, &batch),
                                  absl::StrCat("marking job '", name, "' deleted")));
  return deleted;
}

absl::StatusOr<PurgeReport> Store::PurgeDeletedJobs() {
  absl::MutexLock lock(&purge_mu_);
  PurgeReport report;
  SONDE_RETURN_IF_ERROR(ScanPrefix(
      kJobs, DeletingJobPrefix(), [&](absl::string_view key, absl::string_view value) {
        key.remove_prefix(DeletingJobPrefix().size());
        SONDE_ASSIGN_OR_RETURN(uint64_t id, ConsumeU64(key));
        report.jobs.push_back(DeletedJob{std::string(value), id, 0});
        return absl::OkStatus();
      }));
  if (report.jobs.empty()) return report;
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync_writes;
  // The smallest range per kind of key that covers every purged job: one
  // compaction per kind, however many jobs (the jobs between are rewritten
  // unchanged).
  std::map<std::pair<int, std::string>, Range> to_compact;
  for (const DeletedJob& job : report.jobs) {
    rocksdb::WriteBatch batch;
    for (const Range& r : JobRanges(job.job_id)) {
      SONDE_RETURN_IF_ERROR(FromRocks(batch.DeleteRange(handles_[r.family], r.begin, r.end),
                                      "range-deleting a job"));
      // Keys of one kind differ only in the id after the tag (if any).
      const std::string kind = r.begin.substr(0, r.begin.size() - 8);
      auto [it, fresh] = to_compact.try_emplace({r.family, kind}, r);
      if (!fresh) {
        it->second.begin = std::min(it->second.begin, r.begin);
        it->second.end = std::max(it->second.end, r.end);
      }
    }
    SONDE_RETURN_IF_ERROR(FromRocks(
        db_->Write(wo, &batch), absl::StrCat("deleting the keys of job '", job.name, "'")));
  }
  rocksdb::CompactRangeOptions cro;
  cro.exclusive_manual_compaction = false;  // ingest's own compactions go on
  // Rewrite bottommost files too: that is where the deleted keys and their
  // tombstones are finally dropped.
  cro.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForceOptimized;
  for (const auto& [kind, r] : to_compact) {
    const rocksdb::Slice begin(r.begin);
    const rocksdb::Slice end(r.end);
    report.compaction = FromRocks(db_->CompactRange(cro, handles_[r.family], &begin, &end),
                                  "compacting deleted jobs");
    if (!report.compaction.ok()) break;
  }
  return report;
}

absl::StatusOr<DeletedJob> Store::DeleteJob(absl::string_view name) {
  SONDE_ASSIGN_OR_RETURN(DeletedJob deleted, MarkJobDeleted(name));
  // A failed compaction is no failed deletion (see PurgeReport).
  SONDE_RETURN_IF_ERROR(PurgeDeletedJobs().status());
  return deleted;
}

}  // namespace sonde::storage
