#include "server/notifier.h"

#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/http_server.h"
#include "tests/testing/smtp_server.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

#include <fstream>

namespace sonde::server {
namespace {

using ::sonde::testing::StatusIs;
using ::sonde::testing::TestHttpServer;
using ::sonde::testing::TestSmtpServer;
using ::testing::HasSubstr;

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

Notifier::Options Fast(int attempts) {
  Notifier::Options o;
  o.max_attempts = attempts;
  o.initial_backoff = absl::Milliseconds(10);
  o.request_timeout = absl::Seconds(5);
  return o;
}

TEST(Notifier, PostsTheVerdictAsJson) {
  TestHttpServer server;
  {
    Notifier notifier(Fast(3));
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

TEST(Notifier, InvalidUtf8InAMessageIsReplacedNotFatal) {
  v1::Action a = Verdict("http://127.0.0.1:1/h");
  a.mutable_verdict()->set_message("cut in the middle of \xe2\x82");
  const std::string json = VerdictJson(a);
  auto doc = nlohmann::json::parse(json);
  EXPECT_NE(doc["message"].get<std::string>().find("cut in the middle of"), std::string::npos);
}

TEST(Notifier, RetriesServerErrorsUntilDelivered) {
  TestHttpServer server({500, 503});
  Notifier notifier(Fast(5));
  notifier.Post(Verdict(server.Url("/h")));
  auto requests = server.WaitForRequests(3, absl::Seconds(20));
  ASSERT_EQ(requests.size(), 3u);
  EXPECT_EQ(requests[0].body, requests[2].body);
}

TEST(Notifier, GivesUpAfterMaxAttemptsAndCountsIt) {
  TestHttpServer server({500, 500, 500});
  {
    Notifier notifier(Fast(2));
    notifier.Post(Verdict(server.Url("/h")));
    server.WaitForRequests(2, absl::Seconds(20));
  }
  EXPECT_EQ(server.requests().size(), 2u);
  Notifier unreachable(Fast(2));
  unreachable.Post(Verdict("http://127.0.0.1:1/h"));
  ASSERT_TRUE(unreachable.WaitIdle(absl::Seconds(20)));
  EXPECT_EQ(unreachable.webhooks().failed, 1u);
  EXPECT_EQ(unreachable.webhooks().delivered, 0u);
}

TEST(Notifier, ARefusedRequestIsNotRetried) {
  // 404 will not change in the next seconds; 429 (too many requests) may.
  TestHttpServer server({404, 429});
  Notifier notifier(Fast(5));
  notifier.Post(Verdict(server.Url("/gone")));
  ASSERT_TRUE(notifier.WaitIdle(absl::Seconds(20)));
  EXPECT_EQ(server.requests().size(), 1u);
  EXPECT_EQ(notifier.webhooks().failed, 1u);
  notifier.Post(Verdict(server.Url("/busy")));
  ASSERT_TRUE(notifier.WaitIdle(absl::Seconds(20)));
  EXPECT_EQ(server.requests().size(), 3u);  // 429, then 200
  EXPECT_EQ(notifier.webhooks().delivered, 1u);
}

TEST(Notifier, CountsDeliveriesAndFailures) {
  TestHttpServer ok;
  Notifier notifier(Fast(1));
  notifier.Post(Verdict(ok.Url("/h")));
  notifier.Post(Verdict("http://127.0.0.1:1/h"));
  ASSERT_TRUE(notifier.WaitIdle(absl::Seconds(20)));
  const Notifier::Counters c = notifier.webhooks();
  EXPECT_EQ(c.delivered, 1u);
  EXPECT_EQ(c.failed, 1u);
}

v1::Action Mail(const std::string& address) {
  v1::Action a = Verdict("");
  a.set_type(v1::ACTION_EMAIL);
  a.set_target(address);
  a.mutable_verdict()->set_worker(1);
  a.mutable_verdict()->set_mode_step(7);
  a.mutable_verdict()->add_actions_taken("StopTraining");
  a.mutable_verdict()->add_actions_taken("Email:" + address);
  return a;
}

Notifier::Options Relay(const TestSmtpServer& server, int attempts) {
  Notifier::Options o = Fast(attempts);
  o.smtp.url = server.Url();
  o.smtp.from = "sonde@test.example";
  return o;
}

// The text part of a mail the notifier sent: after the part's headers
// (quoted-printable), up to the closing boundary, decoded.
std::string TextOf(const TestSmtpServer::Mail& mail) {
  const std::string marker = "Content-Transfer-Encoding: quoted-printable\r\n";
  const size_t part = mail.data.find(marker);
  if (part == std::string::npos) return "";
  const size_t start = mail.data.find("\r\n\r\n", part) + 4;
  const size_t end = mail.data.find("\r\n--", start);
  // Its lines end in CRLF, as mail's do; the verdict's had LF.
  return absl::StrReplaceAll(::sonde::testing::DecodeQuotedPrintable(
                                 absl::string_view(mail.data).substr(start, end - start)),
                             {{"\r\n", "\n"}});
}

TEST(Notifier, MailsTheVerdictThroughTheRelay) {
  TestSmtpServer relay;
  Notifier notifier(Relay(relay, 3));
  notifier.Post(Mail("ops@example.com"));
  ASSERT_TRUE(notifier.WaitIdle(absl::Seconds(20)));
  auto mails = relay.mails();
  ASSERT_EQ(mails.size(), 1u);
  const TestSmtpServer::Mail& m = mails[0];
  EXPECT_EQ(m.from, "sonde@test.example");
  EXPECT_EQ(m.to, std::vector<std::string>{"ops@example.com"});
  EXPECT_EQ(m.Header("From"), "sonde@test.example");
  EXPECT_EQ(m.Header("To"), "ops@example.com");
  EXPECT_EQ(m.Header("Subject"), "[sonde] job j: ExplodingTensor found issues at step 12");
  EXPECT_THAT(m.Header("Date"), HasSubstr("+0000"));
  EXPECT_THAT(m.Header("Message-ID"), HasSubstr("@"));
  EXPECT_EQ(m.Header("Auto-Submitted"), "auto-generated");
  const std::string text = TextOf(m);
  EXPECT_THAT(text, HasSubstr("Rule ExplodingTensor (ExplodingTensor) found issues in job j at "
                              "step 12 (TRAIN step 7), worker 1."));
  EXPECT_THAT(text, HasSubstr("tensor 'gradient/w' has 3 NaN"));
  EXPECT_THAT(text, HasSubstr("Tensors: gradient/w\n"));
  EXPECT_THAT(text, HasSubstr("Suggestion: Lower the learning rate.\n"));
  EXPECT_THAT(text, HasSubstr("Actions taken: StopTraining, Email:ops@example.com\n"));
  const size_t json = text.find("The verdict as JSON:\n");
  ASSERT_NE(json, std::string::npos) << text;
  auto doc = nlohmann::json::parse(text.substr(json + 21));
  EXPECT_EQ(doc["action"], "Email");
  EXPECT_EQ(doc["rule"], "ExplodingTensor");
  EXPECT_EQ(doc["step"], 12);
  EXPECT_EQ(notifier.emails().delivered, 1u);
  EXPECT_EQ(notifier.webhooks().delivered, 0u);
}

TEST(Notifier, AMailCarriesAnyTextIntact) {
  // A line of ".", which would end the mail unescaped, a line far past
  // SMTP's 998 characters, UTF-8, and a line break in the rule's name.
  TestSmtpServer relay;
  Notifier notifier(Relay(relay, 1));
  v1::Action a = Mail("ops@example.com");
  const std::string message = "first\n.\n" + std::string(3000, 'x') + "\nd\xc3\xa9j\xc3\xa0 vu =";
  a.mutable_verdict()->set_message(message);
  a.mutable_verdict()->set_rule("Bad\r\nBcc: victim@example.com");
  notifier.Post(a);
  ASSERT_TRUE(notifier.WaitIdle(absl::Seconds(20)));
  auto mails = relay.mails();
  ASSERT_EQ(mails.size(), 1u);
  EXPECT_THAT(TextOf(mails[0]), HasSubstr(message));
  EXPECT_EQ(mails[0].Header("Bcc"), "");
  EXPECT_THAT(mails[0].Header("Subject"), HasSubstr("Bad??Bcc: victim@example.com"));
  EXPECT_EQ(mails[0].to, std::vector<std::string>{"ops@example.com"});
}

TEST(Notifier, RetriesARelayThatSaysTryLater) {
  TestSmtpServer relay({451});
  Notifier notifier(Relay(relay, 3));
  notifier.Post(Mail("ops@example.com"));
  ASSERT_TRUE(notifier.WaitIdle(absl::Seconds(20)));
  auto mails = relay.mails();
  ASSERT_EQ(mails.size(), 2u);
  EXPECT_EQ(mails[0].reply, 451);
  EXPECT_EQ(mails[1].reply, 250);
  EXPECT_EQ(mails[0].Header("Subject"), mails[1].Header("Subject"));
  EXPECT_EQ(notifier.emails().delivered, 1u);
  EXPECT_EQ(notifier.emails().failed, 0u);
}

TEST(Notifier, CountsAMailThatNeverGetsThrough) {
  // 554 (transaction failed) is final: not tried again.
  TestSmtpServer relay({554, 554});
  Notifier::Options o = Relay(relay, 3);
  Notifier notifier(o);
  notifier.Post(Mail("ops@example.com"));
  o.smtp.url = "smtp://127.0.0.1:1";  // nothing listens
  Notifier unreachable(o);
  unreachable.Post(Mail("ops@example.com"));
  ASSERT_TRUE(notifier.WaitIdle(absl::Seconds(20)));
  ASSERT_TRUE(unreachable.WaitIdle(absl::Seconds(20)));
  EXPECT_EQ(relay.mails().size(), 1u);
  EXPECT_EQ(notifier.emails().failed, 1u);
  EXPECT_EQ(notifier.emails().delivered, 0u);
  EXPECT_EQ(unreachable.emails().failed, 1u);
}

TEST(Notifier, RequiredTlsSendsNothingToAPlainRelay) {
  TestSmtpServer relay;  // offers no STARTTLS
  Notifier::Options o = Relay(relay, 1);
  o.smtp.require_tls = true;
  Notifier notifier(o);
  notifier.Post(Mail("ops@example.com"));
  ASSERT_TRUE(notifier.WaitIdle(absl::Seconds(20)));
  EXPECT_TRUE(relay.mails().empty());
  EXPECT_EQ(notifier.emails().failed, 1u);
}

TEST(Notifier, AMailsSubjectStaysOneShortLine) {
  v1::Action a = Mail("ops@example.com");
  a.mutable_verdict()->set_rule(std::string(1000, 'r'));
  const VerdictMail mail = VerdictMailOf(a);
  EXPECT_LT(mail.subject.size(), 300u);
  EXPECT_THAT(mail.subject, HasSubstr(std::string(200, 'r') + "... found issues at step 12"));
  EXPECT_EQ(mail.subject.find('\n'), std::string::npos);
}

TEST(Notifier, EmailNeedsARelay) {
  Notifier none{Notifier::Options()};
  EXPECT_THAT(none.CanDeliver("Email:ops@example.com"),
              StatusIs(absl::StatusCode::kFailedPrecondition, "--smtp_url"));
  EXPECT_TRUE(none.CanDeliver("Webhook:http://127.0.0.1:1/h").ok());
  EXPECT_TRUE(none.CanDeliver("StopTraining").ok());
  TestSmtpServer relay;
  Notifier some(Relay(relay, 1));
  EXPECT_TRUE(some.CanDeliver("Email:ops@example.com").ok());
}

TEST(Notifier, SmtpFlagsAreChecked) {
  EXPECT_TRUE(SmtpOptionsFromFlags("", "", "", "", false).ok());
  EXPECT_THAT(SmtpOptionsFromFlags("", "a@b.c", "", "", false),
              StatusIs(absl::StatusCode::kInvalidArgument, "without --smtp_url"));
  EXPECT_THAT(SmtpOptionsFromFlags("http://relay:25", "", "", "", false),
              StatusIs(absl::StatusCode::kInvalidArgument, "smtp://"));
  EXPECT_THAT(SmtpOptionsFromFlags("smtp://relay:25", "Sonde <a@b.c>", "", "", false),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a mail address"));
  EXPECT_THAT(SmtpOptionsFromFlags("smtps://relay:465", "", "me", "", false),
              StatusIs(absl::StatusCode::kInvalidArgument, "go together"));
  ::sonde::testing::TempDir dir;
  EXPECT_THAT(SmtpOptionsFromFlags("smtps://relay:465", "", "me", dir.Sub("none"), false),
              StatusIs(absl::StatusCode::kNotFound, "cannot read"));
  const std::string file = dir.Sub("password");
  std::ofstream(file) << "s3cret\r\nignored\n";
  auto o = SmtpOptionsFromFlags("smtps://relay:465", "a@b.c", "me", file, false);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->url, "smtps://relay:465");
  EXPECT_EQ(o->from, "a@b.c");
  EXPECT_EQ(o->user, "me");
  EXPECT_EQ(o->password, "s3cret");
}

}  // namespace
}  // namespace sonde::server
