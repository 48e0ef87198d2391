// CRC-32C (Castagnoli), the checksum carried by every tensor chunk.
// Uses the SSE4.2 crc32 instruction when the CPU has it (three streams at
// once, joined by zero-append operators), a table otherwise.
// Thread-safe; no state.
#ifndef SONDE_COMMON_CRC32C_H_
#define SONDE_COMMON_CRC32C_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace sonde {

// Extends `crc` (the CRC of earlier bytes, 0 for none) with `n` more bytes.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

inline uint32_t Crc32c(absl::string_view data) {
  return Crc32cExtend(0, data.data(), data.size());
}

}  // namespace sonde

#endif  // SONDE_COMMON_CRC32C_H_
