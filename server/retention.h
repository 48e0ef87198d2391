// Deleting jobs from a running collector: on request (Query.DeleteJob) and
// by a retention policy that a background thread applies periodically.
//
// A job is deleted only when it is not live on this collector, and the
// JobRegistry forgets it while the store hides it, so no hello can slip in
// between; then the store removes every key and compacts (storage/store.h
// has the two durable steps). A later hello with the same name starts a
// fresh job.
//
// The policy deletes only jobs that have ended (finished, or stopped by a
// rule): never a running job, nor a disconnected one (its workers may still
// come back), nor one registered but not started. Thread-safe.
#ifndef SONDE_SERVER_RETENTION_H_
#define SONDE_SERVER_RETENTION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/job_registry.h"
#include "storage/store.h"

namespace sonde::server {

// Deletes one job and everything stored for it, and gives the disk space
// back. FailedPrecondition while the job is live here (streaming, or rules
// still judging it), NotFound for an unknown job, store errors as they come.
// With `job_id`, only while the name is still that job's (NotFound once it
// names a job created since: retention lists jobs, then erases them).
absl::StatusOr<storage::DeletedJob> EraseJob(const std::string& job, storage::Store& store,
                                             JobRegistry& registry,
                                             std::optional<uint64_t> job_id = std::nullopt);

// What one pass of the policy did.
struct RetentionReport {
  std::vector<storage::DeletedJob> deleted;  // in the order deleted
  // Candidates left alone because they turned out live, or were deleted by
  // someone else meanwhile.
  int skipped = 0;
  // The database's approximate size (storage::Store::ApproximateSizeBytes)
  // before and after the pass.
  uint64_t bytes_before = 0;
  uint64_t bytes_after = 0;
  // max_bytes is set and the database is still above it: no ended job is
  // left to delete.
  bool over_limit = false;
};

struct RetentionOptions {
  // Delete jobs that ended longer ago than this. Default: unset, jobs are
  // kept whatever their age. Must be positive when set.
  std::optional<absl::Duration> max_age;
  // Delete the jobs that ended first while the database's approximate size
  // is above this many bytes. Default: unset, no size limit. Must be
  // positive when set.
  std::optional<uint64_t> max_bytes;
  // Time between passes; the first pass runs when the thread starts.
  // Default 10 minutes. Must be positive.
  absl::Duration interval = absl::Minutes(10);
  // Called on the retention thread after every pass, with what it did (or
  // its error). Default: none (passes are logged).
  std::function<void(const absl::StatusOr<RetentionReport>&)> on_pass;

  // Whether any policy is set; the collector starts no thread otherwise.
  bool enabled() const { return max_age.has_value() || max_bytes.has_value(); }
};

// InvalidArgument for a non-positive max_age, max_bytes or interval.
absl::Status ValidateRetentionOptions(const RetentionOptions& options);

// One pass: first every ended job that ended before now - max_age, then,
// while the database is above max_bytes, the ended jobs that ended first
// (re-measuring after each). Jobs that turn out live are skipped.
// `cancelled` is asked before each deletion; true ends the pass early.
absl::StatusOr<RetentionReport> ApplyRetention(
    const RetentionOptions& options, storage::Store& store, JobRegistry& registry,
    absl::Time now, const std::function<bool()>& cancelled = [] { return false; });

// The background thread that applies the policy every interval.
class RetentionThread {
 public:
  // `store` and `registry` must outlive the thread. InvalidArgument for bad
  // options.
  static absl::StatusOr<std::unique_ptr<RetentionThread>> Start(RetentionOptions options,
                                                                storage::Store* store,
                                                                JobRegistry* registry);
  // Stops: waits for a deletion in progress, skips the rest of the pass.
  ~RetentionThread();

  RetentionThread(const RetentionThread&) = delete;
  RetentionThread& operator=(const RetentionThread&) = delete;

 private:
  RetentionThread(RetentionOptions options, storage::Store* store, JobRegistry* registry);
  void Loop();
  bool stopping();

  const RetentionOptions options_;
  storage::Store* const store_;
  JobRegistry* const registry_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace sonde::server

#endif  // SONDE_SERVER_RETENTION_H_
