#include "server/job_registry.h"

#include <algorithm>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "common/names.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "storage/keys.h"

namespace sonde::server {

struct JobRegistry::LiveJob {
  explicit LiveJob(absl::Mutex& registry_mu) : mu(registry_mu) {}
  // The registry's mu_, under which every field but commit_mu is read and
  // written. The analysis cannot see that a LiveJob found under mu_ shares
  // it, so each function that touches a job says so with AssertHeld (also
  // checked when it runs).
  absl::Mutex& mu;
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK(mu) { mu.AssertHeld(); }

  v1::JobInfo info ABSL_GUARDED_BY(mu);
  std::map<int32_t, StreamHandle*> streams ABSL_GUARDED_BY(mu);  // connected workers
  std::map<int32_t, uint64_t> stream_client ABSL_GUARDED_BY(mu);  // their Hello.client_id
  // When the last connected worker left (streams empty), for
  // worker_end_timeout_.
  absl::Time disconnected_since ABSL_GUARDED_BY(mu) = absl::InfiniteFuture();
  // When each worker's owner last stopped streaming (Leave), for the lease;
  // workers not in it count from when the job became live here.
  std::map<int32_t, absl::Time> owner_left ABSL_GUARDED_BY(mu);
  absl::Time live_since ABSL_GUARDED_BY(mu) = absl::Now();
  // Found unfinished in the store when the collector started (its workers
  // were gone by then), with no hello since: the worker-end timeout counts
  // from then, and ends it (rules included) if no worker comes back.
  std::optional<absl::Time> dormant_since ABSL_GUARDED_BY(mu);
  // Handed to the dormant thread to be ended (EndDormant replays its
  // steps, which may take long): the ticker leaves it alone meanwhile.
  bool ending_dormant ABSL_GUARDED_BY(mu) = false;
  StepAssembler steps ABSL_GUARDED_BY(mu);  // between the workers' commits and the rules
  std::unique_ptr<RuleActions> sink ABSL_GUARDED_BY(mu);
  std::unique_ptr<rules::RuleRunner> runner ABSL_GUARDED_BY(mu);
  std::optional<v1::Action> stop ABSL_GUARDED_BY(mu);
  // Per worker: the client and the last ProfileBatch.sequence fed to the rules.
  std::map<int32_t, std::pair<uint64_t, uint64_t>> profile_fed ABSL_GUARDED_BY(mu);
  // Serialises everything that writes this job's record or delivers steps,
  // so records are written in order and steps reach the rules in order.
  absl::Mutex commit_mu;
};

namespace {

int64_t NowMicros() { return absl::ToUnixMicros(absl::Now()); }

}  // namespace

JobRegistry::JobRegistry(storage::Store* store, ThreadPool* rule_pool,
                         const rules::RuleFactory* rule_factory,
                         std::vector<v1::RuleSpec> default_rules, absl::Duration step_wait,
                         Notifier* notifier)
    : store_(store),
      rule_pool_(rule_pool),
      rule_factory_(rule_factory),
      default_rules_(std::move(default_rules)),
      step_wait_(step_wait),
      notifier_(notifier) {
  ticker_ = std::thread([this] { TickLoop(); });
  dormant_ender_ = std::thread([this] { DormantLoop(); });
}

JobRegistry::~JobRegistry() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  ticker_.join();
  dormant_ender_.join();
  DrainRules();
}

void JobRegistry::TickLoop() {
  const absl::Duration tick =
      std::max(absl::Milliseconds(10), std::min(step_wait_ / 4, absl::Seconds(1)));
  while (true) {
    std::vector<LiveJob*> jobs;
    {
      absl::MutexLock lock(&mu_);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stop), tick)) return;
      for (auto& [name, job] : jobs_) {
        job->AssertHeld();
        // Being ended on the dormant thread, which holds its commit_mu for
        // as long as its replay takes: skipped, so other jobs keep ticking.
        // (Unless a hello revived it meanwhile: then it ticks as any job.)
        if (!job->ending_dormant || job->runner != nullptr) jobs.push_back(job.get());
      }
    }
    const absl::Time now = absl::Now();
    std::vector<std::string> ended;
    for (LiveJob* job : jobs) {
      absl::MutexLock commit(&job->commit_mu);
      absl::MutexLock lock(&mu_);
      job->AssertHeld();
      if (job->runner == nullptr) {
        if (job->dormant_since.has_value() && worker_end_timeout_ > absl::ZeroDuration() &&
            now - *job->dormant_since >= worker_end_timeout_ && !job->ending_dormant) {
          job->ending_dormant = true;
          dormant_queue_.push_back(job);
        }
        continue;
      }
      if (worker_end_timeout_ > absl::ZeroDuration() && job->streams.empty() &&
          job->info.status() == v1::JOB_STATUS_DISCONNECTED &&
          now - job->disconnected_since >= worker_end_timeout_) {
        const std::string reason = absl::StrCat(
            "workers ", absl::StrJoin(MissingWorkers(job->info.ended_workers(), job->info.world_size()), ","),
            " never sent their job end; ended after ", absl::FormatDuration(worker_end_timeout_),
            " with no worker connected (--worker_end_timeout)");
        LOG(WARNING) << "job '" << job->info.job() << "': " << reason;
        job->info.set_end_reason(reason);
        MaybeEndJobLocked(*job);
        ended.push_back(job->info.job());
        continue;
      }
      if (job->info.status() == v1::JOB_STATUS_RUNNING) job->runner->Tick(now);
      job->steps.DeliverOverdue(now, step_wait_, DeliverTo(*job));
    }
    for (const std::string& job : ended) PublishIfEnded(job);
  }
}

void JobRegistry::DormantLoop() {
  while (true) {
    LiveJob* job = nullptr;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !dormant_queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      job = dormant_queue_.front();
      dormant_queue_.pop_front();
    }
    std::vector<std::string> ended;
    EndDormant(*job, &ended);
    {
      absl::MutexLock lock(&mu_);
      job->AssertHeld();
      job->ending_dormant = false;
    }
    for (const std::string& name : ended) PublishIfEnded(name);
  }
}

absl::Status JobRegistry::RecordDroppedSteps(const std::string& job_name, uint64_t steps) {
  SONDE_ASSIGN_OR_RETURN(LiveJob * job, FindLive(job_name));
  absl::MutexLock commit(&job->commit_mu);
  absl::MutexLock lock(&mu_);
  job->AssertHeld();
  v1::JobInfo info = CopyForWorker(job->info, -1);
  info.set_steps_dropped(info.steps_dropped() + steps);
  SONDE_RETURN_IF_ERROR(store_->PutJob(info));
  job->info.set_steps_dropped(info.steps_dropped());
  return absl::OkStatus();
}

void JobRegistry::set_notification_gate(
    std::function<bool(const std::string& job, const v1::Action&)> gate) {
  absl::MutexLock lock(&mu_);
  notification_gate_ = std::move(gate);
}

void JobRegistry::PostNotification(const v1::Action& action) {
  if (notifier_ == nullptr) {
    LOG(WARNING) << "no notifier; verdict of " << action.rule() << " for " << action.target()
                 << " not sent";
    return;
  }
  notifier_->Post(action);
}

absl::Status JobRegistry::CheckRule(const v1::RuleSpec& spec) {
  SONDE_RETURN_IF_ERROR(rule_factory_->Create(spec).status());
  if (notifier_ == nullptr) return absl::OkStatus();
  {
    absl::MutexLock lock(&mu_);
    if (notification_gate_) return absl::OkStatus();
  }
  for (const std::string& action : spec.actions()) {
    absl::Status s = notifier_->CanDeliver(action);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("rule '", spec.name(), "': ", s.message()));
    }
  }
  return absl::OkStatus();
}

void JobRegistry::set_worker_lease(absl::Duration lease) {
  absl::MutexLock lock(&mu_);
  worker_lease_ = lease;
}

void JobRegistry::set_worker_end_timeout(absl::Duration timeout) {
  {
    absl::MutexLock lock(&mu_);
    worker_end_timeout_ = timeout;
  }
  if (timeout <= absl::ZeroDuration()) return;
  // Jobs left unfinished by an earlier collector: none of their workers is
  // connected now, so the timeout applies to them too.
  absl::StatusOr<std::vector<v1::JobInfo>> stored = store_->ListJobs();
  if (!stored.ok()) {
    LOG(ERROR) << "the worker-end timeout cannot see stored jobs: " << stored.status();
    return;
  }
  absl::MutexLock lock(&mu_);
  for (const v1::JobInfo& info : *stored) {
    if (info.status() != v1::JOB_STATUS_RUNNING &&
        info.status() != v1::JOB_STATUS_DISCONNECTED) {
      continue;
    }
    if (FindLocked(info.job()) != nullptr) continue;
    auto dormant = std::make_unique<LiveJob>(mu_);
    dormant->AssertHeld();
    dormant->info.set_job(info.job());
    dormant->dormant_since = absl::Now();
    jobs_[info.job()] = std::move(dormant);
  }
}

void JobRegistry::EndDormant(LiveJob& job, std::vector<std::string>* ended) {
  absl::MutexLock commit(&job.commit_mu);
  v1::Hello hello;
  {
    absl::MutexLock lock(&mu_);
    job.AssertHeld();
    if (job.runner != nullptr || !job.dormant_since.has_value()) return;  // a worker came back
    hello.set_job(job.info.job());
  }
  absl::StatusOr<v1::JobInfo> stored = store_->GetJob(hello.job());
  absl::Status s = stored.status();
  std::vector<std::string> warnings;
  if (s.ok()) {
    hello.set_world_size(stored->world_size());
    s = Activate(hello, job, &warnings);  // its rules, with its stored steps
  }
  absl::MutexLock lock(&mu_);
  job.AssertHeld();
  if (!s.ok()) {
    LOG(ERROR) << "job '" << hello.job() << "': cannot end it after the worker-end timeout: " << s;
    job.dormant_since.reset();  // not again
    return;
  }
  const std::string reason = absl::StrCat(
      "workers ", absl::StrJoin(MissingWorkers(job.info.ended_workers(), job.info.world_size()), ","),
      " never sent their job end; ended after ", absl::FormatDuration(worker_end_timeout_),
      " with no worker connected since the collector started (--worker_end_timeout)");
  LOG(WARNING) << "job '" << hello.job() << "': " << reason;
  job.info.set_end_reason(reason);
  MaybeEndJobLocked(job);
  ended->push_back(hello.job());
}

StepAssembler::Deliver JobRegistry::DeliverTo(LiveJob& job) {
  return [this, &job](rules::StepData step) {
    job.AssertHeld();  // job.steps calls this under mu_
    if (!step.missing_workers.empty()) {
      LOG(WARNING) << "job '" << job.info.job() << "': step " << step.step << " judged after "
                   << absl::FormatDuration(step_wait_) << " without "
                   << step.missing_workers.size() << " worker(s)";
    }
    watchers_.PublishStep(job.info.job(), step);
    job.runner->SubmitStep(std::move(step));
  };
}

bool JobRegistry::Activated(const LiveJob& job) {
  // Set and reset under the job's commit_mu and mu_: the caller holds the
  // first, so the answer holds until it lets go.
  absl::MutexLock lock(&mu_);
  job.AssertHeld();
  return job.runner != nullptr;
}

absl::StatusOr<JobRegistry::LiveJob*> JobRegistry::FindLive(const std::string& job_name) {
  absl::MutexLock lock(&mu_);
  LiveJob* job = FindLocked(job_name);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no live job '", job_name, "'"));
  return job;
}

JobRegistry::LiveJob* JobRegistry::FindLocked(const std::string& job) {
  auto it = jobs_.find(job);
  return it == jobs_.end() ? nullptr : it->second.get();
}

absl::StatusOr<JoinResult> JobRegistry::Join(const v1::Hello& hello, StreamHandle* stream) {
  SONDE_RETURN_IF_ERROR(ValidateHello(hello));
  LiveJob* job;
  {
    absl::MutexLock lock(&mu_);
    job = FindLocked(hello.job());
    if (job == nullptr) {
      auto fresh = std::make_unique<LiveJob>(mu_);
      job = fresh.get();
      jobs_[hello.job()] = std::move(fresh);
      job->AssertHeld();
      job->info.set_job(hello.job());
    }
  }
  absl::MutexLock commit(&job->commit_mu);
  JoinResult result;
  if (!Activated(*job)) {
    // First hello of this job since the collector started: load or create it.
    SONDE_RETURN_IF_ERROR(Activate(hello, *job, &result.warnings));
  }
  absl::MutexLock lock(&mu_);
  job->AssertHeld();
  SONDE_RETURN_IF_ERROR(CheckJoinable(job->info, hello));
  SONDE_ASSIGN_OR_RETURN(result.same_client, TakeWorkerLocked(*job, hello, stream));
  if (absl::Status stored = store_->PutJob(CopyForWorker(job->info, hello.worker()));
      !stored.ok()) {
    // The hello fails, so its session never leaves: the registry must not
    // keep the stream, which its owner may destroy at once.
    const int32_t worker = hello.worker();
    if (auto it = job->streams.find(worker); it != job->streams.end() && it->second == stream) {
      job->streams.erase(it);
      job->stream_client.erase(worker);
      job->steps.Detach(worker, DeliverTo(*job));
      if (job->streams.empty() && job->info.status() == v1::JOB_STATUS_RUNNING) {
        // As a stream that left: ended by the worker timeout if none comes.
        job->disconnected_since = absl::Now();
        job->info.set_status(v1::JOB_STATUS_DISCONNECTED);
      }
    }
    return stored;
  }
  result.ack.set_job_id(job->info.job_id());
  *result.ack.mutable_rules() = job->info.rules();
  for (const v1::RuleSpec& spec : job->info.rules()) {
    if (const rules::RuleInfo* info = rule_factory_->Find(spec.rule_type())) {
      for (auto& request : rules::CollectionRequestsFor(spec, *info)) {
        *result.ack.add_collections() = std::move(request);
      }
    }
  }
  result.stored_last_step = WorkerLastStep(job->info, hello.worker());
  // Only the client that stored the steps may take them as its own: another
  // would drop its unacknowledged steps as stored when they are not.
  result.ack.set_resume_step(result.same_client ? result.stored_last_step : -1);
  result.pending_stop = job->stop;
  return result;
}

absl::Status JobRegistry::Activate(const v1::Hello& hello, LiveJob& job,
                                   std::vector<std::string>* warnings) {
  v1::JobInfo fresh;
  fresh.set_job(hello.job());
  fresh.set_world_size(hello.world_size());
  fresh.set_status(v1::JOB_STATUS_RUNNING);
  fresh.set_start_unix_micros(NowMicros());
  fresh.set_last_step(-1);
  *fresh.mutable_metadata() = hello.metadata();
  for (const v1::RuleSpec& s : RulesForJob(default_rules_, hello.rules(), warnings)) {
    // Check each rule before anything is stored, so a bad hello leaves no trace.
    SONDE_ASSIGN_OR_RETURN(*fresh.add_rules(), rules::NormalizeRuleSpec(s));
    SONDE_RETURN_IF_ERROR(CheckRule(*fresh.rules().rbegin()));
  }
  SONDE_ASSIGN_OR_RETURN(v1::JobInfo info, store_->CreateJob(fresh));
  if (info.status() == v1::JOB_STATUS_PENDING) {
    // Registered by EnableRules: start it now, with its rules first.
    info = StartRegistered(info, fresh);
    SONDE_RETURN_IF_ERROR(store_->PutJob(info));
  }
  SONDE_RETURN_IF_ERROR(CheckJoinable(info, hello));
  SONDE_ASSIGN_OR_RETURN(std::vector<v1::RuleResult> previous,
                         store_->RuleResults(info.job_id()));
  RuleActions::Targets targets;
  targets.published = [this, job = hello.job()](const v1::RuleResult& r) { Notify(job, r); };
  targets.stop_training = [this, job = hello.job()](const v1::Action& a) { Broadcast(job, a); };
  {
    absl::MutexLock lock(&mu_);
    if (notification_gate_) {
      targets.may_post = [gate = notification_gate_, job = hello.job()](const v1::Action& a) {
        return gate(job, a);
      };
    }
  }
  auto sink = std::make_unique<RuleActions>(hello.job(), info.job_id(), store_, notifier_,
                                            std::move(targets));
  SONDE_ASSIGN_OR_RETURN(
      std::unique_ptr<rules::RuleRunner> runner,
      rules::RuleRunner::Create(hello.job(),
                                std::vector<v1::RuleSpec>(info.rules().begin(), info.rules().end()),
                                previous, *rule_factory_, rule_pool_, sink.get()));
  for (const v1::RuleResult& r : runner->Results()) {
    SONDE_RETURN_IF_ERROR(store_->PutRuleResult(info.job_id(), r));
  }
  std::map<int64_t, rules::StepData> pending;
  if (info.last_step() >= 0) {
    SONDE_ASSIGN_OR_RETURN(pending, Replay(info, *runner));
  }
  absl::MutexLock lock(&mu_);
  job.AssertHeld();
  // A stop decided before a restart still holds for workers that come back.
  if (!job.stop.has_value()) job.stop = StopDecided(previous);
  const int64_t delivered = info.last_step() < 0    ? -1
                            : pending.empty()        ? info.last_step()
                                                     : pending.begin()->first - 1;
  job.steps.Restore(std::move(pending), delivered, absl::Now());
  job.info = std::move(info);
  job.sink = std::move(sink);
  job.runner = std::move(runner);
  job.dormant_since.reset();
  // No worker streams yet: if the hello that activated the job is refused
  // (another client owns the worker), the job is disconnected from now,
  // so the worker-end timeout still applies to it. Taking the worker
  // makes it RUNNING again.
  job.disconnected_since = absl::Now();
  if (job.info.status() == v1::JOB_STATUS_RUNNING) job.info.set_status(v1::JOB_STATUS_DISCONNECTED);
  return absl::OkStatus();
}

absl::StatusOr<bool> JobRegistry::TakeWorkerLocked(LiveJob& job, const v1::Hello& hello,
                                                   StreamHandle* stream) {
  job.AssertHeld();
  const int32_t worker = hello.worker();
  auto streaming = job.streams.find(worker);
  if (streaming != job.streams.end()) {
    if (hello.client_id() == 0 || hello.client_id() != job.stream_client[worker]) {
      return absl::AlreadyExistsError(absl::StrCat("worker ", worker, " of job '", hello.job(),
                                                   "' is already streaming from another client"));
    }
    // The same client reconnected before its old stream was noticed gone.
    streaming->second->Abort(absl::AbortedError("replaced by a newer stream of the same client"));
  }
  auto owner = job.info.worker_client_id().find(worker);
  const bool owned = owner != job.info.worker_client_id().end() && owner->second != 0;
  if (owned && owner->second != hello.client_id() && streaming == job.streams.end()) {
    // Another client for a worker whose owner has not ended: only once the
    // owner's lease has lapsed, so two live clients never interleave their
    // steps (the owner's resent steps would meet the other's).
    const auto& ended = job.info.ended_workers();
    const bool owner_ended = std::find(ended.begin(), ended.end(), worker) != ended.end();
    auto left = job.owner_left.find(worker);
    const absl::Time since = left != job.owner_left.end() ? left->second : job.live_since;
    if (!owner_ended && absl::Now() - since < worker_lease_) {
      return absl::AlreadyExistsError(absl::StrCat(
          "worker ", worker, " of job '", hello.job(), "' belongs to another client (",
          absl::Hex(owner->second), "), whose stream went ",
          absl::FormatDuration(absl::Trunc(absl::Now() - since, absl::Milliseconds(1))),
          " ago; another client may take it over once that one has ended or after ",
          absl::FormatDuration(worker_lease_), " without it (--worker_lease)"));
    }
  }
  const bool same_client = hello.client_id() != 0 && owned && owner->second == hello.client_id();
  job.stream_client[worker] = hello.client_id();
  job.streams[worker] = stream;
  job.steps.Attach(worker, WorkerLastStep(job.info, worker));
  job.disconnected_since = absl::InfiniteFuture();
  AttachWorker(job.info, worker, hello.client_id());
  return same_client;
}

absl::StatusOr<std::map<int64_t, rules::StepData>> JobRegistry::Replay(
    const v1::JobInfo& info, rules::RuleRunner& runner) {
  // Steps every worker of the job has committed are complete.
  int64_t complete_through = info.workers_size() > 0 ? INT64_MAX : -1;
  for (int32_t w : info.workers()) {
    auto it = info.worker_last_step().find(w);
    complete_through = std::min(complete_through, it == info.worker_last_step().end()
                                                      ? int64_t{-1}
                                                      : it->second);
  }
  SONDE_ASSIGN_OR_RETURN(auto steps, store_->ListSteps(info.job_id(), v1::MODE_UNSPECIFIED));
  std::map<int64_t, rules::StepData> pending;
  int replayed = 0;
  for (const v1::StepInfo& s : steps) {
    rules::StepData data;
    data.step = s.step();
    data.mode = s.mode();
    data.mode_step = s.mode_step();
    SONDE_ASSIGN_OR_RETURN(auto records,
                           store_->TensorsAtStep(info.job_id(), s.mode(), s.mode_step()));
    for (v1::TensorRecord& r : records) {
      std::shared_ptr<const std::string> values;
      if (r.has_values() && runner.WantsValues(r)) {
        std::string bytes;
        SONDE_RETURN_IF_ERROR(
            store_
                ->ReadTensor(info.job_id(), s.mode(), s.mode_step(), r.tensor_name(), r.worker(),
                             [&bytes](const v1::TensorRecord&, absl::string_view piece) {
                               bytes.append(piece.data(), piece.size());
                               return absl::OkStatus();
                             })
                .status());
        values = std::make_shared<const std::string>(std::move(bytes));
      }
      data.values.push_back(std::move(values));
      data.tensors.push_back(std::move(r));
    }
    if (s.step() > complete_through) {
      pending[s.step()] = std::move(data);
      continue;
    }
    runner.SubmitStep(std::move(data));
    if (++replayed % 64 == 0) runner.Drain();  // bounds what is held in memory
  }
  runner.Drain();
  LOG(INFO) << "job '" << info.job() << "': replayed " << replayed << " stored steps to its rules, "
            << pending.size() << " wait for other workers";
  return pending;
}

void JobRegistry::Leave(const std::string& job_name, int32_t worker, StreamHandle* stream) {
  RemoveStream(job_name, worker, stream);
  PublishIfEnded(job_name);
}

void JobRegistry::RemoveStream(const std::string& job_name, int32_t worker,
                               StreamHandle* stream) {
  LiveJob* job;
  {
    absl::MutexLock lock(&mu_);
    job = FindLocked(job_name);
  }
  if (job == nullptr) return;
  absl::MutexLock commit(&job->commit_mu);
  absl::MutexLock lock(&mu_);
  job->AssertHeld();
  auto it = job->streams.find(worker);
  if (it == job->streams.end() || it->second != stream) return;
  job->streams.erase(it);
  job->stream_client.erase(worker);
  job->owner_left[worker] = absl::Now();
  job->steps.Detach(worker, DeliverTo(*job));
  if (job->streams.empty() && job->info.status() == v1::JOB_STATUS_RUNNING) {
    if (AllWorkersEnded(job->info)) {
      MaybeEndJobLocked(*job);
    } else {
      job->disconnected_since = absl::Now();
      job->info.set_status(v1::JOB_STATUS_DISCONNECTED);
      absl::Status s = store_->PutJob(CopyForWorker(job->info, -1));
      if (!s.ok()) LOG(ERROR) << "job '" << job_name << "': " << s;
    }
  }
}

absl::Status JobRegistry::CheckStreamOwnerLocked(const LiveJob& job, const std::string& job_name,
                                                  int32_t worker, const StreamHandle* stream) {
  job.AssertHeld();
  auto owner = job.streams.find(worker);
  if (owner == job.streams.end() || owner->second != stream) {
    return absl::AbortedError(absl::StrCat("worker ", worker, " of job '", job_name,
                                           "' is now streamed by a newer stream"));
  }
  return absl::OkStatus();
}

absl::Status JobRegistry::StoreProfile(const std::string& job_name, int32_t worker,
                                       const StreamHandle* stream, v1::ProfileBatch batch) {
  SONDE_ASSIGN_OR_RETURN(LiveJob * job, FindLive(job_name));
  // As CommitStep: under the job's commit lock, so a job being ended or
  // deleted never gets keys written after it.
  absl::MutexLock commit(&job->commit_mu);
  uint64_t job_id;
  uint64_t client;
  {
    absl::MutexLock lock(&mu_);
    job->AssertHeld();
    SONDE_RETURN_IF_ERROR(CheckStreamOwnerLocked(*job, job_name, worker, stream));
    job_id = job->info.job_id();
    client = job->stream_client[worker];
  }
  SONDE_RETURN_IF_ERROR(store_->WriteProfile(job_id, worker, batch));
  absl::MutexLock lock(&mu_);
  job->AssertHeld();
  if (job->runner == nullptr || !job->runner->WantsProfile()) return absl::OkStatus();
  // A batch resent after a broken stream is stored again harmlessly but
  // must reach the rules once: each client numbers its batches.
  auto& [fed_client, fed_sequence] = job->profile_fed[worker];
  if (batch.sequence() > 0) {
    if (fed_client == client && batch.sequence() <= fed_sequence) return absl::OkStatus();
    fed_client = client;
    fed_sequence = batch.sequence();
  }
  job->runner->SubmitProfile(worker, std::move(batch));
  return absl::OkStatus();
}

absl::StatusOr<CommitResult> JobRegistry::CommitStep(const std::string& job_name,
                                                     int32_t worker, const StreamHandle* stream,
                                                     storage::StepWrite write,
                                                     uint64_t steps_dropped) {
  SONDE_ASSIGN_OR_RETURN(LiveJob * job, FindLive(job_name));
  absl::MutexLock commit(&job->commit_mu);
  v1::JobInfo info;
  {
    absl::MutexLock lock(&mu_);
    job->AssertHeld();
    SONDE_RETURN_IF_ERROR(CheckStreamOwnerLocked(*job, job_name, worker, stream));
    info = CopyForWorker(job->info, worker);
  }
  const v1::StepInfo& step = write.step;
  // A resend of a step whose ack was lost: it is stored already.
  if (StepStoredAlready(info, worker, step.step())) return CommitResult{true};
  // A worker's records are keyed by mode step: a new global step with a
  // mode step the worker has stored already (from an earlier stream, whose
  // order the session's checks do not see) would overwrite that step's.
  SONDE_ASSIGN_OR_RETURN(std::optional<v1::StepInfo> holder,
                         store_->WorkerStepAt(info.job_id(), step.mode(), step.mode_step(), worker));
  if (holder.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step ", step.step(), " has ", ModeName(step.mode()), " step ", step.mode_step(),
        ", which worker ", worker, " stored with step ", holder->step(),
        " (mode steps must not repeat)"));
  }
  AddStep(info, worker, step, steps_dropped);
  write.job_id = info.job_id();
  write.worker = worker;
  write.job = info;
  SONDE_RETURN_IF_ERROR(store_->CommitStep(write));

  absl::MutexLock lock(&mu_);
  job->AssertHeld();
  // Keep what the collector changed concurrently (workers, status), take the steps.
  TakeStepFields(info, job->info);
  // Null when the worker is late: the step was judged without it (its data
  // is stored).
  if (rules::StepData* part = job->steps.PartOf(step, absl::Now()); part != nullptr) {
    for (storage::TensorWrite& t : write.tensors) {
      t.record.set_worker(worker);
      std::shared_ptr<const std::string> values;
      if (t.record.has_values() && job->runner->WantsValues(t.record)) {
        values = std::make_shared<const std::string>(std::move(t.bytes));
      }
      part->values.resize(part->tensors.size());
      part->values.push_back(std::move(values));
      part->tensors.push_back(std::move(t.record));
    }
  }
  job->steps.Committed(worker, step.step(), DeliverTo(*job));
  return CommitResult{};
}

absl::Status JobRegistry::EndJob(const std::string& job_name, int32_t worker,
                                 const StreamHandle* stream, const std::string& reason,
                                 uint64_t steps_dropped) {
  const absl::Status s = MarkWorkerEnded(job_name, worker, stream, reason, steps_dropped);
  PublishIfEnded(job_name);
  return s;
}

absl::Status JobRegistry::MarkWorkerEnded(const std::string& job_name, int32_t worker,
                                          const StreamHandle* stream, const std::string& reason,
                                          uint64_t steps_dropped) {
  SONDE_ASSIGN_OR_RETURN(LiveJob * job, FindLive(job_name));
  absl::MutexLock commit(&job->commit_mu);
  absl::MutexLock lock(&mu_);
  job->AssertHeld();
  // A stream its client has replaced ends nothing: the client resends its
  // job end on the new one.
  SONDE_RETURN_IF_ERROR(CheckStreamOwnerLocked(*job, job_name, worker, stream));
  // On a copy, kept once stored: a failed write (the client resends its
  // job end) must not count the end's dropped steps twice. Stored before
  // the job end is acknowledged: which workers ended must survive a
  // collector restart, or the job would wait for them again.
  v1::JobInfo info = CopyForWorker(job->info, worker);
  AddWorkerEnd(info, worker, reason, steps_dropped);
  SONDE_RETURN_IF_ERROR(store_->PutJob(info));
  AddWorkerEnd(job->info, worker, reason, steps_dropped);
  if (AllWorkersEnded(job->info)) MaybeEndJobLocked(*job);
  return absl::OkStatus();
}

void JobRegistry::MaybeEndJobLocked(LiveJob& job) {
  job.AssertHeld();
  if (IsFinished(job.info.status())) return;
  // Every worker has ended: whatever is pending is all there will be.
  job.steps.DeliverAll(DeliverTo(job));
  job.info.set_status(job.stop.has_value() ? v1::JOB_STATUS_STOPPED
                                           : v1::JOB_STATUS_FINISHED);
  job.info.set_end_unix_micros(NowMicros());
  absl::Status s = store_->PutJob(CopyForWorker(job.info, -1));
  if (!s.ok()) LOG(ERROR) << "job '" << job.info.job() << "': " << s;
  job.runner->SubmitJobEnd(job.stop);
}

absl::StatusOr<std::vector<v1::RuleResult>> JobRegistry::RuleResults(const std::string& job_name) {
  std::optional<std::vector<v1::RuleResult>> live;
  {
    absl::MutexLock lock(&mu_);
    if (LiveJob* job = FindLocked(job_name); job != nullptr) {
      job->AssertHeld();
      if (job->runner != nullptr) live = job->runner->Results();
    }
  }
  SONDE_ASSIGN_OR_RETURN(v1::JobInfo info, store_->GetJob(job_name));
  SONDE_ASSIGN_OR_RETURN(auto stored, store_->RuleResults(info.job_id()));
  if (!live.has_value()) return stored;
  // The live view of the job's own rules, plus external workers' verdicts.
  for (const v1::RuleResult& r : stored) {
    bool own = false;
    for (const v1::RuleResult& l : *live) own = own || l.rule() == r.rule();
    if (!own) live->push_back(r);
  }
  return *live;
}

int64_t JobRegistry::DeliveredThrough(const std::string& job_name) {
  absl::MutexLock lock(&mu_);
  LiveJob* job = FindLocked(job_name);
  if (job == nullptr) return -1;
  job->AssertHeld();
  return job->steps.delivered_through();
}

absl::Status JobRegistry::PostExternalResult(v1::RuleResult result,
                                             const std::vector<std::string>& actions) {
  SONDE_RETURN_IF_ERROR(ValidateJobName(result.job()));
  SONDE_RETURN_IF_ERROR(ValidateDataName("rule name", result.rule()));
  if (!v1::RuleStatus_IsValid(result.status()) ||
      result.status() == v1::RULE_STATUS_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        absl::StrCat("rule result has no valid status (", static_cast<int>(result.status()), ")"));
  }
  if (!v1::Mode_IsValid(result.mode())) {
    return absl::InvalidArgumentError(
        absl::StrCat("rule result has an unknown mode (", static_cast<int>(result.mode()), ")"));
  }
  for (const std::string& a : actions) {
    if (a != "StopTraining" && a != "Log") {
      return absl::InvalidArgumentError(absl::StrCat(
          "external rules may ask for StopTraining or Log, not '", a, "'"));
    }
  }
  absl::MutexLock external(&external_mu_);  // one read-modify-write at a time
  SONDE_ASSIGN_OR_RETURN(v1::JobInfo info, store_->GetJob(result.job()));
  for (const v1::RuleSpec& spec : info.rules()) {
    if (spec.name() == result.rule()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "'", result.rule(), "' is one of job '", result.job(), "''s own rules"));
    }
  }
  SONDE_ASSIGN_OR_RETURN(auto stored, store_->RuleResults(info.job_id()));
  bool already_found = false;
  for (const v1::RuleResult& r : stored) {
    if (r.rule() == result.rule()) already_found = r.status() == v1::RULE_STATUS_ISSUES_FOUND;
  }
  if (result.rule_type().empty()) result.set_rule_type("external");
  result.set_updated_unix_micros(NowMicros());
  const bool act = result.status() == v1::RULE_STATUS_ISSUES_FOUND && !already_found;
  if (act) {
    for (const std::string& a : actions) result.add_actions_taken(a);
  }
  SONDE_RETURN_IF_ERROR(store_->PutRuleResult(info.job_id(), result));
  Notify(result.job(), result);
  if (!act) return absl::OkStatus();
  for (const std::string& a : actions) {
    if (a == "Log") {
      LOG(WARNING) << "job '" << result.job() << "' external rule " << result.rule()
                   << " found issues at step " << result.step() << ": " << result.message();
    } else {
      v1::Action stop;
      stop.set_type(v1::ACTION_STOP_TRAINING);
      stop.set_rule(result.rule());
      stop.set_reason(result.message());
      stop.set_step(result.step());
      *stop.mutable_verdict() = result;
      Broadcast(result.job(), stop);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::RuleSpec>> JobRegistry::EnableRules(
    const std::string& job_name, const std::vector<v1::RuleSpec>& specs) {
  SONDE_RETURN_IF_ERROR(ValidateJobName(job_name));
  if (specs.empty()) return absl::InvalidArgumentError("no rules given");
  std::vector<v1::RuleSpec> normalized;
  for (const v1::RuleSpec& s : specs) {
    SONDE_ASSIGN_OR_RETURN(v1::RuleSpec n, rules::NormalizeRuleSpec(s));
    SONDE_RETURN_IF_ERROR(CheckRule(n));
    normalized.push_back(std::move(n));
  }
  // Under the job's commit lock, so a first hello cannot start the job
  // halfway through (Join holds the same lock).
  LiveJob* live;
  {
    absl::MutexLock lock(&mu_);
    live = FindLocked(job_name);
    if (live == nullptr) {
      auto fresh = std::make_unique<LiveJob>(mu_);
      live = fresh.get();
      fresh->AssertHeld();
      fresh->info.set_job(job_name);
      jobs_[job_name] = std::move(fresh);
    }
  }
  absl::MutexLock commit(&live->commit_mu);
  if (Activated(*live)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job_name, "' has started; rules are enabled before a job starts"));
  }
  v1::JobInfo pending;
  pending.set_job(job_name);
  pending.set_status(v1::JOB_STATUS_PENDING);
  pending.set_last_step(-1);
  SONDE_ASSIGN_OR_RETURN(v1::JobInfo info, store_->CreateJob(pending));
  if (info.status() != v1::JOB_STATUS_PENDING) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job_name, "' has started; rules are enabled before a job starts"));
  }
  for (const v1::RuleSpec& n : normalized) {
    for (const v1::RuleSpec& existing : info.rules()) {
      if (existing.name() == n.name()) {
        return absl::AlreadyExistsError(absl::StrCat("job '", job_name,
                                                     "' already has a rule named '", n.name(), "'"));
      }
    }
    *info.add_rules() = n;
  }
  SONDE_RETURN_IF_ERROR(store_->PutJob(info));
  return std::vector<v1::RuleSpec>(info.rules().begin(), info.rules().end());
}

void JobRegistry::Notify(const std::string& job, const v1::RuleResult& result) {
  watchers_.PublishResult(job, result);
  // Only a final verdict can be the one the job's end waited for.
  if (rules::IsFinal(result.status())) PublishIfEnded(job);
}

void JobRegistry::PublishIfEnded(const std::string& job) {
  if (!watchers_.Watched(job) || IsActive(job)) return;
  absl::StatusOr<std::vector<v1::RuleResult>> results = RuleResults(job);
  watchers_.PublishEnded(job, results.ok() ? *results : std::vector<v1::RuleResult>());
}

void JobRegistry::Broadcast(const std::string& job_name, const v1::Action& action) {
  absl::MutexLock lock(&mu_);
  LiveJob* job = FindLocked(job_name);
  if (job == nullptr) return;
  job->AssertHeld();
  if (!job->stop.has_value()) job->stop = action;
  v1::ServerMessage msg;
  *msg.mutable_action() = action;
  for (auto& [worker, stream] : job->streams) stream->Send(msg);
}

bool JobRegistry::IsActive(const std::string& job_name) {
  absl::MutexLock lock(&mu_);
  LiveJob* job = FindLocked(job_name);
  if (job == nullptr) return false;
  job->AssertHeld();
  if (job->runner == nullptr) return false;
  if (!job->streams.empty() || job->info.status() == v1::JOB_STATUS_RUNNING) return true;
  for (const v1::RuleResult& r : job->runner->Results()) {
    if (!rules::IsFinal(r.status())) return job->info.status() != v1::JOB_STATUS_DISCONNECTED;
  }
  return false;
}

absl::Status JobRegistry::Forget(const std::string& job_name,
                                 const std::function<absl::Status()>& erase_stored) {
  SONDE_RETURN_IF_ERROR(ValidateJobName(job_name));
  LiveJob* job;
  {
    absl::MutexLock lock(&mu_);
    job = FindLocked(job_name);
  }
  if (job == nullptr) {
    // Not live here since the collector started: a job only if stored.
    SONDE_RETURN_IF_ERROR(store_->GetJob(job_name).status());
    absl::MutexLock lock(&mu_);
    job = FindLocked(job_name);
    if (job == nullptr) {
      // An empty entry (as after a restart) that a hello for the name finds
      // and waits on while the job is erased. Entries are never removed:
      // other threads may hold them.
      auto fresh = std::make_unique<LiveJob>(mu_);
      job = fresh.get();
      fresh->AssertHeld();
      fresh->info.set_job(job_name);
      jobs_[job_name] = std::move(fresh);
    }
  }
  absl::MutexLock commit(&job->commit_mu);  // Join, Leave, commits and ticks wait
  if (IsActive(job_name)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job_name, "' is live on this collector (streaming, or rules still judging it)"));
  }
  std::unique_ptr<rules::RuleRunner> runner;
  std::unique_ptr<RuleActions> sink;
  {
    absl::MutexLock lock(&mu_);
    job->AssertHeld();
    runner = std::move(job->runner);
    sink = std::move(job->sink);
    job->info = v1::JobInfo();
    job->info.set_job(job_name);
    job->streams.clear();
    job->stream_client.clear();
    job->disconnected_since = absl::InfiniteFuture();
    job->dormant_since.reset();
    job->steps.Clear();
    job->stop.reset();
  }
  // Outside mu_: the runner's destructor waits for its rules, whose results
  // and actions take it. Nothing writes the job once they are done.
  runner.reset();
  sink.reset();
  return erase_stored();
}

void JobRegistry::DrainRules() {
  std::vector<rules::RuleRunner*> runners;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, job] : jobs_) {
      job->AssertHeld();
      if (job->runner != nullptr) runners.push_back(job->runner.get());
    }
  }
  for (auto* r : runners) r->Drain();
}

}  // namespace sonde::server
