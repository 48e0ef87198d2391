// libFuzzer entry point of the ingest target (see ingest_fuzz.h).
#include <cstddef>
#include <cstdint>

#include "tests/fuzz/ingest_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return sonde::fuzz::FuzzIngestSession(data, size);
}
