// rules_bench: the rule engine's cost with every built-in rule enabled on a
// model of a few hundred tensors (weights, gradients, activations, loss),
// real values from examples/mlp-sized layers.
//   - per-step evaluation cost (all rules, one step), median and p99;
//   - latency from a complete step being handed to the rules to every
//     verdict evaluated and its result stored in RocksDB, median and p99;
//   - baseline in the same run: computing the statistics of the same step's
//     tensors (what ingest already pays), so the ratio says what rules add.
// Usage: bazel run -c opt //tests/bench:rules_bench [-- --layers=100 --steps=200]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "stats/statistics.h"
#include "common/thread_pool.h"
#include "rules/rule_factory.h"
#include "rules/rule_runner.h"
#include "storage/store.h"
#include "rules/builtin_rules.h"

ABSL_FLAG(int, layers, 100, "layers; each saves weight, gradient and activation (3 tensors)");
ABSL_FLAG(int, units, 256, "elements per tensor");
ABSL_FLAG(int, steps, 200, "steps measured");

namespace {

using Clock = std::chrono::steady_clock;

double Micros(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

class StoringSink : public sonde::rules::RuleSink {
 public:
  explicit StoringSink(sonde::storage::Store* store) : store_(store) {}
  void OnResult(const sonde::v1::RuleResult& r) override {
    store_->PutRuleResult(1, r).IgnoreError();
  }
  void OnAction(const sonde::v1::Action&) override {}

 private:
  sonde::storage::Store* store_;
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int layers = absl::GetFlag(FLAGS_layers);
  const int units = absl::GetFlag(FLAGS_units);
  const int steps = absl::GetFlag(FLAGS_steps);
  auto factory = sonde::rules::BuiltinRuleFactory();

  // Every built-in rule, pointed at this model's tensors where it needs to be.
  std::vector<sonde::v1::RuleSpec> specs;
  for (const auto& info : factory->Catalog()) {
    sonde::v1::RuleSpec spec;
    spec.set_rule_type(info.rule_type);
    spec.set_name(info.rule_type);
    for (const auto& p : info.parameters) {
      if (p.name == "collection_names" && p.default_value.empty()) {
        (*spec.mutable_parameters())["collection_names"] = "weights";
      }
      if ((p.name == "max_threshold" || p.name == "min_threshold") && p.default_value.empty()) {
        (*spec.mutable_parameters())[p.name] = p.name == "max_threshold" ? "1e6" : "1e-12";
      }
    }
    if (!factory->Create(spec).ok()) {
      std::fprintf(stderr, "skipping %s: %s\n", info.rule_type.c_str(),
                   factory->Create(spec).status().ToString().c_str());
      continue;
    }
    specs.push_back(spec);
  }

  const std::string dir = (std::filesystem::temp_directory_path() / "sonde-rules-bench").string();
  std::filesystem::remove_all(dir);
  sonde::storage::Store::Options so;
  so.path = dir;
  auto store = sonde::storage::Store::Open(so);
  if (!store.ok()) return 1;
  sonde::ThreadPool pool(2, 4096);
  StoringSink sink(store->get());
  auto runner = sonde::rules::RuleRunner::Create("bench", specs, {}, *factory, &pool, &sink);
  if (!runner.ok()) {
    std::fprintf(stderr, "%s\n", runner.status().ToString().c_str());
    return 1;
  }

  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0, 0.1f);
  std::vector<double> eval_us, stats_us;
  size_t values_kept = 0;
  for (int s = 0; s < steps; ++s) {
    sonde::rules::StepData step;
    step.step = s;
    step.mode = sonde::v1::MODE_TRAIN;
    step.mode_step = s;
    const auto t0 = Clock::now();
    auto add = [&](const std::string& name, const char* collection, float shift) {
      std::vector<float> v(units);
      for (auto& x : v) x = normal(rng) + shift;
      std::string bytes(reinterpret_cast<const char*>(v.data()), v.size() * 4);
      sonde::v1::TensorRecord r;
      r.set_tensor_name(name);
      r.set_step(s);
      r.set_mode(sonde::v1::MODE_TRAIN);
      r.set_mode_step(s);
      r.set_dtype(sonde::v1::DTYPE_F32);
      r.add_shape(16);
      r.add_shape(units / 16);
      if (collection[0] != '\0') r.add_collections(collection);
      r.set_has_values(true);
      *r.mutable_statistics() = *sonde::ComputeStatistics(bytes, sonde::v1::DTYPE_F32);
      const bool keep = (*runner)->WantsValues(r);
      values_kept += keep;
      step.values.push_back(keep ? std::make_shared<const std::string>(std::move(bytes)) : nullptr);
      step.tensors.push_back(std::move(r));
    };
    for (int l = 0; l < layers; ++l) {
      add(absl::StrCat("Net_fc", l, ".weight"), "weights", 0);
      add(absl::StrCat("gradient/Net_fc", l, ".weight"), "gradients", 0);
      add(absl::StrCat("Net_relu", l, "_output"), "", 0.5f);
    }
    add("loss", "losses", 10.0f / (s + 1));
    stats_us.push_back(Micros(t0, Clock::now()));
    const auto t1 = Clock::now();
    (*runner)->SubmitStep(std::move(step));
    (*runner)->Drain();
    eval_us.push_back(Micros(t1, Clock::now()));
  }
  // Throughput: submit everything, then wait.
  const auto t2 = Clock::now();
  (*runner)->SubmitJobEnd();
  (*runner)->Drain();
  const double end_us = Micros(t2, Clock::now());

  int issues = 0;
  for (const auto& r : (*runner)->Results()) issues += r.status() == sonde::v1::RULE_STATUS_ISSUES_FOUND;
  std::printf("%zu rules, %d tensors per step (%d elements each), %d steps, values kept for "
              "%.0f tensors per step\n",
              specs.size(), layers * 3 + 1, units, steps, static_cast<double>(values_kept) / steps);
  std::printf("building the step (statistics of every tensor): median %.0f us, p99 %.0f us  "
              "(baseline)\n",
              Percentile(stats_us, 0.5), Percentile(stats_us, 0.99));
  std::printf("step complete -> every verdict evaluated and stored: median %.0f us, p99 %.0f us "
              "= %.2f x baseline (median)\n",
              Percentile(eval_us, 0.5), Percentile(eval_us, 0.99),
              Percentile(eval_us, 0.5) / Percentile(stats_us, 0.5));
  std::printf("per tensor: %.2f us of rule time (median step / tensors)\n",
              Percentile(eval_us, 0.5) / (layers * 3 + 1));
  std::printf("end of training evaluation: %.0f us; rules with issues (random data): %d\n", end_us,
              issues);
  std::filesystem::remove_all(dir);
  return 0;
}
