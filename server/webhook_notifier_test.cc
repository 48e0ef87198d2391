#include "server/webhook_notifier.h"

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/http_server.h"

namespace sonde::server {
namespace {

using ::sonde::testing::TestHttpServer;

v1::Action Verdict(const std::string& url) {
  v1::Action a;
  a.set_type(v1::ACTION_WEBHOOK);
  a.set_target(url);
  a.set_rule("ExplodingTensor");
  v1::RuleResult* r = a.mutable_verdict();
  r->set_job("j");
  r->set_rule("ExplodingTensor");
  r->set_rule_type("ExplodingTensor");
  r->set_status(v1::RULE_STATUS_ISSUES_FOUND);
  r->set_step(12);
  r->set_mode(v1::MODE_TRAIN);
  r->add_tensors("gradient/w");
  r->set_message("tensor 'gradient/w' has 3 NaN");
  r->set_suggestion("Lower the learning rate.");
  r->set_updated_unix_micros(1700000000000000);
  return a;
}

WebhookNotifier::Options Fast(int attempts) {
  WebhookNotifier::Options o;
  o.max_attempts = attempts;
  o.initial_backoff = absl::Milliseconds(10);
  o.request_timeout = absl::Seconds(5);
  return o;
}

TEST(WebhookNotifier, PostsTheVerdictAsJson) {
  TestHttpServer server;
  {
    WebhookNotifier notifier(Fast(3));
    notifier.Post(Verdict(server.Url("/hooks/sonde")));
  }  // the destructor waits for queued deliveries
  auto requests = server.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].method, "POST");
  EXPECT_EQ(requests[0].path, "/hooks/sonde");
  auto doc = nlohmann::json::parse(requests[0].body);
  EXPECT_EQ(doc["job"], "j");
  EXPECT_EQ(doc["rule"], "ExplodingTensor");
  EXPECT_EQ(doc["status"], "IssuesFound");
  EXPECT_EQ(doc["step"], 12);
  EXPECT_EQ(doc["mode"], "TRAIN");
  EXPECT_EQ(doc["tensors"][0], "gradient/w");
  EXPECT_EQ(doc["suggestion"], "Lower the learning rate.");
  EXPECT_EQ(doc["time"], "2023-11-14T22:13:20+00:00");
}

TEST(WebhookNotifier, InvalidUtf8InAMessageIsReplacedNotFatal) {
  v1::Action a = Verdict("http://127.0.0.1:1/h");
  a.mutable_verdict()->set_message("cut in the middle of \xe2\x82");
  const std::string json = VerdictJson(a);
  auto doc = nlohmann::json::parse(json);
  EXPECT_NE(doc["message"].get<std::string>().find("cut in the middle of"), std::string::npos);
}

TEST(WebhookNotifier, RetriesServerErrorsUntilDelivered) {
  TestHttpServer server({500, 503});
  WebhookNotifier notifier(Fast(5));
  notifier.Post(Verdict(server.Url("/h")));
  auto requests = server.WaitForRequests(3, absl::Seconds(20));
  ASSERT_EQ(requests.size(), 3u);
  EXPECT_EQ(requests[0].body, requests[2].body);
}

TEST(WebhookNotifier, GivesUpAfterMaxAttemptsAndCountsIt) {
  TestHttpServer server({500, 500, 500});
  {
    WebhookNotifier notifier(Fast(2));
    notifier.Post(Verdict(server.Url("/h")));
    server.WaitForRequests(2, absl::Seconds(20));
  }
  EXPECT_EQ(server.requests().size(), 2u);
  WebhookNotifier unreachable(Fast(2));
  unreachable.Post(Verdict("http://127.0.0.1:1/h"));
}

TEST(WebhookNotifier, CountsDeliveriesAndFailures) {
  TestHttpServer ok;
  WebhookNotifier notifier(Fast(1));
  notifier.Post(Verdict(ok.Url("/h")));
  notifier.Post(Verdict("http://127.0.0.1:1/h"));
  ASSERT_TRUE(notifier.WaitIdle(absl::Seconds(20)));
  const WebhookNotifier::Counters c = notifier.counters();
  EXPECT_EQ(c.delivered, 1u);
  EXPECT_EQ(c.failed, 1u);
}

}  // namespace
}  // namespace sonde::server
