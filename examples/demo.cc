// The demo: the seed blog's story end to end. Two training runs of a 2-D
// linear model stream their weights, gradients and loss to a collector; a
// healthy run (lr=0.1, inputs in [0, 1)) ends with every rule
// NoIssuesFound, and the blog's bad hyperparameters (lr=100, inputs scaled
// by 1e11) drive the loss to NaN, ExplodingTensor reports IssuesFound at
// the first bad step, and its StopTraining action ends training.
//
// With no flags it starts an embedded collector on a temporary directory;
// with --collector=host:port it uses a running one (and the jobs stay there
// for `sonde jobs`, `sonde rules --job ...`).
//
// Each step sleeps --step_ms to stand in for the forward and backward pass
// of a real model, so the rule's verdict (milliseconds) can reach training
// within a step, as it would on real hardware.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/format.h"
#include "client/hook.h"
#include "client/query_client.h"
#include "examples/linear_model.h"
#include "glog/logging.h"
#include "rules/rule_config.h"
#include "server/collector.h"

ABSL_FLAG(std::string, collector, "", "use this collector (host:port) instead of an embedded one");
ABSL_FLAG(std::string, data_dir, "",
          "embedded collector's data directory (default: a temporary one, removed at exit)");
ABSL_FLAG(int, steps, 60, "training steps per run");
ABSL_FLAG(int, step_ms, 20, "simulated compute time per step, in milliseconds");
ABSL_FLAG(int, batch, 256, "batch size");
ABSL_FLAG(std::string, job_prefix, "demo", "job names are PREFIX-good-TIME and PREFIX-bad-TIME");

namespace sonde::examples {
namespace {

struct RunResult {
  std::string job;
  int steps_run = 0;
  std::optional<v1::Action> stop;
};

RunResult Train(const std::string& collector, const std::string& job, float lr, float scale) {
  HookOptions options;
  options.collector = collector;
  options.job = job;
  options.metadata = {{"lr", absl::StrCat(lr)}, {"scale", absl::StrCat(scale)}};
  options.config.save_config = SaveConfig::Every(1);
  options.config.include_collections = {"weights", "gradients", "losses"};
  auto hook = Hook::Create(options);
  if (!hook.ok()) {
    std::cerr << "demo: " << hook.status() << "\n";
    std::exit(1);
  }
  std::cout << "\n== job " << job << ": lr=" << lr << ", scale=" << scale << "\n";
  LinearModel model(lr, scale, absl::GetFlag(FLAGS_batch), /*seed=*/42);
  (*hook)->SetMode(v1::MODE_TRAIN);
  RunResult result;
  result.job = job;
  const int steps = absl::GetFlag(FLAGS_steps);
  for (int i = 0; i < steps; ++i) {
    if ((*hook)->should_stop()) break;
    (*hook)->StartStep();
    StepOutput out = model.Step();
    (*hook)->SaveTensor("weight1", HostTensor(out.weight.data(), {2, 1}), {"weights"}).IgnoreError();
    (*hook)->SaveTensor("gradients/weight1", HostTensor(out.gradient.data(), {2, 1}),
                        {"gradients"}).IgnoreError();
    (*hook)->SaveScalar("loss", out.loss, {"losses"}).IgnoreError();
    (*hook)->EndStep();
    if (i < 5 || i % 10 == 0 || !std::isfinite(out.loss)) {
      std::cout << "Step=" << i << ", Loss="
                << (std::isnan(out.loss) ? std::string("nan") : absl::StrFormat("%g", out.loss))
                << "\n";
    }
    result.steps_run = i + 1;
    std::this_thread::sleep_for(std::chrono::milliseconds(absl::GetFlag(FLAGS_step_ms)));
  }
  result.stop = (*hook)->stop_action();
  if (result.stop.has_value()) {
    std::cout << "Training stopped after step " << result.steps_run - 1 << ": rule "
              << result.stop->rule() << " found an issue at step " << result.stop->step()
              << ": " << result.stop->reason() << "\n";
  }
  absl::Status closed = (*hook)->Close();
  if (!closed.ok()) std::cerr << "demo: close: " << closed << "\n";
  return result;
}

// Waits until every rule of the job has a verdict, then prints them.
std::vector<v1::RuleResult> Summary(QueryClient& query, const std::string& job) {
  auto results = query.WaitForRuleVerdicts(job, absl::Seconds(30));
  if (!results.ok()) {
    std::cerr << "demo: waiting for rule verdicts: " << results.status() << "\n";
    return {};
  }
  std::cout << "\n" << RuleSummary(job, *results);
  return *results;
}

v1::RuleStatus StatusOf(const std::vector<v1::RuleResult>& results, const std::string& rule) {
  for (const auto& r : results) {
    if (r.rule() == rule) return r.status();
  }
  return v1::RULE_STATUS_UNSPECIFIED;
}

int Main() {
  std::string address = absl::GetFlag(FLAGS_collector);
  std::unique_ptr<server::Collector> embedded;
  std::string temp_dir;
  if (address.empty()) {
    server::CollectorOptions options;
    options.listen = "127.0.0.1:0";
    options.data_dir = absl::GetFlag(FLAGS_data_dir);
    if (options.data_dir.empty()) {
      std::string pattern = (std::filesystem::temp_directory_path() / "sonde-demo-XXXXXX").string();
      if (mkdtemp(pattern.data()) == nullptr) {
        std::cerr << "demo: cannot create a temporary directory\n";
        return 1;
      }
      temp_dir = pattern;
      options.data_dir = temp_dir;
    }
    options.default_rules =
        *rules::ParseRuleFlag("ExplodingTensor(actions=StopTraining);LossNotDecreasing");
    auto collector = server::Collector::Start(options);
    if (!collector.ok()) {
      std::cerr << "demo: " << collector.status() << "\n";
      return 1;
    }
    embedded = std::move(*collector);
    address = embedded->address();
    std::cout << "Embedded collector on " << address << ", data in " << options.data_dir
              << ", rules ExplodingTensor (StopTraining) and LossNotDecreasing\n";
  } else {
    std::cout << "Using the collector at " << address << "\n";
  }
  const std::string suffix = absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::UTCTimeZone());
  const std::string prefix = absl::GetFlag(FLAGS_job_prefix);
  RunResult good = Train(address, absl::StrCat(prefix, "-good-", suffix), 0.1f, 1.0f);
  RunResult bad = Train(address, absl::StrCat(prefix, "-bad-", suffix), 100.0f, 1e11f);

  auto query = QueryClient::Connect(address);
  auto good_results = Summary(*query, good.job);
  auto bad_results = Summary(*query, bad.job);

  const bool good_ok = !good_results.empty() && !good.stop.has_value() &&
                       std::all_of(good_results.begin(), good_results.end(), [](const auto& r) {
                         return r.status() == v1::RULE_STATUS_NO_ISSUES_FOUND;
                       });
  const bool bad_ok = bad.stop.has_value() && bad.stop->rule() == "ExplodingTensor" &&
                      StatusOf(bad_results, "ExplodingTensor") == v1::RULE_STATUS_ISSUES_FOUND &&
                      bad.steps_run - 1 <= bad.stop->step() + 1;
  std::cout << "\nHealthy run: " << (good_ok ? "every rule NoIssuesFound" : "UNEXPECTED RESULT")
            << "\nBad run:     "
            << (bad_ok ? absl::StrCat("stopped by ExplodingTensor at step ", bad.stop->step(),
                                      ", training ended after step ", bad.steps_run - 1)
                       : "UNEXPECTED RESULT")
            << "\n";
  if (embedded != nullptr) {
    std::cout << "\nTo explore the jobs with the CLI, run a collector "
                 "(bazel run //server:sonde-collector) and pass --collector to the demo, then\n"
                 "  bazel run //client:sonde -- jobs\n  bazel run //client:sonde -- rules --job "
              << bad.job << "\n";
    embedded->Shutdown();
    embedded.reset();
  }
  if (!temp_dir.empty()) std::filesystem::remove_all(temp_dir);
  return good_ok && bad_ok ? 0 : 1;
}

}  // namespace
}  // namespace sonde::examples

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Sonde demo: a healthy and a diverging training run, judged live.");
  absl::ParseCommandLine(argc, argv);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;  // warnings and above
  google::InitGoogleLogging(argv[0]);
  return sonde::examples::Main();
}
