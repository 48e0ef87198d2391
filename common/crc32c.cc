#include "common/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace sonde {
namespace {

constexpr uint32_t kPolynomial = 0x82f63b78;  // reflected Castagnoli

struct Table {
  std::array<std::array<uint32_t, 256>, 8> t;
  Table() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1) ? kPolynomial : 0);
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
    }
  }
};

const Table& GetTable() {
  static const Table* table = new Table();
  return *table;
}

// Slicing-by-8 over the raw (pre-inverted) register.
uint32_t ExtendPortable(uint32_t c, const uint8_t* p, size_t n) {
  const auto& t = GetTable().t;
  while (n >= 8) {
    uint32_t lo;
    uint32_t hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^
        t[4][lo >> 24] ^ t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^
        t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xff];
  return c;
}

#if defined(__x86_64__)
// The crc32 instruction takes three cycles and can start one a cycle, so
// three independent streams run at once: the input is cut into three
// adjacent blocks, each folded into a register of its own from zero, and
// the registers are joined by "appending" a block's length of zero bytes
// to the one before (a linear operator on the register, applied through
// tables) and XORing the next in. kLong and kShort must be powers of two.
constexpr size_t kLong = 8192;
constexpr size_t kShort = 256;

// 32x32 matrices over GF(2), as 32 columns.
uint32_t Gf2Times(const uint32_t* matrix, uint32_t vector) {
  uint32_t sum = 0;
  for (int i = 0; vector != 0; ++i, vector >>= 1) {
    if (vector & 1) sum ^= matrix[i];
  }
  return sum;
}

void Gf2Square(uint32_t* square, const uint32_t* matrix) {
  for (int i = 0; i < 32; ++i) square[i] = Gf2Times(matrix, matrix[i]);
}

// Appending `bytes` (a power of two) zero bytes to a raw register, as four
// byte-indexed tables.
struct ZerosTable {
  std::array<std::array<uint32_t, 256>, 4> t;
  explicit ZerosTable(size_t bytes) {
    uint32_t op[32], next[32];
    op[0] = kPolynomial;  // one zero bit
    for (int i = 1; i < 32; ++i) op[i] = uint32_t{1} << (i - 1);
    // Square 3 times for one zero byte, then once per doubling.
    for (size_t bits = 1; bits < bytes * 8; bits *= 2) {
      Gf2Square(next, op);
      std::memcpy(op, next, sizeof(op));
    }
    for (uint32_t b = 0; b < 256; ++b) {
      for (int k = 0; k < 4; ++k) t[k][b] = Gf2Times(op, b << (8 * k));
    }
  }
  uint32_t Shift(uint32_t c) const {
    return t[0][c & 0xff] ^ t[1][(c >> 8) & 0xff] ^ t[2][(c >> 16) & 0xff] ^ t[3][c >> 24];
  }
};

const ZerosTable& LongZeros() {
  static const ZerosTable* table = new ZerosTable(kLong);
  return *table;
}

const ZerosTable& ShortZeros() {
  static const ZerosTable* table = new ZerosTable(kShort);
  return *table;
}

__attribute__((target("sse4.2"))) uint64_t Fold8(uint64_t c, const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return _mm_crc32_u64(c, v);
}

// Three blocks of `block` bytes at once, while they last.
__attribute__((target("sse4.2"))) uint64_t FoldThreeWays(uint64_t c0, const uint8_t*& p,
                                                          size_t& n, size_t block,
                                                          const ZerosTable& zeros) {
  while (n >= 3 * block) {
    uint64_t c1 = 0, c2 = 0;
    for (size_t i = 0; i < block; i += 8) {
      c0 = Fold8(c0, p + i);
      c1 = Fold8(c1, p + block + i);
      c2 = Fold8(c2, p + 2 * block + i);
    }
    c0 = zeros.Shift(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1);
    c0 = zeros.Shift(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c2);
    p += 3 * block;
    n -= 3 * block;
  }
  return c0;
}

__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t c,
                                                        const uint8_t* p,
                                                        size_t n) {
  uint64_t c64 = c;
  c64 = FoldThreeWays(c64, p, n, kLong, LongZeros());
  c64 = FoldThreeWays(c64, p, n, kShort, ShortZeros());
  while (n >= 8) {
    c64 = Fold8(c64, p);
    p += 8;
    n -= 8;
  }
  c = static_cast<uint32_t>(c64);
  while (n--) c = _mm_crc32_u8(c, *p++);
  return c;
}

bool HasSse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
#if defined(__x86_64__)
  if (HasSse42()) return ~ExtendSse42(c, p, n);
#endif
  return ~ExtendPortable(c, p, n);
}

}  // namespace sonde
