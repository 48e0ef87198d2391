// applier_bench: how many workers' steps one cluster node applies, for
// docs/cluster.md's "Hot jobs". One PartitionApplier (one node's apply
// thread for one partition) takes a job's log entries, already in memory
// as the node receives them from JetStream (parsed in the timed loop, as
// the node does), into a real Store and JobRegistry: each worker's step is
// validated, stored in its own WriteBatch, and assembled with the other
// workers' into complete steps.
//
// Two shapes: many workers sending small steps (reductions, a loss), and
// a few sending large tensors. Each is reported as a ratio to raw RocksDB
// WriteBatch writes of the same number and sizes of batches, measured in
// the same run.
//
//   bazel run -c opt //tests/bench:applier_bench [-- --workers=1024 --steps=20]
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/thread_pool.h"
#include "glog/logging.h"
#include "rocksdb/db.h"
#include "rocksdb/write_batch.h"
#include "rules/builtin_rules.h"
#include "server/cluster/applier.h"
#include "server/job_registry.h"
#include "storage/store.h"
#include "tests/testing/logged_stream.h"
#include "tests/testing/temp_dir.h"

ABSL_FLAG(int, workers, 1024, "workers of the many-workers job");
ABSL_FLAG(int, steps, 20, "steps each worker sends");
ABSL_FLAG(int, small_floats, 64, "values per worker step in the many-workers job");
ABSL_FLAG(int, large_workers, 8, "workers of the large-tensors job");
ABSL_FLAG(int, large_kib, 4096, "KiB per worker step in the large-tensors job");

namespace sonde {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Figures {
  double hellos_seconds = 0;  // applying every worker's hello
  double seconds = 0;         // applying the steps (not the hellos, not the ends)
  double ends_seconds = 0;    // applying every worker's job end
  double entries = 0;     // step entries applied
  double step_ends = 0;   // workers' steps stored
  double mib = 0;         // tensor bytes
  double raw_seconds = 0; // raw RocksDB writes of as many batches of the same sizes
};

// Applies `workers` x `steps` worker steps of `floats` values each.
Figures Run(const std::string& dir, int workers, int steps, int floats) {
  Figures f;
  std::filesystem::create_directories(dir);
  // The log, serialized as JetStream holds it.
  std::vector<std::string> log;
  std::vector<testing::LoggedStream> streams;
  for (int w = 0; w < workers; ++w) {
    streams.emplace_back("gw-bench", static_cast<uint64_t>(w + 1));
    log.push_back(streams.back()
                      .Hello("hot", w, workers, static_cast<uint64_t>(w + 1))
                      .SerializeAsString());
  }
  std::vector<float> values(static_cast<size_t>(floats), 0.5f);
  const size_t step_bytes = values.size() * sizeof(float);
  for (int s = 0; s < steps; ++s) {
    for (int w = 0; w < workers; ++w) {
      values[0] = static_cast<float>(s * workers + w);
      log.push_back(streams[w]
                        .Step(s, values, false, "layer.weight", 1 << 20)
                        .SerializeAsString());
    }
  }
  for (int w = 0; w < workers; ++w) log.push_back(streams[w].JobEnd().SerializeAsString());

  {
    storage::Store::Options o;
    o.path = dir + "/store";
    auto store = storage::Store::Open(o);
    if (!store.ok()) {
      std::fprintf(stderr, "store: %s\n", store.status().ToString().c_str());
      std::exit(1);
    }
    ThreadPool pool(2, 256);
    auto factory = rules::BuiltinRuleFactory();
    server::JobRegistry registry(store->get(), &pool, factory.get(), {}, absl::Seconds(60));
    registry.set_worker_lease(absl::ZeroDuration());  // as sonde-cluster runs nodes
    cluster::PartitionApplier applier(0, &registry, store->get(), server::IngestLimits());
    const size_t steps_from = static_cast<size_t>(workers);
    const size_t steps_to = log.size() - static_cast<size_t>(workers);
    Clock::time_point start = Clock::now();
    for (size_t i = 0; i < log.size(); ++i) {
      if (i == steps_from) {
        f.hellos_seconds = Since(start);
        start = Clock::now();
      } else if (i == steps_to) {
        f.seconds = Since(start);
        start = Clock::now();
      }
      v1::LogEntry entry;
      if (!entry.ParseFromString(log[i])) std::exit(1);
      auto outcome = applier.Apply(i + 1, entry);
      if (!outcome.ok() || !outcome->ended.ok()) {
        std::fprintf(stderr, "entry %zu: %s\n", i + 1,
                     (outcome.ok() ? outcome->ended : outcome.status()).ToString().c_str());
        std::exit(1);
      }
    }
    f.ends_seconds = Since(start);
    auto job = (*store)->GetJob("hot");
    auto stored = job.ok() ? (*store)->ListSteps(job->job_id(), v1::MODE_UNSPECIFIED)
                           : absl::StatusOr<std::vector<v1::StepInfo>>(job.status());
    if (!stored.ok() || static_cast<int>(stored->size()) != steps) {
      std::fprintf(stderr, "expected %d complete steps stored\n", steps);
      std::exit(1);
    }
    for (const v1::StepInfo& info : *stored) {
      if (info.workers_size() != workers) {
        std::fprintf(stderr, "step %lld has %d workers, not %d\n",
                     static_cast<long long>(info.step()), info.workers_size(), workers);
        std::exit(1);
      }
    }
  }
  f.entries = static_cast<double>(workers) * steps;
  f.step_ends = static_cast<double>(workers) * steps;
  f.mib = f.step_ends * static_cast<double>(step_bytes) / (1 << 20);

  // Baseline: one raw WriteBatch per worker step, of the same tensor bytes.
  rocksdb::Options o;
  o.create_if_missing = true;
  rocksdb::DB* db = nullptr;
  if (!rocksdb::DB::Open(o, dir + "/raw", &db).ok()) std::exit(1);
  const Clock::time_point start = Clock::now();
  for (int s = 0; s < steps; ++s) {
    for (int w = 0; w < workers; ++w) {
      values[0] = static_cast<float>(s * workers + w);
      rocksdb::WriteBatch batch;
      batch.Put(absl::StrCat("t/", s, "/", w),
                rocksdb::Slice(reinterpret_cast<const char*>(values.data()), step_bytes));
      batch.Put(absl::StrCat("s/", s, "/", w), "step end");
      if (!db->Write(rocksdb::WriteOptions(), &batch).ok()) std::exit(1);
    }
  }
  f.raw_seconds = Since(start);
  delete db;
  return f;
}

void Print(const char* name, int workers, const Figures& f) {
  std::printf(
      "%-14s %5d workers: %9.0f worker steps/s, %8.1f MiB/s; raw RocksDB %9.0f batches/s; "
      "applier/raw %.2f; hellos %.0f/s, job ends %.0f/s\n",
      name, workers, f.step_ends / f.seconds, f.mib / f.seconds, f.step_ends / f.raw_seconds,
      f.raw_seconds / f.seconds, workers / f.hellos_seconds, workers / f.ends_seconds);
}

int Main() {
  const testing::TempDir temp;
  const std::string& dir = temp.path();
  const int steps = absl::GetFlag(FLAGS_steps);
  const Figures many = Run(dir + "/many", absl::GetFlag(FLAGS_workers), steps,
                           absl::GetFlag(FLAGS_small_floats));
  const Figures large = Run(dir + "/large", absl::GetFlag(FLAGS_large_workers), steps,
                            absl::GetFlag(FLAGS_large_kib) * 256);
  std::printf("applier_bench: one partition's apply thread, %d steps per worker\n", steps);
  Print("small steps", absl::GetFlag(FLAGS_workers), many);
  Print("large tensors", absl::GetFlag(FLAGS_large_workers), large);
  return 0;
}

}  // namespace
}  // namespace sonde

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;
  google::InitGoogleLogging(argv[0]);
  return sonde::Main();
}
