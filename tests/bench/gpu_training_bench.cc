// gpu_training_bench: what Sonde costs a training loop on a GPU, and proof
// that it stored what it was asked to.
//
//   bazel run -c opt //tests/bench:gpu_training_bench [-- --rounds=10 ...]
//
// A training-like loop on the device (matrix work standing in for GEMMs, a
// gradient pass, an optimizer pass, one stream sync per step as
// `loss.item()` does) over 300 tensors and 103M parameters by default, with
// an in-process collector. Modes take turns in rounds: no hook (the
// baseline), statistics of every weight and gradient every step, the same
// with histograms, and values every 100 and every 10 steps. It prints each
// mode's step time as a ratio to the baseline (medians and means), then
// checks the collector: every saved step present and complete (or its
// losses counted, under --policy=drop), and at one verification step the
// stored values and statistics of sampled tensors equal device memory.
// Exit status: 0 checks passed, 1 a check failed, 2 no GPU (it says why;
// --emulate runs the same on host memory with the emulated engine, which
// checks the benchmark and the pipeline but whose times mean nothing).
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "glog/logging.h"
#include "tests/bench/training_bench.h"

ABSL_FLAG(bool, emulate, false, "host memory and the emulated device engine (no GPU needed)");
ABSL_FLAG(int, layers, 150, "layers: a weight [rows, cols] and a bias [cols] each");
ABSL_FLAG(int, rows, 672, "rows of each weight");
ABSL_FLAG(int, cols, 1024, "columns of each weight (and size of each bias)");
ABSL_FLAG(double, compute_ms, 18, "matrix work per step, in ms (the rest is the gradient and "
                                  "optimizer passes over the parameters)");
ABSL_FLAG(int, rounds, 10, "measured rounds, after one warm-up round");
ABSL_FLAG(int, steps_per_round, 10, "steps of one mode in a round");
ABSL_FLAG(std::string, modes, "none,stats,stats_deferred,stats_hist,values100,values10",
          "modes, the baseline first: none, stats, stats_hist, values<N>, and any but none "
          "with _deferred (the stream waits for the statistics' reads at the next save or "
          "the step's end, not right after each save; values modes overlap little, since a "
          "snapshot's wait covers the statistics before it)");
ABSL_FLAG(std::string, policy, "spill", "backpressure policy: spill, drop or block");
ABSL_FLAG(std::string, data_dir, "", "collector data directory (default: a temporary one)");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  google::InitGoogleLogging(argv[0]);
  sonde::bench::BenchOptions o;
  o.emulate = absl::GetFlag(FLAGS_emulate);
  o.layers = absl::GetFlag(FLAGS_layers);
  o.rows = absl::GetFlag(FLAGS_rows);
  o.cols = absl::GetFlag(FLAGS_cols);
  o.compute_ms = absl::GetFlag(FLAGS_compute_ms);
  o.rounds = absl::GetFlag(FLAGS_rounds);
  o.steps_per_round = absl::GetFlag(FLAGS_steps_per_round);
  o.data_dir = absl::GetFlag(FLAGS_data_dir);
  const std::string policy = absl::GetFlag(FLAGS_policy);
  if (policy == "drop") {
    o.policy = sonde::BackpressurePolicy::kDrop;
  } else if (policy == "block") {
    o.policy = sonde::BackpressurePolicy::kBlock;
  } else if (policy != "spill") {
    std::fprintf(stderr, "--policy must be spill, drop or block\n");
    return 2;
  }
  auto modes = sonde::bench::ParseModes(absl::GetFlag(FLAGS_modes));
  if (!modes.ok()) {
    std::fprintf(stderr, "%s\n", std::string(modes.status().message()).c_str());
    return 2;
  }
  o.modes = *modes;
  // The timings first, as soon as they exist: closing the hooks and
  // checking the collector can take long (a run stopped then keeps them).
  o.on_timings = [](const std::string& timings) {
    std::printf("%s\n", timings.c_str());
    std::fflush(stdout);
  };
  auto report = sonde::bench::RunTrainingBench(o);
  if (!report.ok()) {
    std::printf("gpu_training_bench: %s\n", report.status().ToString().c_str());
    return 2;
  }
  std::printf("%s", sonde::bench::FormatReport(*report).c_str());
  return report->ok() ? 0 : 1;
}
