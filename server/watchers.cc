#include "server/watchers.h"

namespace sonde::server {

uint64_t Watchers::Add(const std::string& job, WatchSink* sink) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  by_job_[job][id] = sink;
  job_of_[id] = job;
  if (closing_) sink->OnClosing();
  return id;
}

void Watchers::Remove(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = job_of_.find(id);
  if (it == job_of_.end()) return;
  auto job = by_job_.find(it->second);
  job->second.erase(id);
  if (job->second.empty()) by_job_.erase(job);
  job_of_.erase(it);
}

bool Watchers::Watched(const std::string& job) const {
  absl::MutexLock lock(&mu_);
  return by_job_.contains(job);
}

size_t Watchers::size() const {
  absl::MutexLock lock(&mu_);
  return job_of_.size();
}

template <typename Fn>
void Watchers::ForJob(const std::string& job, Fn fn) {
  absl::MutexLock lock(&mu_);
  auto it = by_job_.find(job);
  if (it == by_job_.end()) return;
  for (auto& [id, sink] : it->second) fn(*sink);
}

void Watchers::PublishResult(const std::string& job, const v1::RuleResult& result) {
  ForJob(job, [&](WatchSink& s) { s.OnResult(result); });
}

void Watchers::PublishStep(const std::string& job, const rules::StepData& step) {
  ForJob(job, [&](WatchSink& s) { s.OnStep(step); });
}

void Watchers::PublishEnded(const std::string& job,
                            const std::vector<v1::RuleResult>& final_results) {
  ForJob(job, [&](WatchSink& s) { s.OnEnded(final_results); });
}

void Watchers::CloseAll() {
  absl::MutexLock lock(&mu_);
  closing_ = true;
  for (auto& [job, sinks] : by_job_) {
    for (auto& [id, sink] : sinks) sink->OnClosing();
  }
}

}  // namespace sonde::server
