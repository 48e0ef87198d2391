// The training benchmark behind gpu_training_bench: a training-like loop on
// a TrainingDevice (matrix work, a gradient pass, an optimizer pass, one
// stream sync per step as `loss.item()` does) over a model of a few hundred
// tensors, against an in-process collector, in several modes interleaved in
// rounds; then it checks what the collector stored.
#ifndef SONDE_TESTS_BENCH_TRAINING_BENCH_H_
#define SONDE_TESTS_BENCH_TRAINING_BENCH_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/backpressure.h"

namespace sonde::bench {

struct BenchMode {
  std::string name;        // none, stats, stats_hist, values100, values10
  bool hook = true;        // false: the baseline, no hook at all
  int64_t interval = 1;    // save every `interval` steps
  bool values = false;     // values, else statistics only
  bool histogram = false;  // histograms too
  // Suffix _deferred: device.defer_producer_wait (the reads overlap the
  // step's work until the next save or the step's end).
  bool deferred = false;
};

// "none,stats,..." into modes (any but none may end in _deferred);
// InvalidArgument naming an unknown one.
absl::StatusOr<std::vector<BenchMode>> ParseModes(const std::string& list);

struct BenchOptions {
  bool emulate = false;       // host memory and the emulated engine
  int layers = 150;           // a weight [rows, cols] and a bias [cols] each
  int rows = 672;
  int cols = 1024;
  double compute_ms = 18;     // matrix work per step
  int rounds = 10;            // measured, after one warm-up round
  int steps_per_round = 10;
  std::vector<BenchMode> modes;
  BackpressurePolicy policy = BackpressurePolicy::kSpill;
  // Emulated engine only: time per 4 MiB piece of a download and per
  // statistics batch (PCIe and kernels stand-ins).
  double emulated_piece_us = 80;
  double emulated_batch_us = 200;
  std::string data_dir;       // collector data; empty: a temporary directory
  // Called with the timings as soon as the measured rounds end (before the
  // hooks close and the collector is checked, which can take long), with
  // FormatTimings' text.
  std::function<void(const std::string&)> on_timings;
};

// One step's host time on the training thread, in microseconds.
struct StepHostTimes {
  double save_weights_us = 0;  // StartStep + SaveTensors(weights), the device idle
  // The same call's CPU time on the training thread: its work without the
  // time it was descheduled (what a busy, small machine adds).
  double save_weights_cpu_us = 0;
  double save_grads_us = 0;    // SaveTensors(gradients), behind the compute
  double end_step_us = 0;      // EndStep
  double sync_us = 0;          // the wait for the device (loss.item())
};

struct ModeResult {
  BenchMode mode;
  std::vector<double> step_ms;  // measured steps
  std::vector<StepHostTimes> host;  // the same steps
  // Means a measured step of the training thread's time in the device
  // capture's enqueues, of it in the engine's calls and in handing tensors
  // to the sender (Hook::Counters, over the measured rounds).
  double enqueue_us = 0, engine_us = 0, handover_us = 0;
  double median_ms = 0, mean_ms = 0, p90_ms = 0;
  // What the collector stored.
  int64_t saved_steps_expected = 0;
  int64_t saved_steps_present = 0;
  int64_t saved_steps_complete = 0;
  uint64_t tensors_dropped = 0;  // reported by the hook, and on StepInfo
  uint64_t values_dropped = 0;
  uint64_t stored_tensors_dropped = 0;
  uint64_t stored_values_dropped = 0;
  uint64_t device_waits = 0;
  double device_waited_ms = 0;
  uint64_t snapshot_peak_bytes = 0;
  uint64_t values_spilled = 0;  // device values that went through the local spill file
  int64_t verify_step = -1;
  int verified_tensors = 0;        // compared with device memory
  std::vector<std::string> failures;  // checks that did not hold
};

struct BenchReport {
  std::string device;
  uint64_t parameters = 0;
  int tensors = 0;  // per kind (weights+biases; gradients as many)
  std::vector<ModeResult> modes;
  bool ok() const;
};

absl::StatusOr<BenchReport> RunTrainingBench(const BenchOptions& options);

// The report as the benchmark prints it: the timings (also alone, as
// on_timings gets them), then what the collector stored.
std::string FormatReport(const BenchReport& report);
std::string FormatTimings(const BenchReport& report);  // with FormatHostTimes
// Where the training thread's time went, per mode (StepHostTimes' medians).
std::string FormatHostTimes(const BenchReport& report);

}  // namespace sonde::bench

#endif  // SONDE_TESTS_BENCH_TRAINING_BENCH_H_
