#include "server/tensorboard/tfrecord.h"

#include <cstdint>
#include <string>

#include "common/crc32c.h"
#include "gtest/gtest.h"

namespace sonde::server::tensorboard {
namespace {

uint32_t LittleEndian32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(s[at + i]);
  return v;
}

TEST(TfRecord, Crc32cIsCastagnoli) {
  // The check value of CRC-32C (RFC 3720), the checksum TFRecord uses.
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
}

TEST(TfRecord, MaskRotatesRightBy15AndAddsTheDelta) {
  EXPECT_EQ(MaskCrc32c(0), 0xa282ead8u);
  EXPECT_EQ(MaskCrc32c(0xFFFFFFFFu), 0xa282ead7u);  // the sum wraps around
  EXPECT_EQ(MaskCrc32c(0xE3069283u), 0xc78ab0e5u);
  EXPECT_EQ(MaskCrc32c(0x00008000u), 0xa282ead9u);  // bit 15 lands on bit 0
}

TEST(TfRecord, FramesLengthDataAndMaskedChecksums) {
  std::string out;
  AppendTfRecord(out, "hello");
  ASSERT_EQ(out.size(), kTfRecordOverhead + 5);
  EXPECT_EQ(out.substr(0, 8), std::string("\x05\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(LittleEndian32(out, 8), 0x3e04b2eau);  // masked CRC of the 8 length bytes
  EXPECT_EQ(out.substr(12, 5), "hello");
  EXPECT_EQ(LittleEndian32(out, 17), 0x191c1fbbu);  // masked CRC of "hello"
}

TEST(TfRecord, EmptyRecordAndAppendingKeepEarlierRecords) {
  std::string out = "prefix";
  AppendTfRecord(out, "");
  ASSERT_EQ(out.size(), 6 + kTfRecordOverhead);
  EXPECT_EQ(out.substr(0, 6), "prefix");
  EXPECT_EQ(out.substr(6, 8), std::string(8, '\0'));
  EXPECT_EQ(LittleEndian32(out, 14), 0x07980329u);
  EXPECT_EQ(LittleEndian32(out, 18), 0xa282ead8u);  // CRC of nothing is 0
  const std::string data(70000, 'x');
  AppendTfRecord(out, data);
  EXPECT_EQ(out.size(), 6 + 2 * kTfRecordOverhead + data.size());
  EXPECT_EQ(static_cast<uint8_t>(out[6 + kTfRecordOverhead + 0]), 70000 & 0xFF);
  EXPECT_EQ(static_cast<uint8_t>(out[6 + kTfRecordOverhead + 1]), (70000 >> 8) & 0xFF);
  EXPECT_EQ(static_cast<uint8_t>(out[6 + kTfRecordOverhead + 2]), (70000 >> 16) & 0xFF);
}

}  // namespace
}  // namespace sonde::server::tensorboard
