// Who watches which job: the sinks of open WatchRuleResults and WatchSteps
// calls, told of each rule result, delivered step and the job's end as it
// happens. Push, not polling: an idle watch costs its sink's memory and an
// entry here, no thread.
//
// Lock order: JobRegistry's mu_ (held while steps are published), then
// Watchers::mu_, then a sink's own lock. Sinks' callbacks run under
// Watchers::mu_ and must neither block nor call into the registry.
// Thread-safe.
#ifndef SONDE_SERVER_WATCHERS_H_
#define SONDE_SERVER_WATCHERS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "proto/rule.pb.h"
#include "rules/rule.h"

namespace sonde::server {

class WatchSink {
 public:
  virtual ~WatchSink() = default;
  // A rule result of the job was stored (or posted by an external rule).
  virtual void OnResult(const v1::RuleResult&) {}
  // A step of the job was delivered to its rules (every worker's part, or
  // the step wait ran out).
  virtual void OnStep(const rules::StepData&) {}
  // The job is no longer active (ended or disconnected, and its rules are
  // done): `final_results` are the results it ended with. May come more
  // than once.
  virtual void OnEnded(const std::vector<v1::RuleResult>& /*final_results*/) {}
  // The collector is shutting down.
  virtual void OnClosing() {}
};

class Watchers {
 public:
  // `sink` hears of `job` until Remove(returned id); it must outlive that.
  uint64_t Add(const std::string& job, WatchSink* sink);
  // After it returns no callback of that sink runs or will run.
  void Remove(uint64_t id);
  bool Watched(const std::string& job) const;
  size_t size() const;

  void PublishResult(const std::string& job, const v1::RuleResult& result);
  void PublishStep(const std::string& job, const rules::StepData& step);
  void PublishEnded(const std::string& job, const std::vector<v1::RuleResult>& final_results);
  // Tells every sink the collector is closing; later Adds are told at once.
  void CloseAll();

 private:
  template <typename Fn>
  void ForJob(const std::string& job, Fn fn) ABSL_LOCKS_EXCLUDED(mu_);

  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  // job -> (id -> sink), ordered by id so sinks hear in the order they came.
  absl::flat_hash_map<std::string, std::map<uint64_t, WatchSink*>> by_job_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::string> job_of_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sonde::server

#endif  // SONDE_SERVER_WATCHERS_H_
