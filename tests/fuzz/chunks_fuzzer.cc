// libFuzzer entry point of the chunks target (see chunks_fuzz.h).
#include <cstddef>
#include <cstdint>

#include "tests/fuzz/chunks_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return sonde::fuzz::FuzzTensorChunks(data, size);
}
