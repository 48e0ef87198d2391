#include "server/step_assembler.h"

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

namespace sonde::server {

void StepAssembler::Restore(std::map<int64_t, rules::StepData> pending,
                            int64_t delivered_through, absl::Time now) {
  delivered_through_ = delivered_through;
  for (const auto& [step, data] : pending) {
    pending_since_[step] = now;
    restored_.insert(step);
  }
  pending_ = std::move(pending);
}

void StepAssembler::Attach(int32_t worker, int64_t last_step) {
  known_.insert(worker);
  auto [it, added] = last_step_.try_emplace(worker, last_step);
  if (!added) {
    last_steps_.erase(last_steps_.find(it->second));
    it->second = last_step;
  }
  last_steps_.insert(last_step);
}

void StepAssembler::Detach(int32_t worker, const Deliver& deliver) {
  auto it = last_step_.find(worker);
  if (it != last_step_.end()) {
    last_steps_.erase(last_steps_.find(it->second));
    last_step_.erase(it);
  }
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
  if (pending_.count(step) > 0) committed_by_[step].insert(worker);
  auto it = last_step_.find(worker);
  if (it != last_step_.end() && step > it->second) {
    last_steps_.erase(last_steps_.find(it->second));
    it->second = step;
    last_steps_.insert(step);
  }
  DeliverComplete(deliver);
}

void StepAssembler::DeliverOverdue(absl::Time now, absl::Duration wait, const Deliver& deliver) {
  while (!pending_.empty() && now - pending_since_[pending_.begin()->first] >= wait) {
    DeliverFirst(deliver);
  }
}

void StepAssembler::DeliverAll(const Deliver& deliver) {
  last_step_.clear();
  last_steps_.clear();
  DeliverComplete(deliver);
}

void StepAssembler::Clear() {
  pending_.clear();
  pending_since_.clear();
  committed_by_.clear();
  restored_.clear();
  known_.clear();
  last_step_.clear();
  last_steps_.clear();
  delivered_through_ = -1;
}

void StepAssembler::DeliverComplete(const Deliver& deliver) {
  const int64_t complete_through =
      last_steps_.empty() ? std::numeric_limits<int64_t>::max() : *last_steps_.begin();
  while (!pending_.empty() && pending_.begin()->first <= complete_through) {
    DeliverFirst(deliver);
  }
}

std::vector<int32_t> StepAssembler::MissingAt(int64_t step) const {
  std::vector<int32_t> missing;
  if (restored_.count(step) > 0) {
    for (const auto& [worker, last] : last_step_) {
      if (last < step) missing.push_back(worker);
    }
    return missing;
  }
  auto by = committed_by_.find(step);
  for (int32_t worker : known_) {
    if (by == committed_by_.end() || by->second.count(worker) == 0) missing.push_back(worker);
  }
  return missing;
}

void StepAssembler::DeliverFirst(const Deliver& deliver) {
  auto it = pending_.begin();
  const int64_t step = it->first;
  it->second.missing_workers = MissingAt(step);
  delivered_through_ = step;
  rules::StepData data = std::move(it->second);
  pending_since_.erase(step);
  committed_by_.erase(step);
  restored_.erase(step);
  pending_.erase(it);
  deliver(std::move(data));
}

}  // namespace sonde::server
