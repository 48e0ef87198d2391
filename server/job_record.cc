#include "server/job_record.h"

#include <algorithm>
#include <set>

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
  *into.mutable_worker_last_step() = from.worker_last_step();
  into.set_tensors_dropped(from.tensors_dropped());
  into.set_values_dropped(from.values_dropped());
  into.set_steps_dropped(from.steps_dropped());
}

void AddWorkerEnd(v1::JobInfo& info, int32_t worker, const std::string& reason,
                  uint64_t steps_dropped) {
  auto* ended = info.mutable_ended_workers();
  if (std::find(ended->begin(), ended->end(), worker) == ended->end()) {
    info.add_ended_workers(worker);
    std::sort(ended->begin(), ended->end());
  }
  if (!reason.empty()) info.set_end_reason(reason);
  info.set_steps_dropped(info.steps_dropped() + steps_dropped);
}

}  // namespace sonde::server
