// Throughput of the CPU statistics path against the memory system, in one
// run: a plain AVX2 read pass over the same buffer is the baseline, and
// every figure is a ratio to it (the machine is shared and noisy, so each
// measurement alternates with its baseline and the ratio is the median of
// the per-pair ratios). Also times the same numbers from
// separate numpy calls (stats/numpy_baseline.py) when numpy is installed.
//
//   bazel run -c opt //stats:stats_bench [-- --mb=256 --reps=7 --threads=0]
//
// The last line is `stats/read = R`: statistics throughput over read-pass
// throughput, both with the same number of threads.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "stats/cpu_stats.h"
#include "stats/histogram.h"

ABSL_FLAG(int, mb, 256, "buffer size in MiB of F32 values");
ABSL_FLAG(int, reps, 11,
          "repetitions of each measurement (the median is reported)");
ABSL_FLAG(int, threads, 0,
          "threads for the parallel figures; 0 = CpuStatsOptions' default");
ABSL_FLAG(std::string, numpy_script, "",
          "path of numpy_baseline.py; default: found through the runfiles");
ABSL_FLAG(int, numpy_reps, 3, "repetitions of the numpy measurement");
ABSL_FLAG(std::string, profile, "",
          "run only this measurement (read1, stats1, stats, exp, fixed, both), "
          "--reps times, "
          "for perf");

namespace sonde {
namespace {

double Seconds(const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double MedianSeconds(int reps, const std::function<void()>& fn) {
  fn();  // warm-up: page tables, the pool's threads
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) t.push_back(Seconds(fn));
  return Median(t);
}

// A measurement and its baseline, run alternately so that both see the
// same state of a shared machine; the ratio is the median of the per-pair
// ratios, which drifts far less than the ratio of two medians.
struct Paired {
  double seconds;   // median of the measurement
  double baseline;  // median of the baseline
  double ratio;     // median of baseline/measurement per pair
};

Paired MeasurePaired(int reps, const std::function<void()>& baseline,
                     const std::function<void()>& fn) {
  baseline();
  fn();
  std::vector<double> t, b, r;
  for (int i = 0; i < reps; ++i) {
    b.push_back(Seconds(baseline));
    t.push_back(Seconds(fn));
    r.push_back(b.back() / t.back());
  }
  return {Median(t), Median(b), Median(r)};
}

// The baseline: the cheapest useful pass over memory, a float sum with
// four independent AVX2 accumulators.
__attribute__((target("avx2"))) float ReadPassAvx2(const float* x, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(x + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(x + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(x + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(x + i + 24));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes,
                  _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  float sum = 0;
  for (float v : lanes) sum += v;
  for (; i < n; ++i) sum += x[i];
  return sum;
}

float ReadPassScalar(const float* x, size_t n) {
  float sum = 0;
  for (size_t i = 0; i < n; ++i) sum += x[i];
  return sum;
}

// The read pass over `threads` contiguous parts, one thread each.
float ReadPass(const float* x, size_t n, int threads) {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  auto part = [&](int i) {
    const size_t per = (n + threads - 1) / threads;
    const size_t begin = std::min(n, per * i), end = std::min(n, begin + per);
    return avx2 ? ReadPassAvx2(x + begin, end - begin)
                : ReadPassScalar(x + begin, end - begin);
  };
  std::vector<float> sums(threads);
  std::vector<std::thread> workers;
  for (int i = 1; i < threads; ++i)
    workers.emplace_back([&, i] { sums[i] = part(i); });
  sums[0] = part(0);
  for (auto& w : workers) w.join();
  float total = 0;
  for (float s : sums) total += s;
  return total;
}

std::string FindNumpyScript(const char* argv0) {
  std::vector<std::string> candidates;
  if (!absl::GetFlag(FLAGS_numpy_script).empty()) {
    candidates.push_back(absl::GetFlag(FLAGS_numpy_script));
  }
  if (const char* dir = std::getenv("RUNFILES_DIR")) {
    candidates.push_back(absl::StrCat(dir, "/sonde/stats/numpy_baseline.py"));
  }
  candidates.push_back(
      "stats/numpy_baseline.py");  // bazel run's working directory
  candidates.push_back(
      absl::StrCat(argv0, ".runfiles/sonde/stats/numpy_baseline.py"));
  for (const std::string& c : candidates) {
    if (FILE* f = std::fopen(c.c_str(), "r")) {
      std::fclose(f);
      return c;
    }
  }
  return "";
}

// Runs the numpy script; false with a reason if it cannot.
bool NumpySeconds(const char* argv0, int mb, double* stats, double* hist,
                  std::string* why) {
  if (std::FILE* f = std::fopen("/usr/bin/python3", "r")) {
    std::fclose(f);
  } else {
    *why = "/usr/bin/python3 is missing";
    return false;
  }
  if (std::system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0) {
    *why =
        "numpy is not installed for /usr/bin/python3 (apt-get install "
        "python3-numpy)";
    return false;
  }
  const std::string script = FindNumpyScript(argv0);
  if (script.empty()) {
    *why = "numpy_baseline.py not found (pass --numpy_script)";
    return false;
  }
  const std::string cmd =
      absl::StrCat("/usr/bin/python3 '", script, "' --mb=", mb,
                   " --reps=", absl::GetFlag(FLAGS_numpy_reps));
  std::FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    *why = "could not start " + cmd;
    return false;
  }
  char line[512];
  bool found = false;
  while (std::fgets(line, sizeof(line), p) != nullptr) {
    found |= std::sscanf(line, "numpy_seconds %lf %lf", stats, hist) == 2;
  }
  const int rc = pclose(p);
  if (rc != 0 || !found) {
    *why = absl::StrCat("'", cmd, "' failed (status ", rc, ")");
    return false;
  }
  return true;
}

int Main(char** argv) {
  const int mb = absl::GetFlag(FLAGS_mb);
  const int reps = absl::GetFlag(FLAGS_reps);
  const uint64_t n = static_cast<uint64_t>(mb) * (1 << 20) / 4;
  const double gb = static_cast<double>(n) * 4 / 1e9;
  int threads = absl::GetFlag(FLAGS_threads);
  if (threads <= 0) {
    threads = static_cast<int>(
        std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
  }

  std::printf(
      "stats_bench: %d MiB of F32 normal(0, 1), %d threads, implementation %s, "
      "median of %d\n",
      mb, threads, CpuStatsImplementation(), reps);
  std::vector<float> data(n);
  {
    std::mt19937 rng(1);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (auto& x : data) x = dist(rng);
  }
  const float* x = data.data();

  CpuStatsOptions one;
  one.threads = 1;
  CpuStatsOptions many;
  many.threads = threads;
  CpuStatsOptions portable = one;
  portable.force_portable = true;

  volatile float sink = 0;
  StatsAccumulator acc;
  HistogramCounts exp_h = HistogramCounts::Empty(DefaultExponentialSpec());
  HistogramCounts fixed_h = HistogramCounts::Empty(FixedSpec(-4, 4, 64));
  auto stats = [&](const CpuStatsOptions& o) {
    return [&, o] {
      acc = StatsAccumulator();
      CpuAccumulate(&acc, nullptr, x, v1::DTYPE_F32, n, o).IgnoreError();
    };
  };
  auto hist = [&](HistogramCounts* h, bool with_stats,
                  const CpuStatsOptions& o) {
    return [&, h, with_stats, o] {
      acc = StatsAccumulator();
      *h = HistogramCounts::Empty(h->spec);
      CpuAccumulate(with_stats ? &acc : nullptr, h, x, v1::DTYPE_F32, n, o)
          .IgnoreError();
    };
  };

  const std::string profile = absl::GetFlag(FLAGS_profile);
  if (!profile.empty()) {
    std::function<void()> fn;
    if (profile == "read1") fn = [&] { sink = ReadPass(x, n, 1); };
    if (profile == "stats1") fn = stats(one);
    if (profile == "stats") fn = stats(many);
    if (profile == "exp") fn = hist(&exp_h, false, many);
    if (profile == "fixed") fn = hist(&fixed_h, false, many);
    if (profile == "both") fn = hist(&exp_h, true, many);
    if (!fn) {
      std::fprintf(stderr, "unknown --profile=%s\n", profile.c_str());
      return 2;
    }
    const double t = MedianSeconds(reps, fn);
    std::printf("%s: %.2f ms %.2f GB/s\n", profile.c_str(), t * 1e3, gb / t);
    return 0;
  }

  struct Row {
    std::string name;
    Paired p;
  };
  auto read_1 = [&] { sink = ReadPass(x, n, 1); };
  auto read_n = [&] { sink = ReadPass(x, n, threads); };
  std::vector<Row> rows;
  rows.push_back(
      {"statistics, 1 thread", MeasurePaired(reps, read_1, stats(one))});
  rows.push_back({"statistics, portable, 1 thread",
                  MeasurePaired(std::min(reps, 3), read_1, stats(portable))});
  const Paired stats_n = MeasurePaired(reps, read_n, stats(many));
  rows.push_back({"statistics", stats_n});
  rows.push_back({"exponential histogram",
                  MeasurePaired(reps, read_n, hist(&exp_h, false, many))});
  rows.push_back({"fixed histogram",
                  MeasurePaired(reps, read_n, hist(&fixed_h, false, many))});
  rows.push_back({"statistics + exponential histogram",
                  MeasurePaired(reps, read_n, hist(&exp_h, true, many))});
  const Paired both_fixed =
      MeasurePaired(reps, read_n, hist(&fixed_h, true, many));
  rows.push_back({"statistics + fixed histogram", both_fixed});

  auto print = [&](const std::string& name, double seconds, double ratio) {
    std::printf("%-40s %8.2f ms %7.2f GB/s  %.2f x read\n", name.c_str(),
                seconds * 1e3, gb / seconds, ratio);
  };
  print("read pass, 1 thread", rows[0].p.baseline, 1.0);
  print(rows[0].name, rows[0].p.seconds, rows[0].p.ratio);
  print(rows[1].name, rows[1].p.seconds, rows[1].p.ratio);
  print(absl::StrCat("read pass, ", threads, " threads"), stats_n.baseline,
        1.0);
  for (size_t i = 2; i < rows.size(); ++i)
    print(rows[i].name, rows[i].p.seconds, rows[i].p.ratio);
  std::printf("check: mean %.6f std %.6f, %llu finite\n", acc.mean,
              std::sqrt(acc.m2 / static_cast<double>(acc.finite_count)),
              static_cast<unsigned long long>(acc.finite_count));

  double np_stats = 0, np_hist = 0;
  std::string why;
  if (NumpySeconds(argv[0], mb, &np_stats, &np_hist, &why)) {
    std::printf("numpy: statistics %.1f ms, np.histogram %.1f ms\n",
                np_stats * 1e3, np_hist * 1e3);
    std::printf("numpy/sonde statistics = %.1f\n", np_stats / stats_n.seconds);
    std::printf("numpy/sonde statistics + fixed histogram = %.1f\n",
                (np_stats + np_hist) / both_fixed.seconds);
  } else {
    std::printf("numpy comparison skipped: %s\n", why.c_str());
  }
  std::printf("stats/read = %.2f\n", stats_n.ratio);
  return 0;
}

}  // namespace
}  // namespace sonde

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return sonde::Main(argv);
}
