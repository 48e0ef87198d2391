#include "server/ingest_session.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/dtype.h"
#include "common/metrics/metrics.h"
#include "stats/histogram.h"
#include "stats/statistics.h"
#include "common/status_macros.h"
#include "common/profile_check.h"
#include "glog/logging.h"
#include "server/statistics_check.h"
#include "storage/keys.h"
#include "common/names.h"

namespace sonde::server {
namespace {

absl::Status Prefixed(const absl::Status& s, absl::string_view where) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(where, s.message()));
}

absl::Status CheckStatisticsFit(const v1::Statistics& stats, v1::DType dtype,
                                const google::protobuf::RepeatedField<int64_t>& shape,
                                const std::string& name) {
  SONDE_RETURN_IF_ERROR(ValidateStatistics(stats));
  SONDE_ASSIGN_OR_RETURN(uint64_t elements, ElementCount(shape));
  if (stats.count() != elements) {
    return absl::InvalidArgumentError(absl::StrCat(
        "statistics of tensor '", name, "' count ", stats.count(), " values, shape ",
        ShapeString(shape), " has ", elements, " (dtype ", DTypeName(dtype), ")"));
  }
  return absl::OkStatus();
}

// What clients report about themselves (ClientCounters, cumulative per
// client) as process-wide counters for operators: each report adds what
// changed since that client's previous one, across its reconnects.
class ClientCounterMetrics {
 public:
  static ClientCounterMetrics& Get() {
    static ClientCounterMetrics* const m = new ClientCounterMetrics();
    return *m;
  }

  void Report(const std::string& job, int32_t worker, uint64_t client_id,
              const v1::ClientCounters& now) {
    v1::ClientCounters before;
    {
      absl::MutexLock lock(&mu_);
      Last& last = last_[{job, worker}];
      if (last.client_id == client_id) before = last.counters;
      last.client_id = client_id;
      last.counters = now;
    }
    auto add = [](metrics::Counter* c, uint64_t was, uint64_t is) {
      if (is > was) c->Increment(is - was);
    };
    add(tensors_dropped_, before.tensors_dropped(), now.tensors_dropped());
    add(values_dropped_, before.values_dropped(), now.values_dropped());
    add(steps_dropped_, before.steps_dropped(), now.steps_dropped());
    add(tensors_spilled_, before.tensors_spilled(), now.tensors_spilled());
    add(bytes_spilled_, before.bytes_spilled(), now.bytes_spilled());
    add(device_values_spilled_, before.device_values_spilled(), now.device_values_spilled());
    add(device_bytes_spilled_, before.device_bytes_spilled(), now.device_bytes_spilled());
    add(messages_resent_, before.messages_resent(), now.messages_resent());
    add(reconnects_, before.reconnects(), now.reconnects());
  }

  void Duplicate() { duplicate_steps_->Increment(); }
  void StatisticsReplaced() { statistics_replaced_->Increment(); }

 private:
  struct Last {
    uint64_t client_id = 0;
    v1::ClientCounters counters;
  };

  ClientCounterMetrics() {
    metrics::Registry& r = metrics::Registry::Default();
    tensors_dropped_ = r.AddCounter("sonde_client_tensors_dropped_total",
                                    "Tensors clients saved but dropped under backpressure "
                                    "(as they report on step ends).");
    values_dropped_ = r.AddCounter("sonde_client_values_dropped_total",
                                   "Device tensors clients sent with statistics only because "
                                   "their values were lost on the device path.");
    steps_dropped_ = r.AddCounter("sonde_client_steps_dropped_total",
                                  "Whole steps clients dropped under backpressure.");
    tensors_spilled_ = r.AddCounter("sonde_client_tensors_spilled_total",
                                    "Tensors clients spilled to their local spill file.");
    bytes_spilled_ = r.AddCounter("sonde_client_spilled_bytes_total",
                                  "Bytes of tensor values clients spilled to disk.");
    device_values_spilled_ = r.AddCounter(
        "sonde_client_device_values_spilled_total",
        "Device tensors whose values clients wrote to their local values spill file to free "
        "GPU snapshot memory (sent later, not lost).");
    device_bytes_spilled_ = r.AddCounter("sonde_client_device_spilled_bytes_total",
                                         "Bytes of device values clients spilled to disk.");
    messages_resent_ = r.AddCounter("sonde_client_messages_resent_total",
                                    "Messages clients sent again after a broken stream.");
    reconnects_ = r.AddCounter("sonde_client_reconnects_total",
                               "Times clients reconnected to the collector.");
    statistics_replaced_ = r.AddCounter(
        "sonde_ingest_statistics_replaced_total",
        "Tensors whose client-sent statistics did not fit the values sent with them; the "
        "collector stored statistics computed from the values instead.");
    duplicate_steps_ = r.AddCounter("sonde_ingest_duplicate_steps_total",
                                    "Resent steps the collector already had: acknowledged "
                                    "as duplicates, not stored again.");
  }

  absl::Mutex mu_;
  std::map<std::pair<std::string, int32_t>, Last> last_ ABSL_GUARDED_BY(mu_);
  metrics::Counter* tensors_dropped_;
  metrics::Counter* values_dropped_;
  metrics::Counter* statistics_replaced_;
  metrics::Counter* steps_dropped_;
  metrics::Counter* tensors_spilled_;
  metrics::Counter* bytes_spilled_;
  metrics::Counter* device_values_spilled_;
  metrics::Counter* device_bytes_spilled_;
  metrics::Counter* messages_resent_;
  metrics::Counter* reconnects_;
  metrics::Counter* duplicate_steps_;
};

}  // namespace

IngestSession::~IngestSession() { ReleaseBudget(); }

void IngestSession::ReleaseBudget() {
  if (limits_.open_steps != nullptr && budget_held_ > 0) limits_.open_steps->Give(budget_held_);
  budget_held_ = 0;
}

std::string IngestSession::Where() const {
  if (!hello_seen_) return "";
  return absl::StrCat("job '", hello_.job(), "' worker ", hello_.worker(), ": ");
}

absl::StatusOr<IngestSession::Next> IngestSession::OnMessage(const v1::ClientMessage& m) {
  if (m.seq() != last_seq_ + 1) {
    return absl::InvalidArgumentError(absl::StrCat(Where(), "message seq ", m.seq(),
                                                   ", expected ", last_seq_ + 1));
  }
  last_seq_ = m.seq();
  if (!hello_seen_) {
    if (m.kind_case() != v1::ClientMessage::kHello) {
      return absl::FailedPreconditionError("the first message of a stream must be a hello");
    }
    hello_ = m.hello();
    hello_seen_ = true;
    return Next::kHello;
  }
  if (ended_) {
    return absl::FailedPreconditionError(
        absl::StrCat(Where(), "message after the job end"));
  }
  switch (m.kind_case()) {
    case v1::ClientMessage::kHello:
      return absl::FailedPreconditionError(
          absl::StrCat(Where(), "a second hello on one stream"));
    case v1::ClientMessage::kChunk:
      SONDE_RETURN_IF_ERROR(Prefixed(OnChunk(m.chunk()), Where()));
      return Next::kRead;
    case v1::ClientMessage::kSummary:
      SONDE_RETURN_IF_ERROR(Prefixed(OnSummary(m.summary()), Where()));
      return Next::kRead;
    case v1::ClientMessage::kStepEnd:
      SONDE_RETURN_IF_ERROR(Prefixed(OnStepEnd(m.step_end()), Where()));
      step_end_seq_ = m.seq();
      return Next::kCommit;
    case v1::ClientMessage::kProfile:
      SONDE_RETURN_IF_ERROR(Prefixed(ValidateProfileBatch(m.profile()), Where()));
      profile_ = m.profile();
      profile_seq_ = m.seq();
      return Next::kProfile;
    case v1::ClientMessage::kJobEnd:
      if (step_.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(
            Where(), "job end while step ", step_->step.step(), " is still open"));
      }
      ended_ = true;
      job_end_ = m.job_end();
      job_end_seq_ = m.seq();
      return Next::kEndJob;
    default:
      return absl::InvalidArgumentError(absl::StrCat(Where(), "empty client message"));
  }
}

absl::Status IngestSession::OpenStep(int64_t step, v1::Mode mode, int64_t mode_step) {
  if (mode == v1::MODE_UNSPECIFIED) mode = v1::MODE_GLOBAL;
  if (!v1::Mode_IsValid(mode)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown mode ", static_cast<int>(mode)));
  }
  if (step_.has_value()) {
    const v1::StepInfo& open = step_->step;
    if (open.step() != step || open.mode() != mode || open.mode_step() != mode_step) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data for step ", step, " (", ModeName(mode), " ", mode_step, ") while step ",
          open.step(), " (", ModeName(open.mode()), " ", open.mode_step(),
          ") is open; send its step end first"));
    }
    return absl::OkStatus();
  }
  if (step < 0 || mode_step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("negative step ", step, " / mode step ", mode_step));
  }
  if (step <= stream_step_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step ", step, " does not follow step ", stream_step_, " (steps must increase)"));
  }
  if (step <= last_step_ && !same_client_) {
    // Only the client that stored a step may send it again (as a resend).
    return absl::InvalidArgumentError(
        absl::StrCat("step ", step, " does not follow the stored step ", last_step_,
                     " (steps must increase; another client wrote this worker's steps)"));
  }
  auto mode_last = stream_mode_steps_.find(mode);
  if (mode_last != stream_mode_steps_.end() && mode_step <= mode_last->second) {
    // Two global steps with one mode step would overwrite each other's
    // records (they are keyed by mode step).
    return absl::InvalidArgumentError(absl::StrCat(
        "step ", step, " has ", ModeName(mode), " step ", mode_step, ", which does not follow ",
        ModeName(mode), " step ", mode_last->second, " (mode steps must increase)"));
  }
  stream_mode_steps_[mode] = mode_step;
  stream_step_ = step;
  step_.emplace();
  step_->step.set_step(step);
  step_->step.set_mode(mode);
  step_->step.set_mode_step(mode_step);
  step_names_.clear();
  step_bytes_ = 0;
  return absl::OkStatus();
}

absl::Status IngestSession::AddTensor(storage::TensorWrite tensor) {
  if (step_->tensors.size() >= limits_.max_tensors_per_step) {
    // Permanent (sent again, the step would be refused again), unlike the
    // shared open-step budget below, which frees as other streams commit.
    return absl::InvalidArgumentError(
        absl::StrCat("step ", step_->step.step(), " has more than ",
                     limits_.max_tensors_per_step, " tensors"));
  }
  step_->tensors.push_back(std::move(tensor));
  return absl::OkStatus();
}

absl::Status IngestSession::OnChunk(const v1::TensorChunk& chunk) {
  if (!chunk.job().empty() && chunk.job() != hello_.job()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk names job '", chunk.job(), "', the stream's hello said '", hello_.job(), "'"));
  }
  if (chunk.worker() != 0 && chunk.worker() != hello_.worker()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk names worker ", chunk.worker(), ", the stream's hello said ", hello_.worker()));
  }
  SONDE_RETURN_IF_ERROR(OpenStep(chunk.step(), chunk.mode(), chunk.mode_step()));
  if (!assembler_.has_value()) {
    if (chunk.chunk_index() != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", chunk.chunk_index(), " of tensor '", chunk.tensor_name(),
                       "' at step ", chunk.step(), " arrived before its chunk 0"));
    }
    SONDE_RETURN_IF_ERROR(ValidateDataName("tensor name", chunk.tensor_name()));
    if (!step_names_.insert(chunk.tensor_name()).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", chunk.tensor_name(), "' sent twice in step ", chunk.step()));
    }
    assembler_.emplace(
        TensorAssembler::Limits{limits_.max_chunk_bytes, limits_.max_tensor_bytes});
  }
  if (step_bytes_ + chunk.payload().size() > limits_.max_step_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", chunk.step(), " exceeds ", limits_.max_step_bytes,
                     " bytes of tensor values (--max_step_bytes)"));
  }
  const uint64_t payload = chunk.payload().size();
  if (limits_.open_steps != nullptr && !limits_.open_steps->TryTake(payload, budget_held_)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the collector holds ", limits_.open_steps->held(), " bytes of open steps, its limit is ",
        limits_.open_steps->limit(), " (--max_open_step_bytes); send step ", chunk.step(),
        " again later"));
  }
  budget_held_ += payload;
  SONDE_RETURN_IF_ERROR(assembler_->Add(chunk));
  step_bytes_ += payload;
  if (!assembler_->complete()) return absl::OkStatus();

  const v1::TensorChunk& h = assembler_->header();
  storage::TensorWrite t;
  t.record.set_tensor_name(h.tensor_name());
  t.record.set_step(step_->step.step());
  t.record.set_mode(step_->step.mode());
  t.record.set_mode_step(step_->step.mode_step());
  *t.record.mutable_collections() = h.collections();
  t.record.set_dtype(h.dtype());
  *t.record.mutable_shape() = h.shape();
  t.record.set_has_values(true);
  if (h.has_statistics()) {
    SONDE_RETURN_IF_ERROR(
        CheckStatisticsFit(h.statistics(), h.dtype(), h.shape(), h.tensor_name()));
    *t.record.mutable_statistics() = h.statistics();
  }
  if (h.has_histogram()) {
    // Checked against the statistics here when the client sent them, else
    // when the collector has computed them (at the step's commit).
    SONDE_RETURN_IF_ERROR(Prefixed(
        ValidateHistogram(h.histogram(), h.has_statistics() ? &h.statistics() : nullptr),
        absl::StrCat("tensor '", h.tensor_name(), "': ")));
    *t.record.mutable_histogram() = h.histogram();
  }
  t.bytes = assembler_->TakeBytes();
  assembler_.reset();
  return AddTensor(std::move(t));
}

absl::Status IngestSession::OnSummary(const v1::TensorSummary& s) {
  SONDE_RETURN_IF_ERROR(OpenStep(s.step(), s.mode(), s.mode_step()));
  if (assembler_.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "summary of '", s.tensor_name(), "' while tensor '",
        assembler_->header().tensor_name(), "' is incomplete"));
  }
  SONDE_RETURN_IF_ERROR(ValidateDataName("tensor name", s.tensor_name()));
  if (DTypeSize(s.dtype()) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("summary of '", s.tensor_name(),
                                                   "' has unsupported dtype ",
                                                   static_cast<int>(s.dtype())));
  }
  SONDE_RETURN_IF_ERROR(CheckStatisticsFit(s.statistics(), s.dtype(), s.shape(), s.tensor_name()));
  if (s.has_histogram()) {
    SONDE_RETURN_IF_ERROR(Prefixed(ValidateHistogram(s.histogram(), &s.statistics()),
                                   absl::StrCat("tensor '", s.tensor_name(), "': ")));
  }
  if (!step_names_.insert(s.tensor_name()).second) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", s.tensor_name(), "' sent twice in step ", s.step()));
  }
  storage::TensorWrite t;
  t.record.set_tensor_name(s.tensor_name());
  t.record.set_step(step_->step.step());
  t.record.set_mode(step_->step.mode());
  t.record.set_mode_step(step_->step.mode_step());
  *t.record.mutable_collections() = s.collections();
  t.record.set_dtype(s.dtype());
  *t.record.mutable_shape() = s.shape();
  *t.record.mutable_statistics() = s.statistics();
  if (s.has_histogram()) *t.record.mutable_histogram() = s.histogram();
  t.record.set_has_values(false);
  return AddTensor(std::move(t));
}

absl::Status IngestSession::OnStepEnd(const v1::StepEnd& end) {
  if (assembler_.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step end of step ", end.step(), " while tensor '",
        assembler_->header().tensor_name(), "' is incomplete"));
  }
  SONDE_RETURN_IF_ERROR(OpenStep(end.step(), end.mode(), end.mode_step()));
  if (end.tensor_count() != step_->tensors.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("step end of step ", end.step(), " says ", end.tensor_count(),
                     " tensors, the collector received ", step_->tensors.size()));
  }
  if (!(end.duration_seconds() >= 0) || !std::isfinite(end.duration_seconds())) {
    return absl::InvalidArgumentError(absl::StrCat("step end of step ", end.step(),
                                                   " has duration ", end.duration_seconds()));
  }
  step_end_ = end;
  return absl::OkStatus();
}

absl::StatusOr<JoinResult> IngestSession::Join(StreamHandle* stream) {
  SONDE_ASSIGN_OR_RETURN(JoinResult result, registry_->Join(hello_, stream));
  joined_ = true;
  stream_ = stream;
  last_step_ = result.stored_last_step;
  same_client_ = result.same_client;
  result.ack.set_max_chunk_bytes(limits_.max_chunk_bytes);
  result.ack.set_max_tensor_bytes(limits_.max_tensor_bytes);
  result.ack.set_max_step_bytes(limits_.max_step_bytes);
  result.ack.set_max_tensors_per_step(limits_.max_tensors_per_step);
  return result;
}

absl::StatusOr<v1::Ack> IngestSession::Commit(
    std::optional<storage::StepWrite::Applied> log_position) {
  storage::StepWrite write = std::move(*step_);
  step_.reset();
  write.log_position = std::move(log_position);
  // The step's bytes leave memory when this call ends, committed or not.
  struct Release {
    IngestSession* session;
    ~Release() { session->ReleaseBudget(); }
  } release{this};
  write.step.set_duration_seconds(step_end_.duration_seconds());
  write.step.set_tensor_count(static_cast<uint32_t>(write.tensors.size()));
  write.step.set_tensors_dropped(step_end_.tensors_dropped());
  write.step.set_values_dropped(step_end_.values_dropped());
  uint64_t bytes = 0;
  for (storage::TensorWrite& t : write.tensors) {
    bytes += t.bytes.size();
    if (!t.record.has_values()) {
      t.record.mutable_statistics()->set_source(v1::Statistics::SOURCE_CLIENT);
      continue;
    }
    // Where values arrive, statistics are the collector's to vouch for:
    // the client's are kept only if the values agree with them.
    SONDE_ASSIGN_OR_RETURN(v1::Statistics computed, ComputeStatistics(t.bytes, t.record.dtype()));
    if (t.record.has_statistics()) {
      absl::Status agree = CheckClientStatistics(t.record.statistics(), computed, t.record.dtype());
      if (agree.ok()) {
        t.record.mutable_statistics()->set_source(v1::Statistics::SOURCE_CHECKED);
        continue;
      }
      ClientCounterMetrics::Get().StatisticsReplaced();
      if (!warned_statistics_) {
        warned_statistics_ = true;
        LOG(WARNING) << Where() << "tensor '" << t.record.tensor_name() << "' at step "
                     << write.step.step() << ": the client's statistics do not fit its values ("
                     << agree.message() << "); storing statistics computed from the values "
                     << "(logged once per stream)";
      }
      if (t.record.has_histogram() &&
          !ValidateHistogram(t.record.histogram(), &computed).ok()) {
        t.record.clear_histogram();  // it fits the false statistics, not the values
      }
    }
    computed.set_source(v1::Statistics::SOURCE_COLLECTOR);
    *t.record.mutable_statistics() = std::move(computed);
    if (t.record.has_histogram()) {
      SONDE_RETURN_IF_ERROR(
          Prefixed(ValidateHistogram(t.record.histogram(), &t.record.statistics()),
                   absl::StrCat("tensor '", t.record.tensor_name(), "': ")));
    }
  }
  v1::Ack ack;
  ack.set_acked_seq(step_end_seq_);
  ack.set_step(write.step.step());
  ack.set_mode(write.step.mode());
  ack.set_tensors(static_cast<uint32_t>(write.tensors.size()));
  ack.set_bytes(bytes);
  const int64_t step = write.step.step();
  SONDE_ASSIGN_OR_RETURN(CommitResult result,
                         registry_->CommitStep(hello_.job(), hello_.worker(), stream_,
                                               std::move(write), step_end_.steps_dropped()));
  ack.set_duplicate(result.duplicate);
  if (result.duplicate) ClientCounterMetrics::Get().Duplicate();
  if (step_end_.has_counters()) {
    ClientCounterMetrics::Get().Report(hello_.job(), hello_.worker(), hello_.client_id(),
                                       step_end_.counters());
  }
  last_step_ = std::max(last_step_, step);
  return ack;
}


absl::StatusOr<std::optional<v1::Ack>> IngestSession::StoreProfile() {
  SONDE_RETURN_IF_ERROR(
      registry_->StoreProfile(hello_.job(), hello_.worker(), stream_, std::move(profile_)));
  profile_.Clear();
  if (step_.has_value()) return std::optional<v1::Ack>();
  v1::Ack ack;
  ack.set_acked_seq(profile_seq_);
  ack.set_step(-1);
  return std::optional<v1::Ack>(ack);
}

absl::StatusOr<v1::Ack> IngestSession::EndJob() {
  SONDE_RETURN_IF_ERROR(registry_->EndJob(hello_.job(), hello_.worker(), stream_, job_end_.reason(),
                                          job_end_.steps_dropped()));
  if (job_end_.has_counters()) {
    ClientCounterMetrics::Get().Report(hello_.job(), hello_.worker(), hello_.client_id(),
                                       job_end_.counters());
  }
  v1::Ack ack;
  ack.set_acked_seq(job_end_seq_);
  ack.set_step(last_step_);
  return ack;
}

void IngestSession::Close(StreamHandle* stream) {
  if (joined_) registry_->Leave(hello_.job(), hello_.worker(), stream);
  joined_ = false;
  step_.reset();
  assembler_.reset();
  ReleaseBudget();
}

}  // namespace sonde::server
