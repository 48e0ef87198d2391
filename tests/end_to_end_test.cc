// End-to-end: the real collector (RocksDB, gRPC on a loopback port) driven
// by the real C++ hook, read back through the real query client.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/hook.h"
#include "client/query_client.h"
#include "common/crc32c.h"
#include "common/tensor_chunks.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/health_check_service_interface.h"
#include "gtest/gtest.h"
#include "proto/collector.grpc.pb.h"
#include "storage/store.h"
#include "proto/health.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/testing/http_server.h"
#include "tests/testing/in_process_collector.h"
#include "tests/testing/smtp_server.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace sonde {
namespace {

using ::sonde::testing::InProcessCollector;
using ::sonde::testing::IsOk;
using ::sonde::testing::StatusIs;

constexpr char kStopOnNaN[] = "ExplodingTensor(actions=StopTraining);LossNotDecreasing";

HookOptions Options(const std::string& address, const std::string& job) {
  HookOptions o;
  o.collector = address;
  o.job = job;
  o.config.save_config = SaveConfig::Every(1);
  o.config.include_collections = {"weights", "gradients", "losses"};
  o.close_timeout = absl::Seconds(20);
  return o;
}

std::vector<float> Ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * (static_cast<float>(i) - n / 2.0f);
  return v;
}

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// Waits (without sleeping) until every rule of the job has a verdict.
std::vector<v1::RuleResult> FinalResults(QueryClient& q, const std::string& job) {
  auto results = q.WaitForRuleVerdicts(job, absl::Seconds(30));
  EXPECT_THAT(results, IsOk());
  return results.ok() ? *results : std::vector<v1::RuleResult>();
}

const v1::RuleResult* Find(const std::vector<v1::RuleResult>& rs, const std::string& rule) {
  for (const auto& r : rs) {
    if (r.rule() == rule) return &r;
  }
  return nullptr;
}

TEST(EndToEnd, TensorsReadBackBitExactWithStatisticsSeriesAndSteps) {
  InProcessCollector collector(kStopOnNaN);
  HookOptions o = Options(collector.address(), "exact");
  o.max_chunk_bytes = 4096;  // a 40 000-byte tensor travels as 10 chunks
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  (*hook)->SetMode(v1::MODE_TRAIN);
  std::vector<std::vector<float>> weights;
  for (int step = 0; step < 5; ++step) {
    (*hook)->StartStep();
    weights.push_back(Ramp(10000, 0.001f * (step + 1)));
    SONDE_ASSERT_OK((*hook)->SaveTensor("fc1.weight", HostTensor(weights.back().data(), {100, 100}),
                                        {"weights"}));
    SONDE_ASSERT_OK((*hook)->SaveScalar("loss", 10.0 - step, {"losses"}));
    SONDE_ASSERT_OK((*hook)->SaveTensor("not_included", HostTensor(weights.back().data(), {10}), {"misc"}));
  }
  SONDE_ASSERT_OK((*hook)->Close());
  EXPECT_EQ((*hook)->counters().tensors_dropped, 0u);

  auto q = QueryClient::Connect(collector.address());
  for (int step = 0; step < 5; ++step) {
    auto value = q->ReadTensor("exact", "fc1.weight", step, v1::MODE_TRAIN);
    SONDE_ASSERT_OK(value);
    EXPECT_EQ(value->bytes, Bytes(weights[step])) << "step " << step;
    EXPECT_EQ(value->header.dtype(), v1::DTYPE_F32);
    EXPECT_EQ(std::vector<int64_t>(value->header.shape().begin(), value->header.shape().end()),
              (std::vector<int64_t>{100, 100}));
    EXPECT_EQ(value->header.statistics().count(), 10000u);
    EXPECT_FLOAT_EQ(value->header.statistics().min(), weights[step][0]);
  }
  auto series = q->ReadSeries("exact", "loss", v1::MODE_TRAIN, 1, 4);
  SONDE_ASSERT_OK(series);
  ASSERT_EQ(series->size(), 3u);
  EXPECT_EQ((*series)[0].mode_step(), 1);
  EXPECT_EQ((*series)[2].statistics().mean(), 10.0 - 3);
  auto tensors = q->ListTensors("exact");
  SONDE_ASSERT_OK(tensors);
  EXPECT_EQ(tensors->size(), 2u);  // "not_included" is in no included collection
  auto weights_only = q->ListTensors("exact", "weights");
  ASSERT_EQ(weights_only->size(), 1u);
  EXPECT_EQ((*weights_only)[0].name(), "fc1.weight");
  EXPECT_EQ(q->ListTensors("exact", "", "^lo")->size(), 1u);
  auto steps = q->ListSteps("exact", v1::MODE_TRAIN);
  SONDE_ASSERT_OK(steps);
  EXPECT_EQ(steps->size(), 5u);
  auto job = q->GetJob("exact");
  SONDE_ASSERT_OK(job);
  EXPECT_EQ(job->status(), v1::JOB_STATUS_FINISHED);
  EXPECT_EQ(job->last_step(), 4);
  ASSERT_EQ(job->modes_size(), 1);
  EXPECT_EQ(job->modes(0).step_count(), 5);
  auto results = FinalResults(*q, "exact");
  ASSERT_EQ(results.size(), 2u);
  for (const auto& r : results) EXPECT_EQ(r.status(), v1::RULE_STATUS_NO_ISSUES_FOUND) << r.rule();
}

TEST(EndToEnd, NaNIsCaughtAtItsStepAndTheStopActionReachesTraining) {
  InProcessCollector collector(kStopOnNaN);
  absl::Notification stopped;
  HookOptions o = Options(collector.address(), "diverges");
  o.on_stop = [&](const v1::Action&) { stopped.Notify(); };
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  int last_step = -1;
  for (int step = 0; step < 1000; ++step) {
    if ((*hook)->should_stop()) break;
    (*hook)->StartStep();
    std::vector<float> g = {1.0f, step >= 3 ? nan : 2.0f};
    SONDE_ASSERT_OK((*hook)->SaveTensor("gradient/w", HostTensor(g.data(), {2}), {"gradients"}));
    (*hook)->EndStep();
    last_step = step;
    if (step >= 3) {
      // Training "computes" until the verdict arrives; a real step takes longer.
      ASSERT_TRUE(stopped.WaitForNotificationWithTimeout(absl::Seconds(20)));
    }
  }
  EXPECT_TRUE((*hook)->should_stop());
  EXPECT_EQ(last_step, 3);
  ASSERT_TRUE((*hook)->stop_action().has_value());
  EXPECT_EQ((*hook)->stop_action()->rule(), "ExplodingTensor");
  EXPECT_EQ((*hook)->stop_action()->step(), 3);
  SONDE_ASSERT_OK((*hook)->Close());

  auto q = QueryClient::Connect(collector.address());
  auto results = FinalResults(*q, "diverges");
  const v1::RuleResult* r = Find(results, "ExplodingTensor");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), v1::RULE_STATUS_ISSUES_FOUND);
  EXPECT_EQ(r->step(), 3);
  EXPECT_EQ(r->tensors(0), "gradient/w");
  EXPECT_EQ(r->actions_taken(0), "StopTraining");
  auto job = q->GetJob("diverges");
  SONDE_ASSERT_OK(job);
  EXPECT_EQ(job->status(), v1::JOB_STATUS_STOPPED);
  EXPECT_EQ(job->end_reason(), "stopped by rule ExplodingTensor");
}

TEST(EndToEnd, ValueRulesReceiveTheValuesTheyAskFor) {
  // UnchangedTensor needs raw values: the collector keeps them for it.
  InProcessCollector collector(
      "UnchangedTensor(collection_names=weights,actions=StopTraining)");
  auto hook = Hook::Create(Options(collector.address(), "frozen"));
  SONDE_ASSERT_OK(hook);
  std::vector<float> frozen = {0.25f, -1.0f, 3.0f};
  std::vector<float> learning = {0.25f, -1.0f, 3.0f};
  for (int step = 0; step < 6; ++step) {
    (*hook)->StartStep();
    learning[0] += 0.5f;
    SONDE_ASSERT_OK((*hook)->SaveTensor("fc1.weight", HostTensor(frozen.data(), {3}), {"weights"}));
    SONDE_ASSERT_OK((*hook)->SaveTensor("fc2.weight", HostTensor(learning.data(), {3}), {"weights"}));
  }
  SONDE_ASSERT_OK((*hook)->Close());
  auto q = QueryClient::Connect(collector.address());
  auto results = FinalResults(*q, "frozen");
  const v1::RuleResult* r = Find(results, "UnchangedTensor");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), v1::RULE_STATUS_ISSUES_FOUND);
  EXPECT_EQ(r->step(), 2);
  ASSERT_EQ(r->tensors_size(), 1);
  EXPECT_EQ(r->tensors(0), "fc1.weight");
  EXPECT_FALSE(r->suggestion().empty());
}

TEST(EndToEnd, EnablingARuleMakesTheHookSaveWhatItNeeds) {
  // The user saves nothing but the loss; DeadRelu's collection (relu
  // outputs, with values) arrives with the hello ack.
  InProcessCollector collector("DeadRelu");
  HookOptions o;
  o.collector = collector.address();
  o.job = "needs";
  o.config.save_config = SaveConfig::Every(1);
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  SONDE_ASSERT_OK((*hook)->WaitUntilConnected(absl::Seconds(20)));
  std::vector<float> dead(32 * 16, 0.0f);  // every unit inactive for every sample
  std::vector<float> other(4, 1.0f);
  for (int step = 0; step < 3; ++step) {
    (*hook)->StartStep();
    SONDE_ASSERT_OK((*hook)->SaveTensor("Net_relu_output", HostTensor(dead.data(), {32, 16})));
    SONDE_ASSERT_OK((*hook)->SaveTensor("Net_fc1.weight", HostTensor(other.data(), {4})));
    SONDE_ASSERT_OK((*hook)->SaveScalar("loss", 1.0, {"losses"}));
  }
  SONDE_ASSERT_OK((*hook)->Close());
  auto q = QueryClient::Connect(collector.address());
  auto results = FinalResults(*q, "needs");
  const v1::RuleResult* r = Find(results, "DeadRelu");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), v1::RULE_STATUS_ISSUES_FOUND);
  EXPECT_EQ(r->step(), 0);
  auto tensors = q->ListTensors("needs");
  SONDE_ASSERT_OK(tensors);
  std::vector<std::string> names;
  for (const auto& t : *tensors) names.push_back(t.name());
  // Weights were not asked for by anyone: not saved.
  EXPECT_EQ(names, (std::vector<std::string>{"Net_relu_output", "loss"}));
}

TEST(EndToEnd, WaitUntilConnectedTimesOutWithoutACollector) {
  HookOptions o = Options("127.0.0.1:1", "nobody");
  o.close_timeout = absl::Milliseconds(100);
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  EXPECT_THAT((*hook)->WaitUntilConnected(absl::Milliseconds(200)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, "127.0.0.1:1"));
}

// Five steps of job `job` whose gradient is NaN from step `nan_from` on:
// one transition to IssuesFound for ExplodingTensor.
void TrainWithNaNFrom(int nan_from, const std::string& address, const std::string& job) {
  auto hook = Hook::Create(Options(address, job));
  SONDE_ASSERT_OK(hook);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int step = 0; step < 5; ++step) {
    (*hook)->StartStep();
    std::vector<float> g = {step >= nan_from ? nan : 1.0f};
    SONDE_ASSERT_OK((*hook)->SaveTensor("gradient/w", HostTensor(g.data(), {1}), {"gradients"}));
  }
  SONDE_ASSERT_OK((*hook)->Close());
}

TEST(EndToEnd, AVerdictIsPostedToTheWebhookOnceAndLogged) {
  ::sonde::testing::TestHttpServer hook_server;
  InProcessCollector collector(absl::StrCat(
      "ExplodingTensor(actions=Webhook:", hook_server.Url("/sonde"), "|Log|StopTraining)"));
  ASSERT_NO_FATAL_FAILURE(TrainWithNaNFrom(2, collector.address(), "notify"));
  auto q = QueryClient::Connect(collector.address());
  FinalResults(*q, "notify");
  collector.Stop();  // waits for queued webhook deliveries
  auto requests = hook_server.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].path, "/sonde");
  auto doc = nlohmann::json::parse(requests[0].body);
  EXPECT_EQ(doc["job"], "notify");
  EXPECT_EQ(doc["rule"], "ExplodingTensor");
  EXPECT_EQ(doc["status"], "IssuesFound");
  EXPECT_EQ(doc["step"], 2);
  EXPECT_NE(doc["message"].get<std::string>().find("1 NaN"), std::string::npos);
}

TEST(EndToEnd, AVerdictIsMailedOnceThroughTheRelay) {
  ::sonde::testing::TestSmtpServer relay;
  InProcessCollector collector(
      "ExplodingTensor(actions=Email:ops@example.com|Email:ml@example.com|StopTraining)", {},
      [&](server::CollectorOptions& o) {
        o.notifications.smtp.url = relay.Url();
        o.notifications.smtp.from = "sonde@ci.example";
      });
  ASSERT_NO_FATAL_FAILURE(TrainWithNaNFrom(2, collector.address(), "mailed"));
  auto q = QueryClient::Connect(collector.address());
  auto results = FinalResults(*q, "mailed");
  collector.Stop();  // waits for queued deliveries
  auto mails = relay.mails();
  ASSERT_EQ(mails.size(), 2u);  // one per Email action, once
  std::vector<std::string> to;
  for (const auto& m : mails) {
    EXPECT_EQ(m.from, "sonde@ci.example");
    ASSERT_EQ(m.to.size(), 1u);
    to.push_back(m.to[0]);
    EXPECT_EQ(m.Header("Subject"), "[sonde] job mailed: ExplodingTensor found issues at step 2");
    EXPECT_NE(::sonde::testing::DecodeQuotedPrintable(m.data).find("1 NaN"), std::string::npos)
        << m.data;
  }
  std::sort(to.begin(), to.end());
  EXPECT_EQ(to, (std::vector<std::string>{"ml@example.com", "ops@example.com"}));
  const v1::RuleResult* r = Find(results, "ExplodingTensor");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), v1::RULE_STATUS_ISSUES_FOUND);
  EXPECT_EQ(std::vector<std::string>(r->actions_taken().begin(), r->actions_taken().end()),
            (std::vector<std::string>{"Email:ops@example.com", "Email:ml@example.com",
                                      "StopTraining"}));
}

TEST(EndToEnd, EmailActionsNeedTheCollectorsRelay) {
  ::sonde::testing::TempDir dir;
  server::CollectorOptions co;
  co.listen = "127.0.0.1:0";
  co.data_dir = dir.Sub("db");
  co.default_rules.emplace_back().set_rule_type("ExplodingTensor");
  co.default_rules.back().add_actions("Email:ops@example.com");
  EXPECT_THAT(server::Collector::Start(co),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "rule 'ExplodingTensor': action 'Email:ops@example.com' needs a mail relay"));
  co.default_rules.back().set_actions(0, "Email:ops at example.com");
  EXPECT_THAT(server::Collector::Start(co),
              StatusIs(absl::StatusCode::kInvalidArgument, "is not a mail address"));

  InProcessCollector collector;  // no relay
  auto q = QueryClient::Connect(collector.address());
  v1::RuleSpec mail;
  mail.set_rule_type("ExplodingTensor");
  mail.add_actions("Email:ops@example.com");
  EXPECT_THAT(q->EnableRules("planned-mail", {mail}),
              StatusIs(absl::StatusCode::kFailedPrecondition, "--smtp_url"));
  HookOptions o = Options(collector.address(), "hello-mail");
  o.rules = {mail};
  auto hook = Hook::Create(o);  // training goes on; the hook says why it stored nothing
  SONDE_ASSERT_OK(hook);
  (*hook)->StartStep();
  std::vector<float> w = {1.0f};
  (void)(*hook)->SaveTensor("w", HostTensor(w.data(), {1}), {"weights"});
  EXPECT_THAT((*hook)->Close(), StatusIs(absl::StatusCode::kUnavailable,
                                         "refused job 'hello-mail': rule 'ExplodingTensor': "
                                         "action 'Email:ops@example.com' needs a mail relay"));
  // Refused before anything was stored.
  EXPECT_THAT(q->GetJob("hello-mail"), StatusIs(absl::StatusCode::kNotFound, ""));
  EXPECT_THAT(q->GetJob("planned-mail"), StatusIs(absl::StatusCode::kNotFound, ""));
}

TEST(EndToEnd, ReductionsOnlyTensorsHaveStatisticsButNoValues) {
  InProcessCollector collector;
  HookOptions o = Options(collector.address(), "reduced");
  o.config.reduction_config = ReductionConfig{{"mean", "max"}, {}, {"l2"}, {}, false};
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  std::vector<float> w = {3, 4};
  SONDE_ASSERT_OK((*hook)->SaveTensor("w", HostTensor(w.data(), {2}), {"weights"}));
  SONDE_ASSERT_OK((*hook)->Close());
  auto q = QueryClient::Connect(collector.address());
  EXPECT_THAT(q->ReadTensor("reduced", "w", 0, v1::MODE_GLOBAL),
              StatusIs(absl::StatusCode::kFailedPrecondition, "statistics only"));
  auto series = q->ReadSeries("reduced", "w");
  SONDE_ASSERT_OK(series);
  ASSERT_EQ(series->size(), 1u);
  EXPECT_EQ((*series)[0].statistics().l2(), 5.0);
  EXPECT_EQ((*series)[0].statistics().mean(), 3.5);
}

// A tensor bigger than the collector takes, or values past a step's limit,
// once ended the stream: the hook lost every unacknowledged step, again at
// each step. The hello now says the limits, and such values go as
// statistics only, counted; every step is stored.
TEST(EndToEnd, ValuesPastTheCollectorsLimitsGoAsStatisticsAndNoStepIsLost) {
  server::IngestLimits limits;
  limits.max_chunk_bytes = 1024;
  limits.max_tensor_bytes = 4096;
  limits.max_step_bytes = 10000;
  InProcessCollector collector("", limits);
  auto hook = Hook::Create(Options(collector.address(), "limits"));
  SONDE_ASSERT_OK(hook);
  constexpr int kSteps = 4;
  std::vector<float> big(2048);  // 8 KiB: over the tensor limit
  std::vector<std::vector<float>> small(4, std::vector<float>(768));  // 3 KiB each
  for (int step = 0; step < kSteps; ++step) {
    (*hook)->StartStep();
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(step + i % 7);
    SONDE_ASSERT_OK((*hook)->SaveTensor("big", HostTensor(big.data(), {2048}), {"weights"}));
    for (size_t t = 0; t < small.size(); ++t) {
      for (size_t i = 0; i < small[t].size(); ++i) small[t][i] = static_cast<float>(step * 10 + t);
      // The fourth passes the step's 10000 bytes (3 x 3072 + 3072).
      SONDE_ASSERT_OK((*hook)->SaveTensor(absl::StrCat("small", t),
                                          HostTensor(small[t].data(), {768}), {"weights"}));
    }
  }
  SONDE_ASSERT_OK((*hook)->Close());
  const Hook::Counters c = (*hook)->counters();
  EXPECT_EQ(c.steps_dropped, 0u);
  EXPECT_EQ(c.tensors_dropped, 0u);
  EXPECT_EQ(c.values_dropped, 2u * kSteps);  // "big" and "small3", each step

  auto q = QueryClient::Connect(collector.address());
  auto steps = q->ListSteps("limits");
  SONDE_ASSERT_OK(steps);
  ASSERT_EQ(steps->size(), static_cast<size_t>(kSteps));
  for (const v1::StepInfo& info : *steps) {
    EXPECT_EQ(info.tensor_count(), 5u) << "step " << info.step();
    EXPECT_EQ(info.values_dropped(), 2u) << "step " << info.step();
    EXPECT_FALSE(info.complete()) << "step " << info.step();
    const int64_t step = info.step();
    EXPECT_THAT(q->ReadTensor("limits", "big", step, v1::MODE_GLOBAL),
                StatusIs(absl::StatusCode::kFailedPrecondition, "statistics only"));
    EXPECT_THAT(q->ReadTensor("limits", "small3", step, v1::MODE_GLOBAL),
                StatusIs(absl::StatusCode::kFailedPrecondition, "statistics only"));
    for (int t = 0; t < 3; ++t) {
      auto v = q->ReadTensor("limits", absl::StrCat("small", t), step, v1::MODE_GLOBAL);
      SONDE_ASSERT_OK(v);
      ASSERT_EQ(v->bytes.size(), 3072u);
      float first;
      std::memcpy(&first, v->bytes.data(), 4);
      EXPECT_EQ(first, static_cast<float>(step * 10 + t));
    }
  }
  // The statistics of values not sent are the tensor's own.
  auto series = q->ReadSeries("limits", "big");
  SONDE_ASSERT_OK(series);
  ASSERT_EQ(series->size(), static_cast<size_t>(kSteps));
  for (const v1::SeriesPoint& p : *series) {
    EXPECT_EQ(p.statistics().count(), 2048u);
    EXPECT_EQ(p.statistics().min(), static_cast<double>(p.step()));
    EXPECT_EQ(p.statistics().max(), static_cast<double>(p.step() + 6));
  }
  auto job = q->GetJob("limits");
  SONDE_ASSERT_OK(job);
  EXPECT_EQ(job->values_dropped(), 2u * kSteps);
}

TEST(EndToEnd, TensorsPastTheCollectorsPerStepLimitAreDroppedCountedAndTheStepsStored) {
  server::IngestLimits limits;
  limits.max_tensors_per_step = 3;
  InProcessCollector collector("", limits);
  auto hook = Hook::Create(Options(collector.address(), "many"));
  SONDE_ASSERT_OK(hook);
  constexpr int kSteps = 3;
  std::vector<float> w(16, 1.0f);
  for (int step = 0; step < kSteps; ++step) {
    (*hook)->StartStep();
    for (int t = 0; t < 5; ++t) {
      SONDE_ASSERT_OK((*hook)->SaveTensor(absl::StrCat("w", t), HostTensor(w.data(), {16}),
                                          {"weights"}));
    }
  }
  SONDE_ASSERT_OK((*hook)->Close());
  const Hook::Counters c = (*hook)->counters();
  EXPECT_EQ(c.steps_dropped, 0u);
  EXPECT_EQ(c.tensors_dropped, 2u * kSteps);
  auto q = QueryClient::Connect(collector.address());
  auto steps = q->ListSteps("many");
  SONDE_ASSERT_OK(steps);
  ASSERT_EQ(steps->size(), static_cast<size_t>(kSteps));
  for (const v1::StepInfo& info : *steps) {
    EXPECT_EQ(info.tensor_count(), 3u) << "step " << info.step();
    EXPECT_EQ(info.tensors_dropped(), 2u) << "step " << info.step();
    EXPECT_FALSE(info.complete());
    SONDE_EXPECT_OK(q->ReadTensor("many", "w2", info.step(), v1::MODE_GLOBAL));
  }
}

TEST(EndToEnd, DataAndRuleResultsSurviveACollectorRestart) {
  InProcessCollector collector(kStopOnNaN);
  {
    auto hook = Hook::Create(Options(collector.address(), "persist"));
    SONDE_ASSERT_OK(hook);
    std::vector<float> w = {1.5f, -2.5f};
    for (int i = 0; i < 3; ++i) {
      (*hook)->StartStep();
      SONDE_ASSERT_OK((*hook)->SaveTensor("w", HostTensor(w.data(), {2}), {"weights"}));
    }
    SONDE_ASSERT_OK((*hook)->Close());
  }
  auto before = QueryClient::Connect(collector.address());
  auto results_before = FinalResults(*before, "persist");
  collector.Restart();
  auto q = QueryClient::Connect(collector.address());
  auto value = q->ReadTensor("persist", "w", 2);
  SONDE_ASSERT_OK(value);
  EXPECT_EQ(value->bytes, Bytes({1.5f, -2.5f}));
  auto job = q->GetJob("persist");
  SONDE_ASSERT_OK(job);
  EXPECT_EQ(job->status(), v1::JOB_STATUS_FINISHED);
  auto results = q->RuleResults("persist");
  SONDE_ASSERT_OK(results);
  ASSERT_EQ(results->size(), results_before.size());
  for (const auto& r : *results) EXPECT_EQ(r.status(), v1::RULE_STATUS_NO_ISSUES_FOUND);
  // A finished job cannot be reopened by mistake.
  auto again = Hook::Create(Options(collector.address(), "persist"));
  SONDE_ASSERT_OK(again);
  (*again)->StartStep();
  EXPECT_FALSE((*again)->Close().ok());
}

TEST(EndToEnd, RulesKeepTheirHistoryAndVerdictsAcrossACollectorRestart) {
  // UnchangedTensor needs the last 4 saved steps: two before the restart and
  // two after. ExplodingTensor fired before the restart and must not again.
  InProcessCollector collector(
      "UnchangedTensor(collection_names=weights,num_steps=4);"
      "ExplodingTensor(tensor_regex=^probe$,actions=StopTraining)");
  HookOptions o = Options(collector.address(), "restarted");
  int stops = 0;
  o.on_stop = [&stops](const v1::Action&) { ++stops; };
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  std::vector<float> frozen = {1.0f, 2.0f};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int step = 0; step < 2; ++step) {
    (*hook)->StartStep();
    SONDE_ASSERT_OK((*hook)->SaveTensor("fc.weight", HostTensor(frozen.data(), {2}), {"weights"}));
    std::vector<float> probe = {step == 1 ? nan : 0.0f};
    SONDE_ASSERT_OK((*hook)->SaveTensor("probe", HostTensor(probe.data(), {1}), {"weights"}));
  }
  SONDE_ASSERT_OK((*hook)->Flush(absl::Seconds(20)));
  auto q = QueryClient::Connect(collector.address());
  // Wait until ExplodingTensor's verdict is stored.
  SONDE_ASSERT_OK(q->WatchRuleResults(
      "restarted",
      [](const v1::RuleResult& r) {
        return !(r.rule() == "ExplodingTensor" && r.status() == v1::RULE_STATUS_ISSUES_FOUND);
      },
      absl::Seconds(20)));

  collector.RestartInPlace();  // the hook reconnects by itself
  for (int step = 2; step < 4; ++step) {
    (*hook)->StartStep();
    SONDE_ASSERT_OK((*hook)->SaveTensor("fc.weight", HostTensor(frozen.data(), {2}), {"weights"}));
  }
  SONDE_ASSERT_OK((*hook)->Close());
  auto q2 = QueryClient::Connect(collector.address());
  auto results = FinalResults(*q2, "restarted");
  const v1::RuleResult* unchanged = Find(results, "UnchangedTensor");
  ASSERT_NE(unchanged, nullptr);
  EXPECT_EQ(unchanged->status(), v1::RULE_STATUS_ISSUES_FOUND);
  EXPECT_EQ(unchanged->step(), 3);  // history 0..3 spans the restart
  const v1::RuleResult* exploding = Find(results, "ExplodingTensor");
  ASSERT_NE(exploding, nullptr);
  EXPECT_EQ(exploding->step(), 1);
  EXPECT_EQ(exploding->actions_taken_size(), 1);
  EXPECT_EQ(stops, 1);
  // The stop decided before the restart still decides how the job ended.
  EXPECT_EQ(q2->GetJob("restarted")->status(), v1::JOB_STATUS_STOPPED);
}

TEST(EndToEnd, JobsRunningWhenTheCollectorDiedShowAsDisconnectedAfterRestart) {
  ::sonde::testing::TempDir dir;
  {
    // What a collector killed mid-run leaves behind: a job still marked running.
    storage::Store::Options so;
    so.path = dir.Sub("db");
    auto store = storage::Store::Open(so);
    SONDE_ASSERT_OK(store);
    v1::JobInfo job;
    job.set_job("crashed");
    job.set_world_size(1);
    job.set_status(v1::JOB_STATUS_RUNNING);
    SONDE_ASSERT_OK((*store)->CreateJob(job));
  }
  server::CollectorOptions co;
  co.listen = "127.0.0.1:0";
  co.data_dir = dir.Sub("db");
  auto collector = server::Collector::Start(co);
  SONDE_ASSERT_OK(collector);
  auto q = QueryClient::Connect((*collector)->address());
  auto job = q->GetJob("crashed");
  SONDE_ASSERT_OK(job);
  EXPECT_EQ(job->status(), v1::JOB_STATUS_DISCONNECTED);
  // Its worker can come back and finish it.
  auto hook = Hook::Create(Options((*collector)->address(), "crashed"));
  SONDE_ASSERT_OK(hook);
  (*hook)->StartStep();
  SONDE_ASSERT_OK((*hook)->Close());
  EXPECT_EQ(q->GetJob("crashed")->status(), v1::JOB_STATUS_FINISHED);
}

TEST(EndToEnd, QueriesForUnknownJobsAndTensorsSayNotFound) {
  InProcessCollector collector;
  auto q = QueryClient::Connect(collector.address());
  EXPECT_THAT(q->GetJob("nope"), StatusIs(absl::StatusCode::kNotFound, "nope"));
  EXPECT_THAT(q->ReadTensor("nope", "w", 0), StatusIs(absl::StatusCode::kNotFound, "nope"));
  EXPECT_THAT(q->RuleResults("nope"), StatusIs(absl::StatusCode::kNotFound, "nope"));
  EXPECT_THAT(q->ListTensors(""), StatusIs(absl::StatusCode::kInvalidArgument, "no job"));
  auto hook = Hook::Create(Options(collector.address(), "known"));
  std::vector<float> w = {1};
  SONDE_ASSERT_OK((*hook)->SaveTensor("w", HostTensor(w.data(), {1}), {"weights"}));
  SONDE_ASSERT_OK((*hook)->Close());
  EXPECT_THAT(q->ReadTensor("known", "w", 7), StatusIs(absl::StatusCode::kNotFound, "7"));
  EXPECT_THAT(q->ReadTensor("known", "v", 0), StatusIs(absl::StatusCode::kNotFound, "'v'"));
  // A mode the proto does not name is refused, not read as an empty index
  // (ListSteps, ReadTensor) or as every mode (ReadSeries).
  const auto unknown_mode = static_cast<v1::Mode>(9);
  EXPECT_THAT(q->ListSteps("known", unknown_mode),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown mode 9"));
  EXPECT_THAT(q->ReadTensor("known", "w", 0, unknown_mode),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown mode 9"));
  EXPECT_THAT(q->ReadSeries("known", "w", unknown_mode),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown mode 9"));
  EXPECT_THAT(q->ReadSeries("known", "w", static_cast<v1::Mode>(-1)),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown mode -1"));
  EXPECT_THAT(q->ListTensors("known", "", "(["),
              StatusIs(absl::StatusCode::kInvalidArgument, "regex"));
  EXPECT_TRUE(q->ListJobs().ok());
}

// A raw Collector stream, for sending what the hook never would.
class RawStream {
 public:
  explicit RawStream(const std::string& address) {
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(64 << 20);
    stub_ = v1::Collector::NewStub(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
    stream_ = stub_->Stream(&context_);
  }
  bool Send(v1::ClientMessage m) {
    m.set_seq(++seq_);
    return stream_->Write(m);
  }
  bool Hello(const std::string& job, int32_t worker = 0, int32_t world_size = 1) {
    v1::ClientMessage m;
    m.mutable_hello()->set_job(job);
    m.mutable_hello()->set_worker(worker);
    m.mutable_hello()->set_world_size(world_size);
    return Send(m);
  }
  // Reads until the server ends the stream and returns its status.
  grpc::Status Finish() {
    stream_->WritesDone();
    v1::ServerMessage in;
    while (stream_->Read(&in)) {
    }
    return stream_->Finish();
  }

 private:
  std::unique_ptr<v1::Collector::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::ClientMessage, v1::ServerMessage>> stream_;
  uint64_t seq_ = 0;
};

v1::ClientMessage Chunk(v1::TensorChunk c) {
  v1::ClientMessage m;
  *m.mutable_chunk() = std::move(c);
  return m;
}

v1::TensorChunk Header(const std::string& name, int64_t step, std::vector<int64_t> shape) {
  v1::TensorChunk h;
  h.set_tensor_name(name);
  h.set_step(step);
  h.set_mode_step(step);
  h.set_mode(v1::MODE_TRAIN);
  h.set_dtype(v1::DTYPE_F32);
  for (auto d : shape) h.add_shape(d);
  return h;
}

TEST(EndToEnd, BadChunksEndTheStreamWithAPreciseStatusAndStoredDataStays) {
  InProcessCollector collector;
  {
    auto hook = Hook::Create(Options(collector.address(), "victim"));
    std::vector<float> w = {7, 8, 9};
    SONDE_ASSERT_OK((*hook)->SaveTensor("w", HostTensor(w.data(), {3}), {"weights"}));
    SONDE_ASSERT_OK((*hook)->Close());
  }
  {
    RawStream s(collector.address());
    ASSERT_TRUE(s.Hello("attacker"));
    auto chunk = SplitIntoChunks(Header("w", 0, {4}), Bytes({1, 2, 3, 4}), 1024)[0];
    chunk.set_crc32c(chunk.crc32c() ^ 1);
    s.Send(Chunk(chunk));
    grpc::Status st = s.Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::DATA_LOSS);
    EXPECT_NE(st.error_message().find("crc32c mismatch"), std::string::npos) << st.error_message();
  }
  {
    RawStream s(collector.address());
    ASSERT_TRUE(s.Hello("attacker2"));
    auto chunk = SplitIntoChunks(Header("w", 0, {5}), Bytes({1, 2, 3, 4}), 1024)[0];
    s.Send(Chunk(chunk));
    grpc::Status st = s.Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(st.error_message().find("needs 20 bytes, total_bytes says 16"), std::string::npos)
        << st.error_message();
  }
  {
    RawStream s(collector.address());
    v1::ClientMessage m;
    m.mutable_step_end()->set_step(0);
    s.Send(m);
    grpc::Status st = s.Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_NE(st.error_message().find("must be a hello"), std::string::npos);
  }
  {
    // Bigger than the collector's message limit: refused by gRPC itself.
    RawStream s(collector.address());
    ASSERT_TRUE(s.Hello("huge"));
    std::vector<float> big(3 << 20, 1.0f);  // 12 MiB in one chunk
    s.Send(Chunk(SplitIntoChunks(Header("big", 0, {3 << 20}), Bytes(big), 64 << 20)[0]));
    grpc::Status st = s.Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  }
  auto q = QueryClient::Connect(collector.address());
  auto value = q->ReadTensor("victim", "w", 0);
  SONDE_ASSERT_OK(value);
  EXPECT_EQ(value->bytes, Bytes({7, 8, 9}));
  EXPECT_THAT(q->ListTensors("attacker"), StatusIs(absl::StatusCode::kOk, ""));
  EXPECT_TRUE(q->ListTensors("attacker")->empty());
}

// The end of a TRAIN step of one tensor.
v1::ClientMessage StepEnd(int64_t step, int64_t mode_step) {
  v1::ClientMessage m;
  m.mutable_step_end()->set_tensor_count(1);
  m.mutable_step_end()->set_step(step);
  m.mutable_step_end()->set_mode(v1::MODE_TRAIN);
  m.mutable_step_end()->set_mode_step(mode_step);
  return m;
}

// A worker's records are keyed by mode step. A later stream of the worker
// (another client: the checks of one stream do not see the last) that
// sends a new global step with a TRAIN step the worker has stored already
// is refused, and the stored step keeps its tensors. Before, the new step's
// tensor overwrote step 0's: reading step 0 answered step 5's values.
TEST(EndToEnd, AModeStepStoredByAnEarlierStreamIsNotOverwritten) {
  InProcessCollector collector;
  {
    RawStream s(collector.address());
    ASSERT_TRUE(s.Hello("remodel"));
    s.Send(Chunk(SplitIntoChunks(Header("w", 0, {3}), Bytes({1, 2, 3}), 1024)[0]));
    s.Send(StepEnd(0, 0));
    EXPECT_TRUE(s.Finish().ok());
  }
  {
    RawStream s(collector.address());
    ASSERT_TRUE(s.Hello("remodel"));
    v1::TensorChunk header = Header("w", 5, {3});
    header.set_mode_step(0);
    s.Send(Chunk(SplitIntoChunks(header, Bytes({4, 5, 6}), 1024)[0]));
    s.Send(StepEnd(5, 0));
    grpc::Status st = s.Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(st.error_message().find("step 5 has TRAIN step 0, which worker 0 stored with step 0"),
              std::string::npos)
        << st.error_message();
  }
  auto q = QueryClient::Connect(collector.address());
  for (v1::Mode mode : {v1::MODE_GLOBAL, v1::MODE_TRAIN}) {
    auto value = q->ReadTensor("remodel", "w", 0, mode);
    SONDE_ASSERT_OK(value);
    EXPECT_EQ(value->bytes, Bytes({1, 2, 3})) << v1::Mode_Name(mode);
  }
  auto steps = q->ListSteps("remodel");
  SONDE_ASSERT_OK(steps);
  ASSERT_EQ(steps->size(), 1u);
  EXPECT_EQ(steps->front().step(), 0);
}

// Workers' mode steps need not agree at a global step: here worker 1 took a
// TRAIN step at global step 1 that worker 0 did not. A global step read of
// one worker is that worker's own step, never the TRAIN step another worker
// stored at it; a global step the worker has no point at is NotFound.
TEST(EndToEnd, AGlobalStepReadOfAWorkerIsThatWorkersOwnStep) {
  InProcessCollector collector;
  // (global step, TRAIN step, value) of each worker.
  const std::vector<std::vector<std::array<int64_t, 3>>> steps = {
      {{0, 0, 0}, {2, 1, 2}},                // worker 0
      {{0, 0, 100}, {1, 1, 101}, {2, 2, 102}},  // worker 1
  };
  for (int32_t worker = 0; worker < 2; ++worker) {
    RawStream s(collector.address());
    ASSERT_TRUE(s.Hello("skew", worker, 2));
    for (const auto& [step, mode_step, value] : steps[worker]) {
      v1::TensorChunk header = Header("w", step, {1});
      header.set_mode_step(mode_step);
      s.Send(Chunk(SplitIntoChunks(header, Bytes({static_cast<float>(value)}), 1024)[0]));
      s.Send(StepEnd(step, mode_step));
    }
    grpc::Status st = s.Finish();
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  auto q = QueryClient::Connect(collector.address());
  for (int32_t worker = 0; worker < 2; ++worker) {
    for (const auto& [step, mode_step, value] : steps[worker]) {
      auto read = q->ReadTensor("skew", "w", step, v1::MODE_GLOBAL, worker);
      SONDE_ASSERT_OK(read);
      EXPECT_EQ(read->bytes, Bytes({static_cast<float>(value)}))
          << "worker " << worker << " global step " << step;
      EXPECT_EQ(read->header.step(), step);
      EXPECT_EQ(read->header.mode_step(), mode_step);
    }
  }
  EXPECT_THAT(q->ReadTensor("skew", "w", 1, v1::MODE_GLOBAL, 0),
              StatusIs(absl::StatusCode::kNotFound, "worker 0 stored no step at global step 1"));
}

TEST(EndToEnd, AnUnreachableCollectorNeverBlocksTraining) {
  // Nothing listens on this port: the hook keeps trying in the background.
  ::sonde::testing::TempDir dir;
  HookOptions o = Options("127.0.0.1:1", "orphan");
  o.close_timeout = absl::Milliseconds(300);
  o.max_queue_bytes = 1 << 16;
  o.backpressure.policy = BackpressurePolicy::kDrop;  // (tests/reliability_test covers spill)
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  std::vector<float> w(1024, 1.0f);  // 4 KiB per save, queue of 64 KiB
  for (int i = 0; i < 100; ++i) {
    (*hook)->StartStep();
    SONDE_ASSERT_OK((*hook)->SaveTensor("w", HostTensor(w.data(), {1024}), {"weights"}));
  }
  auto counters = (*hook)->counters();
  EXPECT_GT(counters.tensors_dropped, 0u);  // the bounded queue overflowed...
  // ...and memory stayed bounded (step ends ride over it). How many were
  // saved depends on how fast the sender moves steps to the spool, which
  // frees memory for more: not asserted.
  EXPECT_LE(counters.memory_bytes, (1u << 16) + (64u << 10));
  EXPECT_THAT((*hook)->Close(), StatusIs(absl::StatusCode::kDeadlineExceeded, "acknowledge"));
}

TEST(EndToEnd, HookConfiguredFromSageMakerJsonFile) {
  InProcessCollector collector;
  ::sonde::testing::TempDir dir;
  const std::string path = dir.Sub("debughookconfig.json");
  std::ofstream(path) << R"({"LocalPath": "/opt/ml/output/tensors",
      "HookParameters": {"save_interval": "2", "job": "from-json"},
      "CollectionConfigurations": [{"CollectionName": "weights"},
                                   {"CollectionName": "losses"}]})";
  HookOptions base;
  base.collector = collector.address();
  auto hook = Hook::CreateFromJsonFile(path, base);
  SONDE_ASSERT_OK(hook);
  std::vector<float> w = {1, 2};
  for (int i = 0; i < 6; ++i) {
    (*hook)->StartStep();
    SONDE_ASSERT_OK((*hook)->SaveTensor("fc.weight", HostTensor(w.data(), {2})));
  }
  SONDE_ASSERT_OK((*hook)->Close());
  auto q = QueryClient::Connect(collector.address());
  auto series = q->ReadSeries("from-json", "fc.weight");
  SONDE_ASSERT_OK(series);
  std::vector<int64_t> steps;
  for (const auto& p : *series) steps.push_back(p.step());
  EXPECT_EQ(steps, (std::vector<int64_t>{0, 2, 4}));
  EXPECT_THAT(Hook::CreateFromJsonFile(dir.Sub("missing.json"), base),
              StatusIs(absl::StatusCode::kNotFound, "missing.json"));
}

TEST(EndToEnd, ACollectorWithAnUnknownDefaultRuleRefusesToStart) {
  ::sonde::testing::TempDir dir;
  server::CollectorOptions co;
  co.listen = "127.0.0.1:0";
  co.data_dir = dir.Sub("db");
  co.default_rules.emplace_back().set_rule_type("ExplodingTensors");
  EXPECT_THAT(server::Collector::Start(co),
              StatusIs(absl::StatusCode::kNotFound, "unknown rule type 'ExplodingTensors'"));
  co.default_rules.back().set_rule_type("ExplodingTensor");
  (*co.default_rules.back().mutable_parameters())["only_nan"] = "perhaps";
  EXPECT_THAT(server::Collector::Start(co),
              StatusIs(absl::StatusCode::kInvalidArgument, "perhaps"));
}

TEST(EndToEnd, ARulePluginLoadedByTheCollectorJudgesAJob) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  const std::string plugin = absl::StrCat(srcdir ? srcdir : ".", "/",
                                          workspace ? workspace : "sonde",
                                          "/examples/rule_plugin/liblarge_weights.so");
  ::sonde::testing::TempDir dir;
  server::CollectorOptions co;
  co.listen = "127.0.0.1:0";
  co.data_dir = dir.Sub("db");
  co.rule_plugins = {plugin};
  co.default_rules.emplace_back().set_rule_type("LargeWeights");
  auto collector = server::Collector::Start(co);
  SONDE_ASSERT_OK(collector);
  auto q = QueryClient::Connect((*collector)->address());
  auto catalog = q->RuleCatalog();
  SONDE_ASSERT_OK(catalog);
  bool listed = false;
  for (const auto& e : *catalog) listed |= e.rule_type() == "LargeWeights" && e.source() == plugin;
  EXPECT_TRUE(listed);
  auto hook = Hook::Create(Options((*collector)->address(), "plugged"));
  SONDE_ASSERT_OK(hook);
  for (int step = 0; step < 3; ++step) {
    (*hook)->StartStep();
    std::vector<float> w = {1.0f, step == 2 ? 42.0f : 3.0f};
    SONDE_ASSERT_OK((*hook)->SaveTensor("fc.weight", HostTensor(w.data(), {2}), {"weights"}));
  }
  SONDE_ASSERT_OK((*hook)->Close());
  auto results = FinalResults(*q, "plugged");
  const v1::RuleResult* r = Find(results, "LargeWeights");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), v1::RULE_STATUS_ISSUES_FOUND);
  EXPECT_EQ(r->step(), 2);
  EXPECT_EQ(r->observed(), 42.0);
  EXPECT_EQ(r->suggestion(), "Add weight decay or lower the learning rate.");
  co.rule_plugins = {"/nonexistent/lib.so"};
  EXPECT_THAT(server::Collector::Start(co), StatusIs(absl::StatusCode::kNotFound, "lib.so"));
}

TEST(EndToEnd, AStalledJobIsFoundByTheClockAndStopped) {
  InProcessCollector collector("StalledTrainingRule(threshold=0.5,stop_training_on_fire=true)");
  absl::Notification stopped;
  HookOptions o = Options(collector.address(), "stalled");
  o.on_stop = [&](const v1::Action&) { stopped.Notify(); };
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  (*hook)->StartStep();
  SONDE_ASSERT_OK((*hook)->SaveScalar("loss", 1.0, {"losses"}));
  (*hook)->EndStep();
  // Training "hangs": no more steps. The collector's clock notices.
  ASSERT_TRUE(stopped.WaitForNotificationWithTimeout(absl::Seconds(30)));
  SONDE_ASSERT_OK((*hook)->Close());
  auto q = QueryClient::Connect(collector.address());
  auto results = q->RuleResults("stalled");
  SONDE_ASSERT_OK(results);
  const v1::RuleResult* r = Find(*results, "StalledTrainingRule");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), v1::RULE_STATUS_ISSUES_FOUND);
  EXPECT_NE(r->message().find("no new step"), std::string::npos) << r->message();
  EXPECT_EQ(r->actions_taken(0), "StopTraining");
}

TEST(EndToEnd, SimilarAcrossRunsComparesAJobWithAStoredReference) {
  InProcessCollector collector;
  auto run = [&](const std::string& job, int diverge_at, std::vector<v1::RuleSpec> rules) {
    HookOptions o = Options(collector.address(), job);
    o.rules = std::move(rules);
    auto hook = Hook::Create(o);
    EXPECT_THAT(hook, IsOk());
    for (int step = 0; step < 5; ++step) {
      (*hook)->StartStep();
      std::vector<float> w = {0.5f * step, 1.0f};
      if (step >= diverge_at) w[1] += 0.01f;
      EXPECT_THAT((*hook)->SaveTensor("fc.weight", HostTensor(w.data(), {2}), {"weights"}), IsOk());
    }
    EXPECT_THAT((*hook)->Close(), IsOk());
  };
  run("reference", 99, {});
  v1::RuleSpec similar;
  similar.set_rule_type("SimilarAcrossRuns");
  (*similar.mutable_parameters())["other_trials"] = "reference";
  (*similar.mutable_parameters())["collection_names"] = "weights";
  run("rerun", 3, {similar});
  auto q = QueryClient::Connect(collector.address());
  auto results = FinalResults(*q, "rerun");
  const v1::RuleResult* r = Find(results, "SimilarAcrossRuns");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), v1::RULE_STATUS_ISSUES_FOUND);
  EXPECT_EQ(r->step(), 3);
  EXPECT_NE(r->message().find("differs from job 'reference' in 1 of 2 values"), std::string::npos)
      << r->message();
  // The same run again matches the reference: quiet.
  run("identical", 99, {similar});
  auto again = FinalResults(*q, "identical");
  ASSERT_NE(Find(again, "SimilarAcrossRuns"), nullptr);
  EXPECT_EQ(Find(again, "SimilarAcrossRuns")->status(), v1::RULE_STATUS_NO_ISSUES_FOUND);
}

TEST(EndToEnd, RulesEnabledThroughTheApiRunWhenTheJobStarts) {
  InProcessCollector collector("ExplodingTensor");
  auto q = QueryClient::Connect(collector.address());
  v1::RuleSpec high_loss;
  high_loss.set_name("loss_high");
  high_loss.set_rule_type("Threshold");
  (*high_loss.mutable_parameters())["collection_names"] = "losses";
  (*high_loss.mutable_parameters())["statistic"] = "mean";
  (*high_loss.mutable_parameters())["threshold"] = "5";
  auto enabled = q->EnableRules("planned", {high_loss});
  SONDE_ASSERT_OK(enabled);
  ASSERT_EQ(enabled->size(), 1u);
  EXPECT_EQ(q->GetJob("planned")->status(), v1::JOB_STATUS_PENDING);
  EXPECT_THAT(q->EnableRules("planned", {high_loss}),
              StatusIs(absl::StatusCode::kAlreadyExists, "loss_high"));
  v1::RuleSpec bad;
  bad.set_rule_type("Threshold");
  EXPECT_THAT(q->EnableRules("planned", {bad}),
              StatusIs(absl::StatusCode::kInvalidArgument, "collection_names or tensor_regex"));

  auto hook = Hook::Create(Options(collector.address(), "planned"));
  SONDE_ASSERT_OK(hook);
  for (int step = 0; step < 3; ++step) {
    (*hook)->StartStep();
    SONDE_ASSERT_OK((*hook)->SaveScalar("loss", step == 2 ? 9.0 : 1.0, {"losses"}));
  }
  SONDE_ASSERT_OK((*hook)->Close());
  auto results = FinalResults(*q, "planned");
  ASSERT_EQ(results.size(), 2u);  // the API's rule and the collector's default
  const v1::RuleResult* r = Find(results, "loss_high");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->status(), v1::RULE_STATUS_ISSUES_FOUND);
  EXPECT_EQ(r->step(), 2);
  EXPECT_NE(Find(results, "ExplodingTensor"), nullptr);
  EXPECT_THAT(q->EnableRules("planned", {high_loss}),
              StatusIs(absl::StatusCode::kFailedPrecondition, "has started"));
}

TEST(EndToEnd, HealthServiceReportsServing) {
  InProcessCollector collector;
  auto channel = grpc::CreateChannel(collector.address(), grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status s = health->Check(&ctx, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

}  // namespace
}  // namespace sonde
