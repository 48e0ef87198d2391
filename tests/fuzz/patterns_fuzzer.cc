// libFuzzer entry point of the patterns target (see patterns_fuzz.h).
#include <cstddef>
#include <cstdint>

#include "tests/fuzz/patterns_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return sonde::fuzz::FuzzPatterns(data, size);
}
