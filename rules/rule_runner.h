// Runs the rules of one job. Each complete step goes to every rule, in step
// order, each step once. Every rule instance has its own Strand on a shared
// pool, so a slow rule delays only itself, never ingest (callers return at
// once) or the other rules. Tracks each rule's status (InProgress ->
// IssuesFound / Error, or NoIssuesFound at job end) and reports results and
// actions to a RuleSink. A rule that fails, exceeds its time budget for one
// step, or falls too far behind gets status Error with the reason and is not
// fed again; the others go on. Thread-safe.
#ifndef SONDE_RULES_RULE_RUNNER_H_
#define SONDE_RULES_RULE_RUNNER_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/thread_pool.h"
#include "proto/profile.pb.h"
#include "proto/rule.pb.h"
#include "rules/rule.h"
#include "rules/rule_factory.h"

namespace sonde::metrics {
class Histogram;
}  // namespace sonde::metrics

namespace sonde::rules {

// Where results and actions go (the collector persists and broadcasts).
// Called from rule strands, possibly concurrently for different rules.
class RuleSink {
 public:
  virtual ~RuleSink() = default;
  virtual void OnResult(const v1::RuleResult& result) = 0;
  virtual void OnAction(const v1::Action& action) = 0;
};

struct RuleBudget {
  // Longest one evaluation (one step, or the end of training) may take.
  // Default 30 s.
  absl::Duration max_evaluation = absl::Seconds(30);
  // Most steps a rule may have waiting before it is declared too slow.
  // Default 10000.
  int64_t max_backlog = 10000;
};

class RuleRunner {
 public:
  // Creates every rule of `specs` (InvalidArgument/NotFound on a bad spec).
  // `previous` are results stored by an earlier collector run: a rule whose
  // stored status is final keeps it and is not evaluated again (so actions
  // do not fire twice); an InProgress rule's stored step is its cursor:
  // steps up to it are replayed silently (the rule rebuilds its state, and
  // nothing is published or acted on), later steps are evaluated for real.
  // `pool` and `sink` must outlive the runner.
  static absl::StatusOr<std::unique_ptr<RuleRunner>> Create(
      std::string job, const std::vector<v1::RuleSpec>& specs,
      const std::vector<v1::RuleResult>& previous, const RuleFactory& factory,
      ThreadPool* pool, RuleSink* sink, RuleBudget budget = RuleBudget());
  ~RuleRunner();

  // Queue a complete step / the end of training. Return at once.
  void SubmitStep(StepData step);
  // `stopped_by`: the action that stopped training, if a rule did; rules
  // that found nothing by then end Stopped instead of NoIssuesFound.
  void SubmitJobEnd(std::optional<v1::Action> stopped_by = std::nullopt);
  // Passes the time to rules that want ticks. Returns at once.
  void Tick(absl::Time now);
  // Passes a worker's profiler data to rules that want it, on their strands
  // (after what is queued there; steps reach rules when complete, batches on
  // arrival). Counts against max_backlog like steps. Returns at once.
  void SubmitProfile(int32_t worker, v1::ProfileBatch batch);
  // Does any rule of the job want profiler data?
  bool WantsProfile() const;
  // Waits until everything submitted has been evaluated.
  void Drain();

  std::vector<v1::RuleResult> Results() const;

  // True if any rule of the job wants the raw values of this tensor.
  // Thread-safe.
  bool WantsValues(const v1::TensorRecord& record) const;

 private:
  struct Instance {
    v1::RuleSpec spec;
    std::string suggestion;  // the catalogue's advice for this rule
    std::unique_ptr<Rule> rule;
    v1::RuleResult result;  // touched only on the instance's strand
    std::unique_ptr<Strand> strand;
    int64_t cursor = -1;  // steps <= cursor were evaluated before a restart
    std::atomic<int64_t> backlog{0};
    metrics::Histogram* evaluation_seconds = nullptr;  // this rule type's series
    std::atomic<bool> stopped_feeding{false};
    int64_t profile_evaluations = 0;  // on the instance's strand
    bool unpublished = false;  // on the strand: result changed since the last Publish
  };

  RuleRunner(std::string job, RuleSink* sink, RuleBudget budget)
      : job_(std::move(job)), sink_(sink), budget_(budget) {}
  // One thing a rule is asked to judge; `kind` says which, and only that
  // kind's field is set.
  struct Input {
    enum class Kind { kStep, kProfile, kTick, kJobEnd };
    Kind kind;
    const StepData* step = nullptr;        // kStep
    const ProfileData* profile = nullptr;  // kProfile
    absl::Time tick;                       // kTick
    std::optional<v1::Action> stopped_by;  // kJobEnd: the stop that ended training, if any

    static Input Step(const StepData& s) { return {Kind::kStep, &s}; }
    static Input Profile(const ProfileData& p) { return {Kind::kProfile, nullptr, &p}; }
    static Input Tick(absl::Time now) { return {Kind::kTick, nullptr, nullptr, now}; }
    static Input JobEnd(std::optional<v1::Action> stopped_by) {
      return {Kind::kJobEnd, nullptr, nullptr, absl::InfinitePast(), std::move(stopped_by)};
    }
  };
  void Evaluate(size_t index, const Input& input);
  // A finding's actions: the spec's, plus StopTraining if the finding asks
  // for it; each is added to r.actions_taken, and each action carries the
  // verdict.
  static std::vector<v1::Action> TakeActions(const Instance& inst, bool stop_training,
                                             v1::RuleResult& r);
  // What an input with no issue changes in the rule's result: progress now
  // and then, the final verdict at the end.
  void RecordNoIssue(size_t index, const Input& input);
  void Publish(size_t index, const std::vector<v1::Action>& actions);
  // Counts one more input waiting for rule `i`; false (and the rule ends
  // with Error, once) when it is not fed or too far behind.
  bool Admit(size_t i);

  const std::string job_;
  RuleSink* const sink_;
  const RuleBudget budget_;
  std::vector<std::unique_ptr<Instance>> instances_;  // fixed after Create
  bool wants_profile_ = false;                        // likewise
  mutable absl::Mutex mu_;  // leaf lock: never held while calling out
  std::vector<v1::RuleResult> snapshot_ ABSL_GUARDED_BY(mu_);
  // WantsValues answers by tensor name and collections: names repeat every
  // step and regex matching is slow.
  mutable absl::Mutex wants_mu_;
  mutable std::map<std::string, bool> wants_values_ ABSL_GUARDED_BY(wants_mu_);
};

// True for IssuesFound, NoIssuesFound, Error and Stopped.
bool IsFinal(v1::RuleStatus status);

}  // namespace sonde::rules

#endif  // SONDE_RULES_RULE_RUNNER_H_
