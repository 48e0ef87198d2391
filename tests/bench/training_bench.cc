#include "tests/bench/training_bench.h"

#include <stdlib.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "client/hook.h"
#include "client/query_client.h"
#include "cuda/conformance.h"
#include "cuda/emulated_device_stats.h"
#include "stats/histogram.h"
#include "stats/statistics.h"
#include "server/collector.h"
#include "tests/bench/training_device.h"

namespace sonde::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Model {
  size_t parameters = 0;
  float* weights = nullptr;  // all weights and biases, one buffer
  float* grads = nullptr;
  std::vector<NamedTensor> weight_tensors;
  std::vector<NamedTensor> grad_tensors;
  std::vector<size_t> offsets;  // of each tensor, in floats
};

Model MakeModel(const BenchOptions& o, TrainingDevice& device) {
  Model m;
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (int l = 0; l < o.layers; ++l) {
    shapes.push_back({absl::StrCat("layer", l, ".weight"), {o.rows, o.cols}});
    shapes.push_back({absl::StrCat("layer", l, ".bias"), {o.cols}});
  }
  for (const auto& [name, shape] : shapes) {
    m.offsets.push_back(m.parameters);
    m.parameters += static_cast<size_t>(std::accumulate(shape.begin(), shape.end(), int64_t{1},
                                                        std::multiplies<int64_t>()));
  }
  m.weights = device.Alloc(m.parameters);
  m.grads = device.Alloc(m.parameters);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto& [name, shape] = shapes[i];
    m.weight_tensors.push_back(
        {name, CudaTensor(m.weights + m.offsets[i], v1::DTYPE_F32, shape, 0, device.stream()), {}});
    m.grad_tensors.push_back({"gradient/" + name,
                              CudaTensor(m.grads + m.offsets[i], v1::DTYPE_F32, shape, 0,
                                         device.stream()),
                              {}});
  }
  return m;
}

// CPU time of the calling thread.
double ThreadCpuUs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

size_t Count(const NamedTensor& t) {
  return static_cast<size_t>(std::accumulate(t.tensor.shape.begin(), t.tensor.shape.end(),
                                             int64_t{1}, std::multiplies<int64_t>()));
}

// One training step: weights saved at its start, matrix work, gradients
// written and saved, the optimizer, and the sync `loss.item()` makes.
// Where a step's host time goes (`times`, when given): the hook's calls
// on the training thread, and the wait for the device at the sync.
void Step(const BenchOptions& o, TrainingDevice& device, Model& m, Hook* hook, int64_t step,
          std::vector<float>* weights_copy = nullptr, std::vector<float>* grads_copy = nullptr,
          StepHostTimes* times = nullptr) {
  StepHostTimes t;
  auto us_since = [](Clock::time_point start) {
    return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  };
  if (hook != nullptr) {
    const Clock::time_point start = Clock::now();
    const double cpu_start = ThreadCpuUs();
    hook->StartStep();
    hook->SaveTensors(m.weight_tensors).IgnoreError();  // losses are counted by the hook
    t.save_weights_cpu_us = ThreadCpuUs() - cpu_start;
    t.save_weights_us = us_since(start);
    if (weights_copy != nullptr) device.CopyToHost(weights_copy->data(), m.weights, m.parameters);
  }
  device.Compute(o.compute_ms);
  device.Gradients(m.grads, m.weights, m.parameters, step);
  if (hook != nullptr) {
    const Clock::time_point start = Clock::now();
    hook->SaveTensors(m.grad_tensors).IgnoreError();
    t.save_grads_us = us_since(start);
    if (grads_copy != nullptr) device.CopyToHost(grads_copy->data(), m.grads, m.parameters);
  }
  device.Optimizer(m.weights, m.grads, m.parameters, 1e-4f);
  Clock::time_point start = Clock::now();
  device.Sync();
  t.sync_us = us_since(start);
  if (hook != nullptr) {
    start = Clock::now();
    hook->EndStep();
    t.end_step_us = us_since(start);
  }
  if (times != nullptr) *times = t;
}

HookOptions MakeHookOptions(const BenchOptions& o, const BenchMode& mode,
                            const std::string& address) {
  HookOptions h;
  h.collector = address;
  h.job = "bench-" + mode.name;
  h.config.save_config = SaveConfig::Every(mode.interval);
  h.config.include_collections = {"weights", "biases", "gradients"};
  if (!mode.values) {
    ReductionConfig r;
    r.reductions = {"min", "max", "mean", "std"};
    r.norms = {"l2"};
    h.config.reduction_config = r;
  }
  if (mode.histogram) {
    for (const char* c : {"weights", "biases", "gradients"}) {
      CollectionConfig cc;
      cc.name = c;
      cc.save_histogram = true;
      h.config.collections.push_back(cc);
    }
  }
  h.backpressure.policy = o.policy;
  h.device.defer_producer_wait = mode.deferred;
  // A close that cannot finish in a minute is a finding (reported), not a
  // reason to hold a GPU lease.
  h.close_timeout = absl::Minutes(1);
  if (o.emulate) {
    EmulatedDeviceOptions e;
    e.stats_latency = absl::Microseconds(o.emulated_batch_us);
    e.piece_latency = absl::Microseconds(o.emulated_piece_us);
    h.device_factory = [e](const DeviceStatsOptions& d)
        -> absl::StatusOr<std::unique_ptr<DeviceStats>> {
      auto engine = EmulatedDeviceStats::Create(d, e);
      if (!engine.ok()) return engine.status();
      return std::unique_ptr<DeviceStats>(std::move(*engine));
    };
  }
  return h;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

// The tensors compared with device memory at the verification step.
std::vector<size_t> Sample(size_t tensors) {
  std::vector<size_t> s = {0, 1, tensors / 2, tensors - 2, tensors - 1};
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
  return s;
}

void Check(ModeResult& r, QueryClient& q, const Model& m, const std::vector<float>& weights,
           const std::vector<float>& grads, int64_t last_step, const BenchOptions& o,
           const Hook::Counters& c) {
  const std::string job = "bench-" + r.mode.name;
  auto steps = q.ListSteps(job);
  if (!steps.ok()) {
    r.failures.push_back(absl::StrCat("ListSteps: ", steps.status().ToString()));
    return;
  }
  std::map<int64_t, v1::StepInfo> by_step;
  for (const v1::StepInfo& s : *steps) by_step[s.step()] = s;
  for (int64_t s = 0; s <= last_step; ++s) {
    if (s % r.mode.interval != 0) continue;
    ++r.saved_steps_expected;
    auto it = by_step.find(s);
    if (it == by_step.end()) {
      r.failures.push_back(absl::StrCat("saved step ", s, " is missing"));
      continue;
    }
    ++r.saved_steps_present;
    r.saved_steps_complete += it->second.complete();
    r.stored_tensors_dropped += it->second.tensors_dropped();
    r.stored_values_dropped += it->second.values_dropped();
  }
  r.tensors_dropped = c.tensors_dropped;
  r.values_dropped = c.values_dropped;
  if (r.stored_tensors_dropped != c.tensors_dropped || r.stored_values_dropped != c.values_dropped) {
    r.failures.push_back(absl::StrCat(
        "the hook counted ", c.tensors_dropped, " tensors and ", c.values_dropped,
        " values dropped; the collector shows ", r.stored_tensors_dropped, " and ",
        r.stored_values_dropped));
  }
  if (o.policy != BackpressurePolicy::kDrop && r.saved_steps_complete != r.saved_steps_expected) {
    r.failures.push_back(absl::StrCat(r.saved_steps_expected - r.saved_steps_complete,
                                      " saved steps are incomplete"));
  }
  // The verification step against device memory, copied right after each save.
  for (size_t i : Sample(m.weight_tensors.size())) {
    for (bool gradient : {false, true}) {
      const NamedTensor& t = gradient ? m.grad_tensors[i] : m.weight_tensors[i];
      const float* want = (gradient ? grads.data() : weights.data()) + m.offsets[i];
      const size_t n = Count(t);
      StatsAccumulator cpu;
      AccumulateStatistics(cpu, want, v1::DTYPE_F32, n);
      v1::Statistics stored;
      const v1::Histogram* histogram = nullptr;
      v1::SeriesPoint point;
      if (r.mode.values) {
        auto value = q.ReadTensor(job, t.name, r.verify_step, v1::MODE_TRAIN);
        if (!value.ok()) {
          if (o.policy != BackpressurePolicy::kDrop) {
            r.failures.push_back(absl::StrCat(t.name, " at step ", r.verify_step, ": ",
                                              value.status().ToString()));
          }
          continue;
        }
        if (value->bytes.size() != n * 4 || std::memcmp(value->bytes.data(), want, n * 4) != 0) {
          r.failures.push_back(absl::StrCat(t.name, " at step ", r.verify_step,
                                            ": stored values differ from device memory"));
        }
        stored = value->header.statistics();
      } else {
        auto series = q.ReadSeries(job, t.name, v1::MODE_TRAIN, r.verify_step, r.verify_step + 1);
        if (!series.ok() || series->size() != 1) {
          r.failures.push_back(absl::StrCat(t.name, " at step ", r.verify_step, ": no statistics (",
                                            series.status().ToString(), ")"));
          continue;
        }
        point = (*series)[0];
        stored = point.statistics();
        if (point.has_histogram()) histogram = &point.histogram();
      }
      absl::Status same = CompareRecords(FromProto(stored), cpu, v1::DTYPE_F32);
      if (!same.ok()) {
        r.failures.push_back(absl::StrCat(t.name, " statistics: ", same.message()));
      }
      if (r.mode.histogram) {
        HistogramCounts h = HistogramCounts::Empty(DefaultExponentialSpec());
        AccumulateHistogramScalar(h, want, v1::DTYPE_F32, n);
        absl::StatusOr<HistogramCounts> got =
            histogram != nullptr ? FromProto(*histogram)
                                 : absl::NotFoundError("no histogram stored");
        absl::Status hs = got.ok() ? CompareHistograms(*got, h) : got.status();
        if (!hs.ok()) r.failures.push_back(absl::StrCat(t.name, " histogram: ", hs.message()));
      }
      ++r.verified_tensors;
    }
  }
}

}  // namespace

absl::StatusOr<std::vector<BenchMode>> ParseModes(const std::string& list) {
  std::vector<BenchMode> modes;
  for (absl::string_view name : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    BenchMode m;
    m.name = std::string(name);
    if (absl::ConsumeSuffix(&name, "_deferred")) m.deferred = true;
    if (name == "none" && !m.deferred) {
      m.hook = false;
    } else if (name == "stats") {
    } else if (name == "stats_hist") {
      m.histogram = true;
    } else if (absl::StartsWith(name, "values") && name.size() > 6) {
      m.values = true;
      if (!absl::SimpleAtoi(name.substr(6), &m.interval) || m.interval < 1) {
        return absl::InvalidArgumentError(absl::StrCat("bad mode '", m.name, "'"));
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown mode '", m.name, "' (none, stats, stats_hist, values<N>, and any but none "
          "with _deferred)"));
    }
    modes.push_back(m);
  }
  if (modes.empty() || modes[0].hook) {
    return absl::InvalidArgumentError("the first mode must be 'none', the baseline");
  }
  return modes;
}

bool BenchReport::ok() const {
  for (const ModeResult& m : modes) {
    if (!m.failures.empty()) return false;
  }
  return true;
}

absl::StatusOr<BenchReport> RunTrainingBench(const BenchOptions& o) {
  std::unique_ptr<TrainingDevice> device;
  if (o.emulate) {
    device = MakeHostTrainingDevice();
  } else {
    auto cuda = MakeCudaTrainingDevice();
    if (!cuda.ok()) return cuda.status();
    device = std::move(*cuda);
  }
  BenchReport report;
  report.device = device->Name();
  Model m = MakeModel(o, *device);
  report.parameters = m.parameters;
  report.tensors = static_cast<int>(m.weight_tensors.size());

  std::string dir = o.data_dir;
  const bool own_dir = dir.empty();
  if (own_dir) {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "sonde-training-bench-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) return absl::InternalError("mkdtemp failed");
    dir = pattern;
  }
  server::CollectorOptions co;
  co.listen = "127.0.0.1:0";
  co.data_dir = dir + "/db";
  auto collector = server::Collector::Start(co);
  if (!collector.ok()) return collector.status();

  std::vector<std::unique_ptr<Hook>> hooks(o.modes.size());
  for (size_t i = 0; i < o.modes.size(); ++i) {
    ModeResult r;
    r.mode = o.modes[i];
    report.modes.push_back(r);
    if (!o.modes[i].hook) continue;
    auto hook = Hook::Create(MakeHookOptions(o, o.modes[i], (*collector)->address()));
    if (!hook.ok()) return hook.status();
    hooks[i] = std::move(*hook);
    hooks[i]->SetMode(v1::MODE_TRAIN);
  }
  std::vector<int64_t> steps(o.modes.size(), 0);
  // Modes take turns, a round of steps each, in a new order every round
  // (shuffled with a fixed seed: a mode that leaves work behind, downloads
  // or the collector's ingest, is not always followed by the same one);
  // the first round warms up and is not counted.
  std::vector<size_t> order(o.modes.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::mt19937 shuffle(20261127);
  // The device path's counters when the measured rounds begin and end.
  std::vector<Hook::Counters> measured_from(o.modes.size());
  for (int round = 0; round <= o.rounds; ++round) {
    if (round == 1) {
      for (size_t i = 0; i < hooks.size(); ++i) {
        if (hooks[i] != nullptr) measured_from[i] = hooks[i]->counters();
      }
    }
    std::shuffle(order.begin(), order.end(), shuffle);
    for (const size_t i : order) {
      for (int s = 0; s < o.steps_per_round; ++s) {
        const Clock::time_point start = Clock::now();
        StepHostTimes times;
        Step(o, *device, m, hooks[i].get(), steps[i]++, nullptr, nullptr, &times);
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
        if (round > 0) {
          report.modes[i].step_ms.push_back(ms);
          report.modes[i].host.push_back(times);
        }
      }
    }
  }
  for (size_t i = 0; i < hooks.size(); ++i) {
    ModeResult& r = report.modes[i];
    if (hooks[i] == nullptr || r.step_ms.empty()) continue;
    const Hook::Counters c = hooks[i]->counters();
    const Hook::Counters& from = measured_from[i];
    auto per_step = [&](absl::Duration now, absl::Duration then) {
      return absl::ToDoubleMicroseconds(now - then) / r.step_ms.size();
    };
    r.enqueue_us = per_step(c.device_enqueue_time, from.device_enqueue_time);
    r.engine_us = per_step(c.device_engine_time, from.device_engine_time);
    r.handover_us = per_step(c.device_handover_time, from.device_handover_time);
  }
  for (ModeResult& r : report.modes) {
    r.median_ms = Percentile(r.step_ms, 0.5);
    r.p90_ms = Percentile(r.step_ms, 0.9);
    r.mean_ms = r.step_ms.empty() ? 0
                                  : std::accumulate(r.step_ms.begin(), r.step_ms.end(), 0.0) /
                                        r.step_ms.size();
  }
  if (o.on_timings) o.on_timings(FormatTimings(report));
  // One verification step per hook, a saving one, with device memory
  // copied to the host right after each save.
  std::vector<float> weights(m.parameters), grads(m.parameters);
  auto query = QueryClient::Connect((*collector)->address());
  for (size_t i = 0; i < o.modes.size(); ++i) {
    ModeResult& r = report.modes[i];
    Hook* hook = hooks[i].get();
    if (hook == nullptr) continue;
    while (steps[i] % r.mode.interval != 0) Step(o, *device, m, hook, steps[i]++);
    r.verify_step = steps[i];
    Step(o, *device, m, hook, steps[i]++, &weights, &grads);
    absl::Status closed = hook->Close();
    if (!closed.ok()) r.failures.push_back(absl::StrCat("close: ", closed.ToString()));
    const Hook::Counters c = hook->counters();
    r.device_waits = c.device_waits;
    r.device_waited_ms = absl::ToDoubleMilliseconds(c.device_waited);
    r.snapshot_peak_bytes = c.device_snapshot_bytes_peak;
    r.values_spilled = c.device_values_spilled;
    Check(r, *query, m, weights, grads, steps[i] - 1, o, c);
  }
  hooks.clear();
  collector->reset();
  if (own_dir) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  return report;
}

namespace {

// A mode's timing columns: median, mean and p90 ms, and the median's and
// mean's ratios to the baseline (the first mode).
std::string TimingColumns(const BenchReport& report, const ModeResult& r) {
  const ModeResult& base = report.modes.front();
  const double xm = base.median_ms > 0 ? r.median_ms / base.median_ms : 0;
  const double xa = base.mean_ms > 0 ? r.mean_ms / base.mean_ms : 0;
  return absl::StrFormat("%-14s %9.3f %9.3f %9.3f %9.4f %9.4f", r.mode.name, r.median_ms,
                         r.mean_ms, r.p90_ms, xm, xa);
}

constexpr char kTimingHeader[] =
    "mode           median ms   mean ms    p90 ms  x median    x mean";

}  // namespace

std::string FormatTimings(const BenchReport& report) {
  std::string out = absl::StrFormat("timings (%s, %.1fM parameters; before any check):\n%s\n",
                                    report.device, report.parameters / 1e6, kTimingHeader);
  for (const ModeResult& r : report.modes) absl::StrAppend(&out, TimingColumns(report, r), "\n");
  absl::StrAppend(&out, "\n", FormatHostTimes(report), "\n");
  return out;
}

std::string FormatHostTimes(const BenchReport& report) {
  std::string out =
      "host time a step, medians in us (save weights: StartStep and SaveTensors of the weights, "
      "after the sync, with the device idle; save grads: SaveTensors of the gradients, behind the "
      "compute; end step: EndStep; sync: the wait for the device; cpu: the save weights call's "
      "CPU time on the training thread; then, means a step of both saves: enqueue: the device "
      "capture's enqueues, of which engine: the engine's calls, and to sender: handing tensors "
      "to the sender; the rest of the saves is the hook's own work)\n"
      "mode           save weights  save grads    end step        sync  weights cpu     enqueue"
      "      engine   to sender\n";
  for (const ModeResult& r : report.modes) {
    std::vector<double> w, g, e, s, c;
    for (const StepHostTimes& t : r.host) {
      w.push_back(t.save_weights_us);
      c.push_back(t.save_weights_cpu_us);
      g.push_back(t.save_grads_us);
      e.push_back(t.end_step_us);
      s.push_back(t.sync_us);
    }
    absl::StrAppend(&out, absl::StrFormat("%-14s %12.1f %11.1f %11.1f %11.1f %12.1f %11.1f "
                                          "%11.1f %11.1f\n",
                                          r.mode.name, Percentile(w, 0.5), Percentile(g, 0.5),
                                          Percentile(e, 0.5), Percentile(s, 0.5),
                                          Percentile(c, 0.5), r.enqueue_us, r.engine_us,
                                          r.handover_us));
  }
  return out;
}

std::string FormatReport(const BenchReport& report) {
  std::string out = absl::StrFormat(
      "device: %s\nmodel: %d weights and biases (and as many gradients), %.1fM parameters "
      "(%.0f MB of F32 each)\n\n",
      report.device, report.tensors, report.parameters / 1e6, report.parameters * 4 / 1e6);
  absl::StrAppend(&out, kTimingHeader,
                  absl::StrFormat(" %7s %10s %14s %15s %9s %8s\n", "waits", "waited ms",
                                  "saved/complete", "dropped t/v", "spilled v", "verified"));
  for (const ModeResult& r : report.modes) {
    absl::StrAppend(
        &out, TimingColumns(report, r),
        absl::StrFormat(" %7d %10.1f %14s %15s %9d %8d\n", r.device_waits, r.device_waited_ms,
                        r.mode.hook ? absl::StrCat(r.saved_steps_present, "/",
                                                   r.saved_steps_complete, " of ",
                                                   r.saved_steps_expected)
                                    : "-",
                        r.mode.hook ? absl::StrCat(r.tensors_dropped, "/", r.values_dropped) : "-",
                        r.values_spilled, r.verified_tensors));
  }
  for (const ModeResult& r : report.modes) {
    for (const std::string& f : r.failures) absl::StrAppend(&out, "FAILED ", r.mode.name, ": ", f, "\n");
  }
  absl::StrAppend(&out, report.ok() ? "checks passed\n" : "checks FAILED\n");
  return out;
}

}  // namespace sonde::bench
