#include "server/cluster/applier.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "server/ingest_session.h"
#include "server/retention.h"

namespace sonde::cluster {

// One logged client stream: its session, and the handle the registry sends
// to (actions, and the abort when a newer stream takes the worker).
struct PartitionApplier::Stream : public server::StreamHandle {
  Stream(PartitionApplier* applier, StreamKey key, uint64_t first)
      : applier(applier),
        key(std::move(key)),
        session(applier->registry_, applier->limits_),
        first_sequence(first) {}
  ~Stream() override { session.Close(this); }

  void Send(const v1::ServerMessage& message) override {
    absl::MutexLock lock(&mu);
    sent.push_back(message);
  }
  void Abort(const absl::Status& status) override {
    absl::MutexLock lock(&mu);
    if (!aborted.ok()) return;
    aborted = status;
    // Told to the applier, which ends it after the entry it is applying,
    // without looking at every open stream after each entry.
    absl::MutexLock queue(&applier->aborted_mu_);
    applier->aborted_keys_.push_back(key);
  }
  // What the registry sent since the last call (from any thread: rules
  // broadcast actions from theirs).
  std::vector<v1::ServerMessage> TakeSent() {
    absl::MutexLock lock(&mu);
    return std::exchange(sent, {});
  }
  absl::Status TakeAborted() {
    absl::MutexLock lock(&mu);
    return aborted;
  }

  PartitionApplier* const applier;
  const StreamKey key;
  server::IngestSession session;
  const uint64_t first_sequence;  // its first entry: where a replay starts
  absl::Mutex mu;
  std::vector<v1::ServerMessage> sent ABSL_GUARDED_BY(mu);
  absl::Status aborted ABSL_GUARDED_BY(mu);
};

PartitionApplier::PartitionApplier(uint32_t partition, server::JobRegistry* registry,
                                   storage::Store* store, server::IngestLimits limits,
                                   absl::Duration gateway_timeout)
    : partition_(partition),
      registry_(registry),
      store_(store),
      limits_(limits),
      gateway_timeout_micros_(absl::ToInt64Microseconds(gateway_timeout)) {}

PartitionApplier::~PartitionApplier() { streams_.clear(); }

absl::StatusOr<uint64_t> PartitionApplier::ReadFrom() {
  SONDE_ASSIGN_OR_RETURN(v1::LogPosition position, store_->GetLogPosition(partition_));
  applied_ = position.applied();
  return std::max<uint64_t>(1, position.replay_from() > 0 ? position.replay_from()
                                                         : position.applied() + 1);
}

v1::LogPosition PartitionApplier::PositionAt(uint64_t sequence) const {
  v1::LogPosition p;
  p.set_applied(sequence);
  p.set_replay_from(first_sequences_.empty()
                        ? sequence + 1
                        : std::min(sequence + 1, *first_sequences_.begin()));
  return p;
}

void PartitionApplier::EndStream(const StreamKey& key) {
  auto it = streams_.find(key);
  if (it == streams_.end()) return;
  first_sequences_.erase(first_sequences_.find(it->second->first_sequence));
  streams_.erase(it);
}

void PartitionApplier::EndOthers(const StreamKey& key, Outcome& outcome) {
  // Streams the registry aborted meanwhile end now, so they hold neither a
  // session nor the replay position back (their gateway may be gone and
  // never log their close). The entry's own stream was told by its entry.
  std::vector<StreamKey> aborted_keys;
  {
    absl::MutexLock lock(&aborted_mu_);
    aborted_keys.swap(aborted_keys_);
  }
  std::sort(aborted_keys.begin(), aborted_keys.end());  // the same order on every replica
  for (const StreamKey& k : aborted_keys) {
    auto it = streams_.find(k);
    if (it == streams_.end()) continue;  // ended already
    if (k == key) {
      // Its next entry is refused; should none come, the next entry of
      // another stream ends it.
      absl::MutexLock lock(&aborted_mu_);
      aborted_keys_.push_back(k);
      continue;
    }
    outcome.others_ended.push_back({k.first, k.second, it->second->TakeAborted()});
    // A taken-over stream's later entries are refused (and counted).
    ended_[k] = it->second->session.joined() ? it->second->session.job() : std::string();
    EndStream(k);
  }
  // A gateway silent past the timeout (in log time) is gone: its streams
  // end as disconnected ones do. Nothing is kept for them: if it was only
  // cut off, its later entries start no session without a hello, and it
  // may never log again.
  for (auto g = gateway_seen_.begin(); g != gateway_seen_.end();) {
    const auto& [gateway, seen] = *g;
    if (log_now_micros_ - seen <= gateway_timeout_micros_) {
      ++g;
      continue;
    }
    std::vector<StreamKey> of_gateway;
    for (auto it = streams_.lower_bound({gateway, 0});
         it != streams_.end() && it->first.first == gateway; ++it) {
      if (it->first != key) of_gateway.push_back(it->first);
    }
    if (!of_gateway.empty()) {
      const absl::Status silent = absl::UnavailableError(absl::StrCat(
          "gateway '", gateway, "' has logged nothing for ",
          absl::FormatDuration(absl::Microseconds(log_now_micros_ - seen)),
          ": its streams are taken for disconnected"));
      for (const StreamKey& k : of_gateway) {
        outcome.others_ended.push_back({k.first, k.second, silent});
        EndStream(k);
      }
    }
    // Forgotten once silent with nothing open (gateways of past rollouts),
    // so entries do not get slower with every gateway ever seen; every
    // replica forgets it at the same entry, and its later entries, if any,
    // bring it back.
    auto left = streams_.lower_bound({gateway, 0});
    const bool open = left != streams_.end() && left->first.first == gateway;
    g = open ? std::next(g) : gateway_seen_.erase(g);
  }
}

absl::StatusOr<PartitionApplier::Outcome> PartitionApplier::Apply(uint64_t sequence,
                                                                 const v1::LogEntry& entry,
                                                                 int64_t log_micros) {
  Outcome outcome;
  const StreamKey key{entry.gateway(), entry.connection()};
  // During a replay (sequence <= applied_) sessions are rebuilt and what
  // they commit is recognised as stored; the position is not written back.
  const bool replaying = sequence <= applied_;
  // The log's own clock where there is one: the same for every replica,
  // and one clock for all gateways however theirs differ.
  const int64_t at = log_micros > 0 ? log_micros : entry.unix_micros();
  if (at > 0) {
    log_now_micros_ = std::max(log_now_micros_, at);
    int64_t& seen = gateway_seen_[entry.gateway()];
    seen = std::max(seen, at);
  }
  if (entry.heartbeat()) {
    // Only the clock moves.
  } else if (entry.control_case() != v1::LogEntry::CONTROL_NOT_SET) {
    ApplyControl(entry, outcome);
  } else if (!ended_.count(key)) {
    auto it = streams_.find(key);
    if (it == streams_.end()) {
      it = streams_.emplace(key, std::make_unique<Stream>(this, key, sequence)).first;
      first_sequences_.insert(sequence);
    }
    Stream& stream = *it->second;
    for (int i = 0; i < entry.messages_size(); ++i) {
      bool storage_failed = false;
      absl::Status s = ApplyMessage(stream, entry.messages(i), sequence, outcome, &storage_failed);
      if (storage_failed) {
        // Not the client's fault, and not to be skipped: the node stops
        // here, the position unmoved, and this entry is applied again.
        return s;
      }
      if (stream.session.joined()) {
        outcome.job = stream.session.job();
        outcome.worker = stream.session.worker();
      }
      for (v1::ServerMessage& sent : stream.TakeSent()) outcome.replies.push_back(std::move(sent));
      if (s.ok()) s = stream.TakeAborted();
      if (!s.ok()) {
        outcome.ended = s;
        const std::string job = stream.session.joined() ? stream.session.job() : "";
        EndStream(key);
        ended_[key] = job;
        // The gateway acknowledged what the log stored; steps refused from
        // here on are counted where the job's gaps are.
        CountRefused(job, entry, i, replaying);
        break;
      }
    }
  } else {
    outcome.ended = absl::AbortedError("the stream ended before this entry");
    CountRefused(ended_[key], entry, 0, replaying);
  }
  if (entry.closed()) {
    EndStream(key);
    ended_.erase(key);
  }
  EndOthers(key, outcome);
  if (!replaying) {
    applied_ = sequence;
    // A committed step wrote the position already; writing it again is
    // harmless and covers entries that stored nothing.
    SONDE_RETURN_IF_ERROR(store_->PutLogPosition(partition_, PositionAt(sequence)));
  }
  outcome.replayed = replaying;
  return outcome;
}

namespace {

// Errors of the storage below a session (RocksDB's, as storage::Store
// gives them), as opposed to a refusal of what the client sent.
bool IsStorageFailure(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kDataLoss:
      return true;
    default:
      return false;
  }
}

}  // namespace

void PartitionApplier::ApplyControl(const v1::LogEntry& entry, Outcome& outcome) {
  if (entry.has_enable_rules()) {
    const v1::EnableRulesRequest& r = entry.enable_rules();
    absl::StatusOr<std::vector<v1::RuleSpec>> rules = registry_->EnableRules(
        r.job(), std::vector<v1::RuleSpec>(r.rules().begin(), r.rules().end()));
    if (!rules.ok()) {
      outcome.ended = rules.status();
      return;
    }
    v1::EnableRulesResponse response;
    for (v1::RuleSpec& spec : *rules) *response.add_rules() = std::move(spec);
    outcome.response = response.SerializeAsString();
    return;
  }
  if (entry.has_delete_job()) {
    const std::string& job = entry.delete_job().job();
    if (job.empty()) {
      outcome.ended = absl::InvalidArgumentError("no job given");
      return;
    }
    // Whether the job is still judged depends on its rules' progress:
    // let them finish first, so every replica refuses or deletes alike.
    registry_->DrainRules();
    absl::StatusOr<storage::DeletedJob> deleted = server::EraseJob(job, *store_, *registry_);
    if (!deleted.ok()) {
      outcome.ended = deleted.status();
      return;
    }
    v1::DeleteJobResponse response;
    response.set_job_id(deleted->job_id);
    response.set_approximate_bytes(deleted->approximate_bytes);
    outcome.response = response.SerializeAsString();
    return;
  }
  const v1::PostRuleResultRequest& r = entry.post_rule_result();
  outcome.ended = registry_->PostExternalResult(
      r.result(), std::vector<std::string>(r.actions().begin(), r.actions().end()));
  outcome.response = v1::PostRuleResultResponse().SerializeAsString();
}

void PartitionApplier::CountRefused(const std::string& job, const v1::LogEntry& entry, int from,
                                    bool replaying) {
  if (replaying || job.empty()) return;  // counted when first applied
  uint64_t steps = 0;
  for (int i = from; i < entry.messages_size(); ++i) steps += entry.messages(i).has_step_end();
  if (steps == 0) return;
  absl::Status s = registry_->RecordDroppedSteps(job, steps);
  if (!s.ok()) {
    LOG(ERROR) << "job '" << job << "': " << steps << " refused step(s) not counted: " << s;
  }
}

absl::Status PartitionApplier::ApplyMessage(Stream& stream, const v1::ClientMessage& message,
                                            uint64_t sequence, Outcome& outcome,
                                            bool* storage_failed) {
  // A refusal of the message itself (its checks need no storage).
  SONDE_ASSIGN_OR_RETURN(server::IngestSession::Next next, stream.session.OnMessage(message));
  absl::Status stored = ApplyNext(stream, next, sequence, outcome);
  *storage_failed = IsStorageFailure(stored);
  return stored;
}

absl::Status PartitionApplier::ApplyNext(Stream& stream, server::IngestSession::Next next,
                                         uint64_t sequence, Outcome& outcome) {
  switch (next) {
    case server::IngestSession::Next::kRead:
      return absl::OkStatus();
    case server::IngestSession::Next::kHello: {
      SONDE_ASSIGN_OR_RETURN(server::JoinResult joined, stream.session.Join(&stream));
      v1::ServerMessage ack;
      *ack.mutable_hello_ack() = joined.ack;
      outcome.replies.push_back(std::move(ack));
      for (const std::string& w : joined.warnings) {
        v1::ServerMessage warning;
        warning.mutable_warning()->set_message(w);
        outcome.replies.push_back(std::move(warning));
      }
      if (joined.pending_stop.has_value()) {
        v1::ServerMessage stop;
        *stop.mutable_action() = *joined.pending_stop;
        outcome.replies.push_back(std::move(stop));
      }
      return absl::OkStatus();
    }
    case server::IngestSession::Next::kCommit: {
      std::optional<storage::StepWrite::Applied> at;
      if (sequence > applied_) at = storage::StepWrite::Applied{partition_, PositionAt(sequence)};
      SONDE_ASSIGN_OR_RETURN(v1::Ack ack, stream.session.Commit(std::move(at)));
      v1::ServerMessage reply;
      *reply.mutable_ack() = std::move(ack);
      outcome.replies.push_back(std::move(reply));
      return absl::OkStatus();
    }
    case server::IngestSession::Next::kEndJob: {
      SONDE_ASSIGN_OR_RETURN(v1::Ack ack, stream.session.EndJob());
      v1::ServerMessage reply;
      *reply.mutable_ack() = std::move(ack);
      outcome.replies.push_back(std::move(reply));
      return absl::OkStatus();
    }
    case server::IngestSession::Next::kProfile: {
      SONDE_ASSIGN_OR_RETURN(std::optional<v1::Ack> ack, stream.session.StoreProfile());
      if (ack.has_value()) {
        v1::ServerMessage reply;
        *reply.mutable_ack() = *std::move(ack);
        outcome.replies.push_back(std::move(reply));
      }
      return absl::OkStatus();
    }
  }
  return absl::InternalError("unknown ingest step");
}

}  // namespace sonde::cluster
