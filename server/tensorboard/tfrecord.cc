#include "server/tensorboard/tfrecord.h"

#include "common/crc32c.h"

namespace sonde::server::tensorboard {
namespace {

void AppendLittleEndian(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

}  // namespace

uint32_t MaskCrc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

void AppendTfRecord(std::string& out, absl::string_view data) {
  const size_t length_at = out.size();
  AppendLittleEndian(out, data.size(), 8);
  const uint32_t length_crc = MaskCrc32c(Crc32cExtend(0, out.data() + length_at, 8));
  AppendLittleEndian(out, length_crc, 4);
  out.append(data.data(), data.size());
  AppendLittleEndian(out, MaskCrc32c(Crc32c(data)), 4);
}

}  // namespace sonde::server::tensorboard
