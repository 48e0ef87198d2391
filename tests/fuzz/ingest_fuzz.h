// Fuzz target for the ingest protocol (server/ingest_session.h) over a real
// JobRegistry and a real RocksDB Store.
//
// Input (see fuzz_input.h for the record format):
//   byte 0   limits: bit 7 the collector's defaults (IngestLimits()), else
//            small ones the fuzzer can reach (bits 0-6, see LimitsFor)
//   records  each a serialized sonde.v1.ClientMessage, delivered the way the
//            reactor in server/collector_service.cc delivers it: OnMessage,
//            then Join / Commit / EndJob when it asks for one; an error ends
//            that stream (Close), and the stream's next message opens a new
//            one (a reconnect); a record may also restart the collector
//            (a new JobRegistry over the same Store). Control bits below.
// Each input runs against its own JobRegistry; job names get a suffix that
// is unique to the input, so inputs never see each other's jobs in the
// Store, which is opened once per process in a temporary directory (and
// started afresh every few thousand inputs to bound its size).
// Properties checked (a violation aborts):
//   - nothing crashes (ASan/UBSan in the libFuzzer build);
//   - every error is a non-OK status with a message, never Unknown or
//     Internal;
//   - a hello ack carries the session's chunk limit and a resume step >= -1;
//   - a commit's ack names the step end's seq, stays within the step
//     limits, and (unless a duplicate) the store then holds exactly its
//     tensors for that worker, each with values of the size dtype and shape
//     give and statistics counting its elements;
//   - a job end's ack names the job end's seq.
#ifndef SONDE_TESTS_FUZZ_INGEST_FUZZ_H_
#define SONDE_TESTS_FUZZ_INGEST_FUZZ_H_

#include <cstddef>
#include <cstdint>

#include "server/ingest_session.h"

namespace sonde::fuzz {

// Record control bits.
inline constexpr uint8_t kIngestSecondStream = 1 << 0;  // stream 1 instead of stream 0
inline constexpr uint8_t kIngestRawSeq = 1 << 1;        // keep the message's seq (else the next)
inline constexpr uint8_t kIngestFixCrc = 1 << 2;        // set a chunk's crc32c to its payload's
inline constexpr uint8_t kIngestReconnect = 1 << 3;     // end the stream before this message
inline constexpr uint8_t kIngestRestart = 1 << 4;       // restart the collector first: every
                                                        // stream ends, a new JobRegistry
                                                        // loads the jobs from the store

// Settings byte 0.
inline constexpr uint8_t kIngestDefaultLimits = 1 << 7;

// The limits settings byte `b` selects.
server::IngestLimits LimitsFor(uint8_t b);

// What one input did, for tests that check a seed reaches what it is for.
struct IngestOutcome {
  int joins = 0;       // successful Join
  int commits = 0;     // successful Commit (duplicates included)
  int duplicates = 0;  // of which acknowledged as duplicates
  int job_ends = 0;    // successful EndJob
  int errors = 0;      // streams ended by an error
};

// Runs one input, checking every property; aborts on a violation.
IngestOutcome RunIngestInput(const uint8_t* data, size_t size);

// The libFuzzer entry point: RunIngestInput, returning 0.
int FuzzIngestSession(const uint8_t* data, size_t size);

}  // namespace sonde::fuzz

#endif  // SONDE_TESTS_FUZZ_INGEST_FUZZ_H_
