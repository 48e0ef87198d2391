#include "server/watch_calls.h"

#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "server/job_record.h"
#include "server/watchers.h"

namespace sonde::server {
namespace {

// What both watches share: the reactor's lifetime, one write at a time,
// and the end. Subclasses say what to write next (NextLocked) and when
// nothing more will come (DoneLocked). gRPC calls (StartWrite, Finish)
// are made without mu_ held, so a reaction run inline cannot deadlock.
template <typename T>
class WatchCall : public grpc::ServerWriteReactor<T>, public WatchSink {
 public:
  explicit WatchCall(JobRegistry* registry) : registry_(registry) {}

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) gone_ = true;  // the client went away
    }
    Pump(true);
  }
  void OnCancel() override {
    {
      absl::MutexLock lock(&mu_);
      gone_ = true;
    }
    Pump(true);
  }
  void OnDone() override {
    // After Unwatch no WatchSink callback runs or will run.
    if (watch_id_ != 0) registry_->Unwatch(watch_id_);
    delete this;
  }
  void OnClosing() override {
    {
      absl::MutexLock lock(&mu_);
      // The collector is shutting down.
      EndLocked(grpc::Status::OK);
    }
    Pump(false);
  }

 protected:
  // The message to write next, taken from what is queued; false if none.
  // `may_block`: false when called from a WatchSink callback (under the
  // registry's and the watchers' locks), where nothing that reads the
  // store may be started.
  virtual bool NextLocked(T* out, bool may_block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  // Runs without mu_ on the message NextLocked gave, before it is written
  // (reading stored tensors). A status ends the call with it.
  virtual absl::Status Complete(T*) { return absl::OkStatus(); }
  // Nothing more will come: the call may end with OK.
  virtual bool DoneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;

  // The status the call ends with, from the one recorded by EndLocked.
  // Called when it ends, with no write or Complete in flight: what was
  // written is settled.
  virtual grpc::Status FinalStatusLocked(const grpc::Status& recorded)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return recorded;
  }

  void EndLocked(grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!end_.has_value()) end_ = std::move(status);
  }

  // The reactor is set up: events heard from now on may be written.
  // (Until then they are only queued: the state they are checked against
  // is not there yet.)
  void Start() {
    {
      absl::MutexLock lock(&mu_);
      started_ = true;
    }
    Pump(true);
  }

  // Starts the next write, or ends the call, if it is time to.
  void Pump(bool may_block) {
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      if (!started_ || finished_ || writing_) return;
      if (gone_) {
        finish = grpc::Status(grpc::StatusCode::CANCELLED, "the watcher went away");
      } else if (end_.has_value()) {
        finish = FinalStatusLocked(*end_);
      } else if (NextLocked(&out_, may_block)) {
        writing_ = true;
      } else if (DoneLocked()) {
        finish = grpc::Status::OK;
      } else {
        return;  // idle until something is published
      }
      if (finish.has_value()) finished_ = true;
    }
    if (finish.has_value()) {
      this->Finish(std::move(*finish));
      return;
    }
    absl::Status completed = Complete(&out_);
    if (!completed.ok()) {
      {
        absl::MutexLock lock(&mu_);
        writing_ = false;
        finished_ = true;
      }
      this->Finish(ToGrpcStatus(completed));
      return;
    }
    this->StartWrite(&out_);
  }

  JobRegistry* const registry_;
  uint64_t watch_id_ = 0;  // set once, before any callback can read it
  absl::Mutex mu_;

 private:
  T out_;  // the message being written; only the writer (writing_) touches it
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool gone_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> end_ ABSL_GUARDED_BY(mu_);
};

class RuleResultsWatch final : public WatchCall<v1::RuleResult> {
 public:
  RuleResultsWatch(JobRegistry* registry, const std::string& job) : WatchCall(registry) {
    // Watch before reading the current state so no change falls between.
    watch_id_ = registry_->Watch(job, this);
    absl::StatusOr<std::vector<v1::RuleResult>> current = registry_->RuleResults(job);
    const bool active = current.ok() && registry_->IsActive(job);
    {
      absl::MutexLock lock(&mu_);
      if (!current.ok()) {
        EndLocked(ToGrpcStatus(current.status()));
      } else {
        for (const v1::RuleResult& r : *current) EnqueueLocked(r);
        if (!active) ended_ = true;
      }
    }
    Start();
  }

  void OnResult(const v1::RuleResult& result) override {
    {
      absl::MutexLock lock(&mu_);
      EnqueueLocked(result);
    }
    Pump(false);
  }
  void OnEnded(const std::vector<v1::RuleResult>& final_results) override {
    {
      absl::MutexLock lock(&mu_);
      // A verdict can be stored before its notification is published:
      // the final results hold whatever was not heard yet.
      for (const v1::RuleResult& r : final_results) EnqueueLocked(r);
      ended_ = true;
    }
    Pump(false);
  }

 private:
  // Keeps only the newest unwritten result of each rule.
  void EnqueueLocked(const v1::RuleResult& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto sent = sent_.find(r.rule());
    if (sent != sent_.end() && sent->second >= r.updated_unix_micros()) return;
    auto [it, added] = pending_.try_emplace(r.rule(), r);
    if (added) {
      order_.push_back(r.rule());
    } else if (r.updated_unix_micros() >= it->second.updated_unix_micros()) {
      it->second = r;
    }
  }
  bool NextLocked(v1::RuleResult* out, bool /*may_block*/) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (order_.empty()) return false;
    auto it = pending_.find(order_.front());
    order_.pop_front();
    *out = std::move(it->second);
    pending_.erase(it);
    sent_[out->rule()] = out->updated_unix_micros();
    return true;
  }
  bool DoneLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ended_ && order_.empty();
  }

  std::map<std::string, int64_t> sent_ ABSL_GUARDED_BY(mu_);  // rule -> updated_unix_micros
  std::map<std::string, v1::RuleResult> pending_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> order_ ABSL_GUARDED_BY(mu_);  // rules of pending_, oldest first
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

v1::CompletedStep ToCompleted(const rules::StepData& d) {
  v1::CompletedStep c;
  c.set_step(d.step);
  c.set_mode(d.mode);
  c.set_mode_step(d.mode_step);
  for (const auto& t : d.tensors) *c.add_tensors() = t;
  for (int32_t w : d.missing_workers) c.add_missing_workers(w);
  return c;
}

class StepsWatch final : public WatchCall<v1::CompletedStep> {
 public:
  StepsWatch(JobRegistry* registry, storage::Store* store, const v1::WatchStepsRequest& request,
             const WatchOptions& options)
      : WatchCall(registry), store_(store), options_(options) {
    absl::Status status = Begin(request);
    if (!status.ok()) {
      absl::MutexLock lock(&mu_);
      EndLocked(ToGrpcStatus(status));
    }
    Start();
  }

  void OnStep(const rules::StepData& step) override {
    {
      absl::MutexLock lock(&mu_);
      if (queue_.size() >= options_.max_queued_steps) {
        // Its message says where to resume, once the write in flight (and
        // the parts it is cut in) is settled: FinalStatusLocked.
        EndLocked(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "fell behind"));
        fell_behind_ = true;
      } else {
        queue_.push_back(ToCompleted(step));
      }
    }
    Pump(false);
  }
  void OnEnded(const std::vector<v1::RuleResult>&) override {
    {
      // Steps are published under the registry's lock before a job can
      // turn inactive: every step is queued by now.
      absl::MutexLock lock(&mu_);
      ended_ = true;
    }
    Pump(false);
  }

 private:
  absl::Status Begin(const v1::WatchStepsRequest& request) {
    if (request.job().empty()) return absl::InvalidArgumentError("no job given");
    absl::StatusOr<v1::JobInfo> job = store_->GetJob(request.job());
    if (!job.ok()) return job.status();
    job_id_ = job->job_id();
    world_size_ = job->world_size();
    {
      // Before any step can be heard: what is at or below it is skipped.
      absl::MutexLock lock(&mu_);
      sent_through_ = request.from_step() - 1;
    }
    // Watch first, then list what is stored, so no step falls between.
    // (What is heard meanwhile is queued; nothing is written before
    // Start.)
    watch_id_ = registry_->Watch(request.job(), this);
    const bool live = registry_->IsActive(request.job());
    // Stored steps the rules have seen (all of them for a job not live here).
    const int64_t through = live ? registry_->DeliveredThrough(request.job())
                                 : std::numeric_limits<int64_t>::max();
    absl::StatusOr<std::vector<v1::StepInfo>> steps =
        store_->ListSteps(job_id_, v1::MODE_UNSPECIFIED);
    if (!steps.ok()) return steps.status();
    absl::MutexLock lock(&mu_);
    for (v1::StepInfo& s : *steps) {
      if (s.step() >= request.from_step() && s.step() <= through) backlog_.push_back(std::move(s));
    }
    if (!live) ended_ = true;
    return absl::OkStatus();
  }

  // The first step a new watch needs: the one after the last written, or
  // the one whose parts are still being written (its parts are all sent
  // again).
  int64_t ResumeStepLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return parts_.empty() ? sent_through_ + 1 : sent_through_;
  }
  grpc::Status FinalStatusLocked(const grpc::Status& recorded) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (fell_behind_) {
      return grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat("this watch fell more than ", options_.max_queued_steps,
                       " steps behind the job; watch again with from_step=", ResumeStepLocked(),
                       " to go on from the last step written"));
    }
    if (recorded.ok() && !parts_.empty()) {
      // The collector is shutting down between a step's parts.
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          absl::StrCat("the collector is shutting down in the middle of step ",
                                       sent_through_, "'s parts; watch again with from_step=",
                                       sent_through_, " for all of it"));
    }
    return recorded;
  }

  bool NextLocked(v1::CompletedStep* out, bool may_block) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!parts_.empty()) {
      // The rest of a step cut in parts (its tensors are in already, and
      // it is cut already: a part of one record past max_part_bytes stays
      // as it is, its `more` too).
      *out = std::move(parts_.front());
      parts_.pop_front();
      read_stored_ = false;
      is_part_ = true;
      return true;
    }
    if (next_backlog_ < backlog_.size()) {
      // Not from a sink callback: the store read would hold up ingest. The
      // write in flight (or Start) comes back for it.
      if (!may_block) return false;
      // Stored: its tensors are read in Complete, without the lock.
      const v1::StepInfo& s = backlog_[next_backlog_++];
      out->Clear();
      out->set_step(s.step());
      out->set_mode(s.mode());
      out->set_mode_step(s.mode_step());
      // As the rules were told, and as ListSteps says.
      for (int32_t w : MissingWorkers(s.workers(), world_size_)) out->add_missing_workers(w);
      sent_through_ = s.step();
      read_stored_ = true;
      is_part_ = false;
      return true;
    }
    while (!queue_.empty() && queue_.front().step() <= sent_through_) queue_.pop_front();
    if (queue_.empty()) return false;
    *out = std::move(queue_.front());
    queue_.pop_front();
    sent_through_ = out->step();
    read_stored_ = false;
    is_part_ = false;
    return true;
  }
  absl::Status Complete(v1::CompletedStep* out) override {
    bool read;
    bool part;
    {
      absl::MutexLock lock(&mu_);
      read = read_stored_;
      part = is_part_;
    }
    if (part) return absl::OkStatus();
    if (read) {
      absl::StatusOr<std::vector<v1::TensorRecord>> records =
          store_->TensorsAtStep(job_id_, out->mode(), out->mode_step());
      if (!records.ok()) return records.status();
      for (v1::TensorRecord& r : *records) *out->add_tensors() = std::move(r);
    }
    if (out->ByteSizeLong() > options_.max_part_bytes) Split(out);
    return absl::OkStatus();
  }
  // A step past a message's size goes in parts: `out` keeps the first, the
  // others are written next, before anything else.
  void Split(v1::CompletedStep* out) {
    std::deque<v1::CompletedStep> parts;
    auto start_part = [&] {
      v1::CompletedStep& p = parts.emplace_back();
      p.set_step(out->step());
      p.set_mode(out->mode());
      p.set_mode_step(out->mode_step());
      p.set_more(true);
      return &p;
    };
    v1::CompletedStep* part = start_part();
    size_t bytes = 0;
    for (v1::TensorRecord& r : *out->mutable_tensors()) {
      const size_t size = r.ByteSizeLong() + 6;
      if (bytes + size > options_.max_part_bytes && part->tensors_size() > 0) {
        part = start_part();
        bytes = 0;
      }
      bytes += size;
      *part->add_tensors() = std::move(r);
    }
    *part->mutable_missing_workers() = std::move(*out->mutable_missing_workers());
    part->set_more(false);
    *out = std::move(parts.front());
    parts.pop_front();
    absl::MutexLock lock(&mu_);
    for (auto it = parts.rbegin(); it != parts.rend(); ++it) parts_.push_front(std::move(*it));
  }
  bool DoneLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ended_ && parts_.empty() && next_backlog_ == backlog_.size() && queue_.empty();
  }

  storage::Store* const store_;
  const WatchOptions options_;
  uint64_t job_id_ = 0;
  int32_t world_size_ = 1;  // the job's when the watch began: its stored steps' workers
  std::vector<v1::StepInfo> backlog_ ABSL_GUARDED_BY(mu_);  // stored steps to send first
  size_t next_backlog_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<v1::CompletedStep> queue_ ABSL_GUARDED_BY(mu_);  // delivered, not yet written
  std::deque<v1::CompletedStep> parts_ ABSL_GUARDED_BY(mu_);  // of the step being written
  int64_t sent_through_ ABSL_GUARDED_BY(mu_) = -1;
  bool read_stored_ ABSL_GUARDED_BY(mu_) = false;  // the message being written needs its tensors
  bool fell_behind_ ABSL_GUARDED_BY(mu_) = false;  // ended for max_queued_steps
  bool is_part_ ABSL_GUARDED_BY(mu_) = false;      // it is a later part of a step split already
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

grpc::ServerWriteReactor<v1::RuleResult>* NewRuleResultsWatch(JobRegistry* registry,
                                                               const std::string& job) {
  if (job.empty()) {
    return new RefusedWrite<v1::RuleResult>(
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no job given"));
  }
  return new RuleResultsWatch(registry, job);
}

grpc::ServerWriteReactor<v1::CompletedStep>* NewStepsWatch(JobRegistry* registry,
                                                            storage::Store* store,
                                                            const v1::WatchStepsRequest& request,
                                                            const WatchOptions& options) {
  return new StepsWatch(registry, store, request, options);
}

}  // namespace sonde::server
