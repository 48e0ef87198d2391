// What the hook does with saved tensors when the collector is slower than
// training and the send queue is full (see HookOptions::backpressure).
#ifndef SONDE_CLIENT_BACKPRESSURE_H_
#define SONDE_CLIENT_BACKPRESSURE_H_

#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/time/time.h"

namespace sonde {

// What happens to a tensor saved while the queue is full.
enum class BackpressurePolicy {
  kSpill,  // write its values to the spill file; send them when the collector catches up
  kDrop,   // drop it (counted, reported to the collector)
  kBlock,  // wait up to max_block for room, then drop
};

struct BackpressureOptions {
  BackpressurePolicy policy = BackpressurePolicy::kSpill;
  // Directory of the spill files (made, with its parents, if missing; each
  // file is unlinked at once, so it never outlives the process). Default:
  // $TMPDIR, else /tmp.
  std::string spill_dir;
  // Most bytes the spill files hold together (the sender's queue, and
  // device values, client/value_spill.h); beyond it tensors are dropped,
  // and device values wait on the device. Default 4 GiB.
  uint64_t max_spill_bytes = uint64_t{4} << 30;
  // kBlock: longest a save waits for room. Default 1 s.
  absl::Duration max_block = absl::Seconds(1);
};

// The directory spill files go to: `configured`, else $TMPDIR, else /tmp.
inline std::string SpillDirOrTemp(const std::string& configured) {
  if (!configured.empty()) return configured;
  const char* tmp = std::getenv("TMPDIR");
  return tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
}

}  // namespace sonde

#endif  // SONDE_CLIENT_BACKPRESSURE_H_
