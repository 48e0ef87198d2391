// Fuzz target for tensor chunking and reassembly (common/tensor_chunks.h).
//
// Input (see fuzz_input.h for the record format):
//   byte 0   the assembler's max_chunk_bytes minus 1 (1..256)
//   byte 1   bit 7: the production default limits (4 MiB chunks, 2 GiB
//            tensors) instead of bits 0-6: max_tensor_bytes = 64 * (1 + v)
//   byte 2   round trip: dtype (low nibble) and a 2-D shape (bit 4)
//   records  each a serialized sonde.v1.TensorChunk, fed in order to one
//            TensorAssembler; control bits below.
// Properties checked (a violation aborts):
//   - Add never crashes; every error is InvalidArgument or DataLoss with a
//     message, and the assembler is then discarded as its contract says;
//   - every accepted chunk is within the limits, in order (index, offset),
//     and its payload matches its crc32c;
//   - the bytes held are exactly the accepted payloads, never more than
//     total_bytes or max_tensor_bytes;
//   - complete() means chunk_count chunks carried total_bytes bytes, the
//     number dtype and shape need; a chunk after that is refused;
//   - SplitIntoChunks of the whole input (as a tensor of the chosen dtype)
//     reassembles to the same bytes and fields, with statistics on chunk 0
//     only.
#ifndef SONDE_TESTS_FUZZ_CHUNKS_FUZZ_H_
#define SONDE_TESTS_FUZZ_CHUNKS_FUZZ_H_

#include <cstddef>
#include <cstdint>

namespace sonde::fuzz {

// Record control bits.
inline constexpr uint8_t kChunkFixCrc = 1 << 0;     // replace crc32c with the payload's
inline constexpr uint8_t kChunkNewTensor = 1 << 1;  // discard the assembler first

// Settings byte 1.
inline constexpr uint8_t kChunkDefaultLimits = 1 << 7;

// What one input did, for tests that check a seed reaches what it is for.
struct ChunkOutcome {
  int accepted = 0;     // chunks Add accepted
  int refused = 0;      // chunks Add refused with InvalidArgument
  int crc_refused = 0;  // chunks Add refused for their CRC (DataLoss)
  int completed = 0;    // tensors completed
};

// Runs one input, checking every property; aborts on a violation.
ChunkOutcome RunChunkInput(const uint8_t* data, size_t size);

// The libFuzzer entry point: RunChunkInput, returning 0.
int FuzzTensorChunks(const uint8_t* data, size_t size);

}  // namespace sonde::fuzz

#endif  // SONDE_TESTS_FUZZ_CHUNKS_FUZZ_H_
