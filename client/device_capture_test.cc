// The capture pipeline over the emulated engine: batches split to fit a
// slot, downloads held to the sender's budget with the awaited tensor
// first, the backpressure policies, and losses that carry their reason.
#include "client/device_capture.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "cuda/emulated_device_stats.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace sonde {
namespace {

struct Rig {
  DeviceCaptureOptions options;
  EmulatedDeviceStats* engine = nullptr;
  // The sender's budget, as ReserveHost keeps it.
  absl::Mutex mu;
  uint64_t budget = UINT64_MAX;
  uint64_t charged = 0;

  explicit Rig(EmulatedDeviceOptions emulated = {}) {
    options.factory = [this, emulated](const DeviceStatsOptions& o)
        -> absl::StatusOr<std::unique_ptr<DeviceStats>> {
      auto e = EmulatedDeviceStats::Create(o, emulated);
      if (!e.ok()) return e.status();
      engine = e->get();
      return std::unique_ptr<DeviceStats>(std::move(*e));
    };
    options.reserve_host = [this](uint64_t bytes, bool force) {
      absl::MutexLock lock(&mu);
      if (!force && charged + bytes > budget) return false;
      charged += bytes;
      return true;
    };
    options.release_host = [this](uint64_t bytes) {
      absl::MutexLock lock(&mu);
      charged -= bytes;
    };
  }
  void Release(uint64_t bytes) {
    absl::MutexLock lock(&mu);
    charged -= bytes;
  }
};

std::vector<DeviceCapture::Request> Requests(const std::vector<std::vector<float>>& tensors,
                                             bool values) {
  std::vector<DeviceCapture::Request> out;
  for (const auto& t : tensors) {
    DeviceCapture::Request r;
    r.ref = DeviceTensorRef{t.data(), v1::DTYPE_F32, t.size(), false};
    r.values = values;
    out.push_back(r);
  }
  return out;
}

TEST(DeviceCaptureTest, ABatchLargerThanASlotIsSplitNotDropped) {
  Rig rig;
  rig.options.engine.slot_bytes = 8192;  // ~50 tensors of one chunk each
  auto capture = DeviceCapture::Create(std::move(rig.options));
  SONDE_ASSERT_OK(capture);
  std::vector<std::vector<float>> tensors;
  for (int i = 0; i < 300; ++i) tensors.emplace_back(100 + i, static_cast<float>(i));
  DeviceCapture::Enqueued e = (*capture)->Enqueue(Requests(tensors, false), nullptr);
  EXPECT_EQ(e.dropped, 0u);
  SONDE_EXPECT_OK(e.status);
  EXPECT_GT((*capture)->counters().batches, 4u);
  EXPECT_EQ(rig.engine->counters().batches_refused, 0u);
  for (size_t i = 0; i < tensors.size(); ++i) {
    ASSERT_NE(e.pending[i], nullptr);
    SONDE_ASSERT_OK((*capture)->Await(e.pending[i], absl::Seconds(10)));
    EXPECT_EQ(e.pending[i]->stats.count, tensors[i].size());
    EXPECT_EQ(e.pending[i]->stats.min, static_cast<double>(i));
  }
}

// A capture whose statistics reads do not make the producer wait.
absl::StatusOr<std::unique_ptr<DeviceCapture>> Deferred(Rig& rig) {
  rig.options.engine.defer_producer_wait = true;
  return DeviceCapture::Create(std::move(rig.options));
}

TEST(DeviceCaptureTest, DeferredReadsAreFencedAtTheNextSaveOrWhenAsked) {
  Rig rig;
  auto capture = Deferred(rig);
  SONDE_ASSERT_OK(capture);
  std::vector<std::vector<float>> tensors = {std::vector<float>(1000, 1.0f)};
  int stream = 0;  // any pointer names the producer's stream here
  DeviceCapture::Enqueued first = (*capture)->Enqueue(Requests(tensors, false), &stream);
  EXPECT_EQ(first.dropped, 0u);
  EXPECT_EQ(rig.engine->unfenced_batches(&stream), 1u);  // the stream did not wait
  // The next save fences the earlier reads before it enqueues its own.
  DeviceCapture::Enqueued second = (*capture)->Enqueue(Requests(tensors, false), &stream);
  EXPECT_EQ(second.dropped, 0u);
  EXPECT_EQ(rig.engine->fences(), 1u);
  EXPECT_EQ(rig.engine->unfenced_batches(&stream), 1u);
  SONDE_EXPECT_OK((*capture)->Fence(&stream));
  EXPECT_EQ(rig.engine->fences(), 2u);
  EXPECT_EQ(rig.engine->unfenced_batches(&stream), 0u);
  SONDE_ASSERT_OK((*capture)->Await(second.pending[0], absl::Seconds(10)));
  EXPECT_EQ(second.pending[0]->stats.count, 1000u);
}

TEST(DeviceCaptureTest, EachStreamIsFencedForItself) {
  Rig rig;
  auto capture = Deferred(rig);
  SONDE_ASSERT_OK(capture);
  std::vector<std::vector<float>> tensors = {std::vector<float>(100, 1.0f)};
  int a = 0, b = 0;  // two producer streams
  (*capture)->Enqueue(Requests(tensors, false), &a);
  (*capture)->Enqueue(Requests(tensors, false), &b);
  EXPECT_EQ(rig.engine->unfenced_batches(&a), 1u);  // b's save does not fence a
  EXPECT_EQ(rig.engine->unfenced_batches(&b), 1u);
  SONDE_EXPECT_OK((*capture)->Fence(&a));
  EXPECT_EQ(rig.engine->unfenced_batches(&a), 0u);
  EXPECT_EQ(rig.engine->unfenced_batches(&b), 1u);  // a's fence does not order b
  SONDE_EXPECT_OK((*capture)->Fence(&a));           // nothing left: no second fence
  EXPECT_EQ(rig.engine->fences(), 1u);
  SONDE_EXPECT_OK((*capture)->Fence(&b));
  EXPECT_EQ(rig.engine->unfenced_batches(&b), 0u);
  EXPECT_EQ(rig.engine->fences(), 2u);
  // FenceAll fences every stream with reads left, and only those.
  (*capture)->Enqueue(Requests(tensors, false), &a);
  (*capture)->Enqueue(Requests(tensors, false), &b);  // fences nothing: b had none left
  EXPECT_EQ(rig.engine->fences(), 2u);
  SONDE_EXPECT_OK((*capture)->FenceAll());
  EXPECT_EQ(rig.engine->unfenced_batches(&a), 0u);
  EXPECT_EQ(rig.engine->unfenced_batches(&b), 0u);
  EXPECT_EQ(rig.engine->fences(), 4u);
}

TEST(DeviceCaptureTest, WithoutDeferralNothingIsLeftToFence) {
  Rig rig;
  auto capture = DeviceCapture::Create(std::move(rig.options));
  SONDE_ASSERT_OK(capture);
  std::vector<std::vector<float>> tensors = {std::vector<float>(10, 1.0f)};
  (*capture)->Enqueue(Requests(tensors, false), nullptr);
  (*capture)->Enqueue(Requests(tensors, false), nullptr);
  SONDE_EXPECT_OK((*capture)->Fence(nullptr));
  EXPECT_EQ(rig.engine->fences(), 0u);
  EXPECT_EQ(rig.engine->unfenced_batches(nullptr), 0u);
}

TEST(DeviceCaptureTest, DownloadsKeepToTheHostBudgetAndTheAwaitedTensorGoesFirst) {
  Rig rig;
  rig.budget = 100000;
  auto capture = DeviceCapture::Create(std::move(rig.options));
  SONDE_ASSERT_OK(capture);
  std::vector<std::vector<float>> tensors(3, std::vector<float>(20000, 1.0f));  // 80 KB each
  std::vector<size_t> order;
  DeviceCapture::Enqueued e = (*capture)->Enqueue(
      Requests(tensors, true), nullptr,
      [&](const std::vector<size_t>& ready, const auto&) {
        order.insert(order.end(), ready.begin(), ready.end());
      });
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2}));
  // The first fits the budget; the third goes because the sender waits for it.
  SONDE_ASSERT_OK((*capture)->Await(e.pending[0], absl::Seconds(10)));
  SONDE_ASSERT_OK((*capture)->Await(e.pending[2], absl::Seconds(10)));
  EXPECT_TRUE(e.pending[0]->values_ok());
  EXPECT_TRUE(e.pending[2]->values_ok());
  EXPECT_EQ(e.pending[2]->host_reserved, 80000u);
  {
    absl::MutexLock lock(&rig.mu);
    EXPECT_EQ(rig.charged, 160000u);  // past the budget only by the awaited one
  }
  EXPECT_FALSE(e.pending[1]->values_done);
  EXPECT_EQ(rig.engine->snapshot_bytes_used(), 80000u);
  // The sender takes the first: the second fits now.
  rig.Release(80000);
  SONDE_ASSERT_OK((*capture)->Await(e.pending[1], absl::Seconds(10)));
  EXPECT_TRUE(e.pending[1]->values_ok());
  EXPECT_EQ(std::memcmp(e.pending[1]->values.get(), tensors[1].data(), 80000), 0);
  EXPECT_EQ(rig.engine->snapshot_bytes_used(), 0u);
  EXPECT_EQ((*capture)->counters().bytes_downloaded, 240000u);
}

// Values taken by the sender give their host buffers back: the next
// step's downloads are written into them (already faulted in), and the
// values are the new ones.
TEST(DeviceCaptureTest, TheNextStepsValuesReuseTheHostBuffersOfTheLast) {
  Rig rig;
  rig.options.value_pool_bytes = 1 << 20;
  auto capture = DeviceCapture::Create(std::move(rig.options));
  SONDE_ASSERT_OK(capture);
  std::vector<const char*> first_buffers;
  for (int step = 0; step < 2; ++step) {
    std::vector<std::vector<float>> tensors(3, std::vector<float>(20000, 1.0f + step));
    DeviceCapture::Enqueued e = (*capture)->Enqueue(Requests(tensors, true), nullptr, nullptr);
    for (size_t i = 0; i < tensors.size(); ++i) {
      SONDE_ASSERT_OK((*capture)->Await(e.pending[i], absl::Seconds(10)));
      ASSERT_TRUE(e.pending[i]->values_ok());
      EXPECT_EQ(std::memcmp(e.pending[i]->values.get(), tensors[i].data(), 80000), 0) << step;
      if (step == 0) first_buffers.push_back(e.pending[i]->values.get());
      if (step == 1) {
        EXPECT_NE(std::find(first_buffers.begin(), first_buffers.end(),
                            e.pending[i]->values.get()),
                  first_buffers.end());
      }
    }
    for (auto& p : e.pending) {
      rig.Release(p->host_reserved);  // what the sender does once it has them
      p->values.reset();
    }
  }
  EXPECT_EQ((*capture)->counters().value_buffers_reused, 3u);
}

TEST(DeviceCaptureTest, BlockWaitsOnceForABusyDeviceThenGivesUpAtOnceUntilItCatchesUp) {
  Rig rig;
  rig.options.engine.batch_slots = 1;
  rig.options.policy = BackpressurePolicy::kBlock;
  rig.options.max_block = absl::Milliseconds(30);
  auto capture = DeviceCapture::Create(std::move(rig.options));
  SONDE_ASSERT_OK(capture);
  std::vector<std::vector<float>> one(1, std::vector<float>(10, 1.0f));
  rig.engine->Pause();
  DeviceCapture::Enqueued first = (*capture)->Enqueue(Requests(one, false), nullptr);
  EXPECT_EQ(first.dropped, 0u);
  DeviceCapture::Enqueued second = (*capture)->Enqueue(Requests(one, false), nullptr);
  EXPECT_EQ(second.dropped, 1u);
  EXPECT_EQ(second.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ((*capture)->counters().waits, 1u);
  // It waited (for up to max_block; how long exactly is the clock's, not
  // asserted: measured against its own start it can read 29.9 ms).
  EXPECT_GT((*capture)->counters().waited, absl::ZeroDuration());
  // Stalled: the next save does not wait again.
  DeviceCapture::Enqueued third = (*capture)->Enqueue(Requests(one, false), nullptr);
  EXPECT_EQ(third.dropped, 1u);
  EXPECT_EQ((*capture)->counters().waits, 1u);
  // The device catches up: saves go through (and may wait) again.
  rig.engine->Resume();
  SONDE_ASSERT_OK((*capture)->Await(first.pending[0], absl::Seconds(10)));
  DeviceCapture::Enqueued fourth = (*capture)->Enqueue(Requests(one, false), nullptr);
  EXPECT_EQ(fourth.dropped, 0u);
  EXPECT_EQ((*capture)->counters().tensors_dropped, 2u);
}

TEST(DeviceCaptureTest, DropNeverWaitsAndLosesValuesWithTheReason) {
  Rig rig;
  rig.options.engine.snapshot_bytes = 100000;
  rig.options.policy = BackpressurePolicy::kDrop;
  rig.budget = 0;  // nothing downloads until the sender waits
  auto capture = DeviceCapture::Create(std::move(rig.options));
  SONDE_ASSERT_OK(capture);
  std::vector<std::vector<float>> tensors(3, std::vector<float>(20000, 2.0f));  // 80 KB each
  tensors.emplace_back(30000, 3.0f);  // 120 KB: more than all snapshot memory
  DeviceCapture::Enqueued e = (*capture)->Enqueue(Requests(tensors, true), nullptr);
  EXPECT_EQ(e.dropped, 0u);
  EXPECT_EQ((*capture)->counters().waits, 0u);
  for (auto& p : e.pending) SONDE_ASSERT_OK((*capture)->Await(p, absl::Seconds(10)));
  EXPECT_TRUE(e.pending[0]->values_ok());
  EXPECT_EQ(e.pending[1]->values_status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(e.pending[2]->values_status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(e.pending[3]->values_status.message()).find("larger than all snapshot"),
            std::string::npos)
      << e.pending[3]->values_status;
  // Statistics are kept for every one.
  for (auto& p : e.pending) EXPECT_EQ(p->stats.count, p == e.pending[3] ? 30000u : 20000u);
  EXPECT_EQ((*capture)->counters().values_dropped, 3u);
}

TEST(DeviceCaptureTest, AnAbandonedTensorGivesItsSnapshotMemoryBack) {
  Rig rig;
  rig.budget = 0;
  auto capture = DeviceCapture::Create(std::move(rig.options));
  SONDE_ASSERT_OK(capture);
  std::vector<std::vector<float>> tensors(2, std::vector<float>(1000, 1.0f));
  DeviceCapture::Enqueued e = (*capture)->Enqueue(Requests(tensors, true), nullptr);
  EXPECT_EQ(rig.engine->snapshot_bytes_used(), 8000u);
  (*capture)->Abandon(e.pending[0]);
  EXPECT_EQ(rig.engine->snapshot_bytes_used(), 4000u);
  SONDE_ASSERT_OK((*capture)->Await(e.pending[1], absl::Seconds(10)));
  EXPECT_EQ(rig.engine->snapshot_bytes_used(), 0u);
}

TEST(DeviceCaptureTest, ATensorGivenUpAfterATimeoutGivesItsHostChargeBack) {
  Rig rig;
  auto capture = DeviceCapture::Create(std::move(rig.options));
  SONDE_ASSERT_OK(capture);
  std::vector<std::vector<float>> tensors(1, std::vector<float>(5000, 1.0f));
  rig.engine->Pause();  // the download is granted but does not land
  DeviceCapture::Enqueued e = (*capture)->Enqueue(Requests(tensors, true), nullptr);
  {
    // The pump grants the download (and charges it) before it is given up.
    absl::MutexLock lock(&rig.mu);
    auto granted = [&rig]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(rig.mu) { return rig.charged > 0; };
    ASSERT_TRUE(rig.mu.AwaitWithTimeout(absl::Condition(&granted), absl::Seconds(10)));
    EXPECT_EQ(rig.charged, 20000u);
  }
  EXPECT_EQ((*capture)->Await(e.pending[0], absl::Milliseconds(20)).code(),
            absl::StatusCode::kDeadlineExceeded);
  rig.engine->Resume();
  // The landing is handled by the pump: wait for the charge to come back.
  absl::MutexLock lock(&rig.mu);
  auto released = [&rig]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(rig.mu) { return rig.charged == 0; };
  EXPECT_TRUE(rig.mu.AwaitWithTimeout(absl::Condition(&released), absl::Seconds(10)))
      << rig.charged << " bytes still charged";
  EXPECT_EQ(rig.engine->snapshot_bytes_used(), 0u);
}

// Tensors of `floats` values each, every one different.
std::vector<std::vector<float>> Distinct(size_t tensors, size_t floats) {
  std::vector<std::vector<float>> out(tensors, std::vector<float>(floats));
  for (size_t t = 0; t < tensors; ++t) {
    for (size_t i = 0; i < floats; ++i) out[t][i] = static_cast<float>(t * 1000003 + i);
  }
  return out;
}

// A capture under kSpill with `snapshot_bytes` of snapshot memory, its
// spill file in `dir`, and no host budget: nothing downloads to memory
// until the sender waits for it.
void SpillRig(Rig& rig, const ::sonde::testing::TempDir& dir, uint64_t snapshot_bytes) {
  rig.options.engine.snapshot_bytes = snapshot_bytes;
  rig.options.spill_dir = dir.path();
  rig.budget = 0;
}

// Snapshot memory for one 80 KB tensor and no host budget: each save
// needs the room of the one before, which the pump makes by spilling it
// to disk (before the save has to wait, or while it waits).
TEST(DeviceCaptureTest, UnderSpillValuesTheBudgetHasNoRoomForGoToDiskAndComeBackWhole) {
  ::sonde::testing::TempDir dir;
  Rig rig;
  SpillRig(rig, dir, 100000);
  rig.options.max_block = absl::Seconds(10);
  auto capture = DeviceCapture::Create(std::move(rig.options));
  SONDE_ASSERT_OK(capture);
  const std::vector<std::vector<float>> tensors = Distinct(10, 20000);  // 80 KB each
  std::vector<std::shared_ptr<PendingDeviceTensor>> pending;
  for (const auto& t : tensors) {
    DeviceCapture::Enqueued e = (*capture)->Enqueue(Requests({t}, true), nullptr);
    ASSERT_EQ(e.dropped, 0u);
    pending.push_back(e.pending[0]);
  }
  EXPECT_EQ((*capture)->counters().values_dropped, 0u);
  // Every one but the last was spilled to make room for the next; their
  // writes may land after the next save got the room.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while ((*capture)->counters().values_spilled < 9 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_GE((*capture)->counters().values_spilled, 9u);
  // The sender gives one up while it is on disk; the rest arrive whole.
  ASSERT_TRUE(pending[4]->values_on_disk);
  (*capture)->Abandon(pending[4]);
  for (size_t i = 0; i < pending.size(); ++i) {
    if (i == 4) continue;
    SONDE_ASSERT_OK((*capture)->Await(pending[i], absl::Seconds(10)));
    ASSERT_TRUE(pending[i]->values_ok()) << i << ": " << pending[i]->values_status;
    EXPECT_FALSE(pending[i]->values_on_disk);
    EXPECT_EQ(std::memcmp(pending[i]->values.get(), tensors[i].data(), 80000), 0) << i;
    EXPECT_EQ(pending[i]->host_reserved, 80000u);  // charged when read back, for the sender
    EXPECT_EQ(pending[i]->stats.count, 20000u);
  }
  EXPECT_EQ(rig.engine->snapshot_bytes_used(), 0u);
  EXPECT_EQ((*capture)->counters().values_dropped, 0u);
  absl::MutexLock lock(&rig.mu);
  EXPECT_EQ(rig.charged, 9 * 80000u);  // only what the sender holds now
}

// With room to spare but snapshot memory over half full, the pump spills
// before any save has to wait.
TEST(DeviceCaptureTest, UnderSpillSnapshotMemoryIsFreedBeforeASaveWaits) {
  ::sonde::testing::TempDir dir;
  Rig rig;
  SpillRig(rig, dir, 1000000);
  auto capture = DeviceCapture::Create(std::move(rig.options));
  SONDE_ASSERT_OK(capture);
  const std::vector<std::vector<float>> tensors = Distinct(10, 20000);  // 800 KB in all
  DeviceCapture::Enqueued e = (*capture)->Enqueue(Requests(tensors, true), nullptr);
  ASSERT_EQ(e.dropped, 0u);
  // Snapshot memory comes back when a download lands, the count when its
  // write does.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while ((rig.engine->snapshot_bytes_used() > 500000 ||
          (*capture)->counters().values_spilled < 4) &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_LE(rig.engine->snapshot_bytes_used(), 500000u);
  EXPECT_EQ((*capture)->counters().waits, 0u);
  EXPECT_GE((*capture)->counters().values_spilled, 4u);
  for (size_t i = 0; i < tensors.size(); ++i) {
    SONDE_ASSERT_OK((*capture)->Await(e.pending[i], absl::Seconds(10)));
    ASSERT_TRUE(e.pending[i]->values_ok()) << i;
    EXPECT_EQ(std::memcmp(e.pending[i]->values.get(), tensors[i].data(), 80000), 0) << i;
  }
  EXPECT_EQ((*capture)->counters().values_dropped, 0u);
}

TEST(DeviceCaptureTest, UnderBlockValuesAreNotSpilledButDroppedAndCounted) {
  ::sonde::testing::TempDir dir;
  Rig rig;
  SpillRig(rig, dir, 100000);
  rig.options.policy = BackpressurePolicy::kBlock;
  rig.options.max_block = absl::Milliseconds(20);
  auto capture = DeviceCapture::Create(std::move(rig.options));
  SONDE_ASSERT_OK(capture);
  const std::vector<std::vector<float>> tensors = Distinct(3, 20000);
  std::vector<std::shared_ptr<PendingDeviceTensor>> pending;
  for (const auto& t : tensors) {
    pending.push_back((*capture)->Enqueue(Requests({t}, true), nullptr).pending[0]);
  }
  EXPECT_EQ((*capture)->counters().values_spilled, 0u);
  EXPECT_EQ((*capture)->counters().values_dropped, 2u);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  SONDE_ASSERT_OK((*capture)->Await(pending[0], absl::Seconds(10)));
  EXPECT_TRUE(pending[0]->values_ok());
  EXPECT_EQ(pending[2]->values_status.code(), absl::StatusCode::kResourceExhausted);
}

// A spill file without room for a tensor takes no more (its values wait
// on the device, and past max_block are dropped and counted, as under
// block) until a record is read back.
TEST(DeviceCaptureTest, AFullSpillFileStopsSpillingUntilARecordIsReadBack) {
  ::sonde::testing::TempDir dir;
  Rig rig;
  SpillRig(rig, dir, 100000);
  rig.options.max_spill_bytes = 100000;  // one tensor
  rig.options.max_block = absl::Seconds(1);
  auto capture = DeviceCapture::Create(std::move(rig.options));
  SONDE_ASSERT_OK(capture);
  const std::vector<std::vector<float>> tensors = Distinct(6, 20000);
  std::vector<std::shared_ptr<PendingDeviceTensor>> pending;
  for (size_t i = 0; i < 4; ++i) {
    pending.push_back((*capture)->Enqueue(Requests({tensors[i]}, true), nullptr).pending[0]);
  }
  // 0 went to disk, 1 took the snapshot memory that freed; 2 waited
  // max_block for room, and 3 gave up at once after it.
  DeviceCapture::Counters c = (*capture)->counters();
  EXPECT_EQ(c.values_spilled, 1u);
  EXPECT_EQ(c.values_dropped, 2u);
  EXPECT_EQ(pending[2]->values_status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pending[3]->values_status.code(), absl::StatusCode::kResourceExhausted);
  for (size_t i = 0; i < 2; ++i) {
    SONDE_ASSERT_OK((*capture)->Await(pending[i], absl::Seconds(10)));
    ASSERT_TRUE(pending[i]->values_ok()) << i;
    EXPECT_EQ(std::memcmp(pending[i]->values.get(), tensors[i].data(), 80000), 0) << i;
  }
  // The file is empty again: the next saves spill.
  auto e = (*capture)->Enqueue(Requests({tensors[4]}, true), nullptr).pending[0];
  auto f = (*capture)->Enqueue(Requests({tensors[5]}, true), nullptr).pending[0];
  // (e made room for f; awaited before its write, it would not be written.)
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while ((*capture)->counters().values_spilled < 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  SONDE_ASSERT_OK((*capture)->Await(e, absl::Seconds(10)));
  SONDE_ASSERT_OK((*capture)->Await(f, absl::Seconds(10)));
  EXPECT_EQ(std::memcmp(e->values.get(), tensors[4].data(), 80000), 0);
  EXPECT_EQ(std::memcmp(f->values.get(), tensors[5].data(), 80000), 0);
  EXPECT_GE((*capture)->counters().values_spilled, 2u);
  EXPECT_EQ((*capture)->counters().values_dropped, 2u);
}

// Closing while values are on their way to disk: nothing is left
// half-done (every value is in, or lost with a reason), and the close does
// not wait for writes nobody will read back.
TEST(DeviceCaptureTest, ClosingWhileSpillingLeavesNothingHalfDone) {
  ::sonde::testing::TempDir dir;
  Rig rig;
  SpillRig(rig, dir, 400000);
  auto capture = DeviceCapture::Create(std::move(rig.options));
  SONDE_ASSERT_OK(capture);
  const std::vector<std::vector<float>> tensors = Distinct(20, 20000);
  std::vector<std::shared_ptr<PendingDeviceTensor>> pending;
  for (const auto& t : tensors) {
    DeviceCapture::Enqueued e = (*capture)->Enqueue(Requests({t}, true), nullptr);
    ASSERT_EQ(e.dropped, 0u);
    pending.push_back(e.pending[0]);
  }
  capture->reset();
  for (size_t i = 0; i < pending.size(); ++i) {
    EXPECT_TRUE(pending[i]->stats_done) << i;
    EXPECT_TRUE(pending[i]->values_done) << i;
    EXPECT_FALSE(pending[i]->spilling) << i;
    if (!pending[i]->values_ok() && !pending[i]->values_on_disk) {
      EXPECT_FALSE(pending[i]->values_status.ok()) << i;  // lost, with its reason
    }
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));  // the file went with the capture
}

TEST(DeviceCaptureTest, ASpillDirectoryThatCannotBeUsedFallsBackToWaiting) {
  ::sonde::testing::TempDir dir;
  const std::string file = dir.path() + "/plain-file";
  ASSERT_EQ(std::system(("touch " + file).c_str()), 0);
  Rig rig;
  rig.options.engine.snapshot_bytes = 100000;
  rig.options.spill_dir = file + "/sonde-spill";  // under a file: not even root can make it
  rig.options.max_block = absl::Milliseconds(20);
  rig.budget = 0;
  auto capture = DeviceCapture::Create(std::move(rig.options));
  SONDE_ASSERT_OK(capture);  // the hook goes on without the file
  const std::vector<std::vector<float>> tensors = Distinct(2, 20000);
  auto first = (*capture)->Enqueue(Requests({tensors[0]}, true), nullptr).pending[0];
  auto second = (*capture)->Enqueue(Requests({tensors[1]}, true), nullptr).pending[0];
  EXPECT_EQ((*capture)->counters().values_spilled, 0u);
  EXPECT_EQ((*capture)->counters().values_dropped, 1u);
  SONDE_ASSERT_OK((*capture)->Await(first, absl::Seconds(10)));
  EXPECT_TRUE(first->values_ok());
  EXPECT_EQ(second->values_status.code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace sonde
