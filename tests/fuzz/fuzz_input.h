// How Sonde's fuzz targets read their input, and how the seed generator
// writes it. An input is a few leading bytes of settings, then records of
// [control u8][length u16, little endian][bytes]. A reader never fails: past
// the end it yields zeros and empty records, so every byte string is a valid
// input and mutations stay meaningful.
//
// Also FuzzFail: a fuzz target's property check that aborts, which libFuzzer
// reports as a crash and the corpus replay test as a dead test binary.
// Not thread-safe (plain values); no global state.
#ifndef SONDE_TESTS_FUZZ_FUZZ_INPUT_H_
#define SONDE_TESTS_FUZZ_FUZZ_INPUT_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace sonde::fuzz {

class FuzzReader {
 public:
  FuzzReader(const uint8_t* data, size_t size)
      : in_(reinterpret_cast<const char*>(data), size) {}
  explicit FuzzReader(absl::string_view in) : in_(in) {}

  bool empty() const { return in_.empty(); }
  absl::string_view rest() const { return in_; }

  uint8_t U8();
  uint16_t U16();  // little endian
  uint32_t U32();
  uint64_t U64();
  // Up to `n` bytes (fewer at the end of the input).
  absl::string_view Bytes(size_t n);

  struct Record {
    uint8_t control = 0;
    absl::string_view bytes;
  };
  // The next record; false when the input is used up.
  bool NextRecord(Record& record);

 private:
  absl::string_view in_;
};

// Appends one record in the format NextRecord reads. `bytes` longer than
// 65535 are cut (the seed generator never writes such).
void AppendRecord(std::string& out, uint8_t control, absl::string_view bytes);
void AppendU64(std::string& out, uint64_t v);  // the order U64() reads

// Silences protobuf's log lines (an invalid UTF-8 string field is logged
// before the parse fails: noise at thousands of inputs a second). Call it
// first thing in a target; only the first call does anything.
void QuietProtobufLogs();

// Prints `what` to stderr and aborts: a property of the code under test
// does not hold.
[[noreturn]] void FuzzFail(const std::string& what);

}  // namespace sonde::fuzz

#endif  // SONDE_TESTS_FUZZ_FUZZ_INPUT_H_
