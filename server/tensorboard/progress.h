// How far the TensorBoard export of one job has got, kept in a small text
// file beside the job's event files (<job dir>/.sonde-tensorboard-progress,
// which TensorBoard ignores), so that a restarted collector resumes after
// what it wrote instead of writing steps twice. It also records how many
// bytes of each event file hold recorded steps: records written after the
// last save (a crash between writing events and saving) are cut off on
// resume and written again. Written atomically (temporary file, rename).
// Thread-compatible; one writer per job directory.
#ifndef SONDE_SERVER_TENSORBOARD_PROGRESS_H_
#define SONDE_SERVER_TENSORBOARD_PROGRESS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sonde::server::tensorboard {

struct ExportProgress {
  // The job these files are of (a job deleted and created again under the
  // same name has a new id).
  uint64_t job_id = 0;
  // Every global step up to this one has been written (-1: none).
  int64_t exported_through = -1;
  // Every event file written for the job, by its path relative to the job
  // directory, with the bytes that hold recorded steps.
  std::map<std::string, uint64_t> files;
};

// The job directory's record; nullopt if there is none. DataLoss if it
// cannot be parsed, with the line.
absl::StatusOr<std::optional<ExportProgress>> ReadExportProgress(const std::string& job_dir);
// Replaces the record atomically. File-system errors with the path.
absl::Status WriteExportProgress(const std::string& job_dir, const ExportProgress& progress);

}  // namespace sonde::server::tensorboard

#endif  // SONDE_SERVER_TENSORBOARD_PROGRESS_H_
