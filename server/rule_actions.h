// Where one job's rule results and actions go: each result is stored, then
// published (the registry tells the job's watchers and checks whether the
// job has ended); StopTraining goes to the job's training processes, Log
// to the collector's log, Webhook and Email to the notifier. Thread-safe as far as
// its targets are (rule threads call it).
#ifndef SONDE_SERVER_RULE_ACTIONS_H_
#define SONDE_SERVER_RULE_ACTIONS_H_

#include <cstdint>
#include <functional>
#include <string>

#include "proto/rule.pb.h"
#include "rules/rule_runner.h"
#include "server/notifier.h"
#include "storage/store.h"

namespace sonde::server {

class RuleActions final : public rules::RuleSink {
 public:
  struct Targets {
    // A result, once stored (or not: the store's error is logged).
    std::function<void(const v1::RuleResult&)> published;
    // A StopTraining action, for every stream of the job.
    std::function<void(const v1::Action&)> stop_training;
    // Whether a webhook or email action may be posted (null: always). A cluster
    // node posts only for partitions it owns, once per transition.
    std::function<bool(const v1::Action&)> may_post;
  };
  // `store` must outlive this; `notifier` may be null (webhook and email
  // actions are then logged as not sent).
  RuleActions(std::string job, uint64_t job_id, storage::Store* store, Notifier* notifier,
              Targets targets)
      : job_(std::move(job)),
        job_id_(job_id),
        store_(store),
        notifier_(notifier),
        targets_(std::move(targets)) {}

  void OnResult(const v1::RuleResult& result) override;
  void OnAction(const v1::Action& action) override;

 private:
  const std::string job_;
  const uint64_t job_id_;
  storage::Store* const store_;
  Notifier* const notifier_;
  const Targets targets_;
};

}  // namespace sonde::server

#endif  // SONDE_SERVER_RULE_ACTIONS_H_
