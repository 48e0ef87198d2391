// The arithmetic of a job's record (v1::JobInfo), apart from where it is
// kept: what a committed step, a worker's job end and the end of the job
// change in it. Pure functions, no locks, no storage: JobRegistry applies
// them to a copy and keeps the copy only once the store has it, so a failed
// write leaves nothing half-counted.
#ifndef SONDE_SERVER_JOB_RECORD_H_
#define SONDE_SERVER_JOB_RECORD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "google/protobuf/repeated_field.h"
#include "proto/records.pb.h"

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
void TakeStepFields(const v1::JobInfo& from, v1::JobInfo& into);

// Records `worker`'s job end: it joins ended_workers (once, kept sorted),
// `reason` (if any) becomes the end reason, `steps_dropped` adds to the gaps.
void AddWorkerEnd(v1::JobInfo& info, int32_t worker, const std::string& reason,
                  uint64_t steps_dropped);

}  // namespace sonde::server

#endif  // SONDE_SERVER_JOB_RECORD_H_
