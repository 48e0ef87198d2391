// The Query service's watches end to end: a real collector, a real hook
// streaming a live job, real gRPC watchers (async clients, so a thousand
// watches need no thousand client threads either).
//
// What is checked: watches are pushed, not polled (an open watch holds no
// collector thread: a thousand of them add no threads, and every one
// hears a posted verdict); a slow WatchSteps reader is cut off with
// RESOURCE_EXHAUSTED naming the step to resume from, and resuming there
// loses nothing.
#include <dirent.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/hook.h"
#include "client/query_client.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/query.grpc.pb.h"
#include "tests/testing/in_process_collector.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/wait.h"

namespace sonde {
namespace {

size_t ThreadsOfThisProcess() {
  size_t n = 0;
  DIR* d = ::opendir("/proc/self/task");
  if (d == nullptr) return 0;
  while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n;
}

HookOptions Options(const std::string& address, const std::string& job) {
  HookOptions o;
  o.collector = address;
  o.job = job;
  o.config.save_config = SaveConfig::Every(1);
  o.config.include_collections = {"weights"};
  o.upload_left_spools = false;
  return o;
}

// One async call of a server-streaming method; its tag is this object.
template <typename T>
struct AsyncWatch {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientAsyncReader<T>> reader;
  T message;
  grpc::Status status;
};

TEST(Watch, AThousandOpenWatchesHoldNoThreadAndAllHearAVerdict) {
  testing::InProcessCollector collector;
  auto hook = Hook::Create(Options(collector.address(), "watched"));
  SONDE_ASSERT_OK(hook);
  SONDE_ASSERT_OK((*hook)->WaitUntilConnected(absl::Seconds(20)));  // the job is live

  auto channel = grpc::CreateChannel(collector.address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Query::NewStub(channel);
  // Warm the channel (and the server's pools) before counting threads.
  {
    grpc::ClientContext ctx;
    v1::GetJobRequest req;
    req.set_job("watched");
    v1::JobInfo info;
    ASSERT_TRUE(stub->GetJob(&ctx, req, &info).ok());
  }
  const size_t threads_before = ThreadsOfThisProcess();

  constexpr int kWatches = 1000;
  grpc::CompletionQueue cq;
  std::vector<std::unique_ptr<AsyncWatch<v1::RuleResult>>> watches;
  v1::GetRuleResultsRequest request;
  request.set_job("watched");
  for (int i = 0; i < kWatches; ++i) {
    auto w = std::make_unique<AsyncWatch<v1::RuleResult>>();
    w->reader = stub->PrepareAsyncWatchRuleResults(&w->context, request, &cq);
    w->reader->StartCall(w.get());
    watches.push_back(std::move(w));
  }
  void* tag;
  bool ok;
  for (int i = 0; i < kWatches; ++i) {  // every call started
    ASSERT_TRUE(cq.Next(&tag, &ok));
    ASSERT_TRUE(ok);
  }
  ASSERT_TRUE(sonde::testing::WaitUntil([&] { return collector.collector().open_watches() == kWatches; }))
      << collector.collector().open_watches();
  const size_t threads_open = ThreadsOfThisProcess();
  // The synchronous pool may grow by a few; a thread per watch would be 1000.
  EXPECT_LT(threads_open, threads_before + 50)
      << threads_before << " threads before, " << threads_open << " with the watches open";

  for (auto& w : watches) w->reader->Read(&w->message, w.get());
  {
    grpc::ClientContext ctx;
    v1::PostRuleResultRequest post;
    post.mutable_result()->set_job("watched");
    post.mutable_result()->set_rule("external");
    post.mutable_result()->set_status(v1::RULE_STATUS_ISSUES_FOUND);
    post.mutable_result()->set_message("seen by all");
    v1::PostRuleResultResponse resp;
    ASSERT_TRUE(stub->PostRuleResult(&ctx, post, &resp).ok());
  }
  std::set<void*> heard;
  for (int i = 0; i < kWatches; ++i) {
    ASSERT_TRUE(cq.Next(&tag, &ok));
    ASSERT_TRUE(ok) << "a watch ended instead of reading the verdict";
    auto* w = static_cast<AsyncWatch<v1::RuleResult>*>(tag);
    EXPECT_EQ(w->message.rule(), "external");
    EXPECT_EQ(w->message.message(), "seen by all");
    heard.insert(tag);
  }
  EXPECT_EQ(heard.size(), static_cast<size_t>(kWatches));

  // Cancelled by their clients, the watches go away on the server too.
  for (auto& w : watches) w->context.TryCancel();
  for (auto& w : watches) w->reader->Finish(&w->status, w.get());
  for (int i = 0; i < kWatches; ++i) ASSERT_TRUE(cq.Next(&tag, &ok));
  for (auto& w : watches) EXPECT_EQ(w->status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(sonde::testing::WaitUntil([&] { return collector.collector().open_watches() == 0; }))
      << collector.collector().open_watches();
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  SONDE_EXPECT_OK((*hook)->Close());
}

// Starts a WatchSteps call of `job` on `cq` that reads nothing until told,
// and waits until the collector holds it open.
void StartSlowWatch(v1::Query::Stub& stub, const std::string& job,
                    testing::InProcessCollector& collector, grpc::CompletionQueue& cq,
                    AsyncWatch<v1::CompletedStep>& slow) {
  v1::WatchStepsRequest request;
  request.set_job(job);
  slow.reader = stub.PrepareAsyncWatchSteps(&slow.context, request, &cq);
  slow.reader->StartCall(&slow);
  void* tag;
  bool ok;
  ASSERT_TRUE(cq.Next(&tag, &ok));
  ASSERT_TRUE(ok);
  ASSERT_TRUE(sonde::testing::WaitUntil([&] { return collector.collector().open_watches() == 1; }));
}

// `steps` steps of `tensors` tensors of 4 floats equal to the step, with
// names of about 200 bytes (a step's records about 300 bytes a tensor).
void Flood(Hook& hook, int64_t steps, int tensors) {
  std::vector<float> w(4);
  for (int64_t step = 0; step < steps; ++step) {
    std::fill(w.begin(), w.end(), static_cast<float>(step));
    hook.StartStep();
    for (int t = 0; t < tensors; ++t) {
      SONDE_ASSERT_OK(hook.SaveTensor(absl::StrCat("layer", t, "/", std::string(200, 'w')),
                                      HostTensor(w.data(), {4}), {"weights"}));
    }
  }
}

TEST(Watch, ASlowStepsReaderIsCutOffWithWhereToResumeAndResumingLosesNothing) {
  testing::InProcessCollector collector("", server::IngestLimits(),
                                        [](server::CollectorOptions& o) {
                                          o.watch.max_queued_steps = 4;
                                        });
  auto channel = grpc::CreateChannel(collector.address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Query::NewStub(channel);
  auto hook = Hook::Create(Options(collector.address(), "flood"));
  SONDE_ASSERT_OK(hook);
  SONDE_ASSERT_OK((*hook)->WaitUntilConnected(absl::Seconds(20)));

  // A watcher that reads nothing while 300 steps of 64 tensors arrive (each
  // step's records about 20 KB: 6 MB in all), far more than gRPC's
  // flow-control windows hold, so its queue fills.
  grpc::CompletionQueue cq;
  AsyncWatch<v1::CompletedStep> slow;
  ASSERT_NO_FATAL_FAILURE(StartSlowWatch(*stub, "flood", collector, cq, slow));
  void* tag;
  bool ok;

  constexpr int64_t kSteps = 300;
  constexpr int kTensors = 64;
  ASSERT_NO_FATAL_FAILURE(Flood(**hook, kSteps, kTensors));
  SONDE_ASSERT_OK((*hook)->Close());  // every step stored, the job ended

  // Now read: some steps, in order, then the cut-off.
  std::vector<int64_t> got;
  while (true) {
    slow.reader->Read(&slow.message, &slow);
    ASSERT_TRUE(cq.Next(&tag, &ok));
    if (!ok) break;
    got.push_back(slow.message.step());
    ASSERT_EQ(slow.message.tensors_size(), kTensors);
    EXPECT_EQ(slow.message.tensors(0).statistics().max(), static_cast<double>(got.back()));
  }
  slow.reader->Finish(&slow.status, &slow);
  ASSERT_TRUE(cq.Next(&tag, &ok));
  ASSERT_EQ(slow.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << slow.status.error_message();
  const std::string marker = "from_step=";
  const size_t at = slow.status.error_message().find(marker);
  ASSERT_NE(at, std::string::npos) << slow.status.error_message();
  int64_t resume = -1;
  ASSERT_TRUE(absl::SimpleAtoi(
      slow.status.error_message().substr(at + marker.size()).substr(
          0, slow.status.error_message().find_first_not_of("0123456789", at + marker.size()) -
                 (at + marker.size())),
      &resume))
      << slow.status.error_message();
  ASSERT_LT(got.size(), static_cast<size_t>(kSteps));  // it was cut off...
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], static_cast<int64_t>(i));
  EXPECT_EQ(resume, static_cast<int64_t>(got.size()));  // ...right after what it wrote

  // Resuming there gets the rest from storage, in order, and ends (the job
  // has ended).
  grpc::ClientContext ctx;
  v1::WatchStepsRequest request;
  request.set_job("flood");
  request.set_from_step(resume);
  auto reader = stub->WatchSteps(&ctx, request);
  v1::CompletedStep c;
  while (reader->Read(&c)) {
    got.push_back(c.step());
    ASSERT_EQ(c.tensors_size(), kTensors);
    EXPECT_EQ(c.tensors(0).statistics().max(), static_cast<double>(c.step()));
  }
  SONDE_EXPECT_OK(absl::Status(static_cast<absl::StatusCode>(reader->Finish().error_code()), ""));
  ASSERT_EQ(got.size(), static_cast<size_t>(kSteps));
  for (int64_t i = 0; i < kSteps; ++i) EXPECT_EQ(got[i], i);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

// The same cut-off when every step comes in parts (parts of 4 KB here, of
// 3 MiB by default): where the cut falls in the middle of a step, the
// resume point is that step, not the one after it, so resuming gets all of
// it. Before, the hint named the next step and the cut step was lost.
TEST(Watch, AReaderCutOffInTheMiddleOfAStepsPartsResumesAtThatStep) {
  testing::InProcessCollector collector("", server::IngestLimits(),
                                        [](server::CollectorOptions& o) {
                                          o.watch.max_queued_steps = 4;
                                          o.watch.max_part_bytes = 4096;
                                        });
  auto stub = v1::Query::NewStub(
      grpc::CreateChannel(collector.address(), grpc::InsecureChannelCredentials()));
  auto hook = Hook::Create(Options(collector.address(), "parts"));
  SONDE_ASSERT_OK(hook);
  SONDE_ASSERT_OK((*hook)->WaitUntilConnected(absl::Seconds(20)));

  grpc::CompletionQueue cq;
  AsyncWatch<v1::CompletedStep> slow;
  ASSERT_NO_FATAL_FAILURE(StartSlowWatch(*stub, "parts", collector, cq, slow));
  void* tag;
  bool ok;

  // 300 steps of 64 records of about 300 bytes: 5 parts a step.
  constexpr int64_t kSteps = 300;
  constexpr int kTensors = 64;
  ASSERT_NO_FATAL_FAILURE(Flood(**hook, kSteps, kTensors));
  SONDE_ASSERT_OK((*hook)->Close());

  // Tensors heard per step, and whether its last part came.
  std::map<int64_t, int> tensors;
  std::set<int64_t> whole;
  v1::CompletedStep last;
  int messages = 0;
  while (true) {
    slow.reader->Read(&slow.message, &slow);
    ASSERT_TRUE(cq.Next(&tag, &ok));
    if (!ok) break;
    last = slow.message;
    ++messages;
    tensors[last.step()] += last.tensors_size();
    if (!last.more()) whole.insert(last.step());
  }
  slow.reader->Finish(&slow.status, &slow);
  ASSERT_TRUE(cq.Next(&tag, &ok));
  ASSERT_EQ(slow.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << slow.status.error_message();
  ASSERT_GT(messages, 0);
  const std::string marker = "from_step=";
  const std::string& message = slow.status.error_message();
  const size_t at = message.find(marker) + marker.size();
  ASSERT_GT(at, marker.size() - 1) << message;
  int64_t resume = -1;
  ASSERT_TRUE(absl::SimpleAtoi(
      message.substr(at, message.find_first_not_of("0123456789", at) - at), &resume))
      << message;
  // The last message read was part of a step that was cut (more parts to
  // come) or its end.
  EXPECT_EQ(resume, last.more() ? last.step() : last.step() + 1)
      << "last part read: step " << last.step() << " more=" << last.more();
  for (int64_t s : whole) EXPECT_EQ(tensors[s], kTensors) << "step " << s;
  std::cout << "cut after " << messages << " messages, "
            << (last.more() ? "in the middle of step " : "after the end of step ")
            << last.step() << "\n";

  // Resuming there: every step after the whole ones, all of each.
  grpc::ClientContext ctx;
  v1::WatchStepsRequest request;
  request.set_job("parts");
  request.set_from_step(resume);
  auto reader = stub->WatchSteps(&ctx, request);
  v1::CompletedStep c;
  std::map<int64_t, int> resumed;
  while (reader->Read(&c)) {
    resumed[c.step()] += c.tensors_size();
    if (!c.more()) whole.insert(c.step());
  }
  ASSERT_TRUE(reader->Finish().ok());
  for (const auto& [s, n] : resumed) EXPECT_EQ(n, kTensors) << "step " << s;
  EXPECT_EQ(whole.size(), static_cast<size_t>(kSteps));
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

// A part is cut once: a record bigger than a part on its own travels
// alone, and the parts after the first keep their `more`. Before, each
// later part was cut again on its way out and said it was the last.
TEST(Watch, RecordsBiggerThanAPartGoOnePerPartAndTheStepStillJoins) {
  testing::InProcessCollector collector("", server::IngestLimits(),
                                        [](server::CollectorOptions& o) {
                                          o.watch.max_part_bytes = 4096;
                                        });
  // Histograms of 8,192 bins: each record is over 8 KB.
  HookOptions options = Options(collector.address(), "wide-records");
  CollectionConfig weights;
  weights.name = "weights";
  weights.save_histogram = true;
  options.config.collections = {weights};
  options.histogram = FixedSpec(-1, 1, 8192);
  auto hook = Hook::Create(options);
  SONDE_ASSERT_OK(hook);
  constexpr int kTensors = 4;
  std::vector<float> w(1);
  for (int64_t step = 0; step < 2; ++step) {
    (*hook)->StartStep();
    for (int t = 0; t < kTensors; ++t) {
      w[0] = static_cast<float>(step * 10 + t);
      SONDE_ASSERT_OK(
          (*hook)->SaveTensor(absl::StrCat("t", t), HostTensor(w.data(), {1}), {"weights"}));
    }
  }
  SONDE_ASSERT_OK((*hook)->Close());

  auto stub = v1::Query::NewStub(
      grpc::CreateChannel(collector.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::WatchStepsRequest request;
  request.set_job("wide-records");
  auto reader = stub->WatchSteps(&ctx, request);
  std::vector<v1::CompletedStep> parts;
  v1::CompletedStep c;
  while (reader->Read(&c)) parts.push_back(c);
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_EQ(parts.size(), 2u * kTensors);
  for (size_t i = 0; i < parts.size(); ++i) {
    EXPECT_EQ(parts[i].step(), static_cast<int64_t>(i / kTensors)) << "part " << i;
    EXPECT_EQ(parts[i].tensors_size(), 1) << "part " << i;
    EXPECT_GT(parts[i].ByteSizeLong(), 8192u) << "part " << i;
    EXPECT_EQ(parts[i].more(), i % kTensors != kTensors - 1) << "part " << i;
  }

  auto query = QueryClient::Connect(collector.address(), absl::Seconds(30));
  std::vector<v1::CompletedStep> joined;
  SONDE_ASSERT_OK(query->WatchSteps(
      "wide-records", 0,
      [&](const v1::CompletedStep& step) {
        joined.push_back(step);
        return true;
      },
      absl::Seconds(60)));
  ASSERT_EQ(joined.size(), 2u);
  for (const v1::CompletedStep& step : joined) {
    ASSERT_EQ(step.tensors_size(), kTensors);
    for (const v1::TensorRecord& t : step.tensors()) EXPECT_EQ(t.histogram().counts_size(), 8194);
  }
}

// A step whose records pass a message's size (20,000 tensors of long
// names: 6.5 MB) comes in parts, live and replayed from storage, and the
// query client joins them. Before, the collector could not send it
// ("Sent message larger than max") and the watch failed.
TEST(Watch, AStepPastAMessagesSizeComesInPartsAndIsJoined) {
  testing::InProcessCollector collector;
  auto hook = Hook::Create(Options(collector.address(), "wide"));
  SONDE_ASSERT_OK(hook);
  SONDE_ASSERT_OK((*hook)->WaitUntilConnected(absl::Seconds(20)));
  auto query = QueryClient::Connect(collector.address(), absl::Seconds(60));

  std::vector<v1::CompletedStep> live;
  absl::Status live_status;
  std::thread watcher([&] {
    live_status = query->WatchSteps(
        "wide", 0,
        [&](const v1::CompletedStep& step) {
          live.push_back(step);
          return true;
        },
        absl::Seconds(120));
  });
  ASSERT_TRUE(sonde::testing::WaitUntil([&] { return collector.collector().open_watches() == 1; }));

  constexpr int kWide = 20000;
  const std::string stem(200, 'p');
  std::vector<float> w(1);
  for (int64_t step = 0; step < 3; ++step) {
    (*hook)->StartStep();
    const int tensors = step == 1 ? kWide : 3;
    for (int t = 0; t < tensors; ++t) {
      w[0] = static_cast<float>(step * 100000 + t);
      SONDE_ASSERT_OK((*hook)->SaveTensor(absl::StrCat("t", t, "/", stem),
                                          HostTensor(w.data(), {1}), {"weights"}));
    }
  }
  SONDE_ASSERT_OK((*hook)->Close());
  watcher.join();  // the watch ends with the job

  auto check = [&](const std::vector<v1::CompletedStep>& steps, const char* how) {
    ASSERT_EQ(steps.size(), 3u) << how;
    for (int64_t step = 0; step < 3; ++step) {
      const v1::CompletedStep& c = steps[step];
      ASSERT_EQ(c.step(), step) << how;
      EXPECT_FALSE(c.more()) << how;
      ASSERT_EQ(c.tensors_size(), step == 1 ? kWide : 3) << how;
      std::set<double> values;
      for (const v1::TensorRecord& t : c.tensors()) values.insert(t.statistics().max());
      EXPECT_EQ(values.size(), static_cast<size_t>(c.tensors_size())) << how << ": each once";
      EXPECT_EQ(*values.begin(), static_cast<double>(step * 100000)) << how;
    }
  };
  SONDE_ASSERT_OK(live_status);
  check(live, "live");

  std::vector<v1::CompletedStep> stored;
  SONDE_ASSERT_OK(query->WatchSteps(
      "wide", 0,
      [&](const v1::CompletedStep& step) {
        stored.push_back(step);
        return true;
      },
      absl::Seconds(120)));
  check(stored, "from storage");

  // On the wire: parts under gRPC's default 4 MiB, `more` on all but the
  // last, the step's number on each.
  auto stub = v1::Query::NewStub(
      grpc::CreateChannel(collector.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::WatchStepsRequest request;
  request.set_job("wide");
  request.set_from_step(1);
  auto reader = stub->WatchSteps(&ctx, request);
  std::vector<v1::CompletedStep> parts;
  v1::CompletedStep c;
  while (reader->Read(&c)) parts.push_back(c);
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_GE(parts.size(), 3u);  // step 1 in two parts at least, then step 2
  int tensors = 0;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    EXPECT_EQ(parts[i].step(), 1);
    EXPECT_LT(parts[i].ByteSizeLong(), size_t{4} << 20);
    EXPECT_EQ(parts[i].more(), i + 2 < parts.size()) << "part " << i;
    tensors += parts[i].tensors_size();
  }
  EXPECT_EQ(tensors, kWide);
  EXPECT_EQ(parts.back().step(), 2);
  EXPECT_FALSE(parts.back().more());
}

}  // namespace
}  // namespace sonde
