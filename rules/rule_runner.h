// Runs the rules of one job: each complete step goes to every rule, in step
// order, each step once, on a Strand of a shared pool (never on the caller's
// thread). Tracks each rule's status (InProgress -> IssuesFound / Error, or
// NoIssuesFound at job end), reports results and actions to a RuleSink.
// A rule that fails affects only itself. Thread-safe.
#ifndef SONDE_RULES_RULE_RUNNER_H_
#define SONDE_RULES_RULE_RUNNER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/thread_pool.h"
#include "proto/collector.pb.h"
#include "proto/rule.pb.h"
#include "rules/rule.h"

namespace sonde::rules {

// Where results and actions go (the collector persists and broadcasts).
// Called from the runner's strand, one call at a time per runner.
class RuleSink {
 public:
  virtual ~RuleSink() = default;
  virtual void OnResult(const v1::RuleResult& result) = 0;
  virtual void OnAction(const v1::Action& action) = 0;
};

class RuleRunner {
 public:
  // Creates every rule of `specs` (InvalidArgument/NotFound on a bad spec).
  // `previous` are results stored by an earlier collector run: a rule whose
  // stored status is final keeps it and is not evaluated again (so actions
  // do not fire twice). `pool` and `sink` must outlive the runner.
  static absl::StatusOr<std::unique_ptr<RuleRunner>> Create(
      std::string job, const std::vector<v1::RuleSpec>& specs,
      const std::vector<v1::RuleResult>& previous, ThreadPool* pool, RuleSink* sink);
  ~RuleRunner();

  // Queue a complete step / the end of training. Returns at once.
  void SubmitStep(StepData step);
  void SubmitJobEnd();
  // Waits until everything submitted has been evaluated.
  void Drain();

  std::vector<v1::RuleResult> Results() const;

 private:
  struct Instance {
    v1::RuleSpec spec;
    std::unique_ptr<Rule> rule;
    v1::RuleResult result;
  };

  // What one evaluation wants told to the sink, sent once no lock is held.
  struct Outbox {
    std::vector<v1::RuleResult> results;
    std::vector<v1::Action> actions;
  };

  RuleRunner(std::string job, ThreadPool* pool, RuleSink* sink);
  void EvaluateStep(const StepData& step);
  void EvaluateJobEnd();
  void Publish(Instance& instance, Outbox& out);
  void Conclude(Instance& instance, const absl::StatusOr<std::optional<Finding>>& outcome,
                const StepData* step, Outbox& out);
  // Refreshes the snapshot, then delivers `out` to the sink without locks.
  void Flush(Outbox& out);

  const std::string job_;
  RuleSink* const sink_;
  // Only the strand touches the instances after Create; no lock needed.
  std::vector<Instance> instances_;
  // What Results() returns; mu_ is a leaf lock (never held while calling out).
  mutable absl::Mutex mu_;
  std::vector<v1::RuleResult> snapshot_ ABSL_GUARDED_BY(mu_);
  Strand strand_;
};

// True for IssuesFound, NoIssuesFound, Error and Stopped.
bool IsFinal(v1::RuleStatus status);

}  // namespace sonde::rules

#endif  // SONDE_RULES_RULE_RUNNER_H_
