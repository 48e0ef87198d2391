// An external rule worker (examples/external_rule, Python) against a real
// collector: it follows the job's completed steps, posts its verdict beside
// the built-ins, and its StopTraining reaches the training process.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/hook.h"
#include "client/query_client.h"
#include "grpcpp/create_channel.h"
#include "proto/query.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/testing/in_process_collector.h"
#include "tests/testing/status_matchers.h"

namespace sonde {
namespace {

std::string Runfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir ? srcdir : ".", "/", workspace ? workspace : "sonde", "/", path);
}

// Runs the worker to completion on a thread; returns its exit code and output.
struct Worker {
  int exit_code = -1;
  std::string output;
  std::thread thread;

  void Start(const std::string& collector, const std::string& job, bool stop) {
    const std::string cmd = absl::StrCat(
        "PYTHONPATH=", Runfile("client/python"), " /usr/bin/python3 ",
        Runfile("examples/external_rule/loss_spike_worker.py"), " --collector=", collector,
        " --job=", job, stop ? " --stop" : "", " 2>&1");
    thread = std::thread([this, cmd] {
      FILE* p = popen(cmd.c_str(), "r");
      if (p == nullptr) return;
      char buf[1024];
      size_t n;
      while ((n = fread(buf, 1, sizeof(buf), p)) > 0) output.append(buf, n);
      const int status = pclose(p);
      exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    });
  }
  void Join() { thread.join(); }
};

const v1::RuleResult* Find(const std::vector<v1::RuleResult>& rs, const std::string& rule) {
  for (const auto& r : rs) {
    if (r.rule() == rule) return &r;
  }
  return nullptr;
}

HookOptions Options(const std::string& address, const std::string& job) {
  HookOptions o;
  o.collector = address;
  o.job = job;
  o.config.save_config = SaveConfig::Every(1);
  return o;
}

TEST(ExternalRule, ASpikeIsJudgedByThePythonWorkerAndStopsTraining) {
  testing::InProcessCollector collector("ExplodingTensor");
  absl::Notification stopped;
  HookOptions o = Options(collector.address(), "spiky");
  o.on_stop = [&](const v1::Action&) { stopped.Notify(); };
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  SONDE_ASSERT_OK((*hook)->WaitUntilConnected(absl::Seconds(20)));  // the job exists
  Worker worker;
  worker.Start(collector.address(), "spiky", /*stop=*/true);
  const double losses[] = {1.0, 0.8, 0.7, 0.6, 9.0, 0.5, 0.5, 0.5};
  int last = -1;
  for (int step = 0; step < 8; ++step) {
    if ((*hook)->should_stop()) break;
    (*hook)->StartStep();
    SONDE_ASSERT_OK((*hook)->SaveScalar("loss", losses[step], {"losses"}));
    (*hook)->EndStep();
    last = step;
    if (step == 4) {
      ASSERT_TRUE(stopped.WaitForNotificationWithTimeout(absl::Seconds(60)));
    }
  }
  EXPECT_EQ(last, 4);
  SONDE_ASSERT_OK((*hook)->Close());
  worker.Join();
  EXPECT_EQ(worker.exit_code, 0) << worker.output;
  auto q = QueryClient::Connect(collector.address());
  auto results = q->RuleResults("spiky");
  SONDE_ASSERT_OK(results);
  const v1::RuleResult* r = Find(*results, "LossSpike");
  ASSERT_NE(r, nullptr) << worker.output;
  EXPECT_EQ(r->status(), v1::RULE_STATUS_ISSUES_FOUND);
  EXPECT_EQ(r->step(), 4);
  EXPECT_EQ(r->rule_type(), "LossSpike (external)");
  EXPECT_NEAR(r->observed(), 15.0, 1e-9);
  ASSERT_EQ(r->actions_taken_size(), 2);
  EXPECT_NE(Find(*results, "ExplodingTensor"), nullptr);  // beside the built-in
}

TEST(ExternalRule, AHealthyJobGetsNoIssuesFoundWhenItEnds) {
  testing::InProcessCollector collector;
  auto hook = Hook::Create(Options(collector.address(), "calm"));
  SONDE_ASSERT_OK(hook);
  SONDE_ASSERT_OK((*hook)->WaitUntilConnected(absl::Seconds(20)));
  Worker worker;
  worker.Start(collector.address(), "calm", /*stop=*/false);
  for (int step = 0; step < 6; ++step) {
    (*hook)->StartStep();
    SONDE_ASSERT_OK((*hook)->SaveScalar("loss", 1.0 / (step + 1), {"losses"}));
  }
  SONDE_ASSERT_OK((*hook)->Close());
  worker.Join();  // WatchSteps ends with the job
  EXPECT_EQ(worker.exit_code, 0) << worker.output;
  auto q = QueryClient::Connect(collector.address());
  auto results = q->RuleResults("calm");
  SONDE_ASSERT_OK(results);
  const v1::RuleResult* r = Find(*results, "LossSpike");
  ASSERT_NE(r, nullptr) << worker.output;
  EXPECT_EQ(r->status(), v1::RULE_STATUS_NO_ISSUES_FOUND);
  EXPECT_EQ(r->message(), "no loss spike in 6 losses");
}

TEST(ExternalRule, BadVerdictsAreRefusedWithAReason) {
  testing::InProcessCollector collector("ExplodingTensor");
  auto hook = Hook::Create(Options(collector.address(), "guarded"));
  SONDE_ASSERT_OK(hook);
  SONDE_ASSERT_OK((*hook)->WaitUntilConnected(absl::Seconds(20)));
  auto channel = grpc::CreateChannel(collector.address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Query::NewStub(channel);
  auto post = [&](v1::RuleResult r, std::vector<std::string> actions) {
    grpc::ClientContext ctx;
    v1::PostRuleResultRequest req;
    *req.mutable_result() = std::move(r);
    for (auto& a : actions) req.add_actions(a);
    v1::PostRuleResultResponse resp;
    return stub->PostRuleResult(&ctx, req, &resp);
  };
  v1::RuleResult r;
  r.set_job("guarded");
  r.set_rule("ExplodingTensor");
  r.set_status(v1::RULE_STATUS_ISSUES_FOUND);
  EXPECT_EQ(post(r, {}).error_code(), grpc::StatusCode::ALREADY_EXISTS);
  r.set_rule("mine");
  r.set_status(v1::RULE_STATUS_UNSPECIFIED);
  EXPECT_EQ(post(r, {}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  r.set_status(v1::RULE_STATUS_ISSUES_FOUND);
  EXPECT_EQ(post(r, {"Reboot"}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  r.set_mode(static_cast<v1::Mode>(9));
  grpc::Status bad_mode = post(r, {});
  EXPECT_EQ(bad_mode.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(bad_mode.error_message().find("unknown mode (9)"), std::string::npos)
      << bad_mode.error_message();
  r.set_mode(v1::MODE_TRAIN);
  r.set_job("nobody");
  EXPECT_EQ(post(r, {}).error_code(), grpc::StatusCode::NOT_FOUND);
  SONDE_ASSERT_OK((*hook)->Close());
}

}  // namespace
}  // namespace sonde
