#include "server/step_assembler.h"

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

namespace sonde::server {

void StepAssembler::Restore(std::map<int64_t, rules::StepData> pending,
                            int64_t delivered_through, absl::Time now) {
  delivered_through_ = delivered_through;
  for (const auto& [step, data] : pending) pending_since_[step] = now;
  pending_ = std::move(pending);
}

void StepAssembler::Attach(int32_t worker, int64_t last_step) { last_step_[worker] = last_step; }

void StepAssembler::Detach(int32_t worker, const Deliver& deliver) {
  last_step_.erase(worker);
  DeliverComplete(deliver);
}

rules::StepData* StepAssembler::PartOf(const v1::StepInfo& step, absl::Time now) {
  if (step.step() <= delivered_through_) return nullptr;
  auto [it, added] = pending_.try_emplace(step.step());
  if (added) {
    pending_since_[step.step()] = now;
    it->second.step = step.step();
    it->second.mode = step.mode();
    it->second.mode_step = step.mode_step();
  }
  return &it->second;
}

void StepAssembler::Committed(int32_t worker, int64_t step, const Deliver& deliver) {
  auto it = last_step_.find(worker);
  if (it != last_step_.end()) it->second = std::max(it->second, step);
  DeliverComplete(deliver);
}

void StepAssembler::DeliverOverdue(absl::Time now, absl::Duration wait, const Deliver& deliver) {
  while (!pending_.empty() && now - pending_since_[pending_.begin()->first] >= wait) {
    const int64_t step = pending_.begin()->first;
    std::vector<int32_t> missing;
    for (const auto& [worker, last] : last_step_) {
      if (last < step) missing.push_back(worker);
    }
    DeliverFirst(std::move(missing), deliver);
  }
}

void StepAssembler::DeliverAll(const Deliver& deliver) {
  last_step_.clear();
  DeliverComplete(deliver);
}

void StepAssembler::Clear() {
  pending_.clear();
  pending_since_.clear();
  last_step_.clear();
  delivered_through_ = -1;
}

void StepAssembler::DeliverComplete(const Deliver& deliver) {
  int64_t complete_through = std::numeric_limits<int64_t>::max();
  for (const auto& [worker, step] : last_step_) {
    complete_through = std::min(complete_through, step);
  }
  while (!pending_.empty() && pending_.begin()->first <= complete_through) {
    DeliverFirst({}, deliver);
  }
}

void StepAssembler::DeliverFirst(std::vector<int32_t> missing, const Deliver& deliver) {
  auto it = pending_.begin();
  it->second.missing_workers = std::move(missing);
  delivered_through_ = it->first;
  rules::StepData step = std::move(it->second);
  pending_since_.erase(it->first);
  pending_.erase(it);
  deliver(std::move(step));
}

}  // namespace sonde::server
