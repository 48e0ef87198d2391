#include "server/rule_actions.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace sonde::server {
namespace {

class RuleActionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = storage::Store::Open({dir_.Sub("db")});
    SONDE_ASSERT_OK(store);
    store_ = std::move(*store);
    v1::JobInfo info;
    info.set_job("j");
    auto created = store_->CreateJob(info);
    SONDE_ASSERT_OK(created);
    job_id_ = created->job_id();
  }

  RuleActions Make() {
    RuleActions::Targets t;
    t.published = [this](const v1::RuleResult& r) {
      // Published after it is stored: the store has it already.
      auto stored = store_->RuleResults(job_id_);
      EXPECT_TRUE(stored.ok() && !stored->empty());
      published_.push_back(r);
    };
    t.stop_training = [this](const v1::Action& a) { stops_.push_back(a); };
    return RuleActions("j", job_id_, store_.get(), /*webhooks=*/nullptr, std::move(t));
  }

  testing::TempDir dir_;
  std::unique_ptr<storage::Store> store_;
  uint64_t job_id_ = 0;
  std::vector<v1::RuleResult> published_;
  std::vector<v1::Action> stops_;
};

TEST_F(RuleActionsTest, AResultIsStoredThenPublished) {
  RuleActions actions = Make();
  v1::RuleResult r;
  r.set_job("j");
  r.set_rule("ExplodingTensor");
  r.set_status(v1::RULE_STATUS_ISSUES_FOUND);
  actions.OnResult(r);
  ASSERT_EQ(published_.size(), 1u);
  EXPECT_EQ(published_[0].rule(), "ExplodingTensor");
  auto stored = store_->RuleResults(job_id_);
  SONDE_ASSERT_OK(stored);
  ASSERT_EQ(stored->size(), 1u);
  EXPECT_EQ((*stored)[0].status(), v1::RULE_STATUS_ISSUES_FOUND);
}

TEST_F(RuleActionsTest, OnlyStopTrainingReachesTheStreams) {
  RuleActions actions = Make();
  v1::Action stop;
  stop.set_type(v1::ACTION_STOP_TRAINING);
  stop.set_rule("ExplodingTensor");
  v1::Action log;
  log.set_type(v1::ACTION_LOG);
  v1::Action hook;  // no notifier: logged as not sent, nothing else
  hook.set_type(v1::ACTION_WEBHOOK);
  hook.set_target("http://127.0.0.1:1/x");
  v1::Action mail;  // no notifier either
  mail.set_type(v1::ACTION_EMAIL);
  mail.set_target("ops@example.com");
  actions.OnAction(log);
  actions.OnAction(hook);
  actions.OnAction(mail);
  actions.OnAction(stop);
  ASSERT_EQ(stops_.size(), 1u);
  EXPECT_EQ(stops_[0].rule(), "ExplodingTensor");
  EXPECT_TRUE(published_.empty());
}

}  // namespace
}  // namespace sonde::server
