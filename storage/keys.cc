#include "storage/keys.h"

#include "common/status_macros.h"

#include "absl/strings/str_cat.h"

namespace sonde::storage {

void AppendU64(std::string& out, uint64_t v) {
  for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void AppendU32(std::string& out, uint32_t v) {
  for (int i = 3; i >= 0; --i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void AppendI64(std::string& out, int64_t v) {
  AppendU64(out, static_cast<uint64_t>(v) ^ (uint64_t{1} << 63));
}

void AppendI32(std::string& out, int32_t v) {
  AppendU32(out, static_cast<uint32_t>(v) ^ (uint32_t{1} << 31));
}

namespace {

template <typename T>
absl::StatusOr<T> ConsumeBigEndian(absl::string_view& in) {
  if (in.size() < sizeof(T)) {
    return absl::DataLossError(absl::StrCat("key truncated: need ", sizeof(T),
                                            " bytes, have ", in.size()));
  }
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v = (v << 8) | static_cast<uint8_t>(in[i]);
  in.remove_prefix(sizeof(T));
  return v;
}

}  // namespace

absl::StatusOr<uint64_t> ConsumeU64(absl::string_view& in) {
  return ConsumeBigEndian<uint64_t>(in);
}
absl::StatusOr<uint32_t> ConsumeU32(absl::string_view& in) {
  return ConsumeBigEndian<uint32_t>(in);
}
absl::StatusOr<int64_t> ConsumeI64(absl::string_view& in) {
  auto v = ConsumeBigEndian<uint64_t>(in);
  if (!v.ok()) return v.status();
  return static_cast<int64_t>(*v ^ (uint64_t{1} << 63));
}
absl::StatusOr<int32_t> ConsumeI32(absl::string_view& in) {
  auto v = ConsumeBigEndian<uint32_t>(in);
  if (!v.ok()) return v.status();
  return static_cast<int32_t>(*v ^ (uint32_t{1} << 31));
}

absl::StatusOr<std::string> ConsumeName(absl::string_view& in) {
  const size_t end = in.find('\0');
  if (end == absl::string_view::npos) {
    return absl::DataLossError("key truncated: unterminated name");
  }
  std::string name(in.substr(0, end));
  in.remove_prefix(end + 1);
  return name;
}

std::string JobNameKey(absl::string_view name) { return absl::StrCat("N", name); }

std::string JobInfoKey(uint64_t job_id) {
  std::string k = "J";
  AppendU64(k, job_id);
  return k;
}

std::string JobInfoPrefix() { return "J"; }

std::string WorkerProgressKey(uint64_t job_id, int32_t worker) {
  std::string k = WorkerProgressPrefix(job_id);
  AppendI32(k, worker);
  return k;
}

std::string WorkerProgressPrefix(uint64_t job_id) {
  std::string k = "W";
  AppendU64(k, job_id);
  return k;
}

std::string LogPositionKey(uint32_t partition) {
  std::string k = "L";
  AppendU32(k, partition);
  return k;
}

std::string StepKey(uint64_t job_id, uint8_t mode, int64_t mode_step, int32_t worker) {
  std::string k = StepPrefix(job_id, mode);
  AppendI64(k, mode_step);
  AppendI32(k, worker);
  return k;
}

std::string StepPrefix(uint64_t job_id, uint8_t mode) {
  std::string k = "S";
  AppendU64(k, job_id);
  k.push_back(static_cast<char>(mode));
  return k;
}

std::string GlobalStepKey(uint64_t job_id, int64_t step, int32_t worker) {
  std::string k = GlobalStepPrefix(job_id, step);
  AppendI32(k, worker);
  return k;
}

std::string GlobalStepPrefix(uint64_t job_id, int64_t step) {
  std::string k = GlobalStepsPrefix(job_id);
  AppendI64(k, step);
  return k;
}

std::string GlobalStepsPrefix(uint64_t job_id) {
  std::string k = "G";
  AppendU64(k, job_id);
  return k;
}

std::string TensorNameKey(uint64_t job_id, absl::string_view name) {
  std::string k = TensorNamePrefix(job_id);
  k.append(name.data(), name.size());
  k.push_back('\0');
  return k;
}

namespace {
std::string TaggedJobWorker(char tag, uint64_t job_id, int32_t worker) {
  std::string k(1, tag);
  AppendU64(k, job_id);
  AppendI32(k, worker);
  return k;
}
}  // namespace

std::string MetricSeriesPrefix(uint64_t job_id, int32_t worker, absl::string_view name) {
  std::string k = TaggedJobWorker('M', job_id, worker);
  k.append(name.data(), name.size());
  k.push_back('\0');
  return k;
}

std::string MetricKey(uint64_t job_id, int32_t worker, absl::string_view name, int64_t micros) {
  std::string k = MetricSeriesPrefix(job_id, worker, name);
  AppendI64(k, micros);
  return k;
}

std::string MetricNameKey(uint64_t job_id, int32_t worker, absl::string_view name) {
  std::string k = MetricNamePrefix(job_id, worker);
  k.append(name.data(), name.size());
  k.push_back('\0');
  return k;
}

std::string MetricNamePrefix(uint64_t job_id) {
  std::string k = "m";
  AppendU64(k, job_id);
  return k;
}

std::string MetricNamePrefix(uint64_t job_id, int32_t worker) {
  return TaggedJobWorker('m', job_id, worker);
}

std::string EventKey(uint64_t job_id, int32_t worker, uint8_t kind, absl::string_view name,
                     int64_t start_micros, int64_t end_micros) {
  std::string k = TaggedJobWorker('E', job_id, worker);
  k.push_back(static_cast<char>(kind));
  k.append(name.data(), name.size());
  k.push_back('\0');
  AppendI64(k, start_micros);
  AppendI64(k, end_micros);
  return k;
}

absl::StatusOr<EventKeyParts> DecodeEventKey(absl::string_view key) {
  EventKeyParts e;
  SONDE_ASSIGN_OR_RETURN(e.worker, ConsumeI32(key));
  if (key.empty()) return absl::DataLossError("event key truncated: no kind");
  e.kind = static_cast<uint8_t>(key[0]);
  key.remove_prefix(1);
  SONDE_ASSIGN_OR_RETURN(e.name, ConsumeName(key));
  SONDE_ASSIGN_OR_RETURN(e.start_micros, ConsumeI64(key));
  SONDE_ASSIGN_OR_RETURN(e.end_micros, ConsumeI64(key));
  if (!key.empty()) return absl::DataLossError("event key has trailing bytes");
  return e;
}

std::string EventPrefix(uint64_t job_id) {
  std::string k = "E";
  AppendU64(k, job_id);
  return k;
}

std::string TensorNamePrefix(uint64_t job_id) {
  std::string k = "T";
  AppendU64(k, job_id);
  return k;
}

std::string StatsStepPrefix(uint64_t job_id, uint8_t mode, int64_t mode_step) {
  std::string k;
  AppendU64(k, job_id);
  k.push_back(static_cast<char>(mode));
  AppendI64(k, mode_step);
  return k;
}

std::string StatsKey(const TensorKey& t) {
  std::string k = StatsStepPrefix(t.job_id, t.mode, t.mode_step);
  k.append(t.name);
  k.push_back('\0');
  AppendI32(k, t.worker);
  return k;
}

absl::StatusOr<TensorKey> DecodeStatsKey(absl::string_view key) {
  TensorKey t;
  auto job = ConsumeU64(key);
  if (!job.ok()) return job.status();
  t.job_id = *job;
  if (key.empty()) return absl::DataLossError("key truncated: no mode");
  t.mode = static_cast<uint8_t>(key[0]);
  key.remove_prefix(1);
  auto step = ConsumeI64(key);
  if (!step.ok()) return step.status();
  t.mode_step = *step;
  auto name = ConsumeName(key);
  if (!name.ok()) return name.status();
  t.name = *std::move(name);
  auto worker = ConsumeI32(key);
  if (!worker.ok()) return worker.status();
  t.worker = *worker;
  if (!key.empty()) return absl::DataLossError("key has trailing bytes");
  return t;
}

std::string SeriesPrefix(uint64_t job_id, absl::string_view name, uint8_t mode) {
  std::string k;
  AppendU64(k, job_id);
  k.append(name.data(), name.size());
  k.push_back('\0');
  k.push_back(static_cast<char>(mode));
  return k;
}

std::string SeriesSeek(uint64_t job_id, absl::string_view name, uint8_t mode,
                       int64_t mode_step) {
  std::string k = SeriesPrefix(job_id, name, mode);
  AppendI64(k, mode_step);
  return k;
}

std::string SeriesKey(const TensorKey& t) {
  std::string k = SeriesSeek(t.job_id, t.name, t.mode, t.mode_step);
  AppendI32(k, t.worker);
  return k;
}

std::string PayloadPrefix(const TensorKey& t) { return StatsKey(t); }

std::string PayloadKey(const TensorKey& t, uint32_t piece) {
  std::string k = PayloadPrefix(t);
  AppendU32(k, piece);
  return k;
}

std::string RuleResultPrefix(uint64_t job_id) {
  std::string k = "R";
  AppendU64(k, job_id);
  return k;
}

std::string RuleResultKey(uint64_t job_id, absl::string_view rule) {
  return absl::StrCat(RuleResultPrefix(job_id), rule);
}

std::string RuleStateKey(uint64_t job_id, absl::string_view rule) {
  std::string k = "C";
  AppendU64(k, job_id);
  k.append(rule.data(), rule.size());
  return k;
}

std::string DeletingJobPrefix() { return "D"; }

std::string DeletingJobKey(uint64_t job_id) {
  std::string k = DeletingJobPrefix();
  AppendU64(k, job_id);
  return k;
}

JobKeyPrefixes JobKeyPrefixesOf(uint64_t job_id) {
  auto tagged = [job_id](char tag) {
    std::string k(1, tag);
    AppendU64(k, job_id);
    return k;
  };
  JobKeyPrefixes p;
  p.jobs = {tagged('J'), tagged('S'), tagged('G'), tagged('T'), tagged('D'), tagged('W')};
  AppendU64(p.stats, job_id);
  p.series = p.stats;
  p.payloads = p.stats;
  p.rules = {tagged('R'), tagged('C')};
  p.profile = {tagged('M'), tagged('m'), tagged('E')};
  return p;
}

std::string PrefixEnd(absl::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    const auto last = static_cast<uint8_t>(end.back());
    if (last != 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  return end;
}

}  // namespace sonde::storage
