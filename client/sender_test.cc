// The sender against a real collector (RocksDB, gRPC on a loopback port)
// where the hook's own tests cannot reach: its spill budget, shared with
// the test, runs out between a step's tensors and its step end.
#include "client/sender.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/query_client.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "stats/cpu_stats.h"
#include "tests/testing/collector_later.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace sonde {
namespace {

using ::sonde::testing::CollectorLater;
using ::sonde::testing::TempDir;

constexpr size_t kFloats = 1024;  // 4 KiB a tensor

QueuedTensor Tensor(const std::string& name, int64_t step) {
  QueuedTensor t;
  t.name = name;
  t.collections = {"weights"};
  t.dtype = v1::DTYPE_F32;
  t.shape = {static_cast<int64_t>(kFloats)};
  std::vector<float> v(kFloats, static_cast<float>(step));
  t.bytes.assign(reinterpret_cast<const char*>(v.data()), kFloats * sizeof(float));
  t.step = step;
  t.mode_step = step;
  return t;
}

// Three tensors in memory, queued or unacknowledged: the rest spills
// (into `spill_dir`, charged to `budget` if given) while the collector is
// down or the sender waits for a step's end to have it acknowledged.
SenderOptions SpillingOptions(const std::string& address, const std::string& job,
                              const std::string& spill_dir,
                              std::shared_ptr<SpillBudget> budget = nullptr) {
  SenderOptions o;
  o.collector = address;
  o.hello.set_job(job);
  o.hello.set_world_size(1);
  o.max_queue_bytes = 3 * (kFloats * sizeof(float) + 256);
  o.backpressure.policy = BackpressurePolicy::kSpill;
  o.backpressure.spill_dir = spill_dir;
  if (budget != nullptr) o.spill_budget = std::move(budget);
  o.reconnect_min = absl::Milliseconds(20);
  o.reconnect_max = absl::Milliseconds(200);
  return o;
}

// Steps first..last of two tensors each, with their ends.
void SendSteps(Sender& sender, int64_t first, int64_t last) {
  for (int64_t step = first; step <= last; ++step) {
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(sender.EnqueueTensor(Tensor(absl::StrCat("w", i), step)));
    }
    sender.EnqueueStepEnd(step, v1::MODE_GLOBAL, step, 0.1);
  }
}

// The collector holds steps first..last of `job` and no other, each
// whole: its two tensors, nothing dropped, complete, its values its own;
// and the job counts `steps_dropped` steps lost before them.
void ExpectStepsStoredWhole(const std::string& address, const std::string& job, int64_t first,
                            int64_t last, uint64_t steps_dropped) {
  auto q = QueryClient::Connect(address);
  auto info = q->GetJob(job);
  SONDE_ASSERT_OK(info);
  EXPECT_EQ(info->steps_dropped(), steps_dropped);
  auto steps = q->ListSteps(job);
  SONDE_ASSERT_OK(steps);
  ASSERT_EQ(steps->size(), static_cast<size_t>(last - first + 1));
  for (const v1::StepInfo& info : *steps) {
    EXPECT_GE(info.step(), first);
    EXPECT_EQ(info.tensor_count(), 2u) << "step " << info.step();
    EXPECT_EQ(info.tensors_dropped(), 0u) << "step " << info.step();
    EXPECT_TRUE(info.complete()) << "step " << info.step();
    auto w = q->ReadTensor(job, "w1", info.step(), v1::MODE_GLOBAL);
    SONDE_ASSERT_OK(w);
    float value;
    std::memcpy(&value, w->bytes.data(), sizeof(value));
    EXPECT_EQ(value, static_cast<float>(info.step()));
  }
}

// Step 0 loses its end to a full spill file after its seven tensors were
// taken (three in memory, four spilled, one of them unsendable); steps 1
// to 3 follow. With the collector up from the start, step 0's first
// tensors are on the wire
// already when its end is lost: the stream is ended so the collector lets
// go of the step. Otherwise they are dropped before they are sent.
void RunEndlessStep(bool collector_first) {
  CollectorLater collector;
  TempDir spill;
  auto budget = std::make_shared<SpillBudget>(uint64_t{64} << 20);
  SenderOptions o = SpillingOptions(collector.address(), "endless", spill.path(), budget);
  if (collector_first) {
    collector.Start();
  }
  Sender sender(o);
  if (collector_first) {
    ASSERT_TRUE(sender.WaitForHelloAck(absl::Seconds(30)));
  }

  for (int i = 0; i < 3; ++i) ASSERT_TRUE(sender.EnqueueTensor(Tensor(absl::StrCat("w", i), 0)));
  if (collector_first) {
    // On the wire: the hello and the three tensors.
    ASSERT_TRUE(::sonde::testing::WaitUntil([&] { return sender.counters().messages_sent >= 4; }));
  }
  for (int i = 3; i < 6; ++i) ASSERT_TRUE(sender.EnqueueTensor(Tensor(absl::StrCat("w", i), 0)));
  // And one the sender drops when it reaches it (4095 bytes of F32): a
  // drop counted for step 0, which goes with step 0, not with step 1's end.
  QueuedTensor bad = Tensor("bad", 0);
  bad.bytes.resize(bad.bytes.size() - 1);
  ASSERT_TRUE(sender.EnqueueTensor(std::move(bad)));
  ASSERT_EQ(sender.counters().tensors_spilled, 4u);
  const uint64_t taken = budget->room();  // the device's values took the rest
  ASSERT_TRUE(budget->TryTake(taken));
  sender.EnqueueStepEnd(0, v1::MODE_GLOBAL, 0, 0.1);
  EXPECT_EQ(sender.counters().steps_dropped, 1u);
  budget->Give(taken);

  if (!collector_first) {
    collector.Start();
  }
  ASSERT_TRUE(sender.WaitForHelloAck(absl::Seconds(30)));
  ASSERT_NO_FATAL_FAILURE(SendSteps(sender, 1, 3));
  SONDE_ASSERT_OK(sender.Close("done", absl::Seconds(30)));
  const SenderCounters c = sender.counters();
  EXPECT_EQ(c.steps_dropped, 1u);
  EXPECT_EQ(c.tensors_dropped, 7u);  // step 0's, none of the later steps'
  if (collector_first) {
    EXPECT_GE(c.reconnects, 1u);  // the stream that held step 0 open was ended
  }
  // Before, step 0's tensors went out as part of step 1, the collector
  // ended the stream ("data for step 1 while step 0 is open") and step 1
  // lost what was sent of it with the refused stream.

  ASSERT_NO_FATAL_FAILURE(
      ExpectStepsStoredWhole(collector.address(), "endless", 1, 3, 1));
}

TEST(Sender, AStepWhoseEndDidNotFitInTheSpillFileIsAGapNotARefusedStream) {
  RunEndlessStep(/*collector_first=*/false);
}

TEST(Sender, AStepPartlySentWhenItsEndWasLostIsLetGoByEndingTheStream) {
  RunEndlessStep(/*collector_first=*/true);
}

// The spill file's descriptor (it is unlinked: /proc names it "(deleted)").
int SpillFd(const std::string& dir) {
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (!ec && target.rfind(dir, 0) == 0) return std::stoi(e.path().filename().string());
  }
  return -1;
}

// Flips the last byte of the spill file under `dir`: the last record
// spilled fails its CRC when read back.
void CorruptLastSpilledRecord(const std::string& dir) {
  const int fd = SpillFd(dir);
  ASSERT_GE(fd, 0) << "no open file under " << dir;
  struct stat st;
  ASSERT_EQ(::fstat(fd, &st), 0);
  char last;
  ASSERT_EQ(::pread(fd, &last, 1, st.st_size - 1), 1);
  last = static_cast<char>(last ^ 0x5a);
  ASSERT_EQ(::pwrite(fd, &last, 1, st.st_size - 1), 1);
}

// Step 0's end is spilled and then does not read back (its last byte is
// flipped on disk, so its CRC fails): step 0 is one lost step, counted as
// a step and reported, and its tensors are dropped when step 1 comes.
// Before, the lost record was counted as a tensor of step 1, which was
// then reported incomplete, and no step was counted as lost.
TEST(Sender, ASpilledStepEndThatDoesNotReadBackIsALostStep) {
  CollectorLater collector;
  TempDir spill;
  Sender sender(SpillingOptions(collector.address(), "unreadable-end", spill.path()));
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(sender.EnqueueTensor(Tensor(absl::StrCat("w", i), 0)));
  sender.EnqueueStepEnd(0, v1::MODE_GLOBAL, 0, 0.1);
  ASSERT_EQ(sender.counters().tensors_spilled, 3u);
  ASSERT_NO_FATAL_FAILURE(CorruptLastSpilledRecord(spill.path()));

  collector.Start();
  ASSERT_TRUE(sender.WaitForHelloAck(absl::Seconds(30)));
  ASSERT_NO_FATAL_FAILURE(SendSteps(sender, 1, 3));
  SONDE_ASSERT_OK(sender.Close("done", absl::Seconds(30)));
  const SenderCounters c = sender.counters();
  EXPECT_EQ(c.steps_dropped, 1u);
  EXPECT_EQ(c.tensors_dropped, 6u);

  ASSERT_NO_FATAL_FAILURE(
      ExpectStepsStoredWhole(collector.address(), "unreadable-end", 1, 3, 1));
  // (Step 0's tensors are in that step's gap, not in tensors_dropped.)
}

// A lost spilled step end also loses what it carried: step 0's end did
// not fit in the spill file, so step 1's end carries that gap; step 1's
// end then does not read back. Both steps reach the collector as gaps.
// Before, step 0's gap went with step 1's lost end (the job said 1 step
// dropped, not 2).
TEST(Sender, ALostSpilledStepEndLosesNoGapItCarried) {
  CollectorLater collector;
  TempDir spill;
  auto budget = std::make_shared<SpillBudget>(uint64_t{64} << 20);
  Sender sender(SpillingOptions(collector.address(), "carried", spill.path(), budget));
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(sender.EnqueueTensor(Tensor(absl::StrCat("w", i), 0)));
  const uint64_t taken = budget->room();
  ASSERT_TRUE(budget->TryTake(taken));
  sender.EnqueueStepEnd(0, v1::MODE_GLOBAL, 0, 0.1);  // does not fit: a gap
  budget->Give(taken);
  ASSERT_EQ(sender.counters().steps_dropped, 1u);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(sender.EnqueueTensor(Tensor(absl::StrCat("w", i), 1)));
  sender.EnqueueStepEnd(1, v1::MODE_GLOBAL, 1, 0.1);  // spilled, carrying step 0's gap
  ASSERT_NO_FATAL_FAILURE(CorruptLastSpilledRecord(spill.path()));

  collector.Start();
  ASSERT_TRUE(sender.WaitForHelloAck(absl::Seconds(30)));
  ASSERT_NO_FATAL_FAILURE(SendSteps(sender, 2, 3));
  SONDE_ASSERT_OK(sender.Close("done", absl::Seconds(30)));
  EXPECT_EQ(sender.counters().steps_dropped, 2u);

  ASSERT_NO_FATAL_FAILURE(
      ExpectStepsStoredWhole(collector.address(), "carried", 2, 3, 2));
}

// After step 0's spilled end is lost, a spilled tensor of step 1 does not
// read back either: the gap is step 1's (it is stored with one tensor
// dropped, not complete), not step 0's. Before, it was counted for step 0
// and went with it, and step 1 was reported complete.
TEST(Sender, ALostSpilledTensorIsAGapInItsOwnStep) {
  CollectorLater collector;
  TempDir spill;
  Sender sender(SpillingOptions(collector.address(), "lost-tensor", spill.path()));
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(sender.EnqueueTensor(Tensor(absl::StrCat("w", i), 0)));
  sender.EnqueueStepEnd(0, v1::MODE_GLOBAL, 0, 0.1);
  ASSERT_NO_FATAL_FAILURE(CorruptLastSpilledRecord(spill.path()));
  ASSERT_TRUE(sender.EnqueueTensor(Tensor("w0", 1)));
  ASSERT_NO_FATAL_FAILURE(CorruptLastSpilledRecord(spill.path()));
  ASSERT_TRUE(sender.EnqueueTensor(Tensor("w1", 1)));
  sender.EnqueueStepEnd(1, v1::MODE_GLOBAL, 1, 0.1);
  ASSERT_EQ(sender.counters().tensors_spilled, 5u);

  collector.Start();
  ASSERT_TRUE(sender.WaitForHelloAck(absl::Seconds(30)));
  ASSERT_NO_FATAL_FAILURE(SendSteps(sender, 2, 3));
  SONDE_ASSERT_OK(sender.Close("done", absl::Seconds(30)));
  EXPECT_EQ(sender.counters().steps_dropped, 1u);
  EXPECT_EQ(sender.counters().tensors_dropped, 7u);  // step 0's 6, step 1's w0

  auto q = QueryClient::Connect(collector.address());
  auto steps = q->ListSteps("lost-tensor");
  SONDE_ASSERT_OK(steps);
  ASSERT_EQ(steps->size(), 3u);
  const v1::StepInfo& one = steps->front();
  EXPECT_EQ(one.step(), 1);
  EXPECT_EQ(one.tensor_count(), 1u);
  EXPECT_EQ(one.tensors_dropped(), 1u);
  EXPECT_FALSE(one.complete());
  for (size_t i = 1; i < steps->size(); ++i) {
    EXPECT_TRUE((*steps)[i].complete()) << "step " << (*steps)[i].step();
  }
}

// A device tensor of `step` whose statistics and values have arrived, as
// the capture leaves it once downloaded: its values charged to the
// sender's memory budget (ReserveHost) until the sender takes them.
QueuedTensor DeviceTensor(Sender& sender, const std::string& name, int64_t step) {
  QueuedTensor t = Tensor(name, step);
  auto p = std::make_shared<PendingDeviceTensor>();
  p->want_values = true;
  p->values_dtype = v1::DTYPE_F32;
  p->values_bytes = t.bytes.size();
  p->values = ValuePool::Buffer(new char[t.bytes.size()]);  // no pool: freed when done
  std::memcpy(p->values.get(), t.bytes.data(), t.bytes.size());
  EXPECT_TRUE(CpuAccumulate(&p->stats, nullptr, t.bytes.data(), v1::DTYPE_F32, kFloats).ok());
  p->stats_done = true;
  p->values_done = true;
  EXPECT_TRUE(sender.ReserveHost(t.bytes.size(), /*force=*/true));
  p->host_reserved = t.bytes.size();
  t.bytes.clear();
  t.send_values = true;
  t.pending = std::move(p);
  return t;
}

// Records the device tensors a sender lets go of, doing with each what
// DeviceCapture::Abandon does with downloaded values: their charge on the
// memory budget goes back.
struct AbandonedDevice {
  absl::Mutex mu;
  std::vector<const PendingDeviceTensor*> tensors ABSL_GUARDED_BY(mu);
  Sender* sender = nullptr;  // set once the sender exists

  std::function<void(const std::shared_ptr<PendingDeviceTensor>&)> Callback() {
    return [this](const std::shared_ptr<PendingDeviceTensor>& p) {
      sender->ReleaseHost(p->host_reserved);
      p->host_reserved = 0;
      p->values.reset();
      absl::MutexLock lock(&mu);
      tensors.push_back(p.get());
    };
  }
};

// A spilled device tensor's record that does not read back: the sender
// lets go of its results at once (abandon_device; the capture frees the
// snapshot, or gives back the values' charge on the memory budget, as
// here), and the tensor is a gap in its own step. Before, they were held
// until the sender ended: the memory budget stayed short by the values'
// bytes (with the device's snapshot memory, or the spill budget, likewise).
TEST(Sender, ALostSpilledDeviceTensorLetsGoOfItsResults) {
  CollectorLater collector;
  TempDir spill;
  SenderOptions o = SpillingOptions(collector.address(), "lost-device", spill.path());
  o.await_device = [](const std::shared_ptr<PendingDeviceTensor>& p) { return p->status; };
  AbandonedDevice abandoned;
  o.abandon_device = abandoned.Callback();
  Sender sender(o);
  abandoned.sender = &sender;
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(sender.EnqueueTensor(Tensor(absl::StrCat("w", i), 0)));
  sender.EnqueueStepEnd(0, v1::MODE_GLOBAL, 0, 0.1);
  QueuedTensor lost = DeviceTensor(sender, "d0", 1);
  const PendingDeviceTensor* lost_pending = lost.pending.get();
  ASSERT_TRUE(sender.EnqueueTensor(std::move(lost)));
  ASSERT_NO_FATAL_FAILURE(CorruptLastSpilledRecord(spill.path()));
  ASSERT_TRUE(sender.EnqueueTensor(DeviceTensor(sender, "d1", 1)));
  sender.EnqueueStepEnd(1, v1::MODE_GLOBAL, 1, 0.1);
  ASSERT_EQ(sender.counters().tensors_spilled, 5u);  // 3 of step 0, both of step 1

  collector.Start();
  ASSERT_TRUE(sender.WaitForHelloAck(absl::Seconds(30)));
  ASSERT_NO_FATAL_FAILURE(SendSteps(sender, 2, 3));
  ASSERT_TRUE(::sonde::testing::WaitUntil([&] { return sender.counters().steps_acked >= 4; }));
  {
    absl::MutexLock lock(&abandoned.mu);
    ASSERT_EQ(abandoned.tensors.size(), 1u);
    EXPECT_EQ(abandoned.tensors[0], lost_pending);
  }
  // Everything is stored: nothing is held against the budget.
  EXPECT_EQ(sender.counters().memory_bytes, 0u);
  SONDE_ASSERT_OK(sender.Close("done", absl::Seconds(30)));
  EXPECT_EQ(sender.counters().tensors_dropped, 1u);
  EXPECT_EQ(sender.counters().steps_dropped, 0u);

  auto q = QueryClient::Connect(collector.address());
  auto steps = q->ListSteps("lost-device");
  SONDE_ASSERT_OK(steps);
  ASSERT_EQ(steps->size(), 4u);
  const v1::StepInfo& one = (*steps)[1];
  EXPECT_EQ(one.step(), 1);
  EXPECT_EQ(one.tensor_count(), 1u);
  EXPECT_EQ(one.tensors_dropped(), 1u);
  EXPECT_FALSE(one.complete());
  auto d1 = q->ReadTensor("lost-device", "d1", 1, v1::MODE_GLOBAL);
  SONDE_ASSERT_OK(d1);
  float value;
  std::memcpy(&value, d1->bytes.data(), sizeof(value));
  EXPECT_EQ(value, 1.0f);
}

// The sender ends (Close gives up: no collector ever came) with device
// tensors still queued and spilled: each is handed to abandon_device once,
// so a hook that lives on gets their snapshots and charges back.
TEST(Sender, DeviceTensorsLeftAtTheEndAreLetGoOfOnce) {
  CollectorLater collector;  // never started
  TempDir spill;
  SenderOptions o = SpillingOptions(collector.address(), "left-device", spill.path());
  o.await_device = [](const std::shared_ptr<PendingDeviceTensor>& p) { return p->status; };
  AbandonedDevice abandoned;
  o.abandon_device = abandoned.Callback();
  std::vector<const PendingDeviceTensor*> device;
  {
    Sender sender(o);
    abandoned.sender = &sender;
    auto enqueue_device = [&](const std::string& name) {
      QueuedTensor t = DeviceTensor(sender, name, 0);
      device.push_back(t.pending.get());
      ASSERT_TRUE(sender.EnqueueTensor(std::move(t)));
    };
    ASSERT_NO_FATAL_FAILURE(enqueue_device("d0"));  // queued
    ASSERT_NO_FATAL_FAILURE(enqueue_device("d1"));
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(sender.EnqueueTensor(Tensor(absl::StrCat("w", i), 0)));
    }
    ASSERT_GT(sender.counters().tensors_spilled, 0u);
    ASSERT_NO_FATAL_FAILURE(enqueue_device("d2"));  // spilled: the file is in use
    sender.EnqueueStepEnd(0, v1::MODE_GLOBAL, 0, 0.1);
    EXPECT_FALSE(sender.Close("done", absl::Milliseconds(200)).ok());
    EXPECT_EQ(sender.counters().tensors_dropped, 7u);
  }
  absl::MutexLock lock(&abandoned.mu);
  std::sort(abandoned.tensors.begin(), abandoned.tensors.end());
  std::sort(device.begin(), device.end());
  EXPECT_EQ(abandoned.tensors, device);
}

}  // namespace
}  // namespace sonde
