// TensorBoard export end to end: the real hook streams to the real
// collector, which writes event files; the files are read back by the
// reader below, written from the format's definition alone (TFRecord
// framing with masked CRC-32C, protobuf wire format, TensorFlow's field
// numbers) and sharing no code with the writer.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/hook.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/in_process_collector.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace sonde {
namespace {

using ::sonde::testing::InProcessCollector;
using ::sonde::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;
using ::testing::UnorderedElementsAreArray;

// ---------------------------------------------------------------------------
// The independent reader.

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), bit by bit.
uint32_t BitwiseCrc32c(absl::string_view data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : data) {
    crc ^= byte;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

uint32_t Masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

uint64_t LittleEndian(absl::string_view bytes) {
  uint64_t v = 0;
  for (size_t i = bytes.size(); i > 0; --i) v = (v << 8) | static_cast<uint8_t>(bytes[i - 1]);
  return v;
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The records of a TFRecord file; a bad frame or checksum fails the test.
std::vector<std::string> ReadRecords(const std::string& path) {
  const std::string bytes = ReadWholeFile(path);
  const absl::string_view all(bytes);
  std::vector<std::string> records;
  size_t at = 0;
  while (at < all.size()) {
    if (all.size() - at < 12) {
      ADD_FAILURE() << path << ": torn record header at byte " << at;
      break;
    }
    const uint64_t length = LittleEndian(all.substr(at, 8));
    EXPECT_EQ(LittleEndian(all.substr(at + 8, 4)), Masked(BitwiseCrc32c(all.substr(at, 8))))
        << path << ": length checksum of the record at byte " << at;
    if (all.size() - at - 12 < length + 4) {
      ADD_FAILURE() << path << ": record at byte " << at << " of " << length
                    << " bytes runs past the end";
      break;
    }
    const absl::string_view data = all.substr(at + 12, length);
    EXPECT_EQ(LittleEndian(all.substr(at + 12 + length, 4)), Masked(BitwiseCrc32c(data)))
        << path << ": data checksum of the record at byte " << at;
    records.emplace_back(data);
    at += 12 + length + 4;
  }
  return records;
}

// One field of a protobuf message as it is on the wire.
struct WireField {
  uint64_t number = 0;
  int type = 0;          // 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32
  uint64_t value = 0;    // varint, fixed64 or fixed32 bits
  std::string bytes;     // length-delimited contents
};

bool ReadVarint(absl::string_view& in, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64 && !in.empty(); shift += 7) {
    const uint8_t b = static_cast<uint8_t>(in[0]);
    in.remove_prefix(1);
    v |= static_cast<uint64_t>(b & 0x7F) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

std::vector<WireField> Fields(absl::string_view in) {
  std::vector<WireField> fields;
  while (!in.empty()) {
    uint64_t key = 0;
    if (!ReadVarint(in, key)) {
      ADD_FAILURE() << "bad field key";
      break;
    }
    WireField f;
    f.number = key >> 3;
    f.type = static_cast<int>(key & 7);
    bool ok = true;
    if (f.type == 0) {
      ok = ReadVarint(in, f.value);
    } else if (f.type == 1 || f.type == 5) {
      const size_t n = f.type == 1 ? 8 : 4;
      ok = in.size() >= n;
      if (ok) f.value = LittleEndian(in.substr(0, n));
      if (ok) in.remove_prefix(n);
    } else if (f.type == 2) {
      uint64_t length = 0;
      ok = ReadVarint(in, length) && in.size() >= length;
      if (ok) f.bytes = std::string(in.substr(0, length));
      if (ok) in.remove_prefix(length);
    } else {
      ok = false;
    }
    if (!ok) {
      ADD_FAILURE() << "malformed field " << f.number << " of wire type " << f.type;
      break;
    }
    fields.push_back(std::move(f));
  }
  return fields;
}

double BitsToDouble(uint64_t bits) {
  double d;
  std::memcpy(&d, &bits, 8);
  return d;
}

float BitsToFloat(uint64_t bits) {
  const uint32_t b = static_cast<uint32_t>(bits);
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// A repeated double, packed (one length-delimited field) or not.
void AppendDoubles(const WireField& f, std::vector<double>& out) {
  if (f.type == 1) {
    out.push_back(BitsToDouble(f.value));
    return;
  }
  ASSERT_EQ(f.type, 2);
  ASSERT_EQ(f.bytes.size() % 8, 0u);
  for (size_t i = 0; i < f.bytes.size(); i += 8) {
    out.push_back(BitsToDouble(LittleEndian(absl::string_view(f.bytes).substr(i, 8))));
  }
}

struct Histo {
  double min = 0, max = 0, num = 0, sum = 0, sum_squares = 0;
  std::vector<double> limits;
  std::vector<double> buckets;
};

struct Value {
  std::string tag;
  std::optional<float> simple;
  std::optional<Histo> histo;
};

struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::optional<std::string> file_version;
  bool has_summary = false;
  std::vector<Value> values;
};

// TensorFlow's numbers: HistogramProto {min=1 max=2 num=3 sum=4
// sum_squares=5 bucket_limit=6 bucket=7}, Summary.Value {tag=1
// simple_value=2 histo=5}, Summary {value=1}, Event {wall_time=1 step=2
// file_version=3 summary=5}.
Histo DecodeHisto(absl::string_view in) {
  Histo h;
  for (const WireField& f : Fields(in)) {
    switch (f.number) {
      case 1: h.min = BitsToDouble(f.value); break;
      case 2: h.max = BitsToDouble(f.value); break;
      case 3: h.num = BitsToDouble(f.value); break;
      case 4: h.sum = BitsToDouble(f.value); break;
      case 5: h.sum_squares = BitsToDouble(f.value); break;
      case 6: AppendDoubles(f, h.limits); break;
      case 7: AppendDoubles(f, h.buckets); break;
      default: ADD_FAILURE() << "unexpected HistogramProto field " << f.number;
    }
  }
  return h;
}

Value DecodeValue(absl::string_view in) {
  Value v;
  for (const WireField& f : Fields(in)) {
    if (f.number == 1 && f.type == 2) {
      v.tag = f.bytes;
    } else if (f.number == 2 && f.type == 5) {
      v.simple = BitsToFloat(f.value);
    } else if (f.number == 5 && f.type == 2) {
      v.histo = DecodeHisto(f.bytes);
    } else {
      ADD_FAILURE() << "unexpected Summary.Value field " << f.number;
    }
  }
  return v;
}

Event DecodeEvent(absl::string_view in) {
  Event e;
  for (const WireField& f : Fields(in)) {
    if (f.number == 1 && f.type == 1) {
      e.wall_time = BitsToDouble(f.value);
    } else if (f.number == 2 && f.type == 0) {
      e.step = static_cast<int64_t>(f.value);
    } else if (f.number == 3 && f.type == 2) {
      e.file_version = f.bytes;
    } else if (f.number == 5 && f.type == 2) {
      e.has_summary = true;
      for (const WireField& v : Fields(f.bytes)) {
        EXPECT_EQ(v.number, 1u);
        EXPECT_EQ(v.type, 2);
        e.values.push_back(DecodeValue(v.bytes));
      }
    } else {
      ADD_FAILURE() << "unexpected Event field " << f.number;
    }
  }
  return e;
}

// Every value of a run directory, by (tag, step), from all its event files
// in name order (TensorBoard's order).
struct RunData {
  std::vector<std::string> files;
  std::map<std::pair<std::string, int64_t>, std::vector<Value>> values;
};

RunData ReadRun(const std::string& dir) {
  RunData run;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename();
    if (absl::StrContains(name, "tfevents")) run.files.push_back(entry.path());
  }
  std::sort(run.files.begin(), run.files.end());
  const double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  for (const std::string& file : run.files) {
    std::vector<std::string> records = ReadRecords(file);
    if (records.empty()) {
      ADD_FAILURE() << file << " is empty";
      continue;
    }
    const Event first = DecodeEvent(records[0]);
    EXPECT_EQ(first.file_version, "brain.Event:2") << file;
    EXPECT_FALSE(first.has_summary) << file;
    for (size_t i = 1; i < records.size(); ++i) {
      const Event e = DecodeEvent(records[i]);
      EXPECT_TRUE(e.has_summary) << file << " record " << i;
      EXPECT_FALSE(e.file_version.has_value()) << file << " record " << i;
      EXPECT_NEAR(e.wall_time, now, 600) << file << " record " << i;
      for (const Value& v : e.values) run.values[{v.tag, e.step}].push_back(v);
    }
  }
  return run;
}

// Names in a directory (files and subdirectories).
std::set<std::string> Entries(const std::string& dir) {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    names.insert(entry.path().filename());
  }
  return names;
}

// Tags and steps of a run, each (tag, step) once.
std::set<std::pair<std::string, int64_t>> Keys(const RunData& run) {
  std::set<std::pair<std::string, int64_t>> keys;
  for (const auto& [key, values] : run.values) {
    EXPECT_EQ(values.size(), 1u) << "tag '" << key.first << "' at step " << key.second
                                 << " written " << values.size() << " times";
    keys.insert(key);
  }
  return keys;
}

float Scalar(const RunData& run, const std::string& tag, int64_t step) {
  auto it = run.values.find({tag, step});
  if (it == run.values.end() || !it->second[0].simple.has_value()) {
    ADD_FAILURE() << "no scalar '" << tag << "' at step " << step;
    return std::nanf("");
  }
  return *it->second[0].simple;
}

// ---------------------------------------------------------------------------
// The data the tests send, and what it should become.

constexpr int kTrainSteps = 4;
constexpr int kEvalSteps = 2;

double TrainLoss(int step) { return 1.0 / (step + 1) + 0.125; }
double EvalLoss(int step) { return 2.0 + 0.5 * step; }

std::vector<float> WeightValues(int step) {
  std::vector<float> v(16);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.1f * (static_cast<float>(i) - 7.0f) + 0.01f * step;
  return v;
}

// Spread over the histogram's range [-2, 2] and past both ends.
std::vector<float> ActivationValues(int step) {
  std::vector<float> v(32);
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = -2.6f + 0.17f * static_cast<float>(i) + 0.003f * step + 0.0137f;
  }
  return v;
}

struct Moments {
  double mean = 0, l2 = 0, max = -INFINITY, min = INFINITY, sum = 0, sum_squares = 0;
};

Moments MomentsOf(const std::vector<float>& values) {
  Moments m;
  for (float f : values) {
    const double x = f;
    m.sum += x;
    m.sum_squares += x * x;
    m.max = std::max(m.max, x);
    m.min = std::min(m.min, x);
  }
  m.mean = m.sum / values.size();
  m.l2 = std::sqrt(m.sum_squares);
  return m;
}

HookOptions BaseOptions(const std::string& address, const std::string& job) {
  HookOptions o;
  o.collector = address;
  o.job = job;
  o.config.save_config = SaveConfig::Every(1);
  o.config.include_collections = {"weights", "losses", "activations"};
  CollectionConfig activations;
  activations.name = "activations";
  activations.save_histogram = true;
  o.config.collections = {activations};
  o.histogram = FixedSpec(-2, 2, 8);  // edges -2, -1.5, ..., 2
  o.close_timeout = absl::Seconds(60);
  return o;
}

void TrainStep(Hook& hook, int step) {
  hook.StartStep();
  const std::vector<float> w = WeightValues(step);
  const std::vector<float> a = ActivationValues(step);
  SONDE_ASSERT_OK(hook.SaveTensor("fc.weight", HostTensor(w.data(), {4, 4}), {"weights"}));
  SONDE_ASSERT_OK(hook.SaveTensor("act", HostTensor(a.data(), {32}), {"activations"}));
  SONDE_ASSERT_OK(hook.SaveScalar("loss", TrainLoss(step), {"losses"}));
}

void LossStep(Hook& hook, double loss) {
  hook.StartStep();
  SONDE_ASSERT_OK(hook.SaveScalar("loss", loss, {"losses"}));
}

// The histogram of `values` as TensorBoard reads it: bucket i holds the
// values between limit i-1 (or -inf) and limit i.
void ExpectHistogramOf(const Histo& h, const std::vector<float>& values, int step) {
  SCOPED_TRACE(absl::StrCat("histogram at step ", step));
  const Moments m = MomentsOf(values);
  EXPECT_EQ(h.num, static_cast<double>(values.size()));
  EXPECT_EQ(h.min, m.min);
  EXPECT_EQ(h.max, m.max);
  EXPECT_NEAR(h.sum, m.sum, 1e-9 * std::max(1.0, std::abs(m.sum)));
  EXPECT_NEAR(h.sum_squares, m.sum_squares, 1e-9 * m.sum_squares);
  ASSERT_EQ(h.limits.size(), h.buckets.size());
  ASSERT_FALSE(h.limits.empty());
  std::set<double> edges = {std::numeric_limits<double>::max()};
  for (int i = 0; i <= 8; ++i) edges.insert(-2.0 + 0.5 * i);
  for (float v : values) ASSERT_EQ(edges.count(v), 0u) << v << " sits on an edge";
  double total = 0;
  for (size_t i = 0; i < h.limits.size(); ++i) {
    EXPECT_EQ(edges.count(h.limits[i]), 1u) << "limit " << h.limits[i] << " is no bin edge";
    const double low = i == 0 ? -INFINITY : h.limits[i - 1];
    const double high = h.limits[i] == std::numeric_limits<double>::max() ? INFINITY : h.limits[i];
    EXPECT_LT(low, high);
    const double expected =
        std::count_if(values.begin(), values.end(), [&](float v) { return v > low && v < high; });
    EXPECT_EQ(h.buckets[i], expected) << "bucket up to " << h.limits[i];
    total += h.buckets[i];
  }
  EXPECT_EQ(total, static_cast<double>(values.size()));
  // Values past the range's top land in the bucket that reaches DBL_MAX.
  EXPECT_EQ(h.limits.back(), std::numeric_limits<double>::max());
}

// For the manual check with the real TensorBoard (docs/tensorboard.md):
// with SONDE_TENSORBOARD_KEEP=DIR, a test's files are copied to DIR/<test>.
void KeepForManualCheck(const std::string& tb) {
  const char* keep = std::getenv("SONDE_TENSORBOARD_KEEP");
  if (keep == nullptr) return;
  const std::string to =
      absl::StrCat(keep, "/", ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::create_directories(to);
  std::filesystem::copy(tb, to, std::filesystem::copy_options::recursive);
}

TEST(TensorBoardExport, ScalarsStatisticsAndHistogramsOneRunPerMode) {
  TempDir tb;
  InProcessCollector collector("", server::IngestLimits(), [&](server::CollectorOptions& o) {
    o.tensorboard.dir = tb.path();
    o.tensorboard.export_all = true;
    o.tensorboard.statistics = {"mean", "l2", "max"};
  });
  auto hook = Hook::Create(BaseOptions(collector.address(), "mnist.run-1"));
  SONDE_ASSERT_OK(hook);
  (*hook)->SetMode(v1::MODE_TRAIN);
  for (int step = 0; step < kTrainSteps; ++step) TrainStep(**hook, step);
  (*hook)->SetMode(v1::MODE_EVAL);
  for (int step = 0; step < kEvalSteps; ++step) LossStep(**hook, EvalLoss(step));
  SONDE_ASSERT_OK((*hook)->Close());
  collector.Stop();  // the exporter writes what is left and closes its files

  EXPECT_THAT(Entries(tb.path()), ElementsAre("mnist.run-1"));
  const std::string job_dir = tb.path() + "/mnist.run-1";
  EXPECT_THAT(Entries(job_dir),
              UnorderedElementsAre("train", "eval", ".sonde-tensorboard-progress"));

  const RunData train = ReadRun(job_dir + "/train");
  EXPECT_EQ(train.files.size(), 1u);
  std::set<std::pair<std::string, int64_t>> expected_keys;
  for (int step = 0; step < kTrainSteps; ++step) {
    for (const char* tag : {"loss", "fc.weight/mean", "fc.weight/l2", "fc.weight/max",
                            "act/mean", "act/l2", "act/max", "act"}) {
      expected_keys.insert({tag, step});
    }
  }
  EXPECT_EQ(Keys(train), expected_keys);
  for (int step = 0; step < kTrainSteps; ++step) {
    SCOPED_TRACE(absl::StrCat("train step ", step));
    EXPECT_EQ(Scalar(train, "loss", step), static_cast<float>(TrainLoss(step)));
    const Moments w = MomentsOf(WeightValues(step));
    EXPECT_FLOAT_EQ(Scalar(train, "fc.weight/mean", step), static_cast<float>(w.mean));
    EXPECT_FLOAT_EQ(Scalar(train, "fc.weight/l2", step), static_cast<float>(w.l2));
    EXPECT_EQ(Scalar(train, "fc.weight/max", step), static_cast<float>(w.max));
    const Moments a = MomentsOf(ActivationValues(step));
    EXPECT_FLOAT_EQ(Scalar(train, "act/mean", step), static_cast<float>(a.mean));
    EXPECT_FLOAT_EQ(Scalar(train, "act/l2", step), static_cast<float>(a.l2));
    const Value& histogram = train.values.at({"act", step})[0];
    EXPECT_FALSE(histogram.simple.has_value());
    ASSERT_TRUE(histogram.histo.has_value());
    ExpectHistogramOf(*histogram.histo, ActivationValues(step), step);
  }

  // Eval steps count from 0 again, so TensorBoard overlays the two curves.
  const RunData eval = ReadRun(job_dir + "/eval");
  std::set<std::pair<std::string, int64_t>> eval_keys;
  for (int step = 0; step < kEvalSteps; ++step) eval_keys.insert({"loss", step});
  EXPECT_EQ(Keys(eval), eval_keys);
  for (int step = 0; step < kEvalSteps; ++step) {
    EXPECT_EQ(Scalar(eval, "loss", step), static_cast<float>(EvalLoss(step)));
  }
  KeepForManualCheck(tb.path());
}

TEST(TensorBoardExport, JobsChooseThroughMetadataAndPerWorkerRunsSplitWorkers) {
  // No directory given: only jobs that ask, under <data_dir>/tensorboard.
  InProcessCollector collector;
  const std::string tb = collector.data_dir() + "/tensorboard";
  const int kSteps = 3;
  auto worker_loss = [](int worker, int step) { return 10.0 * worker + step + 0.5; };
  auto worker_weights = [](int worker, int step) {
    return std::vector<float>{1.0f * worker, 2.0f + step, -3.0f, 0.25f * worker};
  };
  {
    std::vector<std::unique_ptr<Hook>> hooks;
    for (int worker = 0; worker < 2; ++worker) {
      HookOptions o = BaseOptions(collector.address(), "ddp");
      o.worker = worker;
      o.world_size = 2;
      o.metadata["sonde.tensorboard"] = "per_worker";
      auto hook = Hook::Create(o);
      SONDE_ASSERT_OK(hook);
      (*hook)->SetMode(v1::MODE_TRAIN);
      hooks.push_back(std::move(*hook));
    }
    // Both workers join before either ends: a job ends when every worker
    // that joined has ended.
    for (auto& hook : hooks) SONDE_ASSERT_OK(hook->WaitUntilConnected(absl::Seconds(30)));
    for (int step = 0; step < kSteps; ++step) {
      for (int worker = 0; worker < 2; ++worker) {
        Hook& hook = *hooks[worker];
        hook.StartStep();
        const std::vector<float> w = worker_weights(worker, step);
        SONDE_ASSERT_OK(hook.SaveTensor("fc.weight", HostTensor(w.data(), {4}), {"weights"}));
        SONDE_ASSERT_OK(hook.SaveScalar("loss", worker_loss(worker, step), {"losses"}));
      }
    }
    for (auto& hook : hooks) SONDE_ASSERT_OK(hook->Close());
  }
  for (const auto& [job, choice] : std::vector<std::pair<std::string, std::string>>{
           {"asks", "on"}, {"refuses", "off"}, {"silent", ""}}) {
    HookOptions o = BaseOptions(collector.address(), job);
    if (!choice.empty()) o.metadata["sonde.tensorboard"] = choice;
    auto hook = Hook::Create(o);
    SONDE_ASSERT_OK(hook);
    (*hook)->SetMode(v1::MODE_TRAIN);
    for (int step = 0; step < 2; ++step) LossStep(**hook, EvalLoss(step));
    SONDE_ASSERT_OK((*hook)->Close());
  }
  collector.Stop();

  KeepForManualCheck(tb);
  EXPECT_THAT(Entries(tb), UnorderedElementsAre("ddp", "asks"));
  EXPECT_THAT(Entries(tb + "/asks"), UnorderedElementsAre("train", ".sonde-tensorboard-progress"));
  EXPECT_EQ(Scalar(ReadRun(tb + "/asks/train"), "loss", 1), static_cast<float>(EvalLoss(1)));
  EXPECT_THAT(Entries(tb + "/ddp"), UnorderedElementsAre("train", "worker_0", "worker_1",
                                                         ".sonde-tensorboard-progress"));
  EXPECT_THAT(Entries(tb + "/ddp/worker_0"), ElementsAre("train"));
  EXPECT_THAT(Entries(tb + "/ddp/worker_1"), ElementsAre("train"));
  const RunData all = ReadRun(tb + "/ddp/train");
  const RunData w0 = ReadRun(tb + "/ddp/worker_0/train");
  const RunData w1 = ReadRun(tb + "/ddp/worker_1/train");
  std::set<std::pair<std::string, int64_t>> keys;
  for (int step = 0; step < kSteps; ++step) {
    for (const char* tag : {"loss", "fc.weight/mean", "fc.weight/std", "fc.weight/l2"}) {
      keys.insert({tag, step});
    }
  }
  EXPECT_EQ(Keys(all), keys);
  EXPECT_EQ(Keys(w0), keys);
  EXPECT_EQ(Keys(w1), keys);
  for (int step = 0; step < kSteps; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    EXPECT_EQ(Scalar(w0, "loss", step), static_cast<float>(worker_loss(0, step)));
    EXPECT_EQ(Scalar(w1, "loss", step), static_cast<float>(worker_loss(1, step)));
    // One-element tensors of several workers: their mean.
    EXPECT_EQ(Scalar(all, "loss", step),
              static_cast<float>((worker_loss(0, step) + worker_loss(1, step)) / 2));
    std::vector<float> both = worker_weights(0, step);
    const std::vector<float> second = worker_weights(1, step);
    both.insert(both.end(), second.begin(), second.end());
    // Larger tensors: statistics of the union of the workers' tensors.
    EXPECT_FLOAT_EQ(Scalar(all, "fc.weight/mean", step), static_cast<float>(MomentsOf(both).mean));
    EXPECT_FLOAT_EQ(Scalar(all, "fc.weight/l2", step), static_cast<float>(MomentsOf(both).l2));
    EXPECT_FLOAT_EQ(Scalar(w1, "fc.weight/l2", step), static_cast<float>(MomentsOf(second).l2));
  }
}

// A record as a crashed collector could have left it after its last
// progress save: a well-formed event repeating step `step` of `tag`.
std::string StrayRecord(const std::string& tag, int64_t step, float value) {
  auto varint = [](uint64_t v) {
    std::string out;
    do {
      out.push_back(static_cast<char>((v & 0x7F) | (v > 0x7F ? 0x80 : 0)));
      v >>= 7;
    } while (v > 0);
    return out;
  };
  auto delimited = [&](int number, const std::string& bytes) {
    return varint(static_cast<uint64_t>(number) << 3 | 2) + varint(bytes.size()) + bytes;
  };
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  std::string fixed32;
  for (int i = 0; i < 4; ++i) fixed32.push_back(static_cast<char>(bits >> (8 * i)));
  const std::string summary_value = delimited(1, tag) + varint(2 << 3 | 5) + fixed32;
  const std::string event =
      varint(2 << 3 | 0) + varint(static_cast<uint64_t>(step)) +
      delimited(5, delimited(1, summary_value));
  auto le = [](uint64_t v, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
    return out;
  };
  const std::string length = le(event.size(), 8);
  return length + le(Masked(BitwiseCrc32c(length)), 4) + event +
         le(Masked(BitwiseCrc32c(event)), 4);
}

TEST(TensorBoardExport, RestartResumesInNewFilesWithoutWritingAStepTwice) {
  TempDir tb;
  InProcessCollector collector("", server::IngestLimits(), [&](server::CollectorOptions& o) {
    o.tensorboard.dir = tb.path();
    o.tensorboard.export_all = true;
  });
  auto hook = Hook::Create(BaseOptions(collector.address(), "resumed"));
  SONDE_ASSERT_OK(hook);
  (*hook)->SetMode(v1::MODE_TRAIN);
  for (int step = 0; step < 5; ++step) TrainStep(**hook, step);
  SONDE_ASSERT_OK((*hook)->Flush(absl::Seconds(30)));

  const std::string train_dir = tb.path() + "/resumed/train";
  std::string first_file;
  uint64_t first_size = 0;
  collector.RestartInPlace([&] {
    // Everything stored was exported when the collector stopped. Then, as
    // if the collector had died after writing more but before recording
    // it, the file gets a record of a step it already has, and a torn one.
    const RunData before = ReadRun(train_dir);
    ASSERT_EQ(before.files.size(), 1u);
    EXPECT_EQ(Scalar(before, "loss", 4), static_cast<float>(TrainLoss(4)));
    first_file = before.files[0];
    first_size = std::filesystem::file_size(first_file);
    std::ofstream out(first_file, std::ios::binary | std::ios::app);
    out << StrayRecord("loss", 3, 123.0f) << std::string("\x20\0\0", 3);
  });
  // The hook reconnects on its own and the job goes on.
  for (int step = 5; step < 9; ++step) TrainStep(**hook, step);
  (*hook)->SetMode(v1::MODE_EVAL);
  for (int step = 0; step < kEvalSteps; ++step) LossStep(**hook, EvalLoss(step));
  SONDE_ASSERT_OK((*hook)->Close());
  collector.Stop();

  EXPECT_EQ(std::filesystem::file_size(first_file), first_size);
  const RunData train = ReadRun(train_dir);
  EXPECT_EQ(train.files.size(), 2u);  // the second session wrote a file of its own
  EXPECT_EQ(train.files[0], first_file);
  std::set<std::pair<std::string, int64_t>> keys;
  for (int step = 0; step < 9; ++step) {
    for (const char* tag : {"loss", "fc.weight/mean", "fc.weight/std", "fc.weight/l2",
                            "act/mean", "act/std", "act/l2", "act"}) {
      keys.insert({tag, step});
    }
  }
  EXPECT_EQ(Keys(train), keys);  // every (tag, step) exactly once across files
  for (int step = 0; step < 9; ++step) {
    EXPECT_EQ(Scalar(train, "loss", step), static_cast<float>(TrainLoss(step))) << step;
  }
  const RunData eval = ReadRun(tb.path() + "/resumed/eval");
  EXPECT_EQ(eval.files.size(), 1u);
  EXPECT_EQ(Scalar(eval, "loss", 1), static_cast<float>(EvalLoss(1)));
  KeepForManualCheck(tb.path());
}

}  // namespace
}  // namespace sonde
