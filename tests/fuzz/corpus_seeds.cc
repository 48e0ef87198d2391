#include "tests/fuzz/corpus_seeds.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "common/crc32c.h"
#include "common/tensor_chunks.h"
#include "stats/histogram.h"
#include "stats/statistics.h"
#include "proto/collector.pb.h"
#include "storage/keys.h"
#include "tests/fuzz/chunks_fuzz.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/ingest_fuzz.h"
#include "tests/fuzz/keys_fuzz.h"
#include "tests/fuzz/patterns_fuzz.h"

namespace sonde::fuzz {
namespace {

std::string F32Bytes(const std::vector<float>& values) {
  std::string out(values.size() * sizeof(float), '\0');
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

const std::vector<float> kWeights = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};

v1::TensorChunk Header(const std::string& name, int64_t step, std::vector<int64_t> shape,
                       v1::DType dtype = v1::DTYPE_F32) {
  v1::TensorChunk h;
  h.set_tensor_name(name);
  h.set_step(step);
  h.set_mode(v1::MODE_TRAIN);
  h.set_mode_step(step);
  h.set_dtype(dtype);
  for (int64_t d : shape) h.add_shape(d);
  h.add_collections("weights");
  return h;
}

std::string Settings(std::initializer_list<uint8_t> bytes) {
  std::string out;
  for (uint8_t b : bytes) out.push_back(static_cast<char>(b));
  return out;
}

void AddChunks(std::string& out, const std::vector<v1::TensorChunk>& chunks,
               uint8_t control = 0) {
  for (const v1::TensorChunk& c : chunks) AppendRecord(out, control, c.SerializeAsString());
}

// --- chunks ---

std::vector<Seed> MakeChunkSeeds() {
  std::vector<Seed> seeds;
  // Assembler limits: 16-byte chunks, 64-byte tensors; round trip as F32.
  const std::string small = Settings({15, 0, 0});
  const auto three = SplitIntoChunks(Header("fc1.weight", 3, {2, 5}), F32Bytes(kWeights), 16);

  {
    std::string s = small;
    AddChunks(s, three);
    seeds.push_back({"seed-three-chunks-f32", s});
  }
  {
    // The production limits, one chunk of a float64 scalar, round trip in
    // 2-D bfloat16.
    std::string s = Settings({255, kChunkDefaultLimits, 0x13});
    AddChunks(s, SplitIntoChunks(Header("loss", 9, {}, v1::DTYPE_F64), std::string(8, '\x3f'),
                                 4 << 20));
    seeds.push_back({"seed-default-limits-scalar", s});
  }
  {
    std::string s = small;
    AddChunks(s, SplitIntoChunks(Header("empty", 0, {0, 4}), "", 16));
    seeds.push_back({"seed-empty-tensor", s});
  }
  {
    // A corrupted payload, refused; then the same chunk with its CRC fixed.
    v1::TensorChunk bad = three[0];
    bad.mutable_payload()->at(0) ^= 0x40;
    std::string s = small;
    AppendRecord(s, 0, bad.SerializeAsString());
    AppendRecord(s, kChunkFixCrc | kChunkNewTensor, bad.SerializeAsString());
    seeds.push_back({"seed-crc-mismatch-then-fixed", s});
  }
  {
    std::string s = small;
    AddChunks(s, {three[0], three[2], three[1]});
    seeds.push_back({"seed-out-of-order", s});
  }
  {
    // Two tensors back to back, and a chunk after the first is complete.
    std::string s = small;
    AddChunks(s, three);
    AppendRecord(s, 0, three[2].SerializeAsString());
    AddChunks(s, SplitIntoChunks(Header("b", 3, {3}, v1::DTYPE_I16), "abcdef", 4));
    seeds.push_back({"seed-two-tensors-and-extra-chunk", s});
  }
  {
    v1::TensorChunk changed = three[1];
    changed.set_dtype(v1::DTYPE_I32);
    std::string s = small;
    AddChunks(s, {three[0], changed, three[2]});
    seeds.push_back({"seed-fields-change-between-chunks", s});
  }
  {
    // One 40-byte chunk against a 16-byte chunk limit.
    std::string s = small;
    AddChunks(s, SplitIntoChunks(Header("fc1.weight", 3, {2, 5}), F32Bytes(kWeights), 64));
    seeds.push_back({"seed-oversized-chunk", s});
  }
  {
    // A shape that needs more than 2^64 bytes.
    std::string s = small;
    v1::TensorChunk c = three[0];
    c.clear_shape();
    c.add_shape(int64_t{1} << 40);
    c.add_shape(int64_t{1} << 30);
    AppendRecord(s, 0, c.SerializeAsString());
    seeds.push_back({"seed-shape-overflow", s});
  }
  return seeds;
}

// --- keys ---

void AppendKeyFields(std::string& out, uint64_t job, uint8_t mode, int64_t step, int32_t worker,
                     uint32_t piece, const std::string& name) {
  AppendU64(out, job);
  out.push_back(static_cast<char>(mode));
  AppendU64(out, static_cast<uint64_t>(step));
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((worker >> (8 * i)) & 0xff));
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((piece >> (8 * i)) & 0xff));
  out.push_back(static_cast<char>(name.size()));
  out.append(name);
}

std::vector<Seed> MakeKeySeeds() {
  std::vector<Seed> seeds;
  const storage::TensorKey key{7, 1, 120, "fc1.weight", 3};
  seeds.push_back({"seed-stats-key", storage::StatsKey(key)});
  seeds.push_back({"seed-payload-key", storage::PayloadKey(key, 2)});
  seeds.push_back({"seed-series-key", storage::SeriesKey(key)});
  {
    const std::string k = storage::StatsKey(key);
    seeds.push_back({"seed-truncated-stats-key", k.substr(0, k.size() - 2)});
  }
  {
    std::string s(1, static_cast<char>(kKeySameJob | kKeySameMode | kKeySameStep |
                                       kKeySameWorker | kKeyNameExtends));
    AppendKeyFields(s, 7, 1, 120, 0, 0, "fc1");
    AppendKeyFields(s, 8, 2, 121, 1, 1, "0");
    seeds.push_back({"seed-name-prefix-fc1-fc10", s});
  }
  {
    std::string s(1, static_cast<char>(kKeySameJob | kKeySameMode | kKeySameName));
    AppendKeyFields(s, 7, 1, -1, -5, 0, "loss");
    AppendKeyFields(s, 7, 1, 1, 5, 1, "loss");
    seeds.push_back({"seed-negative-steps-and-workers", s});
  }
  {
    std::string s(1, static_cast<char>(kKeySameMode | kKeySameStep | kKeySameName));
    AppendKeyFields(s, 0xffffffffffffffffull, 0xff, -1, -1, 0xffffffffu, std::string(3, '\xff'));
    AppendKeyFields(s, 0xfffffffffffffffeull, 0, 0, 0, 0, "");
    seeds.push_back({"seed-adjacent-jobs-all-ff", s});
  }
  {
    std::string s(1, 0);
    AppendKeyFields(s, 1, 1, 1, 1, 1, std::string("a\0b", 3));
    AppendKeyFields(s, 1, 1, 1, 1, 1, "a");
    seeds.push_back({"seed-name-with-nul", s});
  }
  return seeds;
}

// --- ingest ---

v1::ClientMessage HelloMessage(const std::string& job, int32_t worker, int32_t world_size,
                               uint64_t client_id = 0) {
  v1::ClientMessage m;
  v1::Hello* h = m.mutable_hello();
  h->set_job(job);
  h->set_worker(worker);
  h->set_world_size(world_size);
  h->set_client_version("fuzz-seed");
  h->set_client_id(client_id);
  return m;
}

v1::ClientMessage ChunkMessage(const v1::TensorChunk& c) {
  v1::ClientMessage m;
  *m.mutable_chunk() = c;
  return m;
}

v1::ClientMessage StepEndMessage(int64_t step, uint32_t tensor_count) {
  v1::ClientMessage m;
  v1::StepEnd* e = m.mutable_step_end();
  e->set_step(step);
  e->set_mode(v1::MODE_TRAIN);
  e->set_mode_step(step);
  e->set_duration_seconds(0.25);
  e->set_tensor_count(tensor_count);
  return m;
}

v1::ClientMessage JobEndMessage() {
  v1::ClientMessage m;
  m.mutable_job_end()->set_reason("finished");
  return m;
}

v1::ClientMessage LossSummary(int64_t step, float value) {
  v1::ClientMessage m;
  v1::TensorSummary* s = m.mutable_summary();
  s->set_step(step);
  s->set_mode(v1::MODE_TRAIN);
  s->set_mode_step(step);
  s->set_tensor_name("loss");
  s->add_collections("losses");
  s->set_dtype(v1::DTYPE_F32);
  s->add_shape(1);
  auto stats = ComputeStatistics(F32Bytes({value}), v1::DTYPE_F32);
  if (stats.ok()) *s->mutable_statistics() = *stats;
  return m;
}

void Add(std::string& out, const v1::ClientMessage& m, uint8_t control = 0) {
  AppendRecord(out, control, m.SerializeAsString());
}

// One step of worker traffic: a 2x5 F32 tensor in 16-byte chunks and a loss.
void AddStep(std::string& out, int64_t step, uint8_t control = 0) {
  for (const v1::TensorChunk& c :
       SplitIntoChunks(Header("fc1.weight", step, {2, 5}), F32Bytes(kWeights), 16)) {
    Add(out, ChunkMessage(c), control);
  }
  Add(out, LossSummary(step, 1.0f / static_cast<float>(step + 1)), control);
  Add(out, StepEndMessage(step, 2), control);
}

std::vector<Seed> MakeIngestSeeds() {
  std::vector<Seed> seeds;
  // 128-byte chunks, 2 KiB tensors, 4 KiB steps, 8 tensors per step.
  const std::string small = Settings({0x7f});
  {
    std::string s = small;
    Add(s, HelloMessage("run", 0, 1));
    AddStep(s, 0);
    AddStep(s, 1);
    Add(s, JobEndMessage());
    seeds.push_back({"seed-happy-path", s});
  }
  {
    // Client statistics and a histogram on chunk 0; a rule for the job.
    std::string s = small;
    v1::ClientMessage hello = HelloMessage("stats", 0, 1);
    v1::RuleSpec* rule = hello.mutable_hello()->add_rules();
    rule->set_rule_type("ExplodingTensor");
    rule->add_actions("Log");
    Add(s, hello);
    v1::TensorChunk h = Header("fc1.weight", 0, {10});
    const std::string bytes = F32Bytes({1, -2, 3, 0, 5, 6, -7, 8, 9, 1e30f});
    auto stats = ComputeStatistics(bytes, v1::DTYPE_F32);
    if (stats.ok()) *h.mutable_statistics() = *stats;
    HistogramCounts hist = HistogramCounts::Empty(FixedSpec(-10, 10, 4));
    AccumulateHistogramScalar(hist, bytes.data(), v1::DTYPE_F32, 10);
    *h.mutable_histogram() = ToProto(hist);
    for (const v1::TensorChunk& c : SplitIntoChunks(h, bytes, 16)) Add(s, ChunkMessage(c));
    Add(s, StepEndMessage(0, 1));
    Add(s, JobEndMessage());
    seeds.push_back({"seed-statistics-histogram-rule", s});
  }
  {
    // Two workers of one job on two streams, interleaved.
    std::string s = small;
    Add(s, HelloMessage("pair", 0, 2));
    Add(s, HelloMessage("pair", 1, 2), kIngestSecondStream);
    AddStep(s, 0);
    AddStep(s, 0, kIngestSecondStream);
    AddStep(s, 1, kIngestSecondStream);
    AddStep(s, 1);
    Add(s, JobEndMessage());
    Add(s, JobEndMessage(), kIngestSecondStream);
    seeds.push_back({"seed-two-workers", s});
  }
  {
    // A client loses its stream after a step end and resends it on a new
    // stream; another stream of the same client takes the worker over.
    std::string s = small;
    Add(s, HelloMessage("resend", 0, 1, 42));
    AddStep(s, 0);
    Add(s, HelloMessage("resend", 0, 1, 42), kIngestReconnect);
    AddStep(s, 0);
    AddStep(s, 1);
    Add(s, HelloMessage("resend", 0, 1, 42), kIngestSecondStream);
    AddStep(s, 2, kIngestSecondStream);
    AddStep(s, 3);
    seeds.push_back({"seed-reconnect-resend", s});
  }
  {
    // Protocol errors, each ending its stream: a chunk before the hello, a
    // wrong seq, a bad CRC, too many tensors in a step (2 here).
    std::string s = Settings({0x3f});
    const auto chunks =
        SplitIntoChunks(Header("fc1.weight", 0, {2, 5}), F32Bytes(kWeights), 16);
    Add(s, ChunkMessage(chunks[0]));
    v1::ClientMessage hello = HelloMessage("errors", 0, 1);
    hello.set_seq(5);
    Add(s, hello, kIngestRawSeq);
    Add(s, HelloMessage("errors", 0, 1));
    v1::TensorChunk bad = chunks[0];
    bad.set_crc32c(bad.crc32c() ^ 1);
    Add(s, ChunkMessage(bad));
    Add(s, HelloMessage("errors", 0, 1));
    for (const char* name : {"a", "b", "c"}) {
      v1::ClientMessage loss = LossSummary(0, 1);
      loss.mutable_summary()->set_tensor_name(name);
      Add(s, loss);
    }
    seeds.push_back({"seed-protocol-errors", s});
  }
  {
    // The collector restarts after two steps (its registry replays them
    // from the store); the worker resumes at step 2 and finishes.
    std::string s = small;
    Add(s, HelloMessage("restart", 0, 1, 7));
    AddStep(s, 0);
    AddStep(s, 1);
    Add(s, HelloMessage("restart", 0, 1, 7), kIngestRestart);
    AddStep(s, 2);
    Add(s, JobEndMessage());
    seeds.push_back({"seed-collector-restart", s});
  }
  {
    // A NaN under a rule that stops training: the rule's verdict and its
    // StopTraining action go back through the registry.
    std::string s = small;
    v1::ClientMessage hello = HelloMessage("nan", 0, 1);
    v1::RuleSpec* rule = hello.mutable_hello()->add_rules();
    rule->set_rule_type("ExplodingTensor");
    rule->add_actions("StopTraining");
    Add(s, hello);
    const std::string bytes = F32Bytes({1, std::nanf(""), 3, 4});
    for (const v1::TensorChunk& c : SplitIntoChunks(Header("fc1.weight", 0, {4}), bytes, 16)) {
      Add(s, ChunkMessage(c));
    }
    Add(s, StepEndMessage(0, 1));
    AddStep(s, 1);
    seeds.push_back({"seed-nan-stops-training", s});
  }
  {
    // The collector's default limits, a tensor whose chunk count and size
    // disagree, then one with its CRC fixed by the harness.
    std::string s = Settings({kIngestDefaultLimits});
    Add(s, HelloMessage("defaults", 0, 1));
    v1::TensorChunk c = Header("big", 0, {1 << 20});
    c.set_chunk_count(1);
    c.set_total_bytes(4 << 20);
    c.set_payload(std::string(64, 'x'));
    Add(s, ChunkMessage(c), kIngestFixCrc);
    seeds.push_back({"seed-default-limits", s});
  }
  return seeds;
}

}  // namespace

std::vector<Seed> ChunkSeeds() { return MakeChunkSeeds(); }
std::vector<Seed> PatternSeeds() {
  auto seed = [](const std::string& pattern, const std::vector<std::string>& names) {
    std::string s;
    AppendRecord(s, kPatternRecord, pattern);
    for (const std::string& n : names) AppendRecord(s, 1, n);
    return s;
  };
  const std::vector<std::string> names = {"Net_fc1.weight", "gradient/Net_fc1.weight",
                                          "CrossEntropyLoss_output_0", "relu_output_0"};
  return {
      {"seed-plain", seed("fc1", names)},
      {"seed-anchored-class", seed("^gradient/.*fc[0-9]\\.weight$", names)},
      {"seed-alternation", seed("relu_output|[Ll]oss_.*output", names)},
      {"seed-backtracking", seed("(t*)*x", {std::string(1024, 't'), "ttx"})},
      {"seed-nested", seed(std::string(500, '(') + "a" + std::string(500, ')'), {"xa", "b"})},
      {"seed-lookahead-refused", seed("^(?!gradient).*weight", names)},
      {"seed-bad-syntax", seed("fc[1-", names)},
      {"seed-too-large", seed("\\pL{1000}\\pL{1000}\\pL{1000}", names)},
      {"seed-two-patterns", seed("bias", names) + seed("^$", {"", "x"})},
  };
}

std::vector<Seed> KeySeeds() { return MakeKeySeeds(); }
std::vector<Seed> IngestSeeds() { return MakeIngestSeeds(); }

const std::vector<FuzzTarget>& FuzzTargets() {
  static const auto* targets = new std::vector<FuzzTarget>{
      {"chunks", &FuzzTensorChunks, &ChunkSeeds},
      {"keys", &FuzzStorageKeys, &KeySeeds},
      {"ingest", &FuzzIngestSession, &IngestSeeds},
      {"patterns", &FuzzPatterns, &PatternSeeds},
  };
  return *targets;
}

}  // namespace sonde::fuzz
