// TFRecord framing, the container of TensorBoard's event files: each record
// is its length (u64, little-endian), the masked CRC-32C of those 8 bytes,
// the data, and the masked CRC-32C of the data (both CRCs u32,
// little-endian). Masking (rotate right by 15, add 0xa282ead8) keeps a CRC
// of bytes that themselves hold CRCs from being degenerate. Stateless and
// thread-safe.
#ifndef SONDE_SERVER_TENSORBOARD_TFRECORD_H_
#define SONDE_SERVER_TENSORBOARD_TFRECORD_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace sonde::server::tensorboard {

// Bytes a record adds around its data.
inline constexpr size_t kTfRecordOverhead = 8 + 4 + 4;

uint32_t MaskCrc32c(uint32_t crc);

// Appends one framed record holding `data` to `out`.
void AppendTfRecord(std::string& out, absl::string_view data);

}  // namespace sonde::server::tensorboard

#endif  // SONDE_SERVER_TENSORBOARD_TFRECORD_H_
