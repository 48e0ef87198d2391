// The collector's live view of jobs: which workers are streaming, which
// steps are complete (every connected worker has committed them), each
// job's RuleRunner, and who gets told about actions and rule results.
// Durable state lives in the Store; this is the in-memory coordination
// around it. Thread-safe.
#ifndef SONDE_SERVER_JOB_REGISTRY_H_
#define SONDE_SERVER_JOB_REGISTRY_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/thread_pool.h"
#include "proto/collector.pb.h"
#include "proto/query.pb.h"
#include "rules/rule.h"
#include "rules/rule_factory.h"
#include "rules/rule_runner.h"
#include "server/job_record.h"
#include "server/rule_actions.h"
#include "server/step_assembler.h"
#include "server/watchers.h"
#include "server/notifier.h"
#include "storage/store.h"

namespace sonde::server {

// A training process's stream, as the registry sees it.
class StreamHandle {
 public:
  virtual ~StreamHandle() = default;
  // Queues a message to the client; never blocks.
  virtual void Send(const v1::ServerMessage& message) = 0;
  // Ends the stream with `status` (a newer stream of the same client took
  // its place). Never blocks.
  virtual void Abort(const absl::Status& status) = 0;
};

struct JoinResult {
  v1::HelloAck ack;
  std::optional<v1::Action> pending_stop;  // a stop already decided for the job
  // The hello's client_id is the one that last streamed this worker: it may
  // resend steps already stored (they are acknowledged as duplicates), and
  // ack.resume_step tells it which; another client gets resume_step -1.
  bool same_client = false;
  // The worker's last stored step, whoever stored it (-1: none): a client
  // other than its owner may only send later steps.
  int64_t stored_last_step = -1;
  // Said to the client as warnings (a rule of the hello replaced a default).
  std::vector<std::string> warnings;
};

struct CommitResult {
  bool duplicate = false;  // the worker had already stored this step: nothing written
};

class JobRegistry {
 public:
  // `default_rules` run for every job. `store` and `rule_pool` must outlive
  // the registry.
  // A step waits at most `step_wait` for every connected worker; then it is
  // judged with what arrived, and rule verdicts name the missing workers.
  JobRegistry(storage::Store* store, ThreadPool* rule_pool,
              const rules::RuleFactory* rule_factory, std::vector<v1::RuleSpec> default_rules,
              absl::Duration step_wait = absl::Seconds(60), Notifier* notifier = nullptr);
  ~JobRegistry();

  // A worker says hello. Errors: InvalidArgument (bad names, rank out of
  // range, bad rule spec), NotFound (unknown rule type), AlreadyExists (the
  // worker is already streaming from another client), FailedPrecondition
  // (the job has finished, or its world size differs, or a rule asks for
  // Email and this collector has no relay). A hello from the
  // client already streaming the worker (same nonzero client_id: it lost
  // its connection and the collector has not noticed yet) replaces the old
  // stream, which is aborted.
  absl::StatusOr<JoinResult> Join(const v1::Hello& hello, StreamHandle* stream);
  // The worker's stream ended (cleanly or not).
  void Leave(const std::string& job, int32_t worker, StreamHandle* stream);
  // A job none of whose workers is connected for this long ends (FINISHED,
  // its end reason naming the workers that never sent their job end), its
  // rules judging the end of training. Also jobs the store holds unfinished
  // when this is set (a collector restarted after their workers were gone),
  // counting from then. Zero (the default): such a job waits for its
  // workers indefinitely.
  void set_worker_end_timeout(absl::Duration timeout);
  // A worker has one owner, the client (Hello.client_id) that last streamed
  // it. Another client's hello for it is refused with AlreadyExists while
  // the owner streams, and for this long after its stream went (or after
  // the collector started), unless the owner sent its job end. Default 60 s.
  void set_worker_lease(absl::Duration lease);
  // Adds `steps` whole steps to the job's dropped count (JobInfo.steps_
  // dropped), stored at once: steps a cluster node refused after the log
  // had acknowledged them to the client. NotFound for a job not live here.
  absl::Status RecordDroppedSteps(const std::string& job, uint64_t steps) ABSL_LOCKS_EXCLUDED(mu_);
  // Cluster mode: a webhook or email action of `job` is posted only if `gate` says
  // so (server/cluster/node.h: by the partition's owner, once per
  // transition across failovers). Set before the first Join.
  void set_notification_gate(std::function<bool(const std::string& job, const v1::Action&)> gate);
  // Posts a webhook or email action the gate held back earlier (a standby node's,
  // posted once it owns the partition), bypassing the gate.
  void PostNotification(const v1::Action& action);

  // Stores one worker's step (one WriteBatch, with the job record updated)
  // and, once every connected worker has committed it, hands the step to
  // the rules. Idempotent: a step the worker has already stored (a resend
  // after a lost ack) is not written again and reported as a duplicate.
  // Aborted if `stream` no longer owns the worker. `steps_dropped`: whole
  // steps the client dropped before this one (added to the job's gaps).
  // Called from the storage pool.
  absl::StatusOr<CommitResult> CommitStep(const std::string& job, int32_t worker,
                                          const StreamHandle* stream, storage::StepWrite write,
                                          uint64_t steps_dropped = 0);
  // Stores profiler data of the worker (storage::Store::WriteProfile) as it
  // arrives and feeds it to the job's rules once (by ProfileBatch.sequence);
  // writing a batch again stores nothing twice. Aborted if
  // `stream` no longer owns the worker. Called from the storage pool.
  absl::Status StoreProfile(const std::string& job, int32_t worker, const StreamHandle* stream,
                            v1::ProfileBatch batch);
  // The worker finished the job. When every worker that joined has ended,
  // the job ends and rules run their end-of-training evaluation. Aborted
  // when `stream` no longer streams the worker (as CommitStep).
  absl::Status EndJob(const std::string& job, int32_t worker, const StreamHandle* stream,
                      const std::string& reason, uint64_t steps_dropped = 0);

  // Rule results of a job: the live ones for a job this collector runs,
  // else what the store has.
  absl::StatusOr<std::vector<v1::RuleResult>> RuleResults(const std::string& job);

  // `sink` hears of every changed rule result of `job`, every step handed
  // to its rules, and the job's end (server/watchers.h), from now until
  // Unwatch(returned id).
  uint64_t Watch(const std::string& job, WatchSink* sink) { return watchers_.Add(job, sink); }
  void Unwatch(uint64_t id) { watchers_.Remove(id); }
  // Ends every watch (collector shutting down).
  void CloseWatches() { watchers_.CloseAll(); }
  size_t open_watches() const { return watchers_.size(); }

  // The last step of the job handed to its rules (-1: none yet, or the job
  // is not live here).
  int64_t DeliveredThrough(const std::string& job);

  // An external rule worker's verdict: stored, shown to watchers, and its
  // StopTraining/Log actions taken when the rule first reports IssuesFound.
  // NotFound for an unknown job, AlreadyExists if the name is one of the
  // job's own rules, InvalidArgument for a bad result.
  absl::Status PostExternalResult(v1::RuleResult result, const std::vector<std::string>& actions);

  // Registers rules for a job that has not started (see Query.EnableRules).
  absl::StatusOr<std::vector<v1::RuleSpec>> EnableRules(const std::string& job,
                                                        const std::vector<v1::RuleSpec>& specs);

  // True while the job has streams or rules still evaluating.
  bool IsActive(const std::string& job);

  // Forgets a job that is not active (FailedPrecondition while it is): waits
  // for its rules, drops its live state, then runs `erase_stored` (which
  // deletes the job from the store) while the job's hellos wait, so a later
  // hello with the name starts a fresh job. NotFound for a job the store
  // does not know; else erase_stored's status.
  // Not while DrainRules runs (the collector stops queries and retention
  // before it drains).
  absl::Status Forget(const std::string& job, const std::function<absl::Status()>& erase_stored);

  // Waits until every rule of every job has evaluated what it was given.
  void DrainRules();

 private:
  struct LiveJob;

  // A normalized rule can run here: its type is known, its parameters
  // valid, and the notifier can take its actions (Email needs a relay).
  // Cluster nodes (a notification gate set) skip the last check: they
  // apply logged entries, and every replica must decide alike whatever
  // its own flags.
  absl::Status CheckRule(const v1::RuleSpec& spec) ABSL_LOCKS_EXCLUDED(mu_);

  LiveJob* FindLocked(const std::string& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The live job of that name; NotFound if none.
  absl::StatusOr<LiveJob*> FindLive(const std::string& job) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the job's rules run here (Activate has run since the collector
  // started). The caller holds the job's commit_mu.
  bool Activated(const LiveJob& job) ABSL_LOCKS_EXCLUDED(mu_);
  // Join's parts. Activate: the first hello of `job` since the collector
  // started creates or loads its record, starts its rules and replays its
  // stored steps (under job.commit_mu). TakeWorkerLocked: the worker's
  // stream becomes `stream` if no other client owns the worker; whether
  // the hello's client is the one that stored its steps.
  absl::Status Activate(const v1::Hello& hello, LiveJob& job, std::vector<std::string>* warnings)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<bool> TakeWorkerLocked(LiveJob& job, const v1::Hello& hello,
                                        StreamHandle* stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends a job found unfinished at startup whose workers never came back
  // within the worker-end timeout: activates it (rules, replay) and ends it.
  void EndDormant(LiveJob& job, std::vector<std::string>* ended) ABSL_LOCKS_EXCLUDED(mu_);
  // OK while `stream` still streams `worker` of `job`; else Aborted (a newer
  // stream took the worker over), so the old stream writes nothing more.
  absl::Status CheckStreamOwnerLocked(const LiveJob& job, const std::string& job_name,
                                      int32_t worker, const StreamHandle* stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a collector restart: feeds the job's stored steps to its new rule
  // runner (complete ones; see RuleRunner::Create for what rules do with
  // them) and returns the steps some worker has not committed yet.
  absl::StatusOr<std::map<int64_t, rules::StepData>> Replay(const v1::JobInfo& info,
                                                            rules::RuleRunner& runner);
  // What job.steps hands a step to: the watchers, then the rules. Called
  // under mu_.
  StepAssembler::Deliver DeliverTo(LiveJob& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The step-wait clock: hands overdue steps to the rules.
  void TickLoop();
  void DormantLoop();
  void MaybeEndJobLocked(LiveJob& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Leave and EndJob without telling watchers (they do, after).
  void RemoveStream(const std::string& job, int32_t worker, StreamHandle* stream)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status MarkWorkerEnded(const std::string& job, int32_t worker, const StreamHandle* stream,
                               const std::string& reason, uint64_t steps_dropped)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Notify(const std::string& job, const v1::RuleResult& result);
  // Tells the job's watchers it ended, if it is watched and no longer
  // active. Called without locks after anything that may end a job.
  void PublishIfEnded(const std::string& job) ABSL_LOCKS_EXCLUDED(mu_);
  void Broadcast(const std::string& job, const v1::Action& action);

  storage::Store* const store_;
  ThreadPool* const rule_pool_;
  const rules::RuleFactory* const rule_factory_;
  const std::vector<v1::RuleSpec> default_rules_;
  const absl::Duration step_wait_;
  Notifier* const notifier_;  // may be null: webhook and email actions are logged only

  // Lock order: a job's commit_mu (LiveJob), then mu_, then watchers_' own
  // lock, then a watch's; external_mu_ comes before mu_. LiveJob's fields
  // other than commit_mu are guarded by mu_ (LiveJob::mu names it).
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<LiveJob>> jobs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration worker_end_timeout_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  absl::Duration worker_lease_ ABSL_GUARDED_BY(mu_) = absl::Seconds(60);
  std::function<bool(const std::string&, const v1::Action&)> notification_gate_ ABSL_GUARDED_BY(mu_);
  std::thread ticker_;
  // Jobs found unfinished at startup whose worker-end timeout passed, for
  // dormant_ender_ to end one at a time (their replay may take long; the
  // ticker must not wait for it).
  std::deque<LiveJob*> dormant_queue_ ABSL_GUARDED_BY(mu_);
  std::thread dormant_ender_;

  // Serialises PostExternalResult's read-modify-write.
  absl::Mutex external_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  Watchers watchers_;  // its lock comes after mu_
};

}  // namespace sonde::server

#endif  // SONDE_SERVER_JOB_REGISTRY_H_
