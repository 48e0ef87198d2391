// Uploads spools left by clients that are gone (client/spool/spool.h):
// `sonde sync <dir>`, and the hook in the background for its collector.
//
// One spool at a time, over a stream of its own that presents the spool's
// Hello (same job, worker and client id), so the collector takes it as that
// client coming back: steps it already stored are acknowledged as
// duplicates, not stored twice. Segments go in order; each is removed once
// acknowledged, so an upload cut short resumes where it stopped. A spool
// without a job end (its client was killed) leaves the job open, so that a
// restarted run may go on with it; `end_job` ends it instead.
#ifndef SONDE_CLIENT_SPOOL_UPLOAD_H_
#define SONDE_CLIENT_SPOOL_UPLOAD_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/spool/spool.h"
#include "common/channel.h"

namespace sonde::spool {

struct UploadOptions {
  // Where to send. Empty: the collector the spool was streaming to.
  std::string collector;
  ChannelSecurity security;
  // Gives up on one spool after this long without progress.
  absl::Duration timeout = absl::Seconds(60);
  // Set to stop between messages (the hook closing): Cancelled.
  const std::atomic<bool>* cancel = nullptr;
  // Send a job end (reason: the client ended without closing) after a
  // spool that has none, so the job's worker ends and its rules finish.
  bool end_job = false;
};

struct UploadResult {
  uint64_t segments_sent = 0;   // acknowledged (duplicates included)
  uint64_t steps_stored = 0;    // acknowledged as newly stored
  uint64_t steps_duplicate = 0; // acknowledged as already stored
  uint64_t segments_damaged = 0;  // unreadable: not sent, kept in the spool
  bool removed = false;         // the spool is gone: everything in it is stored
};

// Uploads the spool at `left.path` (locking it for the time). OK once
// everything sent is acknowledged and the spool removed. FailedPrecondition when the
// collector says the job has finished while steps of the spool are left
// (they can no longer be stored; the spool is kept; a spool holding only
// its job end is removed: everything else was stored). Unavailable when the
// collector cannot be reached or the spool is in use; what was acknowledged
// by then is removed from the spool. DataLoss when entries of the spool
// are damaged: everything readable is uploaded and removed, the damaged
// entries are counted in `segments_damaged` and kept.
absl::Status Upload(const LeftSpool& left, const UploadOptions& options, UploadResult* result);

}  // namespace sonde::spool

#endif  // SONDE_CLIENT_SPOOL_UPLOAD_H_
