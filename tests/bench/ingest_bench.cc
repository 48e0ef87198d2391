// ingest_bench: how fast Sonde moves tensors, as ratios to baselines
// measured in the same run (these machines are shared and noisy):
//   - CPU statistics and CRC-32C throughput vs memcpy bandwidth;
//   - the training thread's cost of SaveTensor vs memcpy of the same bytes;
//   - collector ingest (hook -> gRPC on loopback -> RocksDB, acknowledged)
//     vs raw RocksDB WriteBatch writes of the same bytes.
// Usage: bazel run -c opt //tests/bench:ingest_bench [-- --steps=40 --tensor_mib=1 --tensors=16]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "client/hook.h"
#include "common/crc32c.h"
#include "stats/statistics.h"
#include "glog/logging.h"
#include "rocksdb/db.h"
#include "rocksdb/write_batch.h"
#include "server/collector.h"

ABSL_FLAG(int, steps, 40, "training steps in the ingest run");
ABSL_FLAG(int, tensors, 16, "tensors saved per step");
ABSL_FLAG(int, tensor_mib, 1, "size of each tensor in MiB");

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "sonde-bench-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) {
    std::perror("mkdtemp");
    std::exit(1);
  }
  return pattern;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;
  google::InitGoogleLogging(argv[0]);
  const int steps = absl::GetFlag(FLAGS_steps);
  const int per_step = absl::GetFlag(FLAGS_tensors);
  const size_t tensor_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_tensor_mib)) << 20;
  const double total_mib = static_cast<double>(steps) * per_step * tensor_bytes / (1 << 20);

  std::vector<float> data(tensor_bytes / 4);
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0, 1);
  for (auto& x : data) x = dist(rng);
  std::vector<char> dst(tensor_bytes);

  // Baseline 1: memcpy.
  const int reps = 64;
  auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) {
    std::memcpy(dst.data(), data.data(), tensor_bytes);
    asm volatile("" : : "r"(dst.data()) : "memory");
  }
  const double memcpy_mibs = reps * tensor_bytes / (1 << 20) / Seconds(t0, Clock::now());

  t0 = Clock::now();
  double sink = 0;
  for (int i = 0; i < reps / 8; ++i) {
    auto s = sonde::ComputeStatistics(
        absl::string_view(reinterpret_cast<const char*>(data.data()), tensor_bytes),
        sonde::v1::DTYPE_F32);
    sink += s->mean();
  }
  const double stats_mibs = reps / 8 * tensor_bytes / (1 << 20) / Seconds(t0, Clock::now());

  t0 = Clock::now();
  uint32_t crc = 0;
  for (int i = 0; i < reps; ++i) crc ^= sonde::Crc32cExtend(0, data.data(), tensor_bytes);
  const double crc_mibs = reps * tensor_bytes / (1 << 20) / Seconds(t0, Clock::now());

  // Baseline 2: raw RocksDB, one WriteBatch per step, WAL on, same bytes.
  const std::string raw_dir = TempDir();
  double rocks_mibs = 0;
  {
    rocksdb::Options o;
    o.create_if_missing = true;
    rocksdb::DB* db = nullptr;
    if (!rocksdb::DB::Open(o, raw_dir, &db).ok()) return 1;
    t0 = Clock::now();
    for (int s = 0; s < steps; ++s) {
      rocksdb::WriteBatch batch;
      for (int t = 0; t < per_step; ++t) {
        batch.Put(absl::StrCat(s, "/", t),
                  rocksdb::Slice(reinterpret_cast<const char*>(data.data()), tensor_bytes));
      }
      if (!db->Write(rocksdb::WriteOptions(), &batch).ok()) return 1;
    }
    rocks_mibs = total_mib / Seconds(t0, Clock::now());
    delete db;
  }
  std::filesystem::remove_all(raw_dir);

  // Sonde: hook -> collector over loopback -> RocksDB, until acknowledged.
  const std::string dir = TempDir();
  sonde::server::CollectorOptions co;
  co.listen = "127.0.0.1:0";
  co.data_dir = dir;
  auto collector = sonde::server::Collector::Start(co);
  if (!collector.ok()) {
    std::fprintf(stderr, "%s\n", collector.status().ToString().c_str());
    return 1;
  }
  sonde::HookOptions ho;
  ho.collector = (*collector)->address();
  ho.job = "bench";
  ho.config.save_config = sonde::SaveConfig::Every(1);
  ho.config.include_collections = {"weights"};
  ho.max_queue_bytes = uint64_t{4} << 30;  // measure throughput, not drops
  auto hook = sonde::Hook::Create(ho);
  // One training step's saves; returns the training thread's time in them.
  auto save_step = [&] {
    double seconds = 0;
    (*hook)->StartStep();
    for (int t = 0; t < per_step; ++t) {
      auto a = Clock::now();
      (*hook)->SaveTensor(absl::StrCat("layer", t, ".weight"),
                          sonde::HostTensor(data.data(), {static_cast<int64_t>(data.size())}),
                          {"weights"})
          .IgnoreError();
      seconds += Seconds(a, Clock::now());
    }
    return seconds;
  };
  double save_seconds = 0;
  t0 = Clock::now();
  for (int s = 0; s < steps; ++s) save_seconds += save_step();
  // Ingest throughput: everything above saved, sent and acknowledged.
  const bool flushed = (*hook)->Flush(absl::Seconds(600)).ok();
  const double ingest_seconds = Seconds(t0, Clock::now());
  // Steady state: the collector keeps up (each step flushed before the
  // next), as in training whose steps take longer than sending them.
  double steady_seconds = 0;
  const int steady_steps = 10;
  for (int s = 0; s < steady_steps; ++s) {
    (*hook)->Flush(absl::Seconds(60)).IgnoreError();
    steady_seconds += save_step();
  }
  const double steady_mibs =
      static_cast<double>(steady_steps) * per_step * tensor_bytes / (1 << 20) / steady_seconds;
  absl::Status closed = (*hook)->Close();
  const auto counters = (*hook)->counters();
  (*collector)->Shutdown();
  std::filesystem::remove_all(dir);
  const double ingest_mibs = total_mib / ingest_seconds;
  const double save_mibs = total_mib / save_seconds;

  std::printf("data: %d steps x %d tensors x %zu MiB = %.0f MiB (float32, random normal)\n",
              steps, per_step, tensor_bytes >> 20, total_mib);
  std::printf("memcpy                      %9.0f MiB/s  (baseline)\n", memcpy_mibs);
  std::printf("statistics (CPU, 1 thread)  %9.0f MiB/s  = %.3f x memcpy\n", stats_mibs,
              stats_mibs / memcpy_mibs);
  std::printf("crc32c                      %9.0f MiB/s  = %.3f x memcpy\n", crc_mibs,
              crc_mibs / memcpy_mibs);
  std::printf("SaveTensor (training thread)%9.0f MiB/s  = %.3f x memcpy\n", save_mibs,
              save_mibs / memcpy_mibs);
  std::printf("SaveTensor, collector keeping up %6.0f MiB/s  = %.3f x memcpy (recycled buffers)\n",
              steady_mibs, steady_mibs / memcpy_mibs);
  std::printf("raw RocksDB WriteBatch      %9.0f MiB/s  (baseline)\n", rocks_mibs);
  std::printf("Sonde ingest, acknowledged  %9.0f MiB/s  = %.3f x raw RocksDB  (%s, %lu dropped)\n",
              ingest_mibs, ingest_mibs / rocks_mibs, flushed && closed.ok() ? "all acked" : "NOT acked",
              static_cast<unsigned long>(counters.tensors_dropped));
  return sink == 12345.0 || crc == 1 ? 2 : 0;
}
