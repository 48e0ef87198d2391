// The rule interface. A rule sees every complete step of one job, in step
// order, each step once, and says whether it found an issue. Rules are plain
// objects: the RuleRunner owns threading, persistence and actions.
// A Rule instance is used by one thread at a time.
#ifndef SONDE_RULES_RULE_H_
#define SONDE_RULES_RULE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/profile.pb.h"
#include "proto/tensor.pb.h"

namespace sonde::rules {

// Everything known about one complete step (all workers).
struct StepData {
  int64_t step = 0;  // global step
  v1::Mode mode = v1::MODE_GLOBAL;
  int64_t mode_step = 0;
  std::vector<v1::TensorRecord> tensors;  // every worker's tensors, in arrival order
  // Raw little-endian values, parallel to `tensors`: kept only for tensors
  // that were sent with values and that some rule WantsValues for; null
  // (or missing) elsewhere.
  std::vector<std::shared_ptr<const std::string>> values;
  // Workers that had not sent this step when the collector's step wait ran
  // out; the step is judged with what arrived.
  std::vector<int32_t> missing_workers;

  const std::string* ValuesOf(size_t i) const {
    return i < values.size() ? values[i].get() : nullptr;
  }
};

// Profiler data of one worker, as it arrived (proto/profile.proto).
struct ProfileData {
  int32_t worker = 0;
  v1::ProfileBatch batch;
};

// What a rule saw when it found an issue.
struct Finding {
  std::string message;               // one line: what was seen
  std::vector<std::string> tensors;  // tensors involved
  int32_t worker = 0;
  double observed = 0;
  double threshold = 0;
  std::string suggestion;  // empty: the catalogue's advice for the rule
  bool stop_training = false;  // also stop training, whatever the spec's actions
  // The global step the issue is about, when it is not the step being
  // judged (profiler rules judge time, not steps). Default: the runner's.
  std::optional<int64_t> step;
};

class Rule {
 public:
  virtual ~Rule() = default;

  // Evaluates one complete step. A Finding means IssuesFound at this step;
  // an error status means the rule itself failed (status Error).
  virtual absl::StatusOr<std::optional<Finding>> OnStep(const StepData& step) = 0;

  // Does the rule need the raw values of this tensor (not only its
  // statistics)? Called from ingest threads: must be const and thread-safe.
  virtual bool WantsValues(const v1::TensorRecord& record) const {
    (void)record;
    return false;
  }

  // Rules that judge the passing of time (e.g. a stalled job) get OnTick
  // about once a second while the job runs, in order with its steps.
  virtual bool WantsTicks() const { return false; }
  virtual absl::StatusOr<std::optional<Finding>> OnTick(absl::Time now) {
    (void)now;
    return std::optional<Finding>();
  }

  // Profiler rules get the job's profiler data as it arrives: each
  // worker's batches in order, each once. Steps reach rules only when every
  // worker has sent them, batches on arrival, so a batch may come before
  // the step it was recorded in. Data from before a collector restart is
  // not fed again.
  virtual bool WantsProfile() const { return false; }
  virtual absl::StatusOr<std::optional<Finding>> OnProfile(const ProfileData& data) {
    (void)data;
    return std::optional<Finding>();
  }

  // Most rules end at their first issue. One that answers true keeps being
  // fed after it (profiler rules: a bottleneck can come and go), and each
  // later evaluation that finds an issue counts in
  // RuleResult.times_triggered and replaces the verdict's details. Actions
  // are taken at the first issue only.
  virtual bool KeepsJudgingAfterIssue() const { return false; }

  // A line that summarises what the rule saw, for a verdict without issues
  // (e.g. OverallSystemUsage's percentiles). Empty: the runner's wording.
  virtual std::string Summary() const { return ""; }

  // End-of-training evaluation, after the last step.
  virtual absl::StatusOr<std::optional<Finding>> OnJobEnd() {
    return std::optional<Finding>();
  }
};

}  // namespace sonde::rules

#endif  // SONDE_RULES_RULE_H_
