#include "server/rule_actions.h"

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace sonde::server {

void RuleActions::OnResult(const v1::RuleResult& result) {
  absl::Status s = store_->PutRuleResult(job_id_, result);
  if (!s.ok()) LOG(ERROR) << "job '" << job_ << "': storing rule result: " << s;
  targets_.published(result);
}

void RuleActions::OnAction(const v1::Action& action) {
  switch (action.type()) {
    case v1::ACTION_STOP_TRAINING:
      LOG(INFO) << "job '" << job_ << "': rule " << action.rule()
                << " asks to stop training: " << action.reason();
      targets_.stop_training(action);
      break;
    case v1::ACTION_LOG:
      LOG(WARNING) << "job '" << job_ << "' rule " << action.rule() << " found issues at step "
                   << action.step() << ": " << action.reason()
                   << (action.verdict().suggestion().empty()
                           ? ""
                           : absl::StrCat(" Suggestion: ", action.verdict().suggestion()));
      break;
    case v1::ACTION_WEBHOOK:
    case v1::ACTION_EMAIL:
      if (targets_.may_post && !targets_.may_post(action)) {
        VLOG(1) << "job '" << job_ << "': " << action.target() << " of " << action.rule()
                << " at step " << action.step()
                << " was sent before or is not this node's to send";
      } else if (notifier_ != nullptr) {
        notifier_->Post(action);
      } else {
        LOG(WARNING) << "job '" << job_ << "': no notifier; verdict of " << action.rule()
                     << " for " << action.target() << " not sent";
      }
      break;
    default:
      break;
  }
}

}  // namespace sonde::server
