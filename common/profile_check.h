// Checks of profiler data (proto/profile.proto) shared by the client, which
// drops a bad event or gauge where it is recorded (logged once), and the
// collector, which refuses a batch that holds one. One definition keeps a
// client from sending what its collector would refuse: a refused batch
// ends the stream. Thread-safe; no state.
#ifndef SONDE_COMMON_PROFILE_CHECK_H_
#define SONDE_COMMON_PROFILE_CHECK_H_

#include "absl/status/status.h"
#include "proto/profile.pb.h"

namespace sonde {

// A sample: a valid name (ValidateDataName, common/names.h) and a finite
// value.
absl::Status ValidateMetricSample(const v1::MetricSample& sample);
// An event: a known kind (not UNSPECIFIED) and mode, times > 0 with
// end >= start, and a valid name (required for spans).
absl::Status ValidateTraceEvent(const v1::TraceEvent& event);
// Every snapshot (time > 0), sample and event of a batch.
absl::Status ValidateProfileBatch(const v1::ProfileBatch& batch);

}  // namespace sonde

#endif  // SONDE_COMMON_PROFILE_CHECK_H_
