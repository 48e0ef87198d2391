#include "tests/fuzz/fuzz_input.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "google/protobuf/stubs/logging.h"

namespace sonde::fuzz {

uint8_t FuzzReader::U8() {
  if (in_.empty()) return 0;
  const auto v = static_cast<uint8_t>(in_[0]);
  in_.remove_prefix(1);
  return v;
}

uint16_t FuzzReader::U16() {
  const uint16_t lo = U8();
  const uint16_t hi = U8();
  return static_cast<uint16_t>(lo | (hi << 8));
}

uint32_t FuzzReader::U32() {
  const uint32_t lo = U16();
  const uint32_t hi = U16();
  return lo | (hi << 16);
}

uint64_t FuzzReader::U64() {
  const uint64_t lo = U32();
  const uint64_t hi = U32();
  return lo | (hi << 32);
}

absl::string_view FuzzReader::Bytes(size_t n) {
  const absl::string_view out = in_.substr(0, std::min(n, in_.size()));
  in_.remove_prefix(out.size());
  return out;
}

bool FuzzReader::NextRecord(Record& record) {
  if (in_.empty()) return false;
  record.control = U8();
  const uint16_t length = U16();
  record.bytes = Bytes(length);
  return true;
}

void AppendRecord(std::string& out, uint8_t control, absl::string_view bytes) {
  const size_t n = std::min<size_t>(bytes.size(), 0xffff);
  out.push_back(static_cast<char>(control));
  out.push_back(static_cast<char>(n & 0xff));
  out.push_back(static_cast<char>(n >> 8));
  out.append(bytes.data(), n);
}

void AppendU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void QuietProtobufLogs() {
  static const bool quiet = [] {
    google::protobuf::SetLogHandler(nullptr);
    return true;
  }();
  (void)quiet;
}

void FuzzFail(const std::string& what) {
  std::fprintf(stderr, "FUZZ PROPERTY VIOLATED: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace sonde::fuzz
