// The protocol logic of one Collector stream, free of gRPC: it checks every
// client message against the stream's state and the limits, reassembles
// chunks, and turns a step end into one StepWrite for the registry. The
// reactor in collector_service.cc only moves messages and threads.
//
// Not thread-safe: the reactor calls it from one thread at a time.
#ifndef SONDE_SERVER_INGEST_SESSION_H_
#define SONDE_SERVER_INGEST_SESSION_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/tensor_chunks.h"
#include "proto/collector.pb.h"
#include "server/ingest_limits.h"
#include "server/job_registry.h"
#include "storage/store.h"

namespace sonde::server {

class IngestSession {
 public:
  IngestSession(JobRegistry* registry, IngestLimits limits)
      : registry_(registry), limits_(limits) {}
  ~IngestSession();

  // What the reactor should do after a message.
  enum class Next {
    kRead,        // keep reading
    kCommit,      // run Commit() off the gRPC thread, then keep reading
    kHello,       // run Join() off the gRPC thread, then keep reading
    kEndJob,      // run EndJob() off the gRPC thread, then keep reading
    kProfile,     // run StoreProfile() off the gRPC thread, then keep reading
  };

  // Checks and absorbs one message. An error ends the stream with that
  // status; nothing of the open step is stored.
  absl::StatusOr<Next> OnMessage(const v1::ClientMessage& message);

  // The blocking halves (storage I/O), run on the storage pool.
  absl::StatusOr<JoinResult> Join(StreamHandle* stream);
  // Stores the step (or acknowledges a resend of a stored step as a
  // duplicate, writing nothing). In the cluster mode, `log_position` is
  // written in the same batch as the step.
  absl::StatusOr<v1::Ack> Commit(
      std::optional<storage::StepWrite::Applied> log_position = std::nullopt);
  absl::StatusOr<v1::Ack> EndJob();
  // Stores the profiler batch. Between steps it is acknowledged at once;
  // within a step the step's ack (later, cumulative) covers it.
  absl::StatusOr<std::optional<v1::Ack>> StoreProfile();

  // The stream is over; leaves the job if it had joined.
  void Close(StreamHandle* stream);

  bool joined() const { return joined_; }
  const std::string& job() const { return hello_.job(); }
  int32_t worker() const { return hello_.worker(); }

 private:
  // Gives back what the open step took from limits_.open_steps.
  void ReleaseBudget();
  absl::Status OnChunk(const v1::TensorChunk& chunk);
  absl::Status OnSummary(const v1::TensorSummary& summary);
  absl::Status OpenStep(int64_t step, v1::Mode mode, int64_t mode_step);
  absl::Status AddTensor(storage::TensorWrite tensor);
  absl::Status OnStepEnd(const v1::StepEnd& end);
  std::string Where() const;

  JobRegistry* const registry_;
  const IngestLimits limits_;

  bool hello_seen_ = false;
  bool joined_ = false;
  bool ended_ = false;
  v1::Hello hello_;
  uint64_t last_seq_ = 0;
  int64_t last_step_ = -1;  // last global step stored for this worker
  int64_t stream_step_ = -1;  // last global step opened on this stream
  std::map<v1::Mode, int64_t> stream_mode_steps_;  // last mode step per mode, likewise
  bool same_client_ = false;  // may resend stored steps (see JoinResult)
  bool warned_statistics_ = false;  // a client's statistics were replaced (logged once)
  StreamHandle* stream_ = nullptr;

  // The open step.
  std::optional<storage::StepWrite> step_;
  std::set<std::string> step_names_;
  uint64_t step_bytes_ = 0;
  uint64_t budget_held_ = 0;  // taken from limits_.open_steps for the open step
  std::optional<TensorAssembler> assembler_;
  v1::StepEnd step_end_;
  uint64_t step_end_seq_ = 0;
  v1::JobEnd job_end_;
  uint64_t job_end_seq_ = 0;
  v1::ProfileBatch profile_;
  uint64_t profile_seq_ = 0;
};

}  // namespace sonde::server

#endif  // SONDE_SERVER_INGEST_SESSION_H_
