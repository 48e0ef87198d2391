// The steps of one job between the workers' commits and the rules: which
// worker has committed how far, the steps some connected worker has not
// committed yet, and handing each step on once every connected worker has
// it, once the step wait runs out (naming the missing workers), or when
// the job ends. Not thread-safe: JobRegistry's mu_ guards it.
#ifndef SONDE_SERVER_STEP_ASSEMBLER_H_
#define SONDE_SERVER_STEP_ASSEMBLER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <vector>

#include "absl/time/time.h"
#include "proto/records.pb.h"
#include "rules/rule.h"

namespace sonde::server {

class StepAssembler {
 public:
  // Called with each step handed on, in step order; its missing_workers
  // name the job's workers (every one attached so far) that had not
  // committed it: late ones, gone ones, and ones that skipped it.
  using Deliver = std::function<void(rules::StepData)>;

  // After a restart: steps some worker had not committed (handed on as
  // they complete) and the last step the rules were given before them.
  void Restore(std::map<int64_t, rules::StepData> pending, int64_t delivered_through,
               absl::Time now);
  // `worker` streams; it has committed through `last_step` (-1: nothing).
  void Attach(int32_t worker, int64_t last_step);
  // `worker` stopped streaming: steps only it held back are handed on.
  void Detach(int32_t worker, const Deliver& deliver);

  // Where `worker`'s part of `step` goes (its tensors are appended), or
  // null when the step was handed on already (the worker is late: its data
  // is stored, the rules judged the step without it).
  rules::StepData* PartOf(const v1::StepInfo& step, absl::Time now);
  // `worker` has committed `step`: hands on every step all connected
  // workers have now.
  void Committed(int32_t worker, int64_t step, const Deliver& deliver);
  // Hands on, oldest first, the steps that have waited `wait` or longer.
  void DeliverOverdue(absl::Time now, absl::Duration wait, const Deliver& deliver);
  // Every worker has ended: what is pending is all there will be.
  void DeliverAll(const Deliver& deliver);
  // Forgets everything (the job is forgotten).
  void Clear();

  // The last step handed on; -1 if none.
  int64_t delivered_through() const { return delivered_through_; }
  size_t pending() const { return pending_.size(); }

 private:
  void DeliverComplete(const Deliver& deliver);
  void DeliverFirst(const Deliver& deliver);
  // The workers `step` (pending) is handed on without.
  std::vector<int32_t> MissingAt(int64_t step) const;

  std::map<int64_t, rules::StepData> pending_;  // committed by some, not all
  std::map<int64_t, absl::Time> pending_since_;  // when each first arrived
  std::map<int64_t, std::set<int32_t>> committed_by_;  // pending steps' committers
  // Pending steps restored after a restart: who committed them before is
  // not known, only who has not committed that far.
  std::set<int64_t> restored_;
  std::set<int32_t> known_;                      // every worker attached
  std::map<int32_t, int64_t> last_step_;        // per connected worker
  std::multiset<int64_t> last_steps_;           // the same, ordered: the least first
  int64_t delivered_through_ = -1;
};

}  // namespace sonde::server

#endif  // SONDE_SERVER_STEP_ASSEMBLER_H_
