#include "tests/fuzz/chunks_fuzz.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/dtype.h"
#include "common/tensor_chunks.h"
#include "proto/tensor.pb.h"
#include "tests/fuzz/fuzz_input.h"

namespace sonde::fuzz {
namespace {

// One assembler and what the harness knows it was given.
struct Tracked {
  explicit Tracked(TensorAssembler::Limits limits) : assembler(limits) {}
  TensorAssembler assembler;
  std::string accepted;     // concatenated payloads of accepted chunks
  uint32_t chunks = 0;      // accepted chunks
};

void CheckError(const absl::Status& s, const v1::TensorChunk& chunk) {
  if (s.message().empty()) {
    FuzzFail(absl::StrCat("Add refused chunk ", chunk.chunk_index(),
                          " with an empty message: ", s.ToString()));
  }
  if (s.code() != absl::StatusCode::kInvalidArgument &&
      s.code() != absl::StatusCode::kDataLoss) {
    FuzzFail(absl::StrCat("Add returned an undocumented code: ", s.ToString()));
  }
}

void CheckAccepted(const Tracked& t, const v1::TensorChunk& chunk,
                   const TensorAssembler::Limits& limits, uint64_t offset_before) {
  const TensorAssembler& a = t.assembler;
  const v1::TensorChunk& h = a.header();
  if (!a.started()) FuzzFail("Add accepted a chunk but started() is false");
  if (chunk.payload().size() > limits.max_chunk_bytes) {
    FuzzFail(absl::StrCat("accepted a payload of ", chunk.payload().size(),
                          " bytes over the chunk limit ", limits.max_chunk_bytes));
  }
  if (Crc32c(chunk.payload()) != chunk.crc32c()) {
    FuzzFail("accepted a chunk whose crc32c does not match its payload");
  }
  if (chunk.chunk_index() != t.chunks - 1) {
    FuzzFail(absl::StrCat("accepted chunk index ", chunk.chunk_index(), " as chunk number ",
                          t.chunks - 1));
  }
  if (chunk.byte_offset() != offset_before) {
    FuzzFail(absl::StrCat("accepted byte_offset ", chunk.byte_offset(), " after ",
                          offset_before, " bytes"));
  }
  if (h.tensor_name().empty() || h.tensor_name() != chunk.tensor_name()) {
    FuzzFail("the header's name is empty or differs from an accepted chunk's");
  }
  if (!h.payload().empty()) FuzzFail("the header kept a payload");
  if (a.bytes() != t.accepted) {
    FuzzFail("the assembled bytes are not the accepted payloads in order");
  }
  if (a.bytes().size() > h.total_bytes() || a.bytes().size() > limits.max_tensor_bytes) {
    FuzzFail(absl::StrCat("holding ", a.bytes().size(), " bytes; total_bytes ", h.total_bytes(),
                          ", limit ", limits.max_tensor_bytes));
  }
  if (t.chunks > h.chunk_count()) {
    FuzzFail(absl::StrCat(t.chunks, " chunks accepted of chunk_count ", h.chunk_count()));
  }
  if (a.complete()) {
    auto expected = TensorBytes(h.dtype(), h.shape());
    if (!expected.ok() || *expected != h.total_bytes()) {
      FuzzFail(absl::StrCat("complete with total_bytes ", h.total_bytes(),
                            " that dtype and shape do not give"));
    }
    if (a.bytes().size() != h.total_bytes() || t.chunks != h.chunk_count()) {
      FuzzFail(absl::StrCat("complete with ", a.bytes().size(), " of ", h.total_bytes(),
                            " bytes in ", t.chunks, " of ", h.chunk_count(), " chunks"));
    }
  } else if (t.chunks == h.chunk_count()) {
    FuzzFail("every chunk accepted but the tensor is not complete");
  }
}

// Split the input as a tensor, then put it back together.
void RoundTrip(absl::string_view input, uint64_t max_chunk, uint8_t settings) {
  const auto dtype = static_cast<v1::DType>(1 + (settings & 0x0f) % 10);
  const size_t width = DTypeSize(dtype);
  const uint64_t elements = input.size() / width;
  const absl::string_view bytes = input.substr(0, elements * width);

  v1::TensorChunk header;
  header.set_job("fuzz");
  header.set_step(static_cast<int64_t>(input.size()));
  header.set_mode(v1::MODE_TRAIN);
  header.set_mode_step(7);
  header.set_tensor_name("layer.weight");
  header.add_collections("weights");
  header.set_dtype(dtype);
  if ((settings & 0x10) && elements % 2 == 0 && elements > 0) {
    header.add_shape(2);
    header.add_shape(static_cast<int64_t>(elements / 2));
  } else {
    header.add_shape(static_cast<int64_t>(elements));
  }
  header.mutable_statistics()->set_count(elements);

  const std::vector<v1::TensorChunk> chunks = SplitIntoChunks(header, bytes, max_chunk);
  const uint64_t want = bytes.empty() ? 1 : (bytes.size() + max_chunk - 1) / max_chunk;
  if (chunks.size() != want) {
    FuzzFail(absl::StrCat("split ", bytes.size(), " bytes in chunks of ", max_chunk, " into ",
                          chunks.size(), " chunks, expected ", want));
  }
  TensorAssembler a(TensorAssembler::Limits{max_chunk, std::max<uint64_t>(bytes.size(), 1)});
  for (size_t i = 0; i < chunks.size(); ++i) {
    const v1::TensorChunk& c = chunks[i];
    if (c.has_statistics() != (i == 0)) {
      FuzzFail(absl::StrCat("chunk ", i, " statistics presence is wrong"));
    }
    if (c.payload().size() > max_chunk) FuzzFail("split made an oversized chunk");
    absl::Status s = a.Add(c);
    if (!s.ok()) FuzzFail(absl::StrCat("round trip: Add refused its own split: ", s.ToString()));
    if (a.complete() != (i + 1 == chunks.size())) {
      FuzzFail(absl::StrCat("round trip: complete() is ", a.complete(), " after chunk ", i,
                            " of ", chunks.size()));
    }
  }
  if (a.bytes() != bytes) FuzzFail("round trip: bytes differ");
  const v1::TensorChunk& h = a.header();
  if (h.tensor_name() != header.tensor_name() || h.step() != header.step() ||
      h.dtype() != dtype || h.statistics().count() != elements ||
      !std::equal(h.shape().begin(), h.shape().end(), header.shape().begin(),
                  header.shape().end())) {
    FuzzFail("round trip: descriptive fields differ");
  }
}

}  // namespace

ChunkOutcome RunChunkInput(const uint8_t* data, size_t size) {
  QuietProtobufLogs();
  ChunkOutcome outcome;
  FuzzReader in(data, size);
  const uint64_t max_chunk = 1 + uint64_t{in.U8()};
  const uint8_t tensor_setting = in.U8();
  const uint8_t round_trip = in.U8();

  TensorAssembler::Limits limits;
  if ((tensor_setting & kChunkDefaultLimits) == 0) {
    limits.max_chunk_bytes = max_chunk;
    limits.max_tensor_bytes = 64 * (1 + uint64_t{tensor_setting & 0x7fu});
  }

  std::optional<Tracked> t;
  FuzzReader::Record record;
  while (in.NextRecord(record)) {
    v1::TensorChunk chunk;
    if (!chunk.ParseFromArray(record.bytes.data(), static_cast<int>(record.bytes.size()))) {
      continue;
    }
    if (record.control & kChunkFixCrc) chunk.set_crc32c(Crc32c(chunk.payload()));
    if (!t.has_value() || (record.control & kChunkNewTensor)) t.emplace(limits);

    const bool was_complete = t->assembler.complete();
    const uint64_t offset_before = t->accepted.size();
    const absl::Status s = t->assembler.Add(chunk);
    if (was_complete && s.ok()) FuzzFail("Add accepted a chunk after the tensor was complete");
    if (!s.ok()) {
      CheckError(s, chunk);
      ++(s.code() == absl::StatusCode::kDataLoss ? outcome.crc_refused : outcome.refused);
      t.reset();  // "After an error the assembler must be discarded."
      continue;
    }
    t->accepted.append(chunk.payload());
    ++t->chunks;
    CheckAccepted(*t, chunk, limits, offset_before);
    ++outcome.accepted;
    if (t->assembler.complete()) ++outcome.completed;
  }

  RoundTrip(absl::string_view(reinterpret_cast<const char*>(data), size), max_chunk,
            round_trip);
  return outcome;
}

int FuzzTensorChunks(const uint8_t* data, size_t size) {
  RunChunkInput(data, size);
  return 0;
}

}  // namespace sonde::fuzz
