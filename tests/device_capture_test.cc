// The hook's device path end to end without a GPU: the real hook, sender
// and collector (gRPC over a socket, RocksDB) with the emulated device
// engine behind DeviceStats, so what happens when buffers run out, the
// device is slow or fails, and the collector is away is tested in CI.
//
// What must hold (issue 14): values of any size arrive whole, in pieces;
// no step disappears because its device work was refused; every tensor or
// value not stored is counted in the hook's counters and shown on the
// collector's StepInfo; a step with a loss is never complete.
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "client/hook.h"
#include "client/query_client.h"
#include "common/metrics/metrics.h"
#include "cuda/emulated_device_stats.h"
#include "math/float16_math.h"
#include "gtest/gtest.h"
#include "server/collector.h"
#include "tests/testing/exposition.h"
#include "tests/testing/in_process_collector.h"
#include "tests/testing/free_address.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace sonde {
namespace {

using ::sonde::testing::InProcessCollector;

// Hook options whose device engine is an emulator; `engine` receives it.
HookOptions Options(const std::string& address, const std::string& job,
                    EmulatedDeviceOptions emulated, EmulatedDeviceStats** engine) {
  HookOptions o;
  o.collector = address;
  o.job = job;
  o.config.save_config = SaveConfig::Every(1);
  o.config.include_collections = {"weights", "gradients", "losses"};
  o.close_timeout = absl::Seconds(60);
  o.device_factory = [emulated, engine](const DeviceStatsOptions& d)
      -> absl::StatusOr<std::unique_ptr<DeviceStats>> {
    auto e = EmulatedDeviceStats::Create(d, emulated);
    if (!e.ok()) return e.status();
    if (engine != nullptr) *engine = e->get();
    return std::unique_ptr<DeviceStats>(std::move(*e));
  };
  return o;
}

// A model's tensors in "device" memory (host memory the emulator reads),
// rewritten every step as training would.
class Model {
 public:
  explicit Model(std::vector<size_t> sizes) {
    for (size_t i = 0; i < sizes.size(); ++i) tensors_.emplace_back(sizes[i]);
  }
  void Step(int64_t step) {
    for (size_t t = 0; t < tensors_.size(); ++t) {
      std::vector<float>& v = tensors_[t];
      for (size_t i = 0; i < v.size(); ++i) v[i] = Value(t, step, i);
    }
  }
  static float Value(size_t tensor, int64_t step, size_t i) {
    return static_cast<float>(tensor + 1) * 0.5f + static_cast<float>(step) * 0.25f +
           static_cast<float>(i % 1021) * 1e-3f;
  }
  std::string Name(size_t t) const { return "layer" + std::to_string(t) + ".weight"; }
  std::vector<NamedTensor> Named(bool gradients = false) const {
    std::vector<NamedTensor> out;
    for (size_t t = 0; t < tensors_.size(); ++t) {
      const std::string name = (gradients ? "gradient/" : "") + Name(t);
      out.push_back({name,
                     CudaTensor(tensors_[t].data(), v1::DTYPE_F32,
                                {static_cast<int64_t>(tensors_[t].size())}),
                     {}});
    }
    return out;
  }
  std::string Expected(size_t t, int64_t step) const {
    std::vector<float> v(tensors_[t].size());
    for (size_t i = 0; i < v.size(); ++i) v[i] = Value(t, step, i);
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  }
  size_t size() const { return tensors_.size(); }

 private:
  std::vector<std::vector<float>> tensors_;
};

// `steps` steps, each saving the model's tensors (every save accepted),
// then Close.
void Train(Hook& hook, Model& model, int steps) {
  for (int64_t step = 0; step < steps; ++step) {
    model.Step(step);
    hook.StartStep();
    SONDE_EXPECT_OK(hook.SaveTensors(model.Named()));
    hook.EndStep();
  }
  SONDE_EXPECT_OK(hook.Close());
}

std::map<int64_t, v1::StepInfo> Steps(QueryClient& q, const std::string& job) {
  std::map<int64_t, v1::StepInfo> out;
  auto steps = q.ListSteps(job);
  EXPECT_TRUE(steps.ok()) << steps.status();
  if (steps.ok()) {
    for (const v1::StepInfo& s : *steps) out[s.step()] = s;
  }
  return out;
}

TEST(DeviceCapture, ValuesOfAModelBiggerThanEveryBufferArriveWholeInPieces) {
  InProcessCollector collector;
  EmulatedDeviceStats* engine = nullptr;
  HookOptions o = Options(collector.address(), "pieces",
                          {absl::Microseconds(100), absl::Microseconds(20)}, &engine);
  // One saved step holds 9.5 MiB of values: more than the ring (4 x 64 KiB),
  // the snapshot memory (6 MiB), the host budget (2 MiB) and a chunk (1 MiB).
  o.device.ring_buffers = 4;
  o.device.ring_buffer_bytes = 64 << 10;
  o.device.snapshot_bytes = 6 << 20;
  o.max_queue_bytes = 2 << 20;
  o.backpressure.max_block = absl::Seconds(20);
  o.config.save_config = SaveConfig::Every(2);
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  Model model({1, 1000, 65537, 262144, 1 << 20, (5 << 20) / 4});
  constexpr int kSteps = 5;
  Train(**hook, model, kSteps);
  const Hook::Counters c = (*hook)->counters();
  EXPECT_EQ(c.tensors_dropped, 0u);
  EXPECT_EQ(c.values_dropped, 0u);
  EXPECT_GT(c.device_waits, 0u) << "6 MiB of snapshot memory cannot hold a 9.5 MiB step at once";
  EXPECT_LE(c.device_snapshot_bytes_peak, uint64_t{6} << 20);
  ASSERT_NE(engine, nullptr);
  EXPECT_GT(engine->counters().pieces, 150u);

  auto q = QueryClient::Connect(collector.address());
  std::map<int64_t, v1::StepInfo> steps = Steps(*q, "pieces");
  ASSERT_EQ(steps.size(), 3u);  // 0, 2, 4
  for (int64_t step : {0, 2, 4}) {
    EXPECT_TRUE(steps[step].complete()) << "step " << step;
    EXPECT_EQ(steps[step].tensor_count(), model.size());
    for (size_t t = 0; t < model.size(); ++t) {
      auto value = q->ReadTensor("pieces", model.Name(t), step);
      SONDE_ASSERT_OK(value);
      EXPECT_TRUE(value->bytes == model.Expected(t, step)) << model.Name(t) << " at " << step;
      EXPECT_EQ(value->header.statistics().count(), value->bytes.size() / 4);
    }
  }
}

TEST(DeviceCapture, DeferredReadsAreFencedByTheStepsEndAndEverythingIsStored) {
  InProcessCollector collector;
  EmulatedDeviceStats* engine = nullptr;
  HookOptions o = Options(collector.address(), "deferred", {}, &engine);
  o.device.defer_producer_wait = true;
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  Model model({1000, 3000, 257});
  for (int64_t step = 0; step < 5; ++step) {
    model.Step(step);
    (*hook)->StartStep();
    SONDE_EXPECT_OK((*hook)->SaveTensors(model.Named()));  // weights
    ASSERT_NE(engine, nullptr);
    EXPECT_EQ(engine->unfenced_batches(nullptr), 1u) << "the stream waited right away";
    const uint64_t fences = engine->fences();
    SONDE_EXPECT_OK((*hook)->SaveTensors(model.Named(true)));  // gradients
    EXPECT_EQ(engine->fences(), fences + 1) << "the weights' reads were not fenced";
    EXPECT_EQ(engine->unfenced_batches(nullptr), 1u);  // the gradients' own
    (*hook)->EndStep();
    EXPECT_EQ(engine->unfenced_batches(nullptr), 0u) << "step " << step;
  }
  EXPECT_EQ(engine->fences(), 10u);
  SONDE_ASSERT_OK((*hook)->Close());
  EXPECT_EQ((*hook)->counters().tensors_dropped, 0u);
  auto q = QueryClient::Connect(collector.address());
  const std::map<int64_t, v1::StepInfo> steps = Steps(*q, "deferred");
  ASSERT_EQ(steps.size(), 5u);
  for (const auto& [step, info] : steps) {
    EXPECT_TRUE(info.complete()) << step;
    EXPECT_EQ(info.tensors_dropped(), 0u) << step;
  }
}

TEST(DeviceCapture, ASaveCallThatSavesNothingStillFencesItsStream) {
  // Gradients are not due (not in an included collection): their save call
  // stores nothing, yet it must fence the weights' reads before the
  // optimizer overwrites the weights.
  InProcessCollector collector;
  EmulatedDeviceStats* engine = nullptr;
  HookOptions o = Options(collector.address(), "fence-not-due", {}, &engine);
  o.config.include_collections = {"weights"};
  o.device.defer_producer_wait = true;
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  Model model({1000, 2000});
  model.Step(0);
  (*hook)->StartStep();
  SONDE_EXPECT_OK((*hook)->SaveTensors(model.Named()));
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(engine->unfenced_batches(nullptr), 1u);
  const uint64_t batches = engine->counters().batches;
  SONDE_EXPECT_OK((*hook)->SaveTensors(model.Named(true)));
  EXPECT_EQ(engine->counters().batches, batches) << "gradients were not due";
  EXPECT_EQ(engine->unfenced_batches(nullptr), 0u);
  EXPECT_EQ(engine->fences(), 1u);
  SONDE_ASSERT_OK((*hook)->Close());
}

TEST(DeviceCapture, ValuesTravelAsBf16WhenAsked) {
  InProcessCollector collector;
  HookOptions o = Options(collector.address(), "bf16", {}, nullptr);
  o.device_transfer_dtype = v1::DTYPE_BF16;
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  Model model({3000});
  model.Step(7);
  (*hook)->StartStep();
  SONDE_ASSERT_OK((*hook)->SaveTensors(model.Named()));
  SONDE_ASSERT_OK((*hook)->Close());
  auto q = QueryClient::Connect(collector.address());
  auto value = q->ReadTensor("bf16", model.Name(0), 0);
  SONDE_ASSERT_OK(value);
  EXPECT_EQ(value->header.dtype(), v1::DTYPE_BF16);
  ASSERT_EQ(value->bytes.size(), 6000u);
  for (size_t i = 0; i < 3000; ++i) {
    uint16_t got;
    std::memcpy(&got, &value->bytes[2 * i], 2);
    ASSERT_EQ(got, SondeFloatToBf16(Model::Value(0, 7, i))) << i;
  }
  // The statistics are of the F32 values, taken on the device.
  EXPECT_EQ(value->header.statistics().count(), 3000u);
  EXPECT_FLOAT_EQ(value->header.statistics().min(), Model::Value(0, 7, 0));
}

// Under "drop", values that find snapshot memory full are dropped at once:
// their statistics are stored, and every loss is counted and visible.
TEST(DeviceCapture, DropPolicyCountsEveryLostValueAndNoStepIsComplete) {
  InProcessCollector collector;
  EmulatedDeviceStats* engine = nullptr;
  HookOptions o = Options(collector.address(), "drop",
                          {absl::Microseconds(50), absl::Microseconds(400)}, &engine);
  o.device.ring_buffer_bytes = 64 << 10;
  o.device.snapshot_bytes = 1 << 20;  // four of the sixteen 256 KiB tensors
  o.backpressure.policy = BackpressurePolicy::kDrop;
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  Model model(std::vector<size_t>(16, 65536));
  constexpr int kSteps = 6;
  Train(**hook, model, kSteps);
  const Hook::Counters c = (*hook)->counters();
  EXPECT_EQ(c.tensors_dropped, 0u);
  EXPECT_GT(c.values_dropped, 0u);
  EXPECT_EQ(c.device_waits, 0u);  // "drop" never waits

  auto q = QueryClient::Connect(collector.address());
  std::map<int64_t, v1::StepInfo> steps = Steps(*q, "drop");
  ASSERT_EQ(steps.size(), static_cast<size_t>(kSteps));
  uint64_t dropped = 0;
  for (auto& [step, info] : steps) {
    EXPECT_EQ(info.tensor_count(), model.size()) << "statistics are kept for every tensor";
    uint32_t with_values = 0;
    for (size_t t = 0; t < model.size(); ++t) {
      auto value = q->ReadTensor("drop", model.Name(t), step);
      if (value.ok()) {
        ++with_values;
        EXPECT_TRUE(value->bytes == model.Expected(t, step));
      } else {
        EXPECT_EQ(value.status().code(), absl::StatusCode::kFailedPrecondition) << value.status();
      }
    }
    EXPECT_EQ(with_values + info.values_dropped(), model.size()) << "step " << step;
    EXPECT_EQ(info.complete(), info.values_dropped() == 0) << "step " << step;
    dropped += info.values_dropped();
  }
  EXPECT_EQ(dropped, c.values_dropped);
  auto job = q->GetJob("drop");
  SONDE_ASSERT_OK(job);
  EXPECT_EQ(job->values_dropped(), c.values_dropped);
}

// A device that holds its work (busy with training) leaves no batch slot
// free. Under "drop" the refused tensors are counted, and a step whose
// every tensor was refused still reaches the collector as a gap; under
// "block" saves wait for the device and nothing is lost.
void SlowDevice(BackpressurePolicy policy) {
  InProcessCollector collector;
  EmulatedDeviceStats* engine = nullptr;
  const std::string job = policy == BackpressurePolicy::kDrop ? "slow-drop" : "slow-block";
  HookOptions o = Options(collector.address(), job, {absl::Milliseconds(2), absl::ZeroDuration()},
                          &engine);
  o.device.batch_slots = 1;
  o.backpressure.policy = policy;
  o.backpressure.max_block = absl::Seconds(30);
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  Model weights(std::vector<size_t>(4, 1000));
  std::vector<float> loss(1, 0.5f);
  const bool drop = policy == BackpressurePolicy::kDrop;
  constexpr int kSteps = 10;
  for (int64_t step = 0; step < kSteps; ++step) {
    weights.Step(step);
    (*hook)->StartStep();
    if (drop && step == 3) {
      ASSERT_NE(engine, nullptr);
      engine->Pause();  // steps 3..5: the device finishes nothing
    }
    if (drop && step == 6) engine->Resume();
    // Weights, gradients and the loss: three batches on one slot.
    std::vector<absl::Status> saves = {
        (*hook)->SaveTensors(weights.Named(false)), (*hook)->SaveTensors(weights.Named(true)),
        (*hook)->SaveTensor("CrossEntropyLoss_output_0",
                            CudaTensor(loss.data(), v1::DTYPE_F32, {}), {"losses"})};
    for (const absl::Status& s : saves) {
      if (drop) {
        EXPECT_TRUE(s.ok() || s.code() == absl::StatusCode::kResourceExhausted) << s;
      } else {
        SONDE_EXPECT_OK(s);
      }
    }
    (*hook)->EndStep();
  }
  SONDE_ASSERT_OK((*hook)->Close());
  const Hook::Counters c = (*hook)->counters();

  auto q = QueryClient::Connect(collector.address());
  std::map<int64_t, v1::StepInfo> steps = Steps(*q, job);
  ASSERT_EQ(steps.size(), static_cast<size_t>(kSteps)) << "no step may vanish";
  uint64_t dropped = 0;
  for (auto& [step, info] : steps) {
    EXPECT_EQ(info.tensor_count() + info.tensors_dropped(), 9u) << "step " << step;
    EXPECT_EQ(info.complete(), info.tensors_dropped() == 0);
    dropped += info.tensors_dropped();
  }
  EXPECT_EQ(dropped, c.tensors_dropped);
  if (drop) {
    // Every save of the paused steps after the first was refused.
    for (int64_t step : {4, 5}) {
      EXPECT_EQ(steps[step].tensor_count(), 0u) << step;
      EXPECT_EQ(steps[step].tensors_dropped(), 9u) << step;
    }
  } else {
    EXPECT_EQ(c.tensors_dropped, 0u);
    EXPECT_GT(c.device_waits, 0u);
    for (auto& [step, info] : steps) EXPECT_TRUE(info.complete()) << step;
  }
}

TEST(DeviceCapture, SlowDeviceUnderDropLosesNoStepSilently) { SlowDevice(BackpressurePolicy::kDrop); }
TEST(DeviceCapture, SlowDeviceUnderBlockLosesNothing) { SlowDevice(BackpressurePolicy::kBlock); }

TEST(DeviceCapture, DeviceErrorsAreCountedAsLossesNotHidden) {
  InProcessCollector collector;
  EmulatedDeviceStats* engine = nullptr;
  auto hook = Hook::Create(Options(collector.address(), "errors", {}, &engine));
  SONDE_ASSERT_OK(hook);
  Model model({100, 200});
  for (int64_t step = 0; step < 3; ++step) {
    model.Step(step);
    if (step == 1) {
      // Step 0's device work is all done: the failures hit step 1's.
      SONDE_ASSERT_OK((*hook)->Flush(absl::Seconds(30)));
    }
    (*hook)->StartStep();
    if (step == 1) {
      ASSERT_NE(engine, nullptr);
      engine->FailNextStats(absl::InternalError("an illegal memory access (emulated)"));
      engine->FailNextDownload(absl::InternalError("a failed copy (emulated)"));
    }
    SONDE_EXPECT_OK((*hook)->SaveTensors(model.Named()));
    if (step == 1) {
      // The second batch of the step: its statistics come, one download fails.
      SONDE_EXPECT_OK((*hook)->SaveTensors(model.Named(true)));
    }
    (*hook)->EndStep();
  }
  SONDE_ASSERT_OK((*hook)->Close());
  auto q = QueryClient::Connect(collector.address());
  std::map<int64_t, v1::StepInfo> steps = Steps(*q, "errors");
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_TRUE(steps[0].complete());
  EXPECT_TRUE(steps[2].complete());
  // Step 1: the weights' batch lost its statistics, and the first download
  // (layer0's values) failed: layer0 is lost whole, layer1 is stored with
  // its values (the collector computes their statistics), the gradients'
  // batch is whole.
  const v1::StepInfo& bad = steps[1];
  EXPECT_FALSE(bad.complete());
  EXPECT_EQ(bad.tensor_count(), 3u);
  EXPECT_EQ(bad.tensors_dropped(), 1u);
  EXPECT_EQ(bad.values_dropped(), 0u);
  auto layer1 = q->ReadTensor("errors", model.Name(1), 1);
  SONDE_ASSERT_OK(layer1);
  EXPECT_TRUE(layer1->bytes == model.Expected(1, 1));
  EXPECT_EQ(layer1->header.statistics().count(), 200u);
  EXPECT_EQ(q->ReadTensor("errors", model.Name(0), 1).status().code(),
            absl::StatusCode::kNotFound);
  const Hook::Counters c = (*hook)->counters();
  EXPECT_EQ(c.tensors_dropped, 1u);
  EXPECT_EQ(c.values_dropped, 0u);
}

// An engine that returns fewer histograms than asked: tensors saved as
// reductions (no values to recompute from) are counted as lost, never
// stored with an empty histogram. (With values, the collector recomputes
// statistics and histograms from them: nothing is lost.)
TEST(DeviceCapture, AMissingHistogramIsALossNotAnEmptyHistogram) {
  InProcessCollector collector;
  EmulatedDeviceStats* engine = nullptr;
  HookOptions o = Options(collector.address(), "histograms", {}, &engine);
  CollectionConfig weights;
  weights.name = "weights";
  weights.save_histogram = true;
  // Reductions only: no values travel, so nothing else can stand in for
  // what the device returns.
  ReductionConfig reductions;
  reductions.reductions = {"mean"};
  weights.reduction_config = reductions;
  o.config.collections.push_back(weights);
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  Model model({100, 200});
  for (int64_t step = 0; step < 2; ++step) {
    model.Step(step);
    if (step == 1) {
      // Step 0's device work is all done: the fault hits step 1's batch.
      SONDE_ASSERT_OK((*hook)->Flush(absl::Seconds(30)));
      ASSERT_NE(engine, nullptr);
      engine->DropNextHistograms();
    }
    (*hook)->StartStep();
    SONDE_EXPECT_OK((*hook)->SaveTensors(model.Named()));
    (*hook)->EndStep();
  }
  SONDE_ASSERT_OK((*hook)->Close());
  auto q = QueryClient::Connect(collector.address());
  std::map<int64_t, v1::StepInfo> steps = Steps(*q, "histograms");
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_TRUE(steps[0].complete());
  EXPECT_EQ(steps[1].tensors_dropped(), 2u);  // both tensors of the batch
  EXPECT_FALSE(steps[1].complete());
  EXPECT_EQ((*hook)->counters().tensors_dropped, 2u);
  // Step 0's histograms are there and full.
  auto series = q->ReadSeries("histograms", model.Name(0));
  SONDE_ASSERT_OK(series);
  ASSERT_EQ(series->size(), 1u);
  uint64_t counted = 0;
  for (uint64_t n : (*series)[0].histogram().counts()) counted += n;
  EXPECT_EQ(counted, 100u);
}

TEST(DeviceCapture, ATensorSavedTwiceInAStepIsRefusedAndCounted) {
  InProcessCollector collector;
  auto hook = Hook::Create(Options(collector.address(), "twice", {}, nullptr));
  SONDE_ASSERT_OK(hook);
  Model model({10});
  model.Step(0);
  std::vector<float> first(4, 1.0f), second(4, 2.0f);
  (*hook)->StartStep();
  SONDE_EXPECT_OK((*hook)->SaveTensors(model.Named()));
  EXPECT_THAT((*hook)->SaveTensors(model.Named()),
              ::sonde::testing::StatusIs(absl::StatusCode::kInvalidArgument, "already saved"));
  SONDE_EXPECT_OK((*hook)->SaveTensor("fc.bias", HostTensor(first.data(), {4}), {"weights"}));
  EXPECT_THAT((*hook)->SaveTensor("fc.bias", HostTensor(second.data(), {4}), {"weights"}),
              ::sonde::testing::StatusIs(absl::StatusCode::kInvalidArgument, "already saved"));
  (*hook)->StartStep();  // a new step takes the names again
  SONDE_EXPECT_OK((*hook)->SaveTensor("fc.bias", HostTensor(second.data(), {4}), {"weights"}));
  SONDE_ASSERT_OK((*hook)->Close());
  EXPECT_EQ((*hook)->counters().tensors_dropped, 2u);
  auto q = QueryClient::Connect(collector.address());
  std::map<int64_t, v1::StepInfo> steps = Steps(*q, "twice");
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].tensor_count(), 2u);
  EXPECT_EQ(steps[0].tensors_dropped(), 2u);
  EXPECT_FALSE(steps[0].complete());
  EXPECT_TRUE(steps[1].complete());
  auto bias = q->ReadTensor("twice", "fc.bias", 0);
  SONDE_ASSERT_OK(bias);
  EXPECT_EQ(bias->bytes, std::string(reinterpret_cast<const char*>(first.data()), 16));
}

// A tensor the hook refuses (an integer device tensor, a host tensor whose
// shape and bytes disagree) is an error to the caller and, when it was
// due, a counted gap the collector shows: the step is not complete.
TEST(DeviceCapture, ARefusedTensorThatWasDueIsACountedGap) {
  InProcessCollector collector;
  auto hook = Hook::Create(Options(collector.address(), "refused", {}, nullptr));
  SONDE_ASSERT_OK(hook);
  std::vector<int32_t> ints(4, 7);
  std::vector<float> w(4, 1.0f);
  (*hook)->StartStep();
  EXPECT_THAT((*hook)->SaveTensor("counts", CudaTensor(ints.data(), v1::DTYPE_I32, {4}),
                                  {"weights"}),
              ::sonde::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                         "device statistics take F32"));
  TensorView bad = HostTensor(w.data(), {4});
  bad.shape = {-1};
  EXPECT_FALSE((*hook)->SaveTensor("bad", bad, {"weights"}).ok());
  // Not due (no saving collection): refused, not counted.
  EXPECT_FALSE((*hook)->SaveTensor("other", bad, {"not-saved"}).ok());
  SONDE_EXPECT_OK((*hook)->SaveTensor("w", HostTensor(w.data(), {4}), {"weights"}));
  (*hook)->StartStep();
  SONDE_EXPECT_OK((*hook)->SaveTensor("w", HostTensor(w.data(), {4}), {"weights"}));
  SONDE_ASSERT_OK((*hook)->Close());
  EXPECT_EQ((*hook)->counters().tensors_dropped, 2u);
  auto q = QueryClient::Connect(collector.address());
  std::map<int64_t, v1::StepInfo> steps = Steps(*q, "refused");
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].tensors_dropped(), 2u);
  EXPECT_FALSE(steps[0].complete());
  EXPECT_TRUE(steps[1].complete());
}

// Starts the collector the hook has been trying to reach, then waits until
// the hook has delivered everything, and closes it. Null (with a failure)
// if any of that fails.
std::unique_ptr<server::Collector> ComeUpAndDrain(const std::string& address,
                                                  const std::string& data_dir, Hook& hook) {
  server::CollectorOptions co;
  co.listen = address;
  co.data_dir = data_dir;
  auto collector = server::Collector::Start(co);
  EXPECT_TRUE(collector.ok()) << collector.status();
  if (!collector.ok()) return nullptr;
  absl::Status s = hook.Flush(absl::Seconds(60));
  if (s.ok()) s = hook.Close();
  EXPECT_TRUE(s.ok()) << s;
  return s.ok() ? std::move(*collector) : nullptr;
}

// Steps 0..steps-1 of `job` all stored and complete, with nothing
// dropped, `tensors` tensors each, and the model's values as saved.
void ExpectEveryStepWhole(QueryClient& q, const std::string& job, const Model& model,
                          int64_t steps, size_t tensors) {
  std::map<int64_t, v1::StepInfo> stored = Steps(q, job);
  ASSERT_EQ(stored.size(), static_cast<size_t>(steps));
  for (int64_t step = 0; step < steps; ++step) {
    EXPECT_TRUE(stored[step].complete()) << step;
    EXPECT_EQ(stored[step].tensor_count(), tensors) << step;
    EXPECT_EQ(stored[step].values_dropped(), 0u) << step;
    for (size_t t = 0; t < model.size(); ++t) {
      auto value = q.ReadTensor(job, model.Name(t), step);
      SONDE_ASSERT_OK(value);
      EXPECT_TRUE(value->bytes == model.Expected(t, step)) << model.Name(t) << " at " << step;
    }
  }
}

// The collector is away while training saves several times the memory
// budget: host tensors spill to disk, device tensors' records spill with
// them in order (their results wait in memory or on the device), and once
// the collector is up every step arrives whole.
TEST(DeviceCapture, DeviceTensorsSpillInOrderWhileTheCollectorIsAway) {
  const ::sonde::testing::ReservedLoopbackAddress reserved;
  const std::string& address = reserved.address();
  ::sonde::testing::TempDir dir;
  HookOptions o = Options(address, "away", {}, nullptr);
  o.max_queue_bytes = 256 << 10;
  o.backpressure.spill_dir = dir.Sub("spill");
  std::filesystem::create_directories(o.backpressure.spill_dir);
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  Model model({4096, 100});  // 16 KiB of device values a step
  std::vector<float> host(8192);  // 32 KiB of host values a step
  constexpr int kSteps = 40;
  for (int64_t step = 0; step < kSteps; ++step) {
    model.Step(step);
    std::iota(host.begin(), host.end(), static_cast<float>(step));
    (*hook)->StartStep();
    SONDE_EXPECT_OK((*hook)->SaveTensor("fc.bias", HostTensor(host.data(), {8192}), {"weights"}));
    SONDE_EXPECT_OK((*hook)->SaveTensors(model.Named()));
    (*hook)->EndStep();
  }
  EXPECT_GT((*hook)->counters().tensors_spilled, 0u);
  std::unique_ptr<server::Collector> collector = ComeUpAndDrain(address, dir.Sub("db"), **hook);
  ASSERT_NE(collector, nullptr);
  const Hook::Counters c = (*hook)->counters();
  EXPECT_EQ(c.tensors_dropped, 0u);
  EXPECT_EQ(c.values_dropped, 0u);
  auto q = QueryClient::Connect(address);
  ExpectEveryStepWhole(*q, "away", model, kSteps, 3);
}

// The collector is away for longer than snapshot memory lasts: under
// spill, device values the send queue has no room for go to a local file,
// so the device's memory comes back and training never gives values up.
// What the collector in this process (its default registry is ours) has
// been told of device values spilled, by every test so far.
double SpilledMetric() {
  const metrics::Registry* registries[] = {&metrics::Registry::Default()};
  return ::sonde::testing::SampleOr0(
      ::sonde::testing::ExpositionSamples(metrics::RenderText(registries)),
      "sonde_client_device_values_spilled_total");
}

TEST(DeviceCapture, DeviceValuesSpillToDiskWhenSnapshotMemoryWouldRunOut) {
  const double spilled_before = SpilledMetric();
  const ::sonde::testing::ReservedLoopbackAddress reserved;
  const std::string& address = reserved.address();
  ::sonde::testing::TempDir dir;
  HookOptions o = Options(address, "values-away", {}, nullptr);
  o.max_queue_bytes = 256 << 10;
  o.device.snapshot_bytes = 256 << 10;  // four steps' values
  o.backpressure.max_block = absl::Seconds(10);  // a loaded machine is no reason to drop
  o.backpressure.spill_dir = dir.Sub("spill");
  std::filesystem::create_directories(o.backpressure.spill_dir);
  // No durable spool: the sender keeps everything until the collector is
  // up (with one, it would drain the queue into the spool meanwhile).
  o.spool_dir = "";
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  Model model({16384, 100});  // 64.4 KiB of device values a step
  constexpr int kSteps = 40;  // 2.5 MiB: ten times snapshot memory
  for (int64_t step = 0; step < kSteps; ++step) {
    model.Step(step);
    (*hook)->StartStep();
    SONDE_EXPECT_OK((*hook)->SaveTensors(model.Named()));
    (*hook)->EndStep();
  }
  Hook::Counters c = (*hook)->counters();
  EXPECT_GT(c.device_values_spilled, 0u);
  EXPECT_GT(c.device_bytes_spilled, 0u);
  EXPECT_EQ(c.values_dropped, 0u);
  std::unique_ptr<server::Collector> collector = ComeUpAndDrain(address, dir.Sub("db"), **hook);
  ASSERT_NE(collector, nullptr);
  c = (*hook)->counters();
  EXPECT_EQ(c.tensors_dropped, 0u);
  EXPECT_EQ(c.values_dropped, 0u);
  // The step ends told the collector, which shows operators (up to the
  // last counters reported: spills can follow the last step end).
  const double spilled = SpilledMetric() - spilled_before;
  EXPECT_GT(spilled, 0.0);
  EXPECT_LE(spilled, static_cast<double>(c.device_values_spilled));
  auto q = QueryClient::Connect(address);
  ExpectEveryStepWhole(*q, "values-away", model, kSteps, model.size());
}

}  // namespace
}  // namespace sonde
