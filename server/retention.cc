#include "server/retention.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace sonde::server {
namespace {

bool HasEnded(const v1::JobInfo& job) {
  return (job.status() == v1::JOB_STATUS_FINISHED || job.status() == v1::JOB_STATUS_STOPPED) &&
         job.end_unix_micros() > 0;
}

}  // namespace

absl::StatusOr<storage::DeletedJob> EraseJob(const std::string& job, storage::Store& store,
                                             JobRegistry& registry,
                                             std::optional<uint64_t> job_id) {
  std::optional<storage::DeletedJob> marked;
  // Only the first, quick step under the job's lock; the range deletes and
  // the compaction run after it.
  SONDE_RETURN_IF_ERROR(registry.Forget(job, [&]() -> absl::Status {
    if (job_id.has_value()) {
      SONDE_ASSIGN_OR_RETURN(v1::JobInfo now, store.GetJob(job));
      if (now.job_id() != *job_id) {
        return absl::NotFoundError(absl::StrCat("job '", job, "' is now job id ", now.job_id(),
                                                ", created since; not job id ", *job_id));
      }
    }
    SONDE_ASSIGN_OR_RETURN(storage::DeletedJob d, store.MarkJobDeleted(job));
    marked = std::move(d);
    return absl::OkStatus();
  }));
  SONDE_ASSIGN_OR_RETURN(storage::PurgeReport purged, store.PurgeDeletedJobs());
  if (!purged.compaction.ok()) {
    LOG(WARNING) << "job '" << job << "' deleted; its disk space comes back later: "
                 << purged.compaction;
  }
  LOG(INFO) << "deleted job '" << job << "' (id " << marked->job_id << ", about "
            << marked->approximate_bytes << " bytes)";
  return *marked;
}

absl::Status ValidateRetentionOptions(const RetentionOptions& options) {
  if (options.max_age.has_value() && *options.max_age <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "retention max_age must be positive, got ", absl::FormatDuration(*options.max_age)));
  }
  if (options.max_bytes.has_value() && *options.max_bytes == 0) {
    return absl::InvalidArgumentError("retention max_bytes must be positive, got 0");
  }
  if (options.interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "retention interval must be positive, got ", absl::FormatDuration(options.interval)));
  }
  return absl::OkStatus();
}

absl::StatusOr<RetentionReport> ApplyRetention(const RetentionOptions& options,
                                               storage::Store& store, JobRegistry& registry,
                                               absl::Time now,
                                               const std::function<bool()>& cancelled) {
  SONDE_RETURN_IF_ERROR(ValidateRetentionOptions(options));
  RetentionReport report;
  SONDE_ASSIGN_OR_RETURN(report.bytes_before, store.ApproximateSizeBytes());
  SONDE_ASSIGN_OR_RETURN(std::vector<v1::JobInfo> jobs, store.ListJobs());
  std::vector<v1::JobInfo> ended;
  for (v1::JobInfo& j : jobs) {
    if (HasEnded(j)) ended.push_back(std::move(j));
  }
  std::sort(ended.begin(), ended.end(), [](const v1::JobInfo& a, const v1::JobInfo& b) {
    return std::make_pair(a.end_unix_micros(), a.job_id()) <
           std::make_pair(b.end_unix_micros(), b.job_id());
  });
  auto erase = [&](const v1::JobInfo& j) -> absl::Status {
    // The job listed, not one created under its name since.
    auto deleted = EraseJob(j.job(), store, registry, j.job_id());
    if (deleted.ok()) {
      report.deleted.push_back(*std::move(deleted));
      return absl::OkStatus();
    }
    const absl::StatusCode code = deleted.status().code();
    if (code == absl::StatusCode::kFailedPrecondition || code == absl::StatusCode::kNotFound) {
      ++report.skipped;
      return absl::OkStatus();
    }
    return deleted.status();
  };
  size_t next = 0;  // ended[..next) are done with
  bool stop = false;
  if (options.max_age.has_value()) {
    const absl::Time cutoff = now - *options.max_age;
    while (next < ended.size() && absl::FromUnixMicros(ended[next].end_unix_micros()) < cutoff &&
           !(stop = cancelled())) {
      SONDE_RETURN_IF_ERROR(erase(ended[next++]));
    }
  }
  SONDE_ASSIGN_OR_RETURN(uint64_t size, store.ApproximateSizeBytes());
  if (options.max_bytes.has_value()) {
    while (!stop && size > *options.max_bytes && next < ended.size() && !(stop = cancelled())) {
      SONDE_RETURN_IF_ERROR(erase(ended[next++]));
      SONDE_ASSIGN_OR_RETURN(size, store.ApproximateSizeBytes());
    }
    report.over_limit = !stop && size > *options.max_bytes;
  }
  report.bytes_after = size;
  return report;
}

absl::StatusOr<std::unique_ptr<RetentionThread>> RetentionThread::Start(
    RetentionOptions options, storage::Store* store, JobRegistry* registry) {
  SONDE_RETURN_IF_ERROR(ValidateRetentionOptions(options));
  if (store == nullptr || registry == nullptr) {
    return absl::InvalidArgumentError("retention needs a store and a job registry");
  }
  std::unique_ptr<RetentionThread> t(new RetentionThread(std::move(options), store, registry));
  t->thread_ = std::thread([raw = t.get()] { raw->Loop(); });
  return t;
}

RetentionThread::RetentionThread(RetentionOptions options, storage::Store* store,
                                 JobRegistry* registry)
    : options_(std::move(options)), store_(store), registry_(registry) {}

RetentionThread::~RetentionThread() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

bool RetentionThread::stopping() {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

void RetentionThread::Loop() {
  while (true) {
    auto report = ApplyRetention(options_, *store_, *registry_, absl::Now(),
                                 [this] { return stopping(); });
    if (!report.ok()) {
      LOG(ERROR) << "retention pass failed: " << report.status();
    } else if (!report->deleted.empty() || report->over_limit) {
      LOG(INFO) << "retention deleted " << report->deleted.size() << " job(s); database "
                << report->bytes_before << " -> " << report->bytes_after << " bytes";
      if (report->over_limit) {
        LOG(WARNING) << "retention: the database (" << report->bytes_after
                     << " bytes) is above max_bytes (" << *options_.max_bytes
                     << ") and no ended job is left to delete";
      }
    }
    if (options_.on_pass) options_.on_pass(report);
    absl::MutexLock lock(&mu_);
    auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
    if (mu_.AwaitWithTimeout(absl::Condition(&stop), options_.interval)) return;
  }
}

}  // namespace sonde::server
