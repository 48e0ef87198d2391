#include "server/job_record.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/status_macros.h"

namespace sonde::server {

bool IsFinished(v1::JobStatus status) {
  return status == v1::JOB_STATUS_FINISHED || status == v1::JOB_STATUS_STOPPED;
}

std::vector<int32_t> MissingWorkers(const google::protobuf::RepeatedField<int32_t>& present,
                                    int32_t world_size) {
  const std::set<int32_t> have(present.begin(), present.end());
  std::vector<int32_t> missing;
  for (int32_t w = 0; w < world_size; ++w) {
    if (have.count(w) == 0) missing.push_back(w);
  }
  return missing;
}

bool AllWorkersEnded(const v1::JobInfo& info) {
  const std::set<int32_t> ended(info.ended_workers().begin(), info.ended_workers().end());
  return static_cast<int64_t>(ended.size()) >= std::max(info.world_size(), 1);
}

bool StepStoredAlready(const v1::JobInfo& info, int32_t worker, int64_t step) {
  auto stored = info.worker_last_step().find(worker);
  return stored != info.worker_last_step().end() && step <= stored->second;
}

void AddStep(v1::JobInfo& info, int32_t worker, const v1::StepInfo& step,
             uint64_t steps_dropped) {
  v1::ModeSteps* mode_steps = nullptr;
  for (v1::ModeSteps& m : *info.mutable_modes()) {
    if (m.mode() == step.mode()) mode_steps = &m;
  }
  if (mode_steps == nullptr) {
    mode_steps = info.add_modes();
    mode_steps->set_mode(step.mode());
    mode_steps->set_first_step(step.mode_step());
    mode_steps->set_last_step(step.mode_step() - 1);
  }
  if (step.mode_step() > mode_steps->last_step()) {
    mode_steps->set_last_step(step.mode_step());
    mode_steps->set_step_count(mode_steps->step_count() + 1);
  }
  mode_steps->set_first_step(std::min(mode_steps->first_step(), step.mode_step()));
  info.set_last_step(std::max(info.last_step(), step.step()));
  (*info.mutable_worker_last_step())[worker] = step.step();
  info.set_tensors_dropped(info.tensors_dropped() + step.tensors_dropped());
  info.set_values_dropped(info.values_dropped() + step.values_dropped());
  info.set_steps_dropped(info.steps_dropped() + steps_dropped);
}

void TakeStepFields(const v1::JobInfo& from, v1::JobInfo& into) {
  *into.mutable_modes() = from.modes();
  into.set_last_step(from.last_step());
  for (const auto& [worker, step] : from.worker_last_step()) {
    (*into.mutable_worker_last_step())[worker] = step;
  }
  into.set_tensors_dropped(from.tensors_dropped());
  into.set_values_dropped(from.values_dropped());
  into.set_steps_dropped(from.steps_dropped());
}

v1::JobInfo CopyForWorker(v1::JobInfo& info, int32_t worker) {
  google::protobuf::Map<int32_t, int64_t> last_steps;
  google::protobuf::Map<int32_t, uint64_t> clients;
  google::protobuf::RepeatedField<int32_t> joined;
  google::protobuf::RepeatedField<int32_t> ended;
  auto swap_out = [&] {
    last_steps.swap(*info.mutable_worker_last_step());
    clients.swap(*info.mutable_worker_client_id());
    joined.Swap(info.mutable_workers());
    ended.Swap(info.mutable_ended_workers());
  };
  swap_out();
  v1::JobInfo copy = info;
  swap_out();  // back
  // Sorted lists: a binary search each.
  if (std::binary_search(info.workers().begin(), info.workers().end(), worker)) {
    copy.add_workers(worker);
  }
  if (std::binary_search(info.ended_workers().begin(), info.ended_workers().end(), worker)) {
    copy.add_ended_workers(worker);
  }
  if (auto it = info.worker_last_step().find(worker); it != info.worker_last_step().end()) {
    (*copy.mutable_worker_last_step())[worker] = it->second;
  }
  if (auto it = info.worker_client_id().find(worker); it != info.worker_client_id().end()) {
    (*copy.mutable_worker_client_id())[worker] = it->second;
  }
  return copy;
}

void AddWorkerEnd(v1::JobInfo& info, int32_t worker, const std::string& reason,
                  uint64_t steps_dropped) {
  auto* ended = info.mutable_ended_workers();
  if (std::find(ended->begin(), ended->end(), worker) != ended->end()) {
    return;  // a job end applied again (a cluster node replaying its log): counted once
  }
  info.add_ended_workers(worker);
  std::sort(ended->begin(), ended->end());
  if (!reason.empty()) info.set_end_reason(reason);
  info.set_steps_dropped(info.steps_dropped() + steps_dropped);
}

namespace {

const std::string& RuleName(const v1::RuleSpec& spec) {
  return spec.name().empty() ? spec.rule_type() : spec.name();
}

}  // namespace

std::vector<v1::RuleSpec> RulesForJob(const std::vector<v1::RuleSpec>& defaults,
                                      const google::protobuf::RepeatedPtrField<v1::RuleSpec>& own,
                                      std::vector<std::string>* warnings) {
  std::vector<v1::RuleSpec> specs;
  for (const v1::RuleSpec& d : defaults) {
    const bool replaced = std::any_of(own.begin(), own.end(), [&](const v1::RuleSpec& r) {
      return RuleName(r) == RuleName(d);
    });
    if (replaced) {
      warnings->push_back(absl::StrCat("rule '", RuleName(d),
                                       "': this job's spec replaces the collector's default"));
      continue;
    }
    specs.push_back(d);
  }
  specs.insert(specs.end(), own.begin(), own.end());
  return specs;
}

v1::JobInfo StartRegistered(const v1::JobInfo& registered, const v1::JobInfo& fresh) {
  v1::JobInfo started = fresh;
  started.set_job_id(registered.job_id());
  *started.mutable_rules() = registered.rules();
  for (const v1::RuleSpec& s : fresh.rules()) {
    const bool taken = std::any_of(registered.rules().begin(), registered.rules().end(),
                                   [&](const v1::RuleSpec& t) { return t.name() == s.name(); });
    if (!taken) *started.add_rules() = s;
  }
  return started;
}

std::optional<v1::Action> StopDecided(const std::vector<v1::RuleResult>& results) {
  for (const v1::RuleResult& r : results) {
    if (r.status() != v1::RULE_STATUS_ISSUES_FOUND) continue;
    for (const std::string& a : r.actions_taken()) {
      if (a != "StopTraining") continue;
      v1::Action stop;
      stop.set_type(v1::ACTION_STOP_TRAINING);
      stop.set_rule(r.rule());
      stop.set_reason(r.message());
      stop.set_step(r.step());
      *stop.mutable_verdict() = r;
      return stop;
    }
  }
  return std::nullopt;
}

void AttachWorker(v1::JobInfo& info, int32_t worker, uint64_t client_id) {
  auto owner = info.worker_client_id().find(worker);
  // The client whose job end was counted, back after a lost ack: it only
  // resends what it sent before, that end included, which must count once
  // (its dropped steps would count twice). Another client, or one without
  // an id (it cannot be told from a new one), starts a new session.
  const bool resending_end =
      client_id != 0 && owner != info.worker_client_id().end() && owner->second == client_id;
  (*info.mutable_worker_client_id())[worker] = client_id;
  auto* ended = info.mutable_ended_workers();
  if (!resending_end) {
    ended->erase(std::remove(ended->begin(), ended->end(), worker), ended->end());
  }
  auto* workers = info.mutable_workers();
  if (std::find(workers->begin(), workers->end(), worker) == workers->end()) {
    info.add_workers(worker);
    std::sort(workers->begin(), workers->end());
  }
  info.set_status(v1::JOB_STATUS_RUNNING);
  info.set_end_unix_micros(0);
}

int64_t WorkerLastStep(const v1::JobInfo& info, int32_t worker) {
  auto it = info.worker_last_step().find(worker);
  return it == info.worker_last_step().end() ? -1 : it->second;
}

absl::Status ValidateHello(const v1::Hello& hello) {
  SONDE_RETURN_IF_ERROR(ValidateJobName(hello.job()));
  if (hello.world_size() < 1 || hello.world_size() > 65536) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size must be 1 to 65536, got ", hello.world_size()));
  }
  if (hello.worker() < 0 || hello.worker() >= hello.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("worker ", hello.worker(),
                                                   " is outside world_size ",
                                                   hello.world_size()));
  }
  return absl::OkStatus();
}

absl::Status CheckJoinable(const v1::JobInfo& info, const v1::Hello& hello) {
  if (IsFinished(info.status())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", hello.job(), "' has already finished; use a new job name"));
  }
  if (info.world_size() != hello.world_size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", hello.job(), "' has world_size ", info.world_size(),
                     ", hello says ", hello.world_size()));
  }
  return absl::OkStatus();
}

}  // namespace sonde::server
