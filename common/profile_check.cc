#include "common/profile_check.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/status_macros.h"

namespace sonde {

absl::Status ValidateMetricSample(const v1::MetricSample& sample) {
  SONDE_RETURN_IF_ERROR(ValidateDataName("metric name", sample.name()));
  if (!std::isfinite(sample.value())) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric '", sample.name(), "' has the value ", sample.value(),
                     " (must be finite)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateTraceEvent(const v1::TraceEvent& event) {
  if (!v1::TraceEvent::Kind_IsValid(event.kind()) ||
      event.kind() == v1::TraceEvent::KIND_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        absl::StrCat("an event of unknown kind ", static_cast<int>(event.kind())));
  }
  if (!v1::Mode_IsValid(event.mode())) {
    return absl::InvalidArgumentError(
        absl::StrCat("an event in unknown mode ", static_cast<int>(event.mode())));
  }
  if (event.start_unix_micros() <= 0 || event.end_unix_micros() < event.start_unix_micros()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "an event from ", event.start_unix_micros(), " to ", event.end_unix_micros(),
        " (times must be > 0 and end >= start)"));
  }
  if (event.kind() == v1::TraceEvent::KIND_SPAN || !event.name().empty()) {
    SONDE_RETURN_IF_ERROR(ValidateDataName("event name", event.name()));
  }
  return absl::OkStatus();
}

absl::Status ValidateProfileBatch(const v1::ProfileBatch& batch) {
  for (const v1::MetricSnapshot& snapshot : batch.snapshots()) {
    if (snapshot.unix_micros() <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("a metric snapshot at time ", snapshot.unix_micros(), " (must be > 0)"));
    }
    for (const v1::MetricSample& sample : snapshot.samples()) {
      SONDE_RETURN_IF_ERROR(ValidateMetricSample(sample));
    }
  }
  for (const v1::TraceEvent& event : batch.events()) SONDE_RETURN_IF_ERROR(ValidateTraceEvent(event));
  return absl::OkStatus();
}

}  // namespace sonde
