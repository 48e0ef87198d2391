// No data loss, exactly once: the real hook and the real collector over real
// sockets, with faults injected by a TCP proxy (lost acks, a connection cut
// in the middle of a tensor) or by a collector that is not there yet, under
// each backpressure policy. Every test reads everything back through the
// query service and checks it bit for bit.
#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/hook.h"
#include "client/query_client.h"
#include "common/metrics/metrics.h"
#include "gtest/gtest.h"
#include "server/collector.h"
#include "tests/testing/exposition.h"
#include "tests/testing/in_process_collector.h"
#include "tests/testing/collector_later.h"
#include "tests/testing/free_address.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tcp_proxy.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace sonde {
namespace {

using ::sonde::testing::CollectorLater;
using ::sonde::testing::InProcessCollector;
using ::sonde::testing::IsOk;
using ::sonde::testing::TcpProxy;
using ::sonde::testing::TempDir;

// Values that depend on the step and position only, so a reader can tell
// which step a tensor came from.
std::vector<float> StepValues(int64_t step, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(step) * 1000.0f + static_cast<float>(i) * 0.25f;
  return v;
}

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

HookOptions Options(const std::string& address, const std::string& job) {
  HookOptions o;
  o.collector = address;
  o.job = job;
  o.config.save_config = SaveConfig::Every(1);
  o.config.include_collections = {"weights", "losses"};
  o.close_timeout = absl::Seconds(60);
  return o;
}

// Saves steps [from, to): "w" (n floats, raw values) and a loss scalar.
void SaveSteps(Hook& hook, int64_t from, int64_t to, size_t n, uint64_t max_memory = 0) {
  for (int64_t step = from; step < to; ++step) {
    hook.StartStep();
    ASSERT_EQ(hook.step(), step);
    const std::vector<float> w = StepValues(step, n);
    SONDE_ASSERT_OK(hook.SaveTensor("w", HostTensor(w.data(), {static_cast<int64_t>(n)}),
                                    {"weights"}));
    SONDE_ASSERT_OK(hook.SaveScalar("loss", static_cast<double>(step), {"losses"}));
    if (max_memory > 0) {
      const uint64_t held = hook.counters().memory_bytes;
      // Step ends and bookkeeping may go a little over the value budget.
      EXPECT_LE(held, max_memory + (64 << 10)) << "at step " << step;
    }
  }
  hook.EndStep();
}

// Every step of [0, steps) is stored exactly once with its loss, and "w"
// bit-exact where it was not dropped. Returns how many "w" are stored.
int CheckStored(QueryClient& q, const std::string& job, int64_t steps, size_t n) {
  auto listed = q.ListSteps(job);
  EXPECT_THAT(listed, IsOk());
  if (!listed.ok()) return -1;
  EXPECT_EQ(static_cast<int64_t>(listed->size()), steps);
  for (size_t i = 0; i < listed->size(); ++i) {
    EXPECT_EQ((*listed)[i].step(), static_cast<int64_t>(i));
    EXPECT_EQ((*listed)[i].workers_size(), 1);
  }
  int stored = 0;
  for (int64_t step = 0; step < steps; ++step) {
    auto w = q.ReadTensor(job, "w", step);
    if (w.ok()) {
      ++stored;
      EXPECT_EQ(w->bytes, Bytes(StepValues(step, n))) << "step " << step;
      EXPECT_EQ(w->header.statistics().count(), n);
    } else {
      EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound) << w.status();
    }
    auto loss = q.ReadTensor(job, "loss", step);
    if (loss.ok()) {
      EXPECT_EQ(loss->header.statistics().sum(), static_cast<double>(step));
    }
  }
  return stored;
}

TEST(Reliability, LostAcksThenACutConnectionStoreEveryStepOnceWithoutResendingStoredOnes) {
  InProcessCollector collector;
  TcpProxy proxy(collector.address());
  auto hook = Hook::Create(Options(proxy.address(), "lost-acks"));
  SONDE_ASSERT_OK(hook);
  SaveSteps(**hook, 0, 5, 1000);
  SONDE_ASSERT_OK((*hook)->Flush(absl::Seconds(30)));

  // Acks vanish on the way back: the collector stores steps 5..9 but the
  // client cannot know, so it keeps them.
  proxy.set_forward_to_client(false);
  SaveSteps(**hook, 5, 10, 1000);
  auto q = QueryClient::Connect(collector.address());
  // Until step 9 is stored and judged (pushed by the watch, not polled).
  SONDE_ASSERT_OK(q->WatchSteps(
      "lost-acks", 0, [](const v1::CompletedStep& s) { return s.step() < 9; },
      absl::Seconds(30)));
  auto steps = q->ListSteps("lost-acks");
  SONDE_ASSERT_OK(steps);
  ASSERT_EQ(steps->size(), 10u);
  EXPECT_GT((*hook)->counters().memory_bytes, 5 * 4000u);  // unacknowledged, still held

  // The connection breaks; the client reconnects and learns from the hello
  // ack that steps through 9 are stored.
  proxy.set_forward_to_client(true);
  proxy.CutAll();
  SONDE_ASSERT_OK((*hook)->Close());
  const Hook::Counters c = (*hook)->counters();
  EXPECT_GE(c.reconnects, 1u);
  EXPECT_EQ(c.duplicates_acked, 0u);
  EXPECT_EQ(c.tensors_dropped, 0u);
  EXPECT_EQ(c.memory_bytes, 0u);
  EXPECT_EQ(CheckStored(*q, "lost-acks", 10, 1000), 10);
  auto job = q->GetJob("lost-acks");
  SONDE_ASSERT_OK(job);
  EXPECT_EQ(job->status(), v1::JOB_STATUS_FINISHED);
}

TEST(Reliability, ALostJobEndAckStillClosesCleanly) {
  InProcessCollector collector;
  TcpProxy proxy(collector.address());
  auto hook = Hook::Create(Options(proxy.address(), "lost-job-end-ack"));
  SONDE_ASSERT_OK(hook);
  SaveSteps(**hook, 0, 3, 100);
  SONDE_ASSERT_OK((*hook)->Flush(absl::Seconds(30)));
  // The job end is stored, but its ack never comes back.
  proxy.set_forward_to_client(false);
  absl::Status closed = absl::UnknownError("Close did not return");
  std::thread closer([&] { closed = (*hook)->Close(); });
  auto q = QueryClient::Connect(collector.address());
  absl::StatusOr<v1::JobInfo> job;
  sonde::testing::WaitUntil([&] {
    job = q->GetJob("lost-job-end-ack");
    return job.ok() && job->status() == v1::JOB_STATUS_FINISHED;
  });
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->status(), v1::JOB_STATUS_FINISHED);
  // On reconnecting, the collector refuses the finished job: the client
  // takes that as the answer to its job end.
  proxy.set_forward_to_client(true);
  proxy.CutAll();
  closer.join();
  EXPECT_THAT(closed, IsOk());
  EXPECT_GE((*hook)->counters().reconnects, 1u);
  EXPECT_EQ(CheckStored(*q, "lost-job-end-ack", 3, 100), 3);
}

TEST(Reliability, AConnectionCutInTheMiddleOfATensorIsResentWhole) {
  InProcessCollector collector;
  TcpProxy proxy(collector.address());
  // The first connection dies after 300 kB from the client: in the middle
  // of step 1's 400 kB tensor.
  proxy.CutAfterClientBytes(300 << 10);
  HookOptions o = Options(proxy.address(), "cut-mid-tensor");
  o.max_chunk_bytes = 64 << 10;
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  SaveSteps(**hook, 0, 6, 100000);
  SONDE_ASSERT_OK((*hook)->Close());
  const Hook::Counters c = (*hook)->counters();
  EXPECT_GE(proxy.connections(), 2);
  EXPECT_GE(c.reconnects, 1u);
  EXPECT_GT(c.messages_resent, 0u);
  EXPECT_EQ(c.tensors_dropped, 0u);
  auto q = QueryClient::Connect(collector.address());
  EXPECT_EQ(CheckStored(*q, "cut-mid-tensor", 6, 100000), 6);
  // What the client reported on its step ends reaches the operators' metrics
  // (the collector runs in this process: its default registry is ours).
  const metrics::Registry* registries[] = {&metrics::Registry::Default()};
  const auto samples = ::sonde::testing::ExpositionSamples(metrics::RenderText(registries));
  EXPECT_GE(::sonde::testing::SampleOr0(samples, "sonde_client_messages_resent_total"),
            static_cast<double>(c.messages_resent) - 1);  // the job end's resends may be unreported
  EXPECT_GE(::sonde::testing::SampleOr0(samples, "sonde_client_reconnects_total"), 1.0);
}

constexpr uint64_t kBudget = 256 << 10;
constexpr int64_t kSteps = 40;
constexpr size_t kFloats = 8192;  // 32 KiB per step: 1.25 MiB in all, 5x the budget

std::unique_ptr<Hook> OfflineHook(const std::string& address, const std::string& job,
                                  BackpressurePolicy policy, const std::string& spill_dir = "") {
  HookOptions o = Options(address, job);
  // The memory-only policies themselves: with a spool the sender would move
  // steps to disk while disconnected (tests/spool_test).
  o.spool_dir = "";
  o.max_queue_bytes = kBudget;
  o.backpressure.policy = policy;
  o.backpressure.spill_dir = spill_dir;
  o.backpressure.max_block = absl::Milliseconds(20);
  auto hook = Hook::Create(o);
  EXPECT_THAT(hook, IsOk());
  return hook.ok() ? std::move(*hook) : nullptr;
}

TEST(Reliability, SpillPolicyKeepsMemoryBoundedAndDeliversEverythingOnceTheCollectorComesUp) {
  CollectorLater collector;
  TempDir spill;
  auto hook = OfflineHook(collector.address(), "spill", BackpressurePolicy::kSpill, spill.path());
  ASSERT_NE(hook, nullptr);
  SaveSteps(*hook, 0, kSteps, kFloats, kBudget);
  Hook::Counters c = hook->counters();
  EXPECT_GT(c.tensors_spilled, 0u);
  EXPECT_GT(c.bytes_spilled, 0u);
  EXPECT_EQ(c.tensors_dropped, 0u);
  // The spill file is unlinked at once: nothing shows in its directory.
  EXPECT_EQ(std::system(absl::StrCat("test -z \"$(ls -A ", spill.path(), ")\"").c_str()), 0);

  collector.Start();
  SONDE_ASSERT_OK(hook->Close());
  c = hook->counters();
  EXPECT_EQ(c.tensors_dropped, 0u);
  EXPECT_EQ(c.memory_bytes, 0u);
  auto q = QueryClient::Connect(collector.address());
  EXPECT_EQ(CheckStored(*q, "spill", kSteps, kFloats), kSteps);
  auto job = q->GetJob("spill");
  SONDE_ASSERT_OK(job);
  EXPECT_EQ(job->tensors_dropped(), 0u);
}

void ExpectGapsMatch(QueryClient& q, const std::string& job, uint64_t dropped) {
  auto steps = q.ListSteps(job);
  SONDE_ASSERT_OK(steps);
  uint64_t gaps = 0;
  for (const v1::StepInfo& s : *steps) gaps += s.tensors_dropped();
  EXPECT_EQ(gaps, dropped);
  auto info = q.GetJob(job);
  SONDE_ASSERT_OK(info);
  EXPECT_EQ(info->tensors_dropped(), dropped);
}

TEST(Reliability, DropPolicyDropsCountsAndTheCollectorShowsTheGaps) {
  CollectorLater collector;
  auto hook = OfflineHook(collector.address(), "drop", BackpressurePolicy::kDrop);
  ASSERT_NE(hook, nullptr);
  SaveSteps(*hook, 0, kSteps, kFloats, kBudget);
  const uint64_t dropped = hook->counters().tensors_dropped;
  EXPECT_GT(dropped, 0u);
  EXPECT_EQ(hook->counters().tensors_spilled, 0u);
  collector.Start();
  SONDE_ASSERT_OK(hook->Close());
  auto q = QueryClient::Connect(collector.address());
  const int stored = CheckStored(*q, "drop", kSteps, kFloats);
  // Each step saved a "w" and a loss; the dropped ones are missing.
  EXPECT_EQ(static_cast<uint64_t>(2 * kSteps) - dropped,
            static_cast<uint64_t>(stored) + [&] {
              uint64_t losses = 0;
              for (int64_t s = 0; s < kSteps; ++s) losses += q->ReadTensor("drop", "loss", s).ok();
              return losses;
            }());
  ExpectGapsMatch(*q, "drop", dropped);
}

TEST(Reliability, BlockPolicyWaitsThenDropsAndCounts) {
  CollectorLater collector;
  auto hook = OfflineHook(collector.address(), "block", BackpressurePolicy::kBlock);
  ASSERT_NE(hook, nullptr);
  SaveSteps(*hook, 0, 12, kFloats, kBudget);  // nothing frees room: each wait runs out
  const uint64_t dropped = hook->counters().tensors_dropped;
  EXPECT_GT(dropped, 0u);
  collector.Start();
  SONDE_ASSERT_OK(hook->Close());
  auto q = QueryClient::Connect(collector.address());
  EXPECT_GT(CheckStored(*q, "block", 12, kFloats), 0);
  ExpectGapsMatch(*q, "block", dropped);
}

TEST(Reliability, ACollectorRestartInPlaceLosesNothing) {
  InProcessCollector collector;
  auto hook = Hook::Create(Options(collector.address(), "restart"));
  SONDE_ASSERT_OK(hook);
  SaveSteps(**hook, 0, 10, 5000);
  collector.RestartInPlace();
  SaveSteps(**hook, 10, 20, 5000);
  collector.RestartInPlace();
  SaveSteps(**hook, 20, 30, 5000);
  SONDE_ASSERT_OK((*hook)->Close());
  EXPECT_EQ((*hook)->counters().tensors_dropped, 0u);
  auto q = QueryClient::Connect(collector.address());
  EXPECT_EQ(CheckStored(*q, "restart", 30, 5000), 30);
}

TEST(Reliability, StepsBuiltBeforeTheCollectorSaidItsLimitsAreRefusedOnceDroppedAndCounted) {
  // The collector is down when the run starts: steps go to the spool built
  // with the default limits, which this collector is configured below. Its
  // refusal is for good (sent again, they would be refused again): the
  // steps are dropped and counted, never resent in a loop, and the steps
  // after the hello ack are cut to its limit and stored.
  CollectorLater collector;
  TempDir spool;
  HookOptions o = Options(collector.address(), "early");
  o.spool_dir = spool.path();
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  std::vector<float> w(16, 1.0f);
  auto save_step = [&] {
    (*hook)->StartStep();
    for (int t = 0; t < 5; ++t) {
      SONDE_ASSERT_OK((*hook)->SaveTensor(absl::StrCat("w", t),
                                          HostTensor(w.data(), {16}), {"weights"}));
    }
  };
  save_step();
  save_step();
  (*hook)->StartStep();  // ends step 1
  ASSERT_TRUE(::sonde::testing::WaitUntil(
      [&] { return (*hook)->counters().entries_spooled >= 2; }));

  server::IngestLimits limits;
  limits.max_tensors_per_step = 3;
  collector.Start(limits);
  ASSERT_TRUE(::sonde::testing::WaitUntil(
      [&] { return (*hook)->counters().steps_dropped >= 2; }))
      << "steps refused for good are resent in a loop";
  for (int t = 0; t < 5; ++t) {  // step 2, after the ack
    SONDE_ASSERT_OK((*hook)->SaveTensor(absl::StrCat("w", t),
                                        HostTensor(w.data(), {16}), {"weights"}));
  }
  save_step();  // step 3
  SONDE_ASSERT_OK((*hook)->Close());
  const Hook::Counters c = (*hook)->counters();
  EXPECT_EQ(c.steps_dropped, 2u);
  EXPECT_EQ(c.tensors_dropped, 2u * 5 + 2u * 2);

  auto q = QueryClient::Connect(collector.address());
  auto steps = q->ListSteps("early");
  SONDE_ASSERT_OK(steps);
  ASSERT_EQ(steps->size(), 2u);
  for (const v1::StepInfo& info : *steps) {
    EXPECT_GE(info.step(), 2);
    EXPECT_EQ(info.tensor_count(), 3u) << "step " << info.step();
    EXPECT_EQ(info.tensors_dropped(), 2u) << "step " << info.step();
    EXPECT_FALSE(info.complete());
  }
  auto job = q->GetJob("early");
  SONDE_ASSERT_OK(job);
  EXPECT_EQ(job->steps_dropped(), 2u);
}

}  // namespace
}  // namespace sonde
