// Key layout of Sonde's RocksDB store. Every integer is fixed width and
// big-endian (signed ones with the sign bit flipped), so byte order equals
// numeric order and a prefix scan returns steps in order. Tensor names end
// with a 0x00 byte (names may not contain 0x00), so "fc1" never matches a
// prefix of "fc10", and a job is always a fixed 8-byte id, so no crafted
// name can reach into another job's keys.
//
// Column family "jobs" (job metadata):
//   'N' <job name>                                  -> job id (u64)
//   'J' <job id u64>                                -> sonde.v1.JobInfo
//   'S' <job id> <mode u8> <mode step i64> <worker i32>
//                                                   -> sonde.v1.StepInfo (one worker)
//   'G' <job id> <global step i64> <worker i32>     -> sonde.v1.StepInfo (same)
//   'T' <job id> <tensor name> 0x00                 -> sonde.v1.TensorInfo
//   'D' <job id>                                    -> job name: the job is being
//                                                      deleted (Store::MarkJobDeleted)
//   'L' <partition u32>                             -> sonde.v1.LogPosition (cluster
//                                                      mode: a log partition applied)
// Column family "stats" (one record per tensor per step per worker; the
// "every tensor at step S" scan):
//   <job id> <mode u8> <mode step i64> <tensor name> 0x00 <worker i32>
//                                                   -> sonde.v1.TensorRecord
// Column family "series" (the "tensor T over steps A..B" scan):
//   <job id> <tensor name> 0x00 <mode u8> <mode step i64> <worker i32>
//                                                   -> sonde.v1.SeriesPoint
// Column family "payloads" (raw values, in pieces of bounded size):
//   <stats key> <piece u32>                         -> bytes
// Column family "rules":
//   'R' <job id> <rule name>                        -> sonde.v1.RuleResult
//   'C' <job id> <rule name>                        -> rule cursor/state bytes
// Column family "profile" (profiler data, time-keyed):
//   'M' <job id> <worker i32> <metric name> 0x00 <unix micros i64>
//                                                   -> the value (IEEE double, u64 bits)
//   'm' <job id> <worker i32> <metric name> 0x00    -> "" (the names a worker sent)
//   'E' <job id> <worker i32> <kind u8> <event name> 0x00 <start unix micros i64>
//       <end unix micros i64>                       -> sonde.v1.TraceEvent
//       (the end too, so two events of one name that start in the same
//       microsecond both stay, while a resent one still lands on its own key;
//       a reader filters by time from the key, before parsing the value)
//
// Every key of a job but its 'N' name key starts with one of the prefixes
// JobKeyPrefixes lists; a new kind of key keyed by job must be added there,
// or deleting a job leaves it behind.
#ifndef SONDE_STORAGE_KEYS_H_
#define SONDE_STORAGE_KEYS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sonde::storage {

// Appends fixed-width big-endian encodings.
void AppendU64(std::string& out, uint64_t v);
void AppendU32(std::string& out, uint32_t v);
void AppendI64(std::string& out, int64_t v);  // order-preserving
void AppendI32(std::string& out, int32_t v);  // order-preserving

// Reads them back from the front of `in`, consuming the bytes.
absl::StatusOr<uint64_t> ConsumeU64(absl::string_view& in);
absl::StatusOr<uint32_t> ConsumeU32(absl::string_view& in);
absl::StatusOr<int64_t> ConsumeI64(absl::string_view& in);
absl::StatusOr<int32_t> ConsumeI32(absl::string_view& in);
// A 0x00-terminated name.
absl::StatusOr<std::string> ConsumeName(absl::string_view& in);

// Names reach keys only once ValidateDataName (common/names.h) accepted
// them: 1..1024 bytes of UTF-8 without 0x00.

// The decoded identity of one tensor at one step of one worker.
struct TensorKey {
  uint64_t job_id = 0;
  uint8_t mode = 0;
  int64_t mode_step = 0;
  std::string name;
  int32_t worker = 0;
};

std::string JobNameKey(absl::string_view name);
std::string JobInfoKey(uint64_t job_id);
std::string LogPositionKey(uint32_t partition);
std::string JobInfoPrefix();
// One worker's progress in a job (v1::WorkerProgress): kept apart from the
// job record so that committing a step writes O(1) bytes, not O(workers).
std::string WorkerProgressKey(uint64_t job_id, int32_t worker);
std::string WorkerProgressPrefix(uint64_t job_id);
std::string StepKey(uint64_t job_id, uint8_t mode, int64_t mode_step, int32_t worker);
std::string StepPrefix(uint64_t job_id, uint8_t mode);       // one mode's steps
std::string GlobalStepKey(uint64_t job_id, int64_t step, int32_t worker);
std::string GlobalStepPrefix(uint64_t job_id, int64_t step);  // one global step
std::string GlobalStepsPrefix(uint64_t job_id);               // all of them
std::string TensorNameKey(uint64_t job_id, absl::string_view name);
std::string TensorNamePrefix(uint64_t job_id);

std::string StatsKey(const TensorKey& k);
std::string StatsStepPrefix(uint64_t job_id, uint8_t mode, int64_t mode_step);
absl::StatusOr<TensorKey> DecodeStatsKey(absl::string_view key);

std::string SeriesKey(const TensorKey& k);
std::string SeriesPrefix(uint64_t job_id, absl::string_view name, uint8_t mode);
std::string SeriesSeek(uint64_t job_id, absl::string_view name, uint8_t mode,
                       int64_t mode_step);

std::string PayloadKey(const TensorKey& k, uint32_t piece);
std::string PayloadPrefix(const TensorKey& k);

std::string RuleResultKey(uint64_t job_id, absl::string_view rule);
std::string RuleResultPrefix(uint64_t job_id);
std::string RuleStateKey(uint64_t job_id, absl::string_view rule);

std::string MetricKey(uint64_t job_id, int32_t worker, absl::string_view name, int64_t micros);
std::string MetricSeriesPrefix(uint64_t job_id, int32_t worker, absl::string_view name);
std::string MetricNameKey(uint64_t job_id, int32_t worker, absl::string_view name);
std::string MetricNamePrefix(uint64_t job_id);
std::string MetricNamePrefix(uint64_t job_id, int32_t worker);  // one worker's names
std::string EventKey(uint64_t job_id, int32_t worker, uint8_t kind, absl::string_view name,
                     int64_t start_micros, int64_t end_micros);
std::string EventPrefix(uint64_t job_id);

// An event key after its EventPrefix, decoded.
struct EventKeyParts {
  int32_t worker = 0;
  uint8_t kind = 0;
  std::string name;
  int64_t start_micros = 0;
  int64_t end_micros = 0;
};
absl::StatusOr<EventKeyParts> DecodeEventKey(absl::string_view key_after_prefix);

std::string DeletingJobKey(uint64_t job_id);
std::string DeletingJobPrefix();

// The prefixes that hold every key of one job (all but its 'N' name key,
// which is keyed by name), by column family. Each is a tag byte and/or the
// job's fixed 8-byte id, so [prefix, PrefixEnd(prefix)) holds exactly that
// job's keys of that kind.
struct JobKeyPrefixes {
  std::vector<std::string> jobs;      // 'J', 'S', 'G', 'T' and 'D' + id
  std::string stats;                  // the id
  std::string series;                 // the id
  std::string payloads;               // the id
  std::vector<std::string> rules;     // 'R' and 'C' + id
  std::vector<std::string> profile;   // 'M', 'm' and 'E' + id
};
JobKeyPrefixes JobKeyPrefixesOf(uint64_t job_id);

// The smallest key greater than every key that starts with `prefix`, or ""
// if there is none (prefix of all 0xff).
std::string PrefixEnd(absl::string_view prefix);

}  // namespace sonde::storage

#endif  // SONDE_STORAGE_KEYS_H_
