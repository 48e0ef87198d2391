// Sonde's durable store: jobs, per-step tensor records and statistics, raw
// tensor values, and rule results, in one RocksDB database with a column
// family each (key layout in storage/keys.h).
//
// Durability: one step of one worker is written with one WriteBatch, with the
// write-ahead log on, so a step is either fully stored or absent after a
// crash; CommitStep returns only after the batch is in the WAL (and fsynced
// when Options::sync_writes is set).
//
// Thread-safe: RocksDB serialises writers; readers see committed batches.
// rocksdb::Status never leaves this component.
#ifndef SONDE_STORAGE_STORE_H_
#define SONDE_STORAGE_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "proto/profile.pb.h"
#include "proto/records.pb.h"
#include "proto/rule.pb.h"
#include "proto/tensor.pb.h"

namespace rocksdb {
class DB;
class ColumnFamilyHandle;
}  // namespace rocksdb

namespace sonde::storage {

// One tensor of one step, ready to store.
struct TensorWrite {
  v1::TensorRecord record;  // name, worker, step, mode, dtype, shape, stats...
  std::string bytes;        // raw values; empty when record.has_values is false
};

// Everything one worker produced for one step, plus the job record as it
// stands after the step: stored atomically.
struct StepWrite {
  uint64_t job_id = 0;
  v1::StepInfo step;  // step, mode, mode_step, workers = {worker}, duration
  int32_t worker = 0;
  std::vector<TensorWrite> tensors;
  std::optional<v1::JobInfo> job;  // written in the same batch when set
  // Cluster mode: the log position this step brings its partition to,
  // written in the same batch when set.
  struct Applied {
    uint32_t partition = 0;
    v1::LogPosition position;
  };
  std::optional<Applied> log_position;
};

// A job MarkJobDeleted hid, or PurgeDeletedJobs removed.
struct DeletedJob {
  std::string name;
  uint64_t job_id = 0;
  // What the job's keys took, approximately (SST files and memtables), when
  // it was marked; 0 in what PurgeDeletedJobs returns.
  uint64_t approximate_bytes = 0;
};

// What one PurgeDeletedJobs call removed.
struct PurgeReport {
  std::vector<DeletedJob> jobs;
  // The compaction that gives the space back. Not OK (e.g. no disk space
  // left to rewrite files): the jobs are deleted all the same, and RocksDB's
  // own compactions reclaim the space later.
  absl::Status compaction;
};

class Store {
 public:
  struct Options {
    // Directory of the database; created if missing. Required.
    std::string path;
    // fsync the WAL on every commit. Default false: a commit survives a
    // process crash (kill -9) but the last commits may be lost on power loss.
    bool sync_writes = false;
    // Raw tensor values are split into RocksDB values of at most this many
    // bytes. Default 1 MiB.
    uint64_t payload_piece_bytes = 1 << 20;
    // RocksDB block cache. Default 64 MiB.
    uint64_t block_cache_bytes = 64 << 20;
    // Memtables of every column family together (RocksDB's write buffer
    // manager flushes once they pass it): bounds the collector's memory
    // under heavy ingest. Default 128 MiB.
    uint64_t memtable_bytes = 128 << 20;
  };

  static absl::StatusOr<std::unique_ptr<Store>> Open(const Options& options);
  ~Store();

  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Jobs. CreateJob assigns a new id to a new name and stores `info` with it;
  // for a known name it returns the existing record untouched.
  //
  // Per-worker entries (worker_last_step, worker_client_id, workers,
  // ended_workers) are stored one key per worker, so a job of thousands of
  // workers does not rewrite them all at each worker's step. A record
  // written (PutJob, StepWrite::job) updates the workers it names in any of
  // them, each whole, and leaves the others as stored; a record read has
  // every worker's.
  absl::StatusOr<v1::JobInfo> CreateJob(const v1::JobInfo& info);
  absl::StatusOr<v1::JobInfo> GetJob(absl::string_view name);  // NotFound
  absl::StatusOr<std::vector<v1::JobInfo>> ListJobs();
  absl::Status PutJob(const v1::JobInfo& info);

  // Stores one worker's step atomically (see the class comment).
  absl::Status CommitStep(const StepWrite& write);

  // Cluster mode: how far the log's `partition` has been applied here
  // (a default LogPosition, applied 0, if never).
  absl::StatusOr<v1::LogPosition> GetLogPosition(uint32_t partition);
  absl::Status PutLogPosition(uint32_t partition, const v1::LogPosition& position);

  // Steps of one mode (every mode for MODE_UNSPECIFIED), in step order, with
  // the workers of each step merged into one StepInfo.
  absl::StatusOr<std::vector<v1::StepInfo>> ListSteps(uint64_t job_id, v1::Mode mode);
  // The same from step `start` on (a global step with MODE_UNSPECIFIED,
  // else the mode's own step), one at a time until `fn` returns false: a
  // page costs the steps it reads, not the job's.
  absl::Status ForEachStep(uint64_t job_id, v1::Mode mode, int64_t start,
                           const std::function<bool(v1::StepInfo&)>& fn);
  // The mode and mode step of a global step; NotFound if no worker stored it.
  // Workers merged: where their mode steps differ at the step, the mode step
  // is one worker's; a read of one worker's data uses WorkerGlobalStepAt.
  absl::StatusOr<v1::StepInfo> FindGlobalStep(uint64_t job_id, int64_t step);
  // What `worker` stored at global step `step` (one point read); nullopt if nothing.
  absl::StatusOr<std::optional<v1::StepInfo>> WorkerGlobalStepAt(uint64_t job_id, int64_t step,
                                                                 int32_t worker);
  // What `worker` stored at a mode step (one point read); nullopt if nothing.
  absl::StatusOr<std::optional<v1::StepInfo>> WorkerStepAt(uint64_t job_id, v1::Mode mode,
                                                           int64_t mode_step, int32_t worker);

  // Every tensor stored at one step (one range scan).
  absl::StatusOr<std::vector<v1::TensorRecord>> TensorsAtStep(uint64_t job_id,
                                                              v1::Mode mode,
                                                              int64_t mode_step);
  // Names of every tensor ever stored for the job, with their last known
  // dtype, shape and collections.
  absl::StatusOr<std::vector<v1::TensorInfo>> ListTensors(uint64_t job_id);
  // The same in name order from the first name after `start_after` (empty:
  // the first), one at a time until `fn` returns false.
  absl::Status ForEachTensor(uint64_t job_id, absl::string_view start_after,
                             const std::function<bool(v1::TensorInfo&)>& fn);

  // Reads one tensor: its raw bytes piece by piece through `on_piece` (with
  // the record; not called for statistics-only tensors), then returns the
  // record. Record and pieces come from one snapshot. NotFound if absent;
  // DataLoss if pieces are missing.
  using PieceFn = std::function<absl::Status(const v1::TensorRecord&, absl::string_view)>;
  absl::StatusOr<v1::TensorRecord> ReadTensor(uint64_t job_id, v1::Mode mode,
                                              int64_t mode_step, absl::string_view name,
                                              int32_t worker, const PieceFn& on_piece);

  // Statistics of one tensor over mode steps [from, to) (to < 0: no end), one
  // range scan per mode; MODE_UNSPECIFIED reads every mode, ordered by
  // global step. worker < 0: every worker.
  absl::StatusOr<std::vector<v1::SeriesPoint>> ReadSeries(uint64_t job_id,
                                                          absl::string_view name,
                                                          v1::Mode mode, int64_t from,
                                                          int64_t to, int32_t worker);
  // One mode's points (MODE_UNSPECIFIED: GLOBAL's) in mode step order, one
  // at a time until `fn` returns false.
  absl::Status ForEachSeriesPoint(uint64_t job_id, absl::string_view name, v1::Mode mode,
                                  int64_t from, int64_t to, int32_t worker,
                                  const std::function<bool(v1::SeriesPoint&)>& fn);

  // Profiler data (proto/profile.proto) of one worker, written at once.
  // Keys are (worker, metric, time) and (worker, event kind, name, start,
  // end), so writing a batch again stores nothing twice. InvalidArgument for
  // a metric or event name that is not a valid key name; other fields are
  // stored as given (ingest checks them first: common/profile_check.h).
  absl::Status WriteProfile(uint64_t job_id, int32_t worker, const v1::ProfileBatch& batch);
  // The metric names each worker sent (of `worker` only when >= 0), by worker.
  absl::StatusOr<std::vector<std::pair<int32_t, std::vector<std::string>>>> ListMetrics(
      uint64_t job_id, int32_t worker = -1);
  // Series of the metrics whose name is in `names` or matches `keep` (both
  // empty/null: every metric), of `worker` (-1: every worker), with times in
  // [start, end) (end 0: no end), by worker, then name. At most `max_points`
  // points over all series (0: no limit); when more matched, reading stops
  // there and `*truncated` (if given) is set, else cleared.
  absl::StatusOr<std::vector<v1::MetricSeries>> ReadMetrics(
      uint64_t job_id, const std::vector<std::string>& names,
      const std::function<bool(const std::string&)>& keep, int32_t worker, int64_t start,
      int64_t end, size_t max_points = 0, bool* truncated = nullptr);
  // Events of `kind` (KIND_UNSPECIFIED: every kind), `name` (empty: every
  // name) and `worker` (-1: every one) that start in [start, end). One scan
  // narrowed to the fixed parts of the key (worker, then kind, then name);
  // kind, name and times are checked on the key before a value is parsed.
  // At most `max_events` (0: no limit), with `truncated` as ReadMetrics.
  absl::StatusOr<std::vector<v1::WorkerEvent>> ReadEvents(uint64_t job_id,
                                                          v1::TraceEvent::Kind kind,
                                                          absl::string_view name, int32_t worker,
                                                          int64_t start, int64_t end,
                                                          size_t max_events = 0,
                                                          bool* truncated = nullptr);

  // Rule results (latest per rule instance) and opaque per-rule state.
  absl::Status PutRuleResult(uint64_t job_id, const v1::RuleResult& result,
                             std::optional<std::string> state = std::nullopt);
  absl::StatusOr<std::vector<v1::RuleResult>> RuleResults(uint64_t job_id);
  absl::StatusOr<std::optional<std::string>> RuleState(uint64_t job_id,
                                                       absl::string_view rule);

  // Deleting a job takes two durable steps, so that a crash never leaves a
  // job that looks whole but is partly gone:
  //  1. MarkJobDeleted: one batch removes the job's name and record and
  //     writes a "deleting" marker. From then on no read finds the job and
  //     its name is free: a new job of that name gets a new id (ids are
  //     never reused), so what is left of the old one never mixes with it.
  //  2. PurgeDeletedJobs: per marked job, one batch range-deletes every key
  //     of its id in every column family, the marker included; then those
  //     ranges are compacted so the disk space comes back. Open runs it, so
  //     a deletion a crash interrupted finishes on the next start.
  // The caller makes sure nothing writes the job any more (in the collector,
  // JobRegistry::Forget). NotFound for an unknown name.
  absl::StatusOr<DeletedJob> MarkJobDeleted(absl::string_view name);
  absl::StatusOr<PurgeReport> PurgeDeletedJobs();
  // Both steps; returns what MarkJobDeleted returned.
  absl::StatusOr<DeletedJob> DeleteJob(absl::string_view name);

  // The database's approximate size in bytes: live SST files plus
  // memtables, over every column family (write-ahead log files not counted).
  absl::StatusOr<uint64_t> ApproximateSizeBytes();

  // Monitoring: a RocksDB integer property (e.g.
  // "rocksdb.estimate-live-data-size") of each column family, as (family
  // name, value); families without a value are left out.
  std::vector<std::pair<std::string, uint64_t>> ColumnFamilyIntProperty(
      absl::string_view property);
  // A database-wide one (e.g. "rocksdb.num-running-compactions",
  // "rocksdb.block-cache-usage"); nullopt if RocksDB has none.
  std::optional<uint64_t> DbIntProperty(absl::string_view property);

 private:
  enum Family { kJobs = 0, kStats, kSeries, kPayloads, kRules, kProfile, kNumFamilies };

  Store(const Options& options, std::unique_ptr<rocksdb::DB> db,
        std::vector<rocksdb::ColumnFamilyHandle*> handles);

  absl::Status ScanPrefix(
      Family family, absl::string_view prefix,
      const std::function<absl::Status(absl::string_view key, absl::string_view value)>& fn);

  // One kind of key of a job: [begin, end) in `family`.
  struct Range {
    Family family;
    std::string begin;
    std::string end;
  };
  // Every key of the job but its name key (see JobKeyPrefixesOf).
  static std::vector<Range> JobRanges(uint64_t job_id);
  // Adds the stored per-worker entries to a job record just read.
  absl::Status AddWorkerProgress(v1::JobInfo& info);
  // Parses a stored job record and adds its workers' entries.
  absl::StatusOr<v1::JobInfo> ReadJobRecord(absl::string_view bytes);
  // Stores records of the format before per-worker keys again, split.
  absl::Status SplitFormerRecords();
  // Approximate bytes of one job's keys (files and memtables).
  absl::StatusOr<uint64_t> ApproximateJobBytes(uint64_t job_id);

  Options options_;
  absl::Mutex create_mu_;  // serialises CreateJob and MarkJobDeleted (names, ids)
  absl::Mutex purge_mu_;   // one PurgeDeletedJobs at a time
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;  // indexed by Family
};

// The step mode stored in keys for a mode (MODE_UNSPECIFIED is stored as GLOBAL).
uint8_t ModeKeyByte(v1::Mode mode);

}  // namespace sonde::storage

#endif  // SONDE_STORAGE_STORE_H_
