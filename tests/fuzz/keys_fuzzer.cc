// libFuzzer entry point of the keys target (see keys_fuzz.h).
#include <cstddef>
#include <cstdint>

#include "tests/fuzz/keys_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return sonde::fuzz::FuzzStorageKeys(data, size);
}
