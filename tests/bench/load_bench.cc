// load_bench: many concurrent training clients against one collector
// process on loopback, for a bounded time. 32 workers of one job plus
// other jobs' workers stream as fast as the collector takes them (the
// hooks' default spill policy absorbs the rest). Reports:
//   - acknowledged ingest throughput, as a ratio to raw RocksDB WriteBatch
//     writes of the same step sizes measured in the same run;
//   - the collector process's peak resident memory (VmHWM) and its RSS
//     sampled over the run;
//   - per-client errors, drops, spills and resends;
// then checks that nothing was lost: every step every worker saved is
// stored exactly once (exit status 1 otherwise).
// Usage: bazel run -c opt //tests/bench:load_bench [-- --seconds=20 --workers=32 --other_jobs=4]
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/hook.h"
#include "client/query_client.h"
#include "glog/logging.h"
#include "rocksdb/db.h"
#include "rocksdb/write_batch.h"

ABSL_FLAG(int, seconds, 20, "how long clients stream");
ABSL_FLAG(int, workers, 32, "workers of the main job");
ABSL_FLAG(int, other_jobs, 4, "other jobs, 2 workers each");
ABSL_FLAG(int, tensors, 8, "tensors per step (raw values)");
ABSL_FLAG(int, tensor_kib, 64, "size of each tensor in KiB");
ABSL_FLAG(std::string, collector_binary, "", "sonde-collector (default: from runfiles)");

namespace {

using Clock = std::chrono::steady_clock;

std::string TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "sonde-load-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) {
    std::perror("mkdtemp");
    std::exit(1);
  }
  return pattern;
}

// kB of a /proc/<pid>/status field.
long StatusKb(pid_t pid, const std::string& field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::atol(line.c_str() + field.size() + 1);
  }
  return -1;
}

// Starts sonde-collector; returns its pid and sets `address` from its first line.
pid_t StartCollector(const std::string& binary, const std::string& data_dir, std::string* address) {
  int out[2];
  if (pipe(out) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, 2);
    close(out[0]);
    std::string listen = "--listen=127.0.0.1:0";
    std::string data = "--data_dir=" + data_dir;
    std::string rules = "--rules=ExplodingTensor;LossNotDecreasing";
    char* argv[] = {const_cast<char*>(binary.c_str()), listen.data(), data.data(), rules.data(),
                    nullptr};
    execv(binary.c_str(), argv);
    _exit(127);
  }
  close(out[1]);
  std::string line;
  char buf[256];
  pollfd p{out[0], POLLIN, 0};
  while (line.find('\n') == std::string::npos && poll(&p, 1, 30000) > 0) {
    const ssize_t n = read(out[0], buf, sizeof(buf));
    if (n <= 0) break;
    line.append(buf, static_cast<size_t>(n));
  }
  close(out[0]);
  *address = line.substr(0, line.find('\n'));
  return address->empty() ? -1 : pid;
}

struct Worker {
  std::string job;
  int worker = 0;
  int world = 1;
  int64_t steps = 0;
  absl::Status closed;
  sonde::Hook::Counters counters;
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 2;
  google::InitGoogleLogging(argv[0]);
  const int seconds = absl::GetFlag(FLAGS_seconds);
  const int per_step = absl::GetFlag(FLAGS_tensors);
  const size_t tensor_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_tensor_kib)) << 10;
  const uint64_t step_bytes = per_step * tensor_bytes;
  std::string binary = absl::GetFlag(FLAGS_collector_binary);
  if (binary.empty()) binary = std::string(argv[0]) + ".runfiles/sonde/server/sonde-collector";

  std::vector<float> data(tensor_bytes / 4);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (float& v : data) v = normal(rng);

  // Baseline: raw RocksDB, one WriteBatch per step (WAL on), same step size.
  double rocks_mibs = 0;
  {
    const std::string dir = TempDir();
    rocksdb::Options o;
    o.create_if_missing = true;
    rocksdb::DB* raw = nullptr;
    if (!rocksdb::DB::Open(o, dir + "/db", &raw).ok()) return 1;
    std::unique_ptr<rocksdb::DB> db(raw);
    const std::string value(reinterpret_cast<const char*>(data.data()), tensor_bytes);
    const int steps = static_cast<int>((256ull << 20) / step_bytes) + 1;
    const auto t0 = Clock::now();
    for (int s = 0; s < steps; ++s) {
      rocksdb::WriteBatch batch;
      for (int t = 0; t < per_step; ++t) batch.Put(absl::StrCat(s, "/", t), value);
      if (!db->Write(rocksdb::WriteOptions(), &batch).ok()) return 1;
    }
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    rocks_mibs = steps * static_cast<double>(step_bytes) / (1 << 20) / secs;
    db.reset();
    std::filesystem::remove_all(dir);
  }

  const std::string data_dir = TempDir();
  std::string address;
  const pid_t collector = StartCollector(binary, data_dir + "/db", &address);
  if (collector <= 0) {
    std::fprintf(stderr, "cannot start %s\n", binary.c_str());
    return 1;
  }

  std::vector<Worker> workers;
  for (int w = 0; w < absl::GetFlag(FLAGS_workers); ++w) {
    workers.push_back({"load-main", w, absl::GetFlag(FLAGS_workers)});
  }
  for (int j = 0; j < absl::GetFlag(FLAGS_other_jobs); ++j) {
    for (int w = 0; w < 2; ++w) workers.push_back({absl::StrCat("load-other-", j), w, 2});
  }

  std::atomic<bool> stop{false};
  std::atomic<long> rss_peak_sampled{0};
  std::thread sampler([&] {
    while (!stop.load()) {
      rss_peak_sampled = std::max(rss_peak_sampled.load(), StatusKb(collector, "VmRSS"));
      absl::SleepFor(absl::Milliseconds(100));
    }
  });
  const auto t0 = Clock::now();
  const auto end = t0 + std::chrono::seconds(seconds);
  std::vector<std::thread> threads;
  for (Worker& w : workers) {
    threads.emplace_back([&w, &address, &data, per_step, tensor_bytes, end] {
      sonde::HookOptions o;
      o.collector = address;
      o.job = w.job;
      o.worker = w.worker;
      o.world_size = w.world;
      o.config.save_config = sonde::SaveConfig::Every(1);
      o.config.include_collections = {"weights", "losses"};
      o.max_queue_bytes = 16 << 20;
      o.close_timeout = absl::Seconds(600);
      auto hook = sonde::Hook::Create(o);
      if (!hook.ok()) {
        w.closed = hook.status();
        return;
      }
      while (Clock::now() < end) {
        (*hook)->StartStep();
        for (int t = 0; t < per_step; ++t) {
          (*hook)
              ->SaveTensor(absl::StrCat("layer", t, ".weight"),
                           sonde::HostTensor(data.data(), {static_cast<int64_t>(tensor_bytes / 4)}),
                           {"weights"})
              .IgnoreError();
        }
        (*hook)->SaveScalar("loss", 1.0 / (1 + w.steps), {"losses"}).IgnoreError();
        ++w.steps;
      }
      w.closed = (*hook)->Close();
      w.counters = (*hook)->counters();
    });
  }
  for (std::thread& t : threads) t.join();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  stop = true;
  sampler.join();
  const long hwm = StatusKb(collector, "VmHWM");

  uint64_t steps = 0, errors = 0, dropped = 0, spilled = 0, resent = 0;
  for (const Worker& w : workers) {
    steps += w.steps;
    errors += !w.closed.ok();
    dropped += w.counters.tensors_dropped;
    spilled += w.counters.tensors_spilled;
    resent += w.counters.messages_resent;
    if (!w.closed.ok()) std::fprintf(stderr, "%s/%d: %s\n", w.job.c_str(), w.worker,
                                     w.closed.ToString().c_str());
  }
  // Nothing lost: every step of every worker is stored, once.
  auto q = sonde::QueryClient::Connect(address, absl::Seconds(120));
  uint64_t missing = 0;
  std::map<std::string, std::map<int, int64_t>> saved;
  for (const Worker& w : workers) saved[w.job][w.worker] = w.steps;
  for (const auto& [job, per_worker] : saved) {
    auto listed = q->ListSteps(job);
    if (!listed.ok()) {
      std::fprintf(stderr, "ListSteps %s: %s\n", job.c_str(), listed.status().ToString().c_str());
      ++missing;
      continue;
    }
    std::map<int, int64_t> stored;
    for (const auto& s : *listed) {
      for (int w : s.workers()) ++stored[w];
      if (s.tensor_count() != static_cast<uint32_t>((per_step + 1) * s.workers_size())) ++missing;
    }
    for (const auto& [w, n] : per_worker) {
      if (stored[w] != n) {
        std::fprintf(stderr, "%s worker %d: saved %ld steps, stored %ld\n", job.c_str(), w,
                     static_cast<long>(n), static_cast<long>(stored[w]));
        ++missing;
      }
    }
  }
  const double mib = steps * static_cast<double>(step_bytes) / (1 << 20);
  std::printf("clients: %zu (%d workers of one job + %d jobs x 2), %d s of streaming, %d x %zu KiB "
              "per step\n",
              workers.size(), absl::GetFlag(FLAGS_workers), absl::GetFlag(FLAGS_other_jobs),
              seconds, per_step, tensor_bytes >> 10);
  std::printf("raw RocksDB WriteBatch        %8.0f MiB/s  (baseline)\n", rocks_mibs);
  std::printf("Sonde ingest, acknowledged    %8.0f MiB/s  = %.3f x raw RocksDB  (%lu steps, "
              "%.0f MiB in %.1f s incl. catching up)\n",
              mib / secs, mib / secs / rocks_mibs, static_cast<unsigned long>(steps), mib, secs);
  std::printf("collector peak RSS (VmHWM)    %8.1f MiB  (sampled max %.1f MiB)\n", hwm / 1024.0,
              rss_peak_sampled.load() / 1024.0);
  std::printf("client errors %lu, tensors dropped %lu, spilled %lu, messages resent %lu\n",
              static_cast<unsigned long>(errors), static_cast<unsigned long>(dropped),
              static_cast<unsigned long>(spilled), static_cast<unsigned long>(resent));
  std::printf("nothing lost: %s\n", missing == 0 ? "yes (every saved step stored once)" : "NO");
  kill(collector, SIGTERM);
  waitpid(collector, nullptr, 0);
  std::filesystem::remove_all(data_dir);
  return missing == 0 && errors == 0 && dropped == 0 ? 0 : 1;
}
