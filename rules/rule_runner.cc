#include "rules/rule_runner.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "rules/builtin_rules.h"

namespace sonde::rules {
namespace {

// InProgress results are republished this often (in evaluated steps), so
// readers see progress without a write per step per rule.
constexpr int64_t kProgressEvery = 50;

}  // namespace

bool IsFinal(v1::RuleStatus status) {
  return status == v1::RULE_STATUS_ISSUES_FOUND ||
         status == v1::RULE_STATUS_NO_ISSUES_FOUND || status == v1::RULE_STATUS_ERROR ||
         status == v1::RULE_STATUS_STOPPED;
}

absl::StatusOr<std::unique_ptr<RuleRunner>> RuleRunner::Create(
    std::string job, const std::vector<v1::RuleSpec>& specs,
    const std::vector<v1::RuleResult>& previous, ThreadPool* pool, RuleSink* sink) {
  std::unique_ptr<RuleRunner> runner(new RuleRunner(std::move(job), pool, sink));
  std::vector<Instance> instances;
  for (const v1::RuleSpec& raw : specs) {
    SONDE_ASSIGN_OR_RETURN(v1::RuleSpec spec, NormalizeRuleSpec(raw));
    for (const Instance& other : instances) {
      if (other.spec.name() == spec.name()) {
        return absl::InvalidArgumentError(
            absl::StrCat("two rules are named '", spec.name(), "'"));
      }
    }
    Instance inst;
    SONDE_ASSIGN_OR_RETURN(inst.rule, CreateRule(spec));
    inst.spec = spec;
    inst.result.set_job(runner->job_);
    inst.result.set_rule(spec.name());
    inst.result.set_rule_type(spec.rule_type());
    inst.result.set_status(v1::RULE_STATUS_IN_PROGRESS);
    inst.result.set_step(-1);
    for (const v1::RuleResult& p : previous) {
      if (p.rule() == spec.name()) inst.result = p;
    }
    instances.push_back(std::move(inst));
  }
  runner->instances_ = std::move(instances);
  Outbox none;
  runner->Flush(none);
  return runner;
}

RuleRunner::RuleRunner(std::string job, ThreadPool* pool, RuleSink* sink)
    : job_(std::move(job)), sink_(sink), strand_(pool) {}

RuleRunner::~RuleRunner() { strand_.Drain(); }

void RuleRunner::SubmitStep(StepData step) {
  strand_.Post([this, step = std::move(step)] { EvaluateStep(step); });
}

void RuleRunner::SubmitJobEnd() {
  strand_.Post([this] { EvaluateJobEnd(); });
}

void RuleRunner::Drain() { strand_.Drain(); }

std::vector<v1::RuleResult> RuleRunner::Results() const {
  absl::MutexLock lock(&mu_);
  return snapshot_;
}

void RuleRunner::Flush(Outbox& out) {
  {
    absl::MutexLock lock(&mu_);
    snapshot_.clear();
    for (const Instance& i : instances_) snapshot_.push_back(i.result);
  }
  for (const v1::Action& a : out.actions) sink_->OnAction(a);
  for (const v1::RuleResult& r : out.results) sink_->OnResult(r);
}

void RuleRunner::Publish(Instance& inst, Outbox& out) {
  inst.result.set_updated_unix_micros(absl::ToUnixMicros(absl::Now()));
  out.results.push_back(inst.result);
}

void RuleRunner::Conclude(Instance& inst,
                          const absl::StatusOr<std::optional<Finding>>& outcome,
                          const StepData* step, Outbox& out) {
  v1::RuleResult& r = inst.result;
  if (!outcome.ok()) {
    r.set_status(v1::RULE_STATUS_ERROR);
    r.set_message(absl::StrCat("rule failed: ", outcome.status().ToString()));
    Publish(inst, out);
    return;
  }
  if (!outcome->has_value()) return;
  const Finding& f = **outcome;
  r.set_status(v1::RULE_STATUS_ISSUES_FOUND);
  r.set_message(f.message);
  r.set_worker(f.worker);
  r.set_observed(f.observed);
  r.set_threshold(f.threshold);
  r.clear_tensors();
  for (const auto& t : f.tensors) r.add_tensors(t);
  if (step != nullptr) {
    r.set_step(step->step);
    r.set_mode(step->mode);
    r.set_mode_step(step->mode_step);
  }
  for (const std::string& action : inst.spec.actions()) {
    if (action != "StopTraining") continue;
    v1::Action a;
    a.set_type(v1::ACTION_STOP_TRAINING);
    a.set_rule(inst.spec.name());
    a.set_reason(f.message);
    a.set_step(r.step());
    out.actions.push_back(a);
    r.add_actions_taken(action);
  }
  Publish(inst, out);
}

void RuleRunner::EvaluateStep(const StepData& step) {
  Outbox out;
  for (Instance& inst : instances_) {
    if (IsFinal(inst.result.status())) continue;
    auto outcome = inst.rule->OnStep(step);
    inst.result.set_steps_evaluated(inst.result.steps_evaluated() + 1);
    const v1::RuleStatus before = inst.result.status();
    Conclude(inst, outcome, &step, out);
    if (inst.result.status() == before) {
      inst.result.set_step(step.step);
      inst.result.set_mode(step.mode);
      inst.result.set_mode_step(step.mode_step);
      if (inst.result.steps_evaluated() == 1 ||
          inst.result.steps_evaluated() % kProgressEvery == 0) {
        inst.result.set_message(absl::StrCat("evaluated ", inst.result.steps_evaluated(),
                                             " steps, no issues so far"));
        Publish(inst, out);
      }
    }
  }
  Flush(out);
}

void RuleRunner::EvaluateJobEnd() {
  Outbox out;
  for (Instance& inst : instances_) {
    if (IsFinal(inst.result.status())) continue;
    auto outcome = inst.rule->OnJobEnd();
    Conclude(inst, outcome, nullptr, out);
    if (!IsFinal(inst.result.status())) {
      inst.result.set_status(v1::RULE_STATUS_NO_ISSUES_FOUND);
      inst.result.set_message(absl::StrCat("no issues found in ",
                                           inst.result.steps_evaluated(), " steps"));
      Publish(inst, out);
    }
  }
  Flush(out);
}

}  // namespace sonde::rules
