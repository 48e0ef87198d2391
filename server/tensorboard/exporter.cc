#include "server/tensorboard/exporter.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/dtype.h"
#include "common/names.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "server/tensorboard/event_file.h"
#include "server/tensorboard/progress.h"
#include "storage/store.h"

namespace sonde::server::tensorboard {

struct Exporter::Job {
  std::string dir;            // <options.dir>/<job>
  bool loaded = false;        // progress read and files cut back to it
  ExportProgress progress;    // as last saved
  // This session's open files, by run directory relative to the job's.
  std::map<std::string, std::unique_ptr<EventFile>> files;
  absl::Time retry_at = absl::InfinitePast();
  bool error_logged = false;
  bool data_problem_logged = false;
  bool metadata_logged = false;
};

namespace {

// Global steps probed one by one (FindGlobalStep) before listing all of
// the job's steps becomes the cheaper way to find the new ones.
constexpr int64_t kProbeLimit = 4096;
// A commit holds at most this many steps or bytes of events.
constexpr size_t kStepsPerCommit = 256;
constexpr size_t kBytesPerCommit = 8 << 20;

bool IsFinished(v1::JobStatus s) {
  return s == v1::JOB_STATUS_FINISHED || s == v1::JOB_STATUS_STOPPED;
}

// "train", "eval", "predict", "global" (where steps without a mode are stored).
std::string ModeDir(v1::Mode mode) {
  return absl::AsciiStrToLower(ModeName(mode == v1::MODE_UNSPECIFIED ? v1::MODE_GLOBAL : mode));
}

// The last global step whose data is all there: every worker that joined
// has stored it, or the job has ended and nothing more will come.
int64_t CompleteThrough(const v1::JobInfo& info) {
  if (IsFinished(info.status())) return info.last_step();
  if (info.workers_size() == 0) return -1;
  int64_t through = info.last_step();
  for (int32_t w : info.workers()) {
    auto it = info.worker_last_step().find(w);
    through = std::min(through, it == info.worker_last_step().end() ? int64_t{-1} : it->second);
  }
  return through;
}

// Steps stored after `after` up to `through`, in order.
absl::StatusOr<std::vector<v1::StepInfo>> StepsBetween(storage::Store& store, uint64_t job_id,
                                                       int64_t after, int64_t through) {
  std::vector<v1::StepInfo> steps;
  if (through - after > kProbeLimit) {
    SONDE_ASSIGN_OR_RETURN(auto all, store.ListSteps(job_id, v1::MODE_UNSPECIFIED));
    for (v1::StepInfo& s : all) {
      if (s.step() > after && s.step() <= through) steps.push_back(std::move(s));
    }
    return steps;
  }
  for (int64_t step = after + 1; step <= through; ++step) {
    absl::StatusOr<v1::StepInfo> found = store.FindGlobalStep(job_id, step);
    if (absl::IsNotFound(found.status())) continue;  // a step nothing was saved at
    if (!found.ok()) return found.status();
    steps.push_back(std::move(*found));
  }
  return steps;
}

double WallTime() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

}  // namespace

absl::Status ValidateExportOptions(const ExportOptions& options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("TensorBoard directory is empty");
  SONDE_RETURN_IF_ERROR(ValidateStatisticNames(options.statistics));
  if (options.poll_interval <= absl::ZeroDuration() ||
      options.retry_interval <= absl::ZeroDuration() ||
      options.stop_budget < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TensorBoard export intervals must be positive: poll ",
        absl::FormatDuration(options.poll_interval), ", retry ",
        absl::FormatDuration(options.retry_interval), ", stop budget ",
        absl::FormatDuration(options.stop_budget)));
  }
  return absl::OkStatus();
}

bool Exporter::Budget::Left() const {
  return final ? absl::Now() < deadline : !exporter->stopping();
}

absl::StatusOr<std::unique_ptr<Exporter>> Exporter::Start(storage::Store* store,
                                                          ExportOptions options) {
  SONDE_RETURN_IF_ERROR(ValidateExportOptions(options));
  std::unique_ptr<Exporter> exporter(new Exporter(store, std::move(options)));
  exporter->thread_ = std::thread([e = exporter.get()] { e->Loop(); });
  return exporter;
}

Exporter::Exporter(storage::Store* store, ExportOptions options)
    : store_(store), options_(std::move(options)) {}

Exporter::~Exporter() { Stop(); }

bool Exporter::stopping() const {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

void Exporter::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void Exporter::Loop() {
  LOG(INFO) << "TensorBoard export to " << options_.dir
            << (options_.export_all ? " for every job" : " for jobs that ask")
            << (options_.per_worker ? ", per worker too" : "");
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.poll_interval);
      if (stopping_) break;
    }
    Pass(Budget{this, absl::InfiniteFuture(), false});
  }
  Pass(Budget{this, absl::Now() + options_.stop_budget, true});
  jobs_.clear();  // closes every file; everything written is flushed already
}

void Exporter::Pass(const Budget& budget) {
  absl::StatusOr<std::vector<v1::JobInfo>> infos = store_->ListJobs();
  if (!infos.ok()) {
    if (!list_error_logged_) LOG(WARNING) << "TensorBoard export: listing jobs: " << infos.status();
    list_error_logged_ = true;
    return;
  }
  list_error_logged_ = false;
  std::set<std::string> listed;
  for (const v1::JobInfo& info : *infos) {
    if (!budget.Left()) break;
    listed.insert(info.job());
    bool on = options_.export_all;
    bool per_worker = options_.per_worker;
    std::unique_ptr<Job>& job = jobs_[info.job()];
    if (job == nullptr) job = std::make_unique<Job>();
    auto asked = info.metadata().find(kMetadataKey);
    if (asked != info.metadata().end()) {
      if (asked->second == "off") {
        on = false;
      } else if (asked->second == "on") {
        on = true;
      } else if (asked->second == "per_worker") {
        on = true;
        per_worker = true;
      } else if (!job->metadata_logged) {
        LOG(WARNING) << "job '" << info.job() << "': " << kMetadataKey << "='" << asked->second
                     << "' is none of off, on, per_worker; the collector's default applies";
        job->metadata_logged = true;
      }
    }
    if (!on || info.job_id() == 0) {
      job->files.clear();
      continue;
    }
    if (!budget.final && absl::Now() < job->retry_at) continue;
    absl::Status s = ExportJob(info, *job, per_worker, budget);
    if (s.ok()) continue;
    if (!job->error_logged) {
      LOG(WARNING) << "job '" << info.job() << "': TensorBoard export stopped, trying again every "
                   << absl::FormatDuration(options_.retry_interval) << ": " << s;
      job->error_logged = true;
    }
    // Start again from the progress record: it cuts off what this attempt
    // may have half written.
    job->files.clear();
    job->loaded = false;
    job->retry_at = absl::Now() + options_.retry_interval;
  }
  // Jobs deleted since the last pass: close their files, leave them on disk.
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    it = listed.count(it->first) > 0 || !budget.Left() ? std::next(it) : jobs_.erase(it);
  }
}

absl::Status Exporter::Load(const v1::JobInfo& info, Job& job) {
  // The name becomes a directory under options_.dir: a job stored before
  // "." and ".." were refused must not write outside it.
  SONDE_RETURN_IF_ERROR(ValidateJobName(info.job()));
  job.dir = absl::StrCat(options_.dir, "/", info.job());
  const std::string& job_dir = job.dir;
  job.files.clear();
  job.progress = ExportProgress();
  job.progress.job_id = info.job_id();
  absl::StatusOr<std::optional<ExportProgress>> saved = ReadExportProgress(job_dir);
  if (!saved.ok()) {
    // Nothing tells what the files hold: write the job again rather than
    // never, and say that steps may now appear twice.
    LOG(WARNING) << "job '" << info.job() << "': " << saved.status()
                 << "; exporting the job from its first step again";
  } else if (saved->has_value() && (*saved)->job_id == info.job_id()) {
    for (const auto& [file, bytes] : (*saved)->files) {
      SONDE_RETURN_IF_ERROR(TruncateEventFile(absl::StrCat(job_dir, "/", file), bytes));
    }
    job.progress = std::move(**saved);
  }
  // A record of another job id is of an older job of the same name: its
  // files stay, this job's steps go to new files beside them.
  job.loaded = true;
  return absl::OkStatus();
}

absl::Status Exporter::ExportJob(const v1::JobInfo& info, Job& job, bool per_worker,
                                 const Budget& budget) {
  if (!job.loaded || job.progress.job_id != info.job_id()) SONDE_RETURN_IF_ERROR(Load(info, job));
  const int64_t through = CompleteThrough(info);
  if (through > job.progress.exported_through) {
    SONDE_ASSIGN_OR_RETURN(
        std::vector<v1::StepInfo> steps,
        StepsBetween(*store_, info.job_id(), job.progress.exported_through, through));
    std::map<std::string, std::vector<tfevents::Event>> pending;
    size_t pending_steps = 0;
    size_t pending_bytes = 0;
    int64_t done = job.progress.exported_through;
    for (const v1::StepInfo& step : steps) {
      if (!budget.Left()) break;
      SONDE_ASSIGN_OR_RETURN(std::vector<v1::TensorRecord> records,
                             store_->TensorsAtStep(info.job_id(), step.mode(), step.mode_step()));
      // The run directories of this step and the records each shows.
      std::map<std::string, std::vector<const v1::TensorRecord*>> runs;
      const std::string mode = ModeDir(step.mode());
      for (const v1::TensorRecord& r : records) {
        runs[mode].push_back(&r);
        if (per_worker) runs[absl::StrCat("worker_", r.worker(), "/", mode)].push_back(&r);
      }
      const double wall_time = WallTime();
      for (const auto& [run, run_records] : runs) {
        tfevents::Event event;
        event.set_wall_time(wall_time);
        event.set_step(step.mode_step());
        absl::Status problem =
            AddTensorValues(run_records, options_.statistics, *event.mutable_summary());
        if (!problem.ok() && !job.data_problem_logged) {
          LOG(WARNING) << "job '" << info.job() << "' step " << step.step()
                       << ": TensorBoard export left out what it could not show: " << problem;
          job.data_problem_logged = true;
        }
        if (event.summary().value_size() == 0) continue;
        pending_bytes += event.ByteSizeLong();
        pending[run].push_back(std::move(event));
      }
      done = step.step();
      if (++pending_steps >= kStepsPerCommit || pending_bytes >= kBytesPerCommit) {
        SONDE_RETURN_IF_ERROR(Commit(job, pending, done));
        pending_steps = 0;
        pending_bytes = 0;
      }
    }
    // Steps nothing was stored at count as written too.
    if (budget.Left()) done = through;
    if (done > job.progress.exported_through) SONDE_RETURN_IF_ERROR(Commit(job, pending, done));
  }
  if (IsFinished(info.status()) && job.progress.exported_through >= info.last_step()) {
    job.files.clear();  // the job is over: close its files
  }
  return absl::OkStatus();
}

std::string Exporter::RelativePath(const Job& job, const EventFile& file) {
  return file.path().substr(job.dir.size() + 1);
}

absl::Status Exporter::Commit(Job& job, std::map<std::string, std::vector<tfevents::Event>>& pending,
                              int64_t through) {
  // A restart that finds the old record cuts every file it names back to
  // its recorded size, so the record names each new file (at its header's
  // size) before any step lands in it.
  bool new_files = false;
  for (const auto& [run, events] : pending) {
    if (events.empty() || job.files.count(run) > 0) continue;
    SONDE_ASSIGN_OR_RETURN(std::unique_ptr<EventFile> file,
                           EventFile::Create(absl::StrCat(job.dir, "/", run), absl::Now()));
    job.progress.files[RelativePath(job, *file)] = file->size();
    job.files[run] = std::move(file);
    new_files = true;
  }
  if (new_files) SONDE_RETURN_IF_ERROR(WriteExportProgress(job.dir, job.progress));
  for (auto& [run, events] : pending) {
    if (events.empty()) continue;
    EventFile& file = *job.files[run];
    for (const tfevents::Event& e : events) file.Append(e);
    SONDE_RETURN_IF_ERROR(file.Flush());
    job.progress.files[RelativePath(job, file)] = file.size();
  }
  pending.clear();
  job.progress.exported_through = through;
  return WriteExportProgress(job.dir, job.progress);
}

}  // namespace sonde::server::tensorboard
