#include "server/watchers.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace sonde::server {
namespace {

struct Recorder : WatchSink {
  std::vector<std::string> heard;
  void OnResult(const v1::RuleResult& r) override { heard.push_back("result " + r.rule()); }
  void OnStep(const rules::StepData& s) override {
    heard.push_back("step " + std::to_string(s.step));
  }
  void OnEnded(const std::vector<v1::RuleResult>& final_results) override {
    heard.push_back("ended " + std::to_string(final_results.size()));
  }
  void OnClosing() override { heard.push_back("closing"); }
};

v1::RuleResult Result(const std::string& rule) {
  v1::RuleResult r;
  r.set_rule(rule);
  return r;
}

TEST(Watchers, EachSinkHearsItsOwnJobInOrder) {
  Watchers w;
  Recorder a, b;
  const uint64_t ida = w.Add("a", &a);
  w.Add("b", &b);
  EXPECT_TRUE(w.Watched("a"));
  EXPECT_FALSE(w.Watched("c"));
  EXPECT_EQ(w.size(), 2u);
  w.PublishResult("a", Result("R1"));
  rules::StepData step;
  step.step = 7;
  w.PublishStep("a", step);
  w.PublishStep("b", step);
  w.PublishEnded("a", {Result("R1"), Result("R2")});
  EXPECT_EQ(a.heard, (std::vector<std::string>{"result R1", "step 7", "ended 2"}));
  EXPECT_EQ(b.heard, (std::vector<std::string>{"step 7"}));
  w.Remove(ida);
  w.PublishResult("a", Result("R3"));
  EXPECT_EQ(a.heard.size(), 3u);  // removed: hears nothing more
  EXPECT_FALSE(w.Watched("a"));
  w.Remove(ida);  // twice is harmless
}

TEST(Watchers, ClosingReachesEveryoneAndLaterComers) {
  Watchers w;
  Recorder a, late;
  w.Add("a", &a);
  w.CloseAll();
  EXPECT_EQ(a.heard, (std::vector<std::string>{"closing"}));
  w.Add("x", &late);
  EXPECT_EQ(late.heard, (std::vector<std::string>{"closing"}));
}

// After Remove returns no callback of the sink runs: the sink may be
// destroyed at once while another thread publishes.
TEST(Watchers, RemoveWaitsForACallbackInProgress) {
  Watchers w;
  std::atomic<bool> stop{false};
  std::thread publisher([&] {
    while (!stop) w.PublishResult("j", Result("R"));
  });
  for (int i = 0; i < 2000; ++i) {
    struct Counting : WatchSink {
      std::atomic<int>* alive;
      void OnResult(const v1::RuleResult&) override { EXPECT_EQ(alive->load(), 1); }
    };
    std::atomic<int> alive{1};
    auto sink = std::make_unique<Counting>();
    sink->alive = &alive;
    const uint64_t id = w.Add("j", sink.get());
    w.Remove(id);
    alive = 0;
    sink.reset();
  }
  stop = true;
  publisher.join();
}

}  // namespace
}  // namespace sonde::server
