// Splitting a tensor into TensorChunk messages and putting them back
// together with every check the wire format allows: order, offsets, byte
// counts against dtype and shape, CRC-32C, and consistent descriptive fields.
// A TensorAssembler is not thread-safe; use one per tensor in flight.
#ifndef SONDE_COMMON_TENSOR_CHUNKS_H_
#define SONDE_COMMON_TENSOR_CHUNKS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/tensor.pb.h"

namespace sonde {

// `header` supplies every descriptive field (job, worker, step, mode, name,
// collections, dtype, shape, statistics); payload, offsets, counts and CRCs
// are filled in here. Statistics go on chunk 0 only. A tensor with no bytes
// still travels as one (empty) chunk.
std::vector<v1::TensorChunk> SplitIntoChunks(const v1::TensorChunk& header,
                                             absl::string_view bytes,
                                             uint64_t max_chunk_bytes);

class TensorAssembler {
 public:
  struct Limits {
    // Largest payload of one chunk. Default 4 MiB.
    uint64_t max_chunk_bytes = 4 << 20;
    // Largest tensor. Default 2 GiB.
    uint64_t max_tensor_bytes = uint64_t{2} << 30;
  };

  TensorAssembler() : TensorAssembler(Limits()) {}
  explicit TensorAssembler(Limits limits) : limits_(limits) {}

  // Adds the next chunk. Errors: InvalidArgument for malformed or
  // out-of-order chunks and mismatched fields, DataLoss for a CRC mismatch.
  // After an error the assembler must be discarded.
  absl::Status Add(const v1::TensorChunk& chunk);

  bool started() const { return started_; }
  // True once the last chunk has arrived and every byte is accounted for.
  bool complete() const { return complete_; }

  // Chunks accepted so far.
  uint32_t chunks_received() const { return next_index_; }
  // Chunk 0 with an empty payload: the tensor's descriptive fields.
  const v1::TensorChunk& header() const { return header_; }
  const std::string& bytes() const { return bytes_; }
  std::string TakeBytes() { return std::move(bytes_); }

 private:
  std::string Describe(const v1::TensorChunk& chunk) const;

  Limits limits_;
  bool started_ = false;
  bool complete_ = false;
  v1::TensorChunk header_;
  std::string bytes_;
  uint32_t next_index_ = 0;
};

}  // namespace sonde

#endif  // SONDE_COMMON_TENSOR_CHUNKS_H_
