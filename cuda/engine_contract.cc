#include "cuda/engine_contract.h"

#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cuda/conformance.h"
#include "math/float16_math.h"
#include "stats/histogram.h"
#include "stats/statistics.h"
#include "gtest/gtest.h"

namespace sonde {
namespace {

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

std::vector<float> Ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = (static_cast<float>(i % 100003) - 50000.5f) * scale;
  return v;
}

std::unique_ptr<DeviceStats> MakeEngine(const ContractTarget& target,
                                        const DeviceStatsOptions& options) {
  absl::StatusOr<std::unique_ptr<DeviceStats>> engine = target.engine(options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

// Downloads a waiting snapshot and returns its bytes.
std::string DownloadAll(DeviceStats& engine, uint64_t ticket) {
  std::string out(engine.SnapshotBytes(ticket), '\0');
  const absl::Status s = engine.Download(ticket, out.data());
  EXPECT_TRUE(s.ok()) << s;
  std::vector<DeviceCompletion> values;
  for (DeviceCompletion& c : CollectUntil(engine, DeviceCompletion::kValues, 1)) {
    if (c.kind == DeviceCompletion::kValues) values.push_back(std::move(c));
  }
  EXPECT_EQ(values.size(), 1u);
  if (!values.empty()) {
    EXPECT_EQ(values[0].ticket, ticket);
    EXPECT_TRUE(values[0].status.ok()) << values[0].status;
  }
  return out;
}

}  // namespace

std::vector<DeviceCompletion> CollectUntil(DeviceStats& engine, DeviceCompletion::Kind kind,
                                           size_t want, double timeout_seconds) {
  std::vector<DeviceCompletion> all;
  size_t got = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(timeout_seconds);
  while (got < want && absl::Now() < deadline) {
    for (DeviceCompletion& c : engine.Collect()) {
      got += c.kind == kind;
      all.push_back(std::move(c));
    }
    if (got < want) absl::SleepFor(absl::Microseconds(100));
  }
  return all;
}

void ContractStatisticsMatchTheCpuOnce(const ContractTarget& target, bool offset,
                                       bool aggregated);
void ContractSnapshotIsTakenBeforeTheProducerGoesOnOnce(const ContractTarget& target,
                                                        bool copy_kernel);

void ContractStatisticsMatchTheCpu(const ContractTarget& target) {
  // Data where allocations put it (16-byte aligned: the kernel's vector
  // loads) and every tensor one element past that (as a view at an offset:
  // a few element loads, then vectors), each with histograms counted per
  // element and warp-aggregated.
  for (const bool offset : {false, true}) {
    for (const bool aggregated : {false, true}) {
      SCOPED_TRACE(absl::StrCat(offset ? "one element in" : "as allocated",
                                aggregated ? ", warp-aggregated histograms" : ""));
      ContractStatisticsMatchTheCpuOnce(target, offset, aggregated);
    }
  }
}

void ContractStatisticsMatchTheCpuOnce(const ContractTarget& target, bool offset,
                                       bool aggregated) {
  const std::vector<ConformanceCase> cases = ConformanceCases();
  std::unique_ptr<ContractMemory> memory = target.memory();
  std::vector<DeviceTensorRef> refs;
  for (const ConformanceCase& c : cases) {
    const size_t skip = offset && c.count > 0 ? c.bytes.size() / c.count : 0;
    const void* at = c.bytes.empty() ? nullptr : memory->Upload(std::string(skip, '\0') + c.bytes);
    refs.push_back({at == nullptr ? nullptr : static_cast<const char*>(at) + skip, c.dtype, c.count,
                    true});
  }
  DeviceStatsOptions options;
  options.slot_bytes = uint64_t{64} << 20;
  options.warp_aggregated_histograms = aggregated;
  std::unique_ptr<DeviceStats> engine = MakeEngine(target, options);
  ASSERT_NE(engine, nullptr);
  absl::StatusOr<uint64_t> ticket = engine->EnqueueStats(refs, memory->producer_stream());
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  EXPECT_LE(engine->LastBatchLaunches(), 2);
  std::vector<DeviceCompletion> done = CollectUntil(*engine, DeviceCompletion::kStats, 1);
  ASSERT_EQ(done.size(), 1u);
  ASSERT_TRUE(done[0].status.ok()) << done[0].status;
  ASSERT_EQ(done[0].stats.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    StatsAccumulator cpu;
    AccumulateStatistics(cpu, cases[i].bytes.data(), cases[i].dtype, cases[i].count);
    const absl::Status same = CompareRecords(done[0].stats[i], cpu, cases[i].dtype);
    EXPECT_TRUE(same.ok()) << cases[i].name << ": " << same;
    HistogramCounts hist = HistogramCounts::Empty(options.histogram);
    AccumulateHistogramScalar(hist, cases[i].bytes.data(), cases[i].dtype, cases[i].count);
    EXPECT_TRUE(CompareHistograms(done[0].histograms[i], hist).ok()) << cases[i].name;
  }
}

void ContractSnapshotsConvertLikeTheCpu(const ContractTarget& target) {
  std::vector<float> values;
  for (int i = 0; i < 100000; ++i) values.push_back((i - 50000) * 0.37f + 1e-6f * i);
  values[7] = std::numeric_limits<float>::quiet_NaN();
  values[8] = -std::numeric_limits<float>::infinity();
  values[9] = 1e-40f;  // a denormal
  std::vector<double> doubles(values.begin(), values.end());
  doubles[10] = 1e300;  // past float: infinity after the conversion
  std::unique_ptr<ContractMemory> memory = target.memory();
  const void* f32 = memory->Upload(Bytes(values));
  const void* f64 = memory->Upload(Bytes(doubles));
  std::unique_ptr<DeviceStats> engine = MakeEngine(target, DeviceStatsOptions());
  ASSERT_NE(engine, nullptr);
  for (v1::DType from : {v1::DTYPE_F32, v1::DTYPE_F64}) {
    DeviceTensorRef ref{from == v1::DTYPE_F32 ? f32 : f64, from, values.size(), false};
    for (v1::DType to : {v1::DTYPE_UNSPECIFIED, v1::DTYPE_F32, v1::DTYPE_F16, v1::DTYPE_BF16}) {
      absl::StatusOr<uint64_t> ticket = engine->EnqueueSnapshot(ref, to, memory->producer_stream());
      ASSERT_TRUE(ticket.ok()) << ticket.status();
      const size_t size = SnapshotElementSize(from, to);
      EXPECT_EQ(engine->SnapshotBytes(*ticket), values.size() * size);
      const std::string got = DownloadAll(*engine, *ticket);
      if (to == v1::DTYPE_UNSPECIFIED || to == from) {
        EXPECT_EQ(got, from == v1::DTYPE_F32 ? Bytes(values) : Bytes(doubles));
        continue;
      }
      ASSERT_EQ(got.size(), values.size() * size);
      for (size_t i = 0; i < values.size(); ++i) {
        const float v = from == v1::DTYPE_F64 ? static_cast<float>(doubles[i]) : values[i];
        if (to == v1::DTYPE_F32) {
          float g;
          std::memcpy(&g, &got[4 * i], 4);
          ASSERT_EQ(std::memcmp(&g, &v, 4), 0) << "element " << i;
          continue;
        }
        uint16_t g;
        std::memcpy(&g, &got[2 * i], 2);
        const uint16_t want = to == v1::DTYPE_F16 ? SondeFloatToHalf(v) : SondeFloatToBf16(v);
        ASSERT_EQ(g, want) << "element " << i << " from " << v1::DType_Name(from) << " to "
                           << v1::DType_Name(to);
      }
    }
  }
  // A conversion the engine does not make is refused, not garbled.
  DeviceTensorRef half{f32, v1::DTYPE_F16, 100, false};
  EXPECT_EQ(engine->EnqueueSnapshot(half, v1::DTYPE_BF16, memory->producer_stream()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

namespace {

// `offset` floats into the allocation (a view: 4-byte aligned, not 16),
// snapshots copied by cudaMemcpyAsync or by the copy kernel.
void LargeTensorsTravelInPiecesOnce(const ContractTarget& target, bool copy_kernel,
                                    int offset) {
  // 1,000,003 floats through a ring of three 64 KiB buffers: 62 pieces, the
  // last one short.
  const std::vector<float> values = Ramp(1000003, 1e-3f);
  std::unique_ptr<ContractMemory> memory = target.memory();
  const void* data = static_cast<const char*>(memory->Upload(
                         std::string(offset * sizeof(float), '\0') + Bytes(values))) +
                     offset * sizeof(float);
  DeviceStatsOptions options;
  options.ring_buffers = 3;
  options.ring_buffer_bytes = 64 << 10;
  options.snapshot_bytes = 16 << 20;
  options.snapshot_copy_kernel = copy_kernel;
  std::unique_ptr<DeviceStats> engine = MakeEngine(target, options);
  ASSERT_NE(engine, nullptr);
  // Two snapshots of it, downloaded one after the other.
  DeviceTensorRef ref{data, v1::DTYPE_F32, values.size(), false};
  absl::StatusOr<uint64_t> a = engine->EnqueueSnapshot(ref, v1::DTYPE_UNSPECIFIED,
                                                       memory->producer_stream());
  absl::StatusOr<uint64_t> b = engine->EnqueueSnapshot(ref, v1::DTYPE_BF16,
                                                       memory->producer_stream());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  std::string first(engine->SnapshotBytes(*a), '\0');
  std::string second(engine->SnapshotBytes(*b), '\0');
  ASSERT_TRUE(engine->Download(*a, first.data()).ok());
  ASSERT_TRUE(engine->Download(*b, second.data()).ok());
  std::vector<DeviceCompletion> done = CollectUntil(*engine, DeviceCompletion::kValues, 2);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].ticket, *a);
  EXPECT_EQ(done[1].ticket, *b);
  EXPECT_TRUE(done[0].status.ok() && done[1].status.ok());
  EXPECT_EQ(first, Bytes(values));
  ASSERT_EQ(second.size(), values.size() * 2);
  for (size_t i = 0; i < values.size(); i += 997) {
    uint16_t g;
    std::memcpy(&g, &second[2 * i], 2);
    ASSERT_EQ(g, SondeFloatToBf16(values[i])) << "element " << i;
  }
  EXPECT_EQ(engine->snapshot_bytes_used(), 0u);
}

}  // namespace

void ContractLargeTensorsTravelInPieces(const ContractTarget& target) {
  for (const bool copy_kernel : {false, true}) {
    for (const int offset : {0, 1}) {
      SCOPED_TRACE(absl::StrCat(copy_kernel ? "copy kernel" : "cudaMemcpyAsync",
                                offset ? ", one element in" : ", as allocated"));
      LargeTensorsTravelInPiecesOnce(target, copy_kernel, offset);
    }
  }
}

void ContractSnapshotIsTakenBeforeTheProducerGoesOn(const ContractTarget& target) {
  for (const bool copy_kernel : {false, true}) {
    SCOPED_TRACE(copy_kernel ? "copy kernel" : "cudaMemcpyAsync");
    ContractSnapshotIsTakenBeforeTheProducerGoesOnOnce(target, copy_kernel);
  }
}

void ContractSnapshotIsTakenBeforeTheProducerGoesOnOnce(const ContractTarget& target,
                                                        bool copy_kernel) {
  const std::vector<float> before(1 << 20, 2.0f);
  const std::vector<float> after(1 << 20, 3.0f);
  std::unique_ptr<ContractMemory> memory = target.memory();
  const void* data = memory->Upload(Bytes(before));
  DeviceStatsOptions options;
  options.snapshot_copy_kernel = copy_kernel;
  std::unique_ptr<DeviceStats> engine = MakeEngine(target, options);
  ASSERT_NE(engine, nullptr);
  DeviceTensorRef ref{data, v1::DTYPE_F32, before.size(), false};
  absl::StatusOr<uint64_t> stats = engine->EnqueueStats({&ref, 1}, memory->producer_stream());
  absl::StatusOr<uint64_t> snapshot =
      engine->EnqueueSnapshot(ref, v1::DTYPE_UNSPECIFIED, memory->producer_stream());
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  // Training's next write to the tensor, enqueued right after.
  memory->Overwrite(data, Bytes(after));
  memory->Sync();
  std::vector<DeviceCompletion> done = CollectUntil(*engine, DeviceCompletion::kStats, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(DownloadAll(*engine, *snapshot), Bytes(before));
  ASSERT_EQ(done[0].stats.size(), 1u);
  EXPECT_EQ(done[0].stats[0].min, 2.0);
  EXPECT_EQ(done[0].stats[0].max, 2.0);
}

namespace {

// Sixteen deferred statistics batches over one 64 MiB tensor of 2.0 (1 GiB
// of reads, about 0.3 ms on an H100), then, on the producer stream, a fence
// if `fence`, then a device-side fill of the tensor with 0x40 bytes
// (3.00392). Returns how many batches saw anything but 2.0.
int DeferredBatchesThatSawTheWrite(const ContractTarget& target, bool fence) {
  constexpr size_t kFloats = size_t{16} << 20;
  constexpr int kBatches = 16;
  std::unique_ptr<ContractMemory> memory = target.memory();
  const void* data = memory->Upload(Bytes(std::vector<float>(kFloats, 2.0f)));
  DeviceStatsOptions options;
  options.defer_producer_wait = true;
  options.batch_slots = kBatches;
  std::unique_ptr<DeviceStats> engine = MakeEngine(target, options);
  EXPECT_NE(engine, nullptr);
  if (engine == nullptr) return -1;
  DeviceTensorRef ref{data, v1::DTYPE_F32, kFloats, true};
  for (int i = 0; i < kBatches; ++i) {
    absl::StatusOr<uint64_t> t = engine->EnqueueStats({&ref, 1}, memory->producer_stream());
    EXPECT_TRUE(t.ok()) << t.status();
  }
  if (fence) {
    EXPECT_TRUE(engine->FenceProducer(memory->producer_stream()).ok());
  }
  memory->Fill(data, 0x40, kFloats * sizeof(float));
  memory->Sync();
  std::vector<DeviceCompletion> done = CollectUntil(*engine, DeviceCompletion::kStats, kBatches);
  EXPECT_EQ(done.size(), static_cast<size_t>(kBatches));
  int saw = 0;
  for (const DeviceCompletion& c : done) {
    EXPECT_TRUE(c.status.ok()) << c.status;
    if (c.stats.size() != 1 || c.stats[0].min != 2.0 || c.stats[0].max != 2.0) ++saw;
  }
  return saw;
}

}  // namespace

void ContractDeferredReadsFinishBeforeAFencedWrite(const ContractTarget& target) {
  EXPECT_EQ(DeferredBatchesThatSawTheWrite(target, /*fence=*/true), 0);
  // Without the fence the write may race the reads (the engine reads host
  // memory at enqueue: never): shown, not asserted, as evidence that the
  // case above could have failed.
  const int raced = DeferredBatchesThatSawTheWrite(target, /*fence=*/false);
  std::printf("deferred reads without a fence: %d of 16 batches saw the later write\n", raced);
}

void ContractSnapshotMemoryIsBoundedAndComesBack(const ContractTarget& target) {
  const std::vector<float> values = Ramp(75000, 1.0f);  // 300,000 bytes
  std::unique_ptr<ContractMemory> memory = target.memory();
  const void* data = memory->Upload(Bytes(values));
  DeviceStatsOptions options;
  options.snapshot_bytes = 1100000;
  std::unique_ptr<DeviceStats> engine = MakeEngine(target, options);
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(engine->snapshot_capacity(), 1100000u);
  DeviceTensorRef ref{data, v1::DTYPE_F32, values.size(), false};
  std::vector<uint64_t> tickets;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<uint64_t> t =
        engine->EnqueueSnapshot(ref, v1::DTYPE_UNSPECIFIED, memory->producer_stream());
    ASSERT_TRUE(t.ok()) << t.status();
    tickets.push_back(*t);
  }
  EXPECT_EQ(engine->snapshot_bytes_used(), 900000u);
  absl::StatusOr<uint64_t> full =
      engine->EnqueueSnapshot(ref, v1::DTYPE_UNSPECIFIED, memory->producer_stream());
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted) << full.status();
  // Half the size fits after the conversion to BF16 (150,000 bytes).
  absl::StatusOr<uint64_t> half = engine->EnqueueSnapshot(ref, v1::DTYPE_BF16,
                                                          memory->producer_stream());
  ASSERT_TRUE(half.ok()) << half.status();
  tickets.push_back(*half);
  // A download that lands gives its memory back.
  EXPECT_EQ(DownloadAll(*engine, tickets[0]), Bytes(values));
  EXPECT_EQ(engine->snapshot_bytes_used(), 750000u);
  absl::StatusOr<uint64_t> again =
      engine->EnqueueSnapshot(ref, v1::DTYPE_UNSPECIFIED, memory->producer_stream());
  ASSERT_TRUE(again.ok()) << again.status();
  tickets.push_back(*again);
  for (size_t i = 1; i < tickets.size(); ++i) DownloadAll(*engine, tickets[i]);
  EXPECT_EQ(engine->snapshot_bytes_used(), 0u);
}

void ContractFullSlotsRefuseRatherThanBlock(const ContractTarget& target) {
  const std::vector<float> values(1 << 16, 1.0f);
  std::unique_ptr<ContractMemory> memory = target.memory();
  const void* data = memory->Upload(Bytes(values));
  DeviceStatsOptions options;
  options.batch_slots = 2;
  std::unique_ptr<DeviceStats> engine = MakeEngine(target, options);
  ASSERT_NE(engine, nullptr);
  DeviceTensorRef ref{data, v1::DTYPE_F32, values.size(), true};
  int accepted = 0, refused = 0;
  for (int i = 0; i < 16; ++i) {
    absl::StatusOr<uint64_t> t = engine->EnqueueStats({&ref, 1}, memory->producer_stream());
    if (t.ok()) {
      ++accepted;
    } else {
      EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted) << t.status();
      ++refused;
    }
  }
  // Slots come back only through Collect.
  EXPECT_EQ(accepted, 2);
  EXPECT_EQ(refused, 14);
  EXPECT_EQ(CollectUntil(*engine, DeviceCompletion::kStats, 2).size(), 2u);
  EXPECT_TRUE(engine->EnqueueStats({&ref, 1}, memory->producer_stream()).ok());
  EXPECT_EQ(CollectUntil(*engine, DeviceCompletion::kStats, 1).size(), 1u);
  // A batch bigger than a slot is refused with what it needs.
  std::vector<DeviceTensorRef> many(2000, ref);
  const uint64_t need = StatsBatchBytes(many, options);
  EXPECT_GT(need, options.slot_bytes);
  absl::StatusOr<uint64_t> big = engine->EnqueueStats(many, memory->producer_stream());
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(big.status().message()).find("split"), std::string::npos) << big.status();
}

void ContractUnknownTicketsAndDiscards(const ContractTarget& target) {
  const std::vector<float> values(1000, 1.0f);
  std::unique_ptr<ContractMemory> memory = target.memory();
  const void* data = memory->Upload(Bytes(values));
  std::unique_ptr<DeviceStats> engine = MakeEngine(target, DeviceStatsOptions());
  ASSERT_NE(engine, nullptr);
  std::string sink(4000, '\0');
  EXPECT_EQ(engine->Download(12345, sink.data()).code(), absl::StatusCode::kNotFound);
  DeviceTensorRef ref{data, v1::DTYPE_F32, values.size(), false};
  absl::StatusOr<uint64_t> t =
      engine->EnqueueSnapshot(ref, v1::DTYPE_UNSPECIFIED, memory->producer_stream());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(engine->snapshot_bytes_used(), 4000u);
  engine->Discard(*t);
  EXPECT_EQ(engine->snapshot_bytes_used(), 0u);
  EXPECT_EQ(engine->Download(*t, sink.data()).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(engine->SnapshotBytes(*t), 0u);
  // Integer tensors have no device statistics.
  DeviceTensorRef ints{data, v1::DTYPE_I32, values.size(), false};
  EXPECT_EQ(engine->EnqueueStats({&ints, 1}, memory->producer_stream()).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(engine->Drain().ok());
}

void ContractOptionsOutOfRangeAreRefused(const ContractTarget& target) {
  struct Case {
    const char* option;
    void (*set)(DeviceStatsOptions&);
  };
  const Case cases[] = {
      {"chunk_elements", [](DeviceStatsOptions& o) { o.chunk_elements = 0; }},
      {"chunk_elements", [](DeviceStatsOptions& o) { o.chunk_elements = kMaxChunkElements + 1; }},
      {"batch_slots", [](DeviceStatsOptions& o) { o.batch_slots = 0; }},
      {"slot_bytes", [](DeviceStatsOptions& o) { o.slot_bytes = 100; }},
      {"ring_buffers", [](DeviceStatsOptions& o) { o.ring_buffers = 0; }},
      {"ring_buffer_bytes", [](DeviceStatsOptions& o) { o.ring_buffer_bytes = 100; }},
  };
  for (const Case& c : cases) {
    DeviceStatsOptions options;
    c.set(options);
    absl::StatusOr<std::unique_ptr<DeviceStats>> engine = target.engine(options);
    ASSERT_FALSE(engine.ok()) << c.option;
    EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument) << engine.status();
    EXPECT_NE(engine.status().message().find(c.option), absl::string_view::npos)
        << engine.status();
  }
  DeviceStatsOptions largest;
  largest.chunk_elements = kMaxChunkElements;
  EXPECT_NE(MakeEngine(target, largest), nullptr);
}

}  // namespace sonde
