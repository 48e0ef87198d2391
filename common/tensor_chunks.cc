#include "common/tensor_chunks.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/dtype.h"

namespace sonde {

std::vector<v1::TensorChunk> SplitIntoChunks(const v1::TensorChunk& header,
                                             absl::string_view bytes,
                                             uint64_t max_chunk_bytes) {
  if (max_chunk_bytes == 0) max_chunk_bytes = 1;
  const uint64_t total = bytes.size();
  const uint32_t count =
      total == 0 ? 1 : static_cast<uint32_t>((total + max_chunk_bytes - 1) / max_chunk_bytes);
  std::vector<v1::TensorChunk> chunks;
  chunks.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    v1::TensorChunk c = header;
    if (i > 0) {
      c.clear_statistics();
      c.clear_histogram();
    }
    const uint64_t offset = uint64_t{i} * max_chunk_bytes;
    const uint64_t n = std::min<uint64_t>(max_chunk_bytes, total - offset);
    c.set_chunk_index(i);
    c.set_chunk_count(count);
    c.set_byte_offset(offset);
    c.set_total_bytes(total);
    c.set_payload(bytes.data() + offset, n);
    c.set_crc32c(Crc32cExtend(0, bytes.data() + offset, n));
    chunks.push_back(std::move(c));
  }
  return chunks;
}

std::string TensorAssembler::Describe(const v1::TensorChunk& c) const {
  return absl::StrCat("chunk ", c.chunk_index(), " of tensor '", c.tensor_name(),
                      "' at step ", c.step());
}

namespace {

// Fields that must not change between chunks of one tensor.
bool SameDescription(const v1::TensorChunk& a, const v1::TensorChunk& b) {
  return a.tensor_name() == b.tensor_name() && a.step() == b.step() &&
         a.mode() == b.mode() && a.mode_step() == b.mode_step() &&
         a.dtype() == b.dtype() && a.chunk_count() == b.chunk_count() &&
         a.total_bytes() == b.total_bytes() &&
         std::equal(a.shape().begin(), a.shape().end(), b.shape().begin(),
                    b.shape().end());
}

}  // namespace

absl::Status TensorAssembler::Add(const v1::TensorChunk& chunk) {
  const std::string where = Describe(chunk);
  if (complete_) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": tensor already complete"));
  }
  if (!started_) {
    if (chunk.tensor_name().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": empty tensor name"));
    }
    if (chunk.chunk_count() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": chunk_count is 0"));
    }
    auto expected = TensorBytes(chunk.dtype(), chunk.shape());
    if (!expected.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", expected.status().message()));
    }
    if (*expected != chunk.total_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": ", DTypeName(chunk.dtype()), " tensor of shape ",
          ShapeString(chunk.shape()), " needs ", *expected,
          " bytes, total_bytes says ", chunk.total_bytes()));
    }
    if (chunk.total_bytes() > limits_.max_tensor_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", chunk.total_bytes(),
                       " bytes exceeds the limit of ", limits_.max_tensor_bytes));
    }
    const uint64_t min_chunks =
        chunk.total_bytes() == 0
            ? 1
            : (chunk.total_bytes() + limits_.max_chunk_bytes - 1) / limits_.max_chunk_bytes;
    if (chunk.chunk_count() < min_chunks ||
        (chunk.total_bytes() > 0 && chunk.chunk_count() > chunk.total_bytes())) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": chunk_count ", chunk.chunk_count(), " cannot carry ",
          chunk.total_bytes(), " bytes in chunks of at most ",
          limits_.max_chunk_bytes));
    }
    header_ = chunk;
    header_.clear_payload();
    header_.clear_chunk_index();
    header_.clear_byte_offset();
    header_.clear_crc32c();
    // Memory is taken as bytes arrive, not as declared: a client that
    // declares 1 GiB and sends 16 bytes holds 16 bytes (and the first
    // chunk's worth of reservation).
    bytes_.reserve(std::min<uint64_t>(chunk.total_bytes(), 2 * limits_.max_chunk_bytes));
    started_ = true;
  } else if (!SameDescription(header_, chunk)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": descriptive fields differ from chunk 0 of tensor '",
        header_.tensor_name(), "'"));
  }
  if (chunk.chunk_index() != next_index_) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": expected chunk index ", next_index_, " of ",
        header_.chunk_count()));
  }
  if (chunk.byte_offset() != bytes_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": expected byte_offset ", bytes_.size(), ", got ",
        chunk.byte_offset()));
  }
  if (chunk.payload().size() > limits_.max_chunk_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": payload of ", chunk.payload().size(),
                     " bytes exceeds the chunk limit of ", limits_.max_chunk_bytes));
  }
  if (chunk.payload().size() > header_.total_bytes() - bytes_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": payload runs past total_bytes ", header_.total_bytes()));
  }
  const uint32_t crc = Crc32c(chunk.payload());
  if (crc != chunk.crc32c()) {
    return absl::DataLossError(absl::StrCat(where, ": crc32c mismatch (computed ",
                                            crc, ", sent ", chunk.crc32c(), ")"));
  }
  bytes_.append(chunk.payload());
  ++next_index_;
  if (next_index_ == header_.chunk_count()) {
    if (bytes_.size() != header_.total_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": last chunk leaves the tensor at ", bytes_.size(), " of ",
          header_.total_bytes(), " bytes"));
    }
    complete_ = true;
  }
  return absl::OkStatus();
}

}  // namespace sonde
