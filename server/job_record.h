// The arithmetic of a job's record (v1::JobInfo), apart from where it is
// kept: what a hello, a committed step, a worker's job end and the end of
// the job change in it. Pure functions, no locks, no storage: JobRegistry applies
// them to a copy and keeps the copy only once the store has it, so a failed
// write leaves nothing half-counted.
#ifndef SONDE_SERVER_JOB_RECORD_H_
#define SONDE_SERVER_JOB_RECORD_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "google/protobuf/repeated_field.h"
#include "proto/collector.pb.h"
#include "proto/records.pb.h"
#include "proto/rule.pb.h"

namespace sonde::server {

// FINISHED or STOPPED: the job will take no more data.
bool IsFinished(v1::JobStatus status);

// Workers of [0, world_size) that are not in `present`, in order.
std::vector<int32_t> MissingWorkers(const google::protobuf::RepeatedField<int32_t>& present,
                                    int32_t world_size);

// Every one of world_size workers (at least one) has sent its job end. The
// list is in the record, so this holds across collector restarts.
bool AllWorkersEnded(const v1::JobInfo& info);

// The worker has stored this step (or a later one) already: a resend after
// a lost ack.
bool StepStoredAlready(const v1::JobInfo& info, int32_t worker, int64_t step);

// Counts `step`, committed by `worker`, into the record: its mode's first,
// last and number of steps, the job's last step, the worker's last step,
// and the gaps the client reported (the step's dropped tensors and values,
// and `steps_dropped` whole steps before it).
void AddStep(v1::JobInfo& info, int32_t worker, const v1::StepInfo& step,
             uint64_t steps_dropped);

// Takes from `from` the fields AddStep changes, leaving the others (the
// workers, the status, which other threads change) as they are in `into`.
// Per-worker entries are merged: `from` may hold one worker's only.
void TakeStepFields(const v1::JobInfo& from, v1::JobInfo& into);

// A copy of `info` whose per-worker fields (the maps, the lists of workers
// and of ended workers) hold `worker`'s entries only (none
// for a worker the job does not have, e.g. -1): what a change of that
// worker, or of no worker, stores (storage::Store writes the workers a
// record names). Copying every worker's would make each step of a job of
// thousands of workers cost as much as their number. `info` is restored
// before this returns.
v1::JobInfo CopyForWorker(v1::JobInfo& info, int32_t worker);

// Records `worker`'s job end: it joins ended_workers (kept sorted), `reason`
// (if any) becomes the end reason, `steps_dropped` adds to the gaps. A
// worker that has ended already changes nothing (the same end applied
// again is counted once).
void AddWorkerEnd(v1::JobInfo& info, int32_t worker, const std::string& reason,
                  uint64_t steps_dropped);

// The rules a new job runs: the collector's defaults, then the hello's own
// specs; a hello spec replaces the default of the same name, and
// `warnings` says so (the client is told).
std::vector<v1::RuleSpec> RulesForJob(const std::vector<v1::RuleSpec>& defaults,
                                      const google::protobuf::RepeatedPtrField<v1::RuleSpec>& own,
                                      std::vector<std::string>* warnings);

// A job registered by EnableRules (`registered`, PENDING) that starts now
// with the record `fresh`: the registered rules first, then fresh's rules
// of other names, under the registered job id.
v1::JobInfo StartRegistered(const v1::JobInfo& registered, const v1::JobInfo& fresh);

// The StopTraining a rule decided before a collector restart (from the
// stored results: the first IssuesFound verdict whose actions took
// StopTraining), so workers that come back are stopped too.
std::optional<v1::Action> StopDecided(const std::vector<v1::RuleResult>& results);

// `worker` streams again from client `client_id`: it is a worker of the job
// (once, sorted), its owner is that client, and the job runs. It has not
// ended unless its end came from this same client (nonzero id): that client
// is back to resend the end, which AddWorkerEnd then counts once.
void AttachWorker(v1::JobInfo& info, int32_t worker, uint64_t client_id);

// The worker's last stored global step; -1 if none.
int64_t WorkerLastStep(const v1::JobInfo& info, int32_t worker);

// InvalidArgument for a hello no job can take: a bad job name, a world size
// outside 1..65536, a worker outside [0, world_size).
absl::Status ValidateHello(const v1::Hello& hello);

// FailedPrecondition if `hello` cannot join the job of `info`: the job has
// finished, or its world size differs.
absl::Status CheckJoinable(const v1::JobInfo& info, const v1::Hello& hello);

}  // namespace sonde::server

#endif  // SONDE_SERVER_JOB_RECORD_H_
