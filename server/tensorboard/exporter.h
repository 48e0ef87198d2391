// TensorBoard export by the collector: a background thread that turns the
// steps the store holds into TensorBoard event files, one run directory per
// job and mode, and per worker where asked:
//
//   <dir>/<job>/<mode>/events.out.tfevents.<secs>.<host>            merged workers
//   <dir>/<job>/worker_<n>/<mode>/events.out.tfevents.<secs>.<host> per worker
//
// with <mode> one of train, eval, predict, global, and each event's step the
// mode step, so TensorBoard overlays a tag's train and eval curves. What a
// tensor becomes is in summary.h.
//
// The exporter reads only what the store has committed, on its own thread,
// so ingest never waits for it. Every poll it lists the jobs; a job is
// exported if the options or its hello metadata (key "sonde.tensorboard":
// off, on, per_worker) say so, up to its last complete step: one every
// worker that joined has stored, or any stored step once the job has
// finished or stopped. A progress record beside the files (progress.h)
// lets a restarted collector resume after what it wrote, in new files,
// without writing a step twice. Errors are logged once per job, and the
// job is tried again later; bad data costs its value, never the process.
// Files of a deleted job stay where they are.
//
// Thread-safe: Stop may be called from any thread.
#ifndef SONDE_SERVER_TENSORBOARD_EXPORTER_H_
#define SONDE_SERVER_TENSORBOARD_EXPORTER_H_

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/query.pb.h"
#include "server/tensorboard/summary.h"

namespace sonde::storage {
class Store;
}  // namespace sonde::storage

namespace sonde::server::tensorboard {

class EventFile;

// The hello metadata key by which a job asks for (or refuses) export.
inline constexpr char kMetadataKey[] = "sonde.tensorboard";

struct ExportOptions {
  // Directory of every job's run directories; created if missing.
  // Required (the collector fills in <data_dir>/tensorboard).
  std::string dir;
  // Export every job whose metadata does not say "off". Default false:
  // only jobs whose metadata says "on" or "per_worker".
  bool export_all = false;
  // Also write one run per worker for every exported job (a job's
  // "per_worker" asks for it regardless). Default false.
  bool per_worker = false;
  // Statistics written as "<tensor>/<statistic>" scalars for tensors of
  // more than one element (names: summary.h). Default mean, std, l2.
  std::vector<std::string> statistics = DefaultStatistics();
  // How often the store is looked at for new steps. Default 1 s.
  absl::Duration poll_interval = absl::Seconds(1);
  // How long a job whose export failed waits before it is tried again.
  // Default 30 s.
  absl::Duration retry_interval = absl::Seconds(30);
  // How long Stop may spend exporting what is still pending; the rest is
  // exported after the next start. Default 10 s.
  absl::Duration stop_budget = absl::Seconds(10);
};

// Checks the options: InvalidArgument for an empty dir, unknown
// statistics or non-positive intervals.
absl::Status ValidateExportOptions(const ExportOptions& options);

class Exporter {
 public:
  // Starts the export thread. `store` must outlive the exporter.
  // InvalidArgument for bad options.
  static absl::StatusOr<std::unique_ptr<Exporter>> Start(storage::Store* store,
                                                         ExportOptions options);
  ~Exporter();  // Stop()

  Exporter(const Exporter&) = delete;
  Exporter& operator=(const Exporter&) = delete;

  // Exports what is complete (for at most stop_budget), closes every file
  // and ends the thread. Idempotent.
  void Stop();

 private:
  struct Job;
  // A pass's limit: non-final passes give way to Stop, the final one to
  // its deadline.
  struct Budget {
    const Exporter* exporter;
    absl::Time deadline;
    bool final;
    bool Left() const;
  };

  Exporter(storage::Store* store, ExportOptions options);
  void Loop();
  // One look at every job.
  void Pass(const Budget& budget);
  // Reads the job's progress record and cuts its files back to it.
  absl::Status Load(const v1::JobInfo& info, Job& job);
  absl::Status ExportJob(const v1::JobInfo& info, Job& job, bool per_worker,
                         const Budget& budget);
  // Writes `pending` (events per run directory) into the job's files and
  // records that every step through `through` is written.
  absl::Status Commit(Job& job, std::map<std::string, std::vector<tfevents::Event>>& pending,
                      int64_t through);
  // A file's name in the progress record: its path below the job's directory.
  static std::string RelativePath(const Job& job, const EventFile& file);
  bool stopping() const;

  storage::Store* const store_;
  const ExportOptions options_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool list_error_logged_ = false;  // export thread only
  // Jobs by name; the export thread's alone.
  std::map<std::string, std::unique_ptr<Job>> jobs_;
  std::thread thread_;
};

}  // namespace sonde::server::tensorboard

#endif  // SONDE_SERVER_TENSORBOARD_EXPORTER_H_
