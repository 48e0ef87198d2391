#include "rules/rule_runner.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/dtype.h"
#include "common/metrics/metrics.h"
#include "common/names.h"
#include "common/status_macros.h"

namespace sonde::rules {
namespace {

// InProgress results are republished this often (in evaluated steps), so
// readers see progress without a write per step per rule.
constexpr int64_t kProgressEvery = 50;
// A rule that keeps judging after an issue republishes its verdict at most
// this often.
constexpr absl::Duration kRepublishEvery = absl::Seconds(1);

// Operators' view of every runner in the process (metrics::Registry::Default()).
struct RuleMetrics {
  metrics::Family<metrics::Histogram>* evaluation_seconds;
  metrics::Counter* results[v1::RuleStatus_ARRAYSIZE] = {};
  metrics::Counter* actions[v1::ActionType_ARRAYSIZE] = {};
  metrics::Gauge* steps_queued;
};

const RuleMetrics& Metrics() {
  static const RuleMetrics* const m = [] {
    metrics::Registry& r = metrics::Registry::Default();
    auto* out = new RuleMetrics();
    out->evaluation_seconds = r.AddHistogramFamily(
        "sonde_rule_evaluation_seconds",
        "Time one rule took to judge one step, a clock tick or the end of training, by rule "
        "type.",
        metrics::LatencyBuckets(), {"rule_type"});
    auto* results = r.AddCounterFamily(
        "sonde_rule_results_total",
        "Rule results published (stored and shown to watchers), by status; InProgress ones "
        "are progress reports, and a profiler rule still finding its issue republishes its "
        "IssuesFound verdict at most once a second.",
        {"status"});
    for (int s = v1::RULE_STATUS_IN_PROGRESS; s <= v1::RuleStatus_MAX; ++s) {
      const auto status = static_cast<v1::RuleStatus>(s);
      out->results[s] = results->Get({std::string(RuleStatusName(status))});
    }
    out->results[v1::RULE_STATUS_UNSPECIFIED] = results->Get({"Unspecified"});
    auto* actions = r.AddCounterFamily(
        "sonde_rule_actions_total",
        "Actions the collector's rules fired, by type (StopTraining, Log, Webhook, Email).",
        {"type"});
    const char* kActionNames[] = {"Unspecified", "StopTraining", "Log", "Webhook", "Email"};
    for (int a = 0; a < v1::ActionType_ARRAYSIZE; ++a) {
      out->actions[a] = actions->Get({a < 5 ? kActionNames[a] : "Other"});
    }
    out->steps_queued = r.AddGauge(
        "sonde_rule_steps_queued",
        "Steps handed to rules and not yet evaluated, summed over every rule of every job.");
    return out;
  }();
  return *m;
}

void CountPublished(const v1::RuleResult& result, const std::vector<v1::Action>& actions) {
  const RuleMetrics& m = Metrics();
  if (v1::RuleStatus_IsValid(result.status())) m.results[result.status()]->Increment();
  for (const v1::Action& a : actions) {
    if (v1::ActionType_IsValid(a.type())) m.actions[a.type()]->Increment();
  }
}

// An evaluation found `f`: it counts, and its details replace the verdict's
// (the first issue's, and each later one of a rule that keeps judging).
void RecordFinding(const Finding& f, v1::RuleResult& r) {
  r.set_times_triggered(r.times_triggered() + 1);
  r.set_message(f.message);
  r.set_worker(f.worker);
  if (f.step.has_value()) r.set_step(*f.step);
  r.set_observed(f.observed);
  r.set_threshold(f.threshold);
  r.clear_tensors();
  for (const auto& t : f.tensors) r.add_tensors(t);
}

}  // namespace

bool IsFinal(v1::RuleStatus status) {
  return status == v1::RULE_STATUS_ISSUES_FOUND ||
         status == v1::RULE_STATUS_NO_ISSUES_FOUND || status == v1::RULE_STATUS_ERROR ||
         status == v1::RULE_STATUS_STOPPED;
}

absl::StatusOr<std::unique_ptr<RuleRunner>> RuleRunner::Create(
    std::string job, const std::vector<v1::RuleSpec>& specs,
    const std::vector<v1::RuleResult>& previous, const RuleFactory& factory, ThreadPool* pool,
    RuleSink* sink, RuleBudget budget) {
  std::unique_ptr<RuleRunner> runner(new RuleRunner(std::move(job), sink, budget));
  for (const v1::RuleSpec& raw : specs) {
    SONDE_ASSIGN_OR_RETURN(v1::RuleSpec spec, NormalizeRuleSpec(raw));
    for (const auto& other : runner->instances_) {
      if (other->spec.name() == spec.name()) {
        return absl::InvalidArgumentError(
            absl::StrCat("two rules are named '", spec.name(), "'"));
      }
    }
    auto inst = std::make_unique<Instance>();
    SONDE_ASSIGN_OR_RETURN(inst->rule, factory.Create(spec));
    if (const RuleInfo* info = factory.Find(spec.rule_type())) {
      inst->suggestion = info->suggestion;
    }
    inst->spec = spec;
    inst->result.set_job(runner->job_);
    inst->result.set_rule(spec.name());
    inst->result.set_rule_type(spec.rule_type());
    inst->result.set_status(v1::RULE_STATUS_IN_PROGRESS);
    inst->result.set_step(-1);
    for (const v1::RuleResult& p : previous) {
      if (p.rule() != spec.name()) continue;
      inst->result = p;
      if (p.status() == v1::RULE_STATUS_IN_PROGRESS) inst->cursor = p.step();
    }
    inst->strand = std::make_unique<Strand>(pool);
    inst->evaluation_seconds = Metrics().evaluation_seconds->Get({spec.rule_type()});
    runner->wants_profile_ = runner->wants_profile_ || inst->rule->WantsProfile();
    runner->instances_.push_back(std::move(inst));
  }
  absl::MutexLock lock(&runner->mu_);
  for (const auto& inst : runner->instances_) runner->snapshot_.push_back(inst->result);
  return runner;
}

RuleRunner::~RuleRunner() { Drain(); }

bool RuleRunner::Admit(size_t i) {
  Instance& inst = *instances_[i];
  if (inst.stopped_feeding.load()) return false;
  if (inst.backlog.fetch_add(1) + 1 <= budget_.max_backlog) return true;
  inst.stopped_feeding = true;
  inst.backlog.fetch_sub(1);
  // Reported from the strand, after what is queued has run.
  inst.strand->Post([this, i] {
    Instance& in = *instances_[i];
    if (IsFinal(in.result.status())) return;
    in.result.set_status(v1::RULE_STATUS_ERROR);
    in.result.set_message(absl::StrCat("rule fell more than ", budget_.max_backlog,
                                       " steps behind training (profiler batches count as "
                                       "steps); it is no longer fed"));
    Publish(i, {});
  });
  return false;
}

void RuleRunner::SubmitStep(StepData step) {
  auto shared = std::make_shared<const StepData>(std::move(step));
  for (size_t i = 0; i < instances_.size(); ++i) {
    if (!Admit(i)) continue;
    Metrics().steps_queued->Increment();
    instances_[i]->strand->Post([this, i, shared] {
      Evaluate(i, Input::Step(*shared));
      instances_[i]->backlog.fetch_sub(1);
      Metrics().steps_queued->Decrement();
    });
  }
}

void RuleRunner::SubmitJobEnd(std::optional<v1::Action> stopped_by) {
  for (size_t i = 0; i < instances_.size(); ++i) {
    instances_[i]->strand->Post(
        [this, i, stopped_by] { Evaluate(i, Input::JobEnd(stopped_by)); });
  }
}

void RuleRunner::Tick(absl::Time now) {
  for (size_t i = 0; i < instances_.size(); ++i) {
    Instance& inst = *instances_[i];
    if (!inst.rule->WantsTicks() || inst.stopped_feeding.load()) continue;
    inst.strand->Post([this, i, now] { Evaluate(i, Input::Tick(now)); });
  }
}

void RuleRunner::SubmitProfile(int32_t worker, v1::ProfileBatch batch) {
  std::shared_ptr<const ProfileData> shared;
  for (size_t i = 0; i < instances_.size(); ++i) {
    if (!instances_[i]->rule->WantsProfile() || !Admit(i)) continue;
    if (shared == nullptr) {
      shared = std::make_shared<const ProfileData>(ProfileData{worker, std::move(batch)});
    }
    instances_[i]->strand->Post([this, i, shared] {
      Evaluate(i, Input::Profile(*shared));
      instances_[i]->backlog.fetch_sub(1);
    });
  }
}

bool RuleRunner::WantsProfile() const { return wants_profile_; }

void RuleRunner::Drain() {
  for (size_t i = 0; i < instances_.size(); ++i) {
    // After what is queued: a verdict the once-a-second limit held back.
    instances_[i]->strand->Post([this, i] {
      if (instances_[i]->unpublished) Publish(i, {});
    });
    instances_[i]->strand->Drain();
  }
}

bool RuleRunner::WantsValues(const v1::TensorRecord& record) const {
  std::string key = record.tensor_name();
  for (const std::string& c : record.collections()) absl::StrAppend(&key, "\n", c);
  {
    absl::MutexLock lock(&wants_mu_);
    auto it = wants_values_.find(key);
    if (it != wants_values_.end()) return it->second;
  }
  bool wants = false;
  for (const auto& inst : instances_) wants = wants || inst->rule->WantsValues(record);
  absl::MutexLock lock(&wants_mu_);
  wants_values_[key] = wants;
  return wants;
}

std::vector<v1::RuleResult> RuleRunner::Results() const {
  absl::MutexLock lock(&mu_);
  return snapshot_;
}

void RuleRunner::Publish(size_t index, const std::vector<v1::Action>& actions) {
  Instance& inst = *instances_[index];
  inst.unpublished = false;
  inst.result.set_updated_unix_micros(absl::ToUnixMicros(absl::Now()));
  CountPublished(inst.result, actions);
  {
    absl::MutexLock lock(&mu_);
    snapshot_[index] = inst.result;
  }
  // The verdict is stored before its actions are taken: a collector killed
  // in between finds the final verdict on restart and does not act again
  // (at most once; a StopTraining still reaches workers that reconnect,
  // from the stored verdict).
  sink_->OnResult(inst.result);
  for (const v1::Action& a : actions) sink_->OnAction(a);
}

void RuleRunner::Evaluate(size_t index, const Input& input) {
  using Kind = Input::Kind;
  const StepData* const step = input.step;
  const ProfileData* const profile = input.profile;
  Instance& inst = *instances_[index];
  v1::RuleResult& r = inst.result;
  // A rule that keeps judging after its first issue stays IssuesFound.
  const bool rejudging =
      r.status() == v1::RULE_STATUS_ISSUES_FOUND && inst.rule->KeepsJudgingAfterIssue();
  if (IsFinal(r.status()) && !rejudging) return;
  if (rejudging && inst.stopped_feeding.load()) return;  // failed after its issue
  if (step != nullptr && step->step <= inst.cursor) {
    // Evaluated before a restart: rebuild the rule's state only.
    inst.rule->OnStep(*step).IgnoreError();
    return;
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<std::optional<Finding>> outcome = absl::InternalError("no input");
  switch (input.kind) {
    case Kind::kStep:
      outcome = inst.rule->OnStep(*step);
      break;
    case Kind::kProfile:
      outcome = inst.rule->OnProfile(*profile);
      break;
    case Kind::kTick:
      outcome = inst.rule->OnTick(input.tick);
      break;
    case Kind::kJobEnd:
      outcome = inst.rule->OnJobEnd();
      break;
  }
  const absl::Duration took = absl::Now() - start;
  inst.evaluation_seconds->ObserveDuration(took);
  if (step != nullptr) {
    r.set_steps_evaluated(r.steps_evaluated() + 1);
    if (!rejudging) {  // an IssuesFound verdict keeps the step of its issue
      r.set_step(step->step);
      r.set_mode(step->mode);
      r.set_mode_step(step->mode_step);
    }
  }
  if (profile != nullptr) {
    r.set_datapoints(r.datapoints() + profile->batch.snapshots_size() +
                     profile->batch.events_size());
  }
  // Only failures name where they happened: not built for every evaluation.
  auto where = [&]() -> std::string {
    if (step != nullptr) return absl::StrCat("step ", step->step);
    if (profile != nullptr) return absl::StrCat("profiler data of worker ", profile->worker);
    return input.kind == Kind::kTick ? "a clock tick" : "the end of training";
  };
  // A rule that fails after it found an issue keeps that verdict (it was
  // acted on), says why it stopped, and is not fed again.
  auto fail = [&](const std::string& why) {
    if (rejudging) {
      inst.stopped_feeding = true;
      r.set_message(absl::StrCat(r.message(), " (then ", why, "; it is no longer fed)"));
    } else {
      r.set_status(v1::RULE_STATUS_ERROR);
      r.set_message(why);
    }
    Publish(index, {});
  };
  if (!outcome.ok()) {
    fail(absl::StrCat("rule failed at ", where(), ": ", outcome.status().ToString()));
    return;
  }
  if (took > budget_.max_evaluation) {
    inst.stopped_feeding = true;
    fail(absl::StrCat("rule took ", absl::FormatDuration(took), " at ", where(),
                      ", over its budget of ", absl::FormatDuration(budget_.max_evaluation)));
    return;
  }
  const bool job_end = input.kind == Kind::kJobEnd;
  if (rejudging) {
    if (outcome->has_value()) {
      const Finding& f = **outcome;
      RecordFinding(f, r);
      if (!f.suggestion.empty()) r.set_suggestion(f.suggestion);
    }
    // The first issue's actions were taken; later ones only update the
    // verdict. Results() sees every update; the sink (the store, watchers)
    // at most once a second and at the end, so a rule that triggers at
    // every batch does not write at every batch.
    if (job_end || absl::Now() - absl::FromUnixMicros(r.updated_unix_micros()) >=
                       kRepublishEvery) {
      Publish(index, {});
    } else {
      inst.unpublished = true;  // Drain() publishes it
      absl::MutexLock lock(&mu_);
      snapshot_[index] = r;
    }
    return;
  }
  if (outcome->has_value()) {
    const Finding& f = **outcome;
    RecordFinding(f, r);
    r.set_status(v1::RULE_STATUS_ISSUES_FOUND);
    if (step != nullptr && !step->missing_workers.empty()) {
      r.set_message(absl::StrCat(f.message, " (step judged without worker",
                                 step->missing_workers.size() > 1 ? "s " : " ",
                                 absl::StrJoin(step->missing_workers, ", "),
                                 ", whose part of it had not arrived)"));
    }
    r.set_suggestion(f.suggestion.empty() ? inst.suggestion : f.suggestion);
    r.set_updated_unix_micros(absl::ToUnixMicros(absl::Now()));
    Publish(index, TakeActions(inst, f.stop_training, r));
    return;
  }
  RecordNoIssue(index, input);
}

std::vector<v1::Action> RuleRunner::TakeActions(const Instance& inst, bool stop_training,
                                                v1::RuleResult& r) {
  std::vector<std::string> wanted(inst.spec.actions().begin(), inst.spec.actions().end());
  if (stop_training && std::find(wanted.begin(), wanted.end(), "StopTraining") == wanted.end()) {
    wanted.push_back("StopTraining");  // the finding asks for it
  }
  std::vector<v1::Action> actions;
  for (const std::string& action : wanted) {
    r.add_actions_taken(action);
    v1::Action a;
    if (action == "StopTraining") {
      a.set_type(v1::ACTION_STOP_TRAINING);
    } else if (action == "Log") {
      a.set_type(v1::ACTION_LOG);
    } else if (absl::StartsWith(action, "Webhook:")) {
      a.set_type(v1::ACTION_WEBHOOK);
      a.set_target(action.substr(8));
    } else if (absl::StartsWith(action, "Email:")) {
      a.set_type(v1::ACTION_EMAIL);
      a.set_target(action.substr(6));
    } else {
      continue;  // NormalizeRuleSpec admits no other
    }
    actions.push_back(std::move(a));
  }
  for (v1::Action& a : actions) {
    a.set_rule(inst.spec.name());
    a.set_reason(r.message());
    a.set_step(r.step());
    *a.mutable_verdict() = r;  // with every action taken
  }
  return actions;
}

void RuleRunner::RecordNoIssue(size_t index, const Input& input) {
  Instance& inst = *instances_[index];
  v1::RuleResult& r = inst.result;
  switch (input.kind) {
    case Input::Kind::kTick:
      return;  // time passed, nothing found
    case Input::Kind::kProfile:
      // Progress, as for steps: now and then, so readers see data points grow.
      if (r.datapoints() ==
              input.profile->batch.snapshots_size() + input.profile->batch.events_size() ||
          ++inst.profile_evaluations % kProgressEvery == 0) {
        r.set_message(
            absl::StrCat("judged ", r.datapoints(), " profiler data points, no issues so far"));
        Publish(index, {});
      }
      return;
    case Input::Kind::kJobEnd:
      if (input.stopped_by.has_value()) {
        r.set_status(v1::RULE_STATUS_STOPPED);
        r.set_message(absl::StrCat("training was stopped by rule ", input.stopped_by->rule(),
                                   " at step ", input.stopped_by->step(), "; no issues found in ",
                                   r.steps_evaluated(), " steps until then"));
      } else {
        r.set_status(v1::RULE_STATUS_NO_ISSUES_FOUND);
        r.set_message(
            r.datapoints() > 0
                ? absl::StrCat("no issues found in ", r.datapoints(), " profiler data points")
                : absl::StrCat("no issues found in ", r.steps_evaluated(), " steps"));
        const std::string summary = inst.rule->Summary();
        if (!summary.empty()) r.set_message(absl::StrCat(r.message(), "; ", summary));
      }
      Publish(index, {});
      return;
    case Input::Kind::kStep:
      if (r.steps_evaluated() == 1 || r.steps_evaluated() % kProgressEvery == 0) {
        r.set_message(absl::StrCat("evaluated ", r.steps_evaluated(), " steps, no issues so far"));
        Publish(index, {});
      }
      return;
  }
}

}  // namespace sonde::rules
