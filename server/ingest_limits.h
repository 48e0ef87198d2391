// What bounds one Collector stream (IngestLimits) and all of them together
// (OpenStepBudget): the options the collector and its tests set, apart from
// the session that enforces them (server/ingest_session.h).
#ifndef SONDE_SERVER_INGEST_LIMITS_H_
#define SONDE_SERVER_INGEST_LIMITS_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace sonde::server {

// Bytes of open steps held by all streams of a collector, against a limit.
// A stream may pass the limit only while it is the only one holding bytes,
// so some step can always complete. Thread-safe.
class OpenStepBudget {
 public:
  explicit OpenStepBudget(uint64_t limit) : limit_(limit) {}
  // Takes `n` more bytes for a stream that holds `held` already: false
  // (nothing taken) when the total would pass the limit and others hold
  // bytes too.
  bool TryTake(uint64_t n, uint64_t held);
  void Give(uint64_t n);
  uint64_t held() const;
  uint64_t peak() const;  // the most held at once
  uint64_t limit() const { return limit_; }

 private:
  const uint64_t limit_;
  mutable absl::Mutex mu_;
  uint64_t held_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t peak_ ABSL_GUARDED_BY(mu_) = 0;
};

struct IngestLimits {
  // Largest payload of one chunk. Default 4 MiB.
  uint64_t max_chunk_bytes = 4 << 20;
  // Largest single tensor. Default 1 GiB.
  uint64_t max_tensor_bytes = uint64_t{1} << 30;
  // Bytes of raw values one worker may send for one step (held in memory
  // until the step end commits them). Default 2 GiB.
  uint64_t max_step_bytes = uint64_t{2} << 30;
  // Tensors one worker may send for one step. Default 100000.
  uint32_t max_tensors_per_step = 100000;
  // Shared by every stream of the collector (null: no limit): bytes of
  // open steps held in memory. A chunk that would pass it ends its stream
  // with RESOURCE_EXHAUSTED, which the hook answers by reconnecting later
  // and resending the step (nothing acknowledged is lost).
  OpenStepBudget* open_steps = nullptr;
};

}  // namespace sonde::server

#endif  // SONDE_SERVER_INGEST_LIMITS_H_
