// How fast a verdict reaches its watchers: an in-process collector, a live
// job (a hook connected), W watchers on WatchRuleResults (async clients on
// one completion queue), and an external rule posting verdicts one at a
// time. For each verdict: the time from sending PostRuleResult until the
// last watcher has it. Baseline, in the same run: the round trip of a
// unary GetJob on the same channel (what any answer costs here).
//
//   bazel run -c opt //tests/bench:watch_bench -- --watchers=1,100,1000 --verdicts=200
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "client/hook.h"
#include "grpcpp/grpcpp.h"
#include "proto/query.grpc.pb.h"
#include "server/collector.h"

ABSL_FLAG(std::string, watchers, "1,100,1000", "numbers of open watches to measure with");
ABSL_FLAG(int, verdicts, 200, "verdicts posted per measurement");

namespace sonde {
namespace {

using Clock = std::chrono::steady_clock;

double Micros(Clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

struct Figures {
  double median, p90, p99;
};

Figures Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))]; };
  return {at(0.5), at(0.9), at(0.99)};
}

struct Watch {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientAsyncReader<v1::RuleResult>> reader;
  v1::RuleResult message;
};

int Run() {
  char dir_template[] = "/tmp/sonde-watch-bench-XXXXXX";
  const char* dir = ::mkdtemp(dir_template);
  if (dir == nullptr) return 1;
  server::CollectorOptions options;
  options.listen = "127.0.0.1:0";
  options.data_dir = std::string(dir) + "/db";
  auto collector = server::Collector::Start(options);
  if (!collector.ok()) {
    std::fprintf(stderr, "collector: %s\n", std::string(collector.status().message()).c_str());
    return 1;
  }
  HookOptions ho;
  ho.collector = (*collector)->address();
  ho.job = "watched";
  ho.upload_left_spools = false;
  ho.spool_dir = "";
  auto hook = Hook::Create(ho);
  if (!hook.ok() || !(*hook)->WaitUntilConnected(absl::Seconds(20)).ok()) return 1;

  auto channel =
      grpc::CreateChannel((*collector)->address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Query::NewStub(channel);
  const int verdicts = absl::GetFlag(FLAGS_verdicts);

  std::vector<double> unary;
  for (int i = 0; i < verdicts; ++i) {
    grpc::ClientContext ctx;
    v1::GetJobRequest req;
    req.set_job("watched");
    v1::JobInfo info;
    const auto t0 = Clock::now();
    if (!stub->GetJob(&ctx, req, &info).ok()) return 1;
    unary.push_back(Micros(Clock::now() - t0));
  }
  const Figures base = Summarize(unary);
  std::printf("baseline: unary GetJob round trip  median %.0f us  p90 %.0f us  p99 %.0f us\n",
              base.median, base.p90, base.p99);

  int round = 0;
  for (absl::string_view n : absl::StrSplit(absl::GetFlag(FLAGS_watchers), ',')) {
    int watchers = 0;
    if (!absl::SimpleAtoi(n, &watchers) || watchers <= 0) return 2;
    ++round;
    grpc::CompletionQueue cq;
    std::vector<std::unique_ptr<Watch>> watches;
    v1::GetRuleResultsRequest request;
    request.set_job("watched");
    void* tag;
    bool ok;
    for (int i = 0; i < watchers; ++i) {
      auto w = std::make_unique<Watch>();
      w->reader = stub->PrepareAsyncWatchRuleResults(&w->context, request, &cq);
      w->reader->StartCall(w.get());
      watches.push_back(std::move(w));
    }
    for (int i = 0; i < watchers; ++i) cq.Next(&tag, &ok);
    // A rule name per round, so earlier rounds' results are not re-sent.
    const std::string rule = "bench" + std::to_string(round);
    std::vector<double> heard;
    for (int v = 0; v < verdicts; ++v) {
      for (auto& w : watches) w->reader->Read(&w->message, w.get());
      grpc::ClientContext ctx;
      v1::PostRuleResultRequest post;
      post.mutable_result()->set_job("watched");
      post.mutable_result()->set_rule(rule);
      post.mutable_result()->set_status(v1::RULE_STATUS_IN_PROGRESS);
      post.mutable_result()->set_step(v);
      v1::PostRuleResultResponse resp;
      const auto t0 = Clock::now();
      if (!stub->PostRuleResult(&ctx, post, &resp).ok()) return 1;
      int got = 0;
      while (got < watchers && cq.Next(&tag, &ok)) {
        if (!ok) return 1;
        ++got;
      }
      heard.push_back(Micros(Clock::now() - t0));
    }
    const Figures f = Summarize(heard);
    std::printf(
        "%5d watchers: post -> last watcher heard  median %.0f us (x%.1f baseline)  p90 %.0f us"
        "  p99 %.0f us\n",
        watchers, f.median, f.median / base.median, f.p90, f.p99);
    for (auto& w : watches) w->context.TryCancel();
    for (auto& w : watches) {
      grpc::Status s;
      w->reader->Finish(&s, w.get());
      cq.Next(&tag, &ok);
    }
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
  }
  (*hook)->Close().IgnoreError();
  hook->reset();
  collector->reset();
  std::system((std::string("rm -rf ") + dir).c_str());
  return 0;
}

}  // namespace
}  // namespace sonde

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return sonde::Run();
}
