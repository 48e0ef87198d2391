#include "common/crc32c.h"

#include <string>

#include "gtest/gtest.h"

namespace sonde {
namespace {

TEST(Crc32c, MatchesRfc3720TestVectors) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending.push_back(static_cast<char>(i));
  EXPECT_EQ(Crc32c(ascending), 0x46DD794Eu);
}

TEST(Crc32c, EmptyInputIsZero) { EXPECT_EQ(Crc32c(""), 0u); }

TEST(Crc32c, ExtendingPiecewiseEqualsWhole) {
  std::string data;
  for (int i = 0; i < 1000; ++i) data.push_back(static_cast<char>(i * 31 + 7));
  const uint32_t whole = Crc32c(data);
  for (size_t split : {0, 1, 7, 8, 9, 500, 999, 1000}) {
    uint32_t c = Crc32cExtend(0, data.data(), split);
    c = Crc32cExtend(c, data.data() + split, data.size() - split);
    EXPECT_EQ(c, whole) << "split at " << split;
  }
}

// A bit at a time, straight from the definition: what every fast path
// (slicing tables, the crc32 instruction, three streams joined) must equal.
uint32_t Reference(const std::string& data) {
  uint32_t c = 0xffffffffu;
  for (unsigned char byte : data) {
    c ^= byte;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1) ? 0x82f63b78u : 0);
  }
  return ~c;
}

TEST(Crc32c, EqualsTheDefinitionAcrossEveryBlockBoundary) {
  std::string data(3 * 8192 * 3 + 3 * 256 * 2 + 100, '\0');
  uint32_t x = 12345;
  for (char& ch : data) {
    x = x * 1103515245u + 12345u;
    ch = static_cast<char>(x >> 24);
  }
  // Around one and two rounds of three 8 KiB blocks and of three 256-byte
  // ones, and whatever is left over; at every alignment of the start.
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{255}, size_t{767},
                   size_t{768}, size_t{769}, size_t{1543}, size_t{1544}, size_t{24575},
                   size_t{24576}, size_t{24577}, size_t{24576 + 768 + 9}, size_t{49152},
                   size_t{49152 + 1536 + 15}}) {
    for (size_t offset = 0; offset < 8; ++offset) {
      const std::string piece = data.substr(offset, n);
      ASSERT_EQ(Crc32c(piece), Reference(piece)) << n << " bytes from " << offset;
    }
  }
  // Extending across a boundary equals the whole.
  const std::string whole = data.substr(3, 24576 + 800);
  const uint32_t head = Crc32c(whole.substr(0, 1000));
  EXPECT_EQ(Crc32cExtend(head, whole.data() + 1000, whole.size() - 1000), Reference(whole));
}

TEST(Crc32c, DetectsSingleBitFlip) {
  std::string data(4096, 'a');
  const uint32_t before = Crc32c(data);
  data[2048] ^= 0x10;
  EXPECT_NE(Crc32c(data), before);
}

}  // namespace
}  // namespace sonde
