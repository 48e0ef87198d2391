// Applies one partition of the cluster's log (docs/cluster.md) to a
// collector node's JobRegistry and Store. Each client stream a gateway
// logged, known by (gateway, connection), runs through its own
// IngestSession, exactly as it would on a single-node collector: the same
// checks, step assembly across workers, rules and stored records.
//
// Where the node is: each step is stored with the log position its entry
// brings the partition to (one write batch), and other entries store the
// position after them. A restarted node reads from the position's
// replay_from, the first entry of the oldest stream still open, so every
// open stream's session is rebuilt from its hello; the steps those entries
// stored already are recognised as stored (per worker, as a client's
// resend is) and written once.
//
// Not thread-safe: one thread applies a partition, in sequence order.
#ifndef SONDE_SERVER_CLUSTER_APPLIER_H_
#define SONDE_SERVER_CLUSTER_APPLIER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/cluster.pb.h"
#include "server/ingest_limits.h"
#include "server/ingest_session.h"
#include "server/job_registry.h"
#include "storage/store.h"

namespace sonde::cluster {

class PartitionApplier {
 public:
  // A gateway silent for `gateway_timeout` of log time (when the log
  // stored its last entry, against the newest entry) is taken for dead:
  // its open streams end as if their clients had disconnected.
  PartitionApplier(uint32_t partition, server::JobRegistry* registry, storage::Store* store,
                   server::IngestLimits limits,
                   absl::Duration gateway_timeout = absl::Minutes(1));
  // Ends every open session, as streams ending without a job end.
  ~PartitionApplier();

  // The sequence to read the partition from: where the last run left off
  // (LogPosition.replay_from), or 1.
  absl::StatusOr<uint64_t> ReadFrom();

  // What applying one entry told its stream, as it would have heard it.
  struct Outcome {
    std::vector<v1::ServerMessage> replies;  // hello ack, warnings, acks, actions
    // Not OK when the stream ended with this status (a refused hello, a
    // malformed step): its later entries are ignored.
    absl::Status ended;
    // The entry was applied before (a restarted node rebuilding its open
    // streams): nothing new was stored, and the position stays.
    bool replayed = false;
    // The stream's job and worker, once its hello was taken.
    std::string job;
    int32_t worker = -1;
    // Other streams this entry ended: a hello that took over a worker
    // aborts the stream that had it (e.g. one whose gateway died). Their
    // gateways should end them too.
    struct Ended {
      std::string gateway;
      uint64_t connection = 0;
      absl::Status status;
    };
    std::vector<Ended> others_ended;
    // A control entry's answer (EnableRulesResponse), serialized.
    std::string response;
  };
  // Applies the entry at `sequence`. Entries come in increasing sequence
  // order, from ReadFrom() on. An error is returned only when the node
  // cannot go on (storage failing); a refused stream is an Outcome.
  // `log_micros`: when the log stored the entry (PartitionLog::Entry::
  // unix_micros); 0 to use the gateway's stamp in the entry instead.
  absl::StatusOr<Outcome> Apply(uint64_t sequence, const v1::LogEntry& entry,
                                int64_t log_micros = 0);

  uint64_t applied() const { return applied_; }
  size_t open_streams() const { return streams_.size(); }

 private:
  struct Stream;
  using StreamKey = std::pair<std::string, uint64_t>;  // gateway, connection

  // `storage_failed`: the error came from storage, not from the message.
  absl::Status ApplyMessage(Stream& stream, const v1::ClientMessage& message, uint64_t sequence,
                            Outcome& outcome, bool* storage_failed);
  absl::Status ApplyNext(Stream& stream, server::IngestSession::Next next, uint64_t sequence,
                         Outcome& outcome);
  // Adds the step ends of `entry` from message `from` on to `job`'s dropped
  // steps (not when replaying: they were counted then).
  void CountRefused(const std::string& job, const v1::LogEntry& entry, int from, bool replaying);
  // EnableRules or PostRuleResult, as the Query service would run them.
  void ApplyControl(const v1::LogEntry& entry, Outcome& outcome);
  v1::LogPosition PositionAt(uint64_t sequence) const;
  void EndStream(const StreamKey& key);
  // Ends the streams other than `key`'s that were aborted (a hello took
  // their worker over) or whose gateway fell silent.
  void EndOthers(const StreamKey& key, Outcome& outcome);

  const uint32_t partition_;
  server::JobRegistry* const registry_;
  storage::Store* const store_;
  const server::IngestLimits limits_;
  const int64_t gateway_timeout_micros_;
  uint64_t applied_ = 0;
  int64_t log_now_micros_ = 0;                      // the newest entry's unix_micros
  std::map<std::string, int64_t> gateway_seen_;     // each gateway's newest entry
  std::map<StreamKey, std::unique_ptr<Stream>> streams_;
  std::multiset<uint64_t> first_sequences_;  // of the open streams
  // Streams aborted since the last entry (from any thread).
  absl::Mutex aborted_mu_;
  std::vector<StreamKey> aborted_keys_ ABSL_GUARDED_BY(aborted_mu_);
  // Streams ended by an error whose gateway has not logged their close
  // yet, with their job ("" before the hello was taken).
  std::map<StreamKey, std::string> ended_;
};

}  // namespace sonde::cluster

#endif  // SONDE_SERVER_CLUSTER_APPLIER_H_
