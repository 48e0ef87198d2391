#include "server/cluster/node.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "proto/cluster.pb.h"

namespace sonde::cluster {

// A partition this node owns: its epoch and the thread applying it.
struct ClusterNode::Owned {
  int partition = 0;
  int64_t epoch = 0;
  std::atomic<bool> stop{false};
  // The apply loop gave up (storage failing, or fenced): the next
  // placement pass releases the partition, so it can be taken again.
  std::atomic<bool> finished{false};
  std::thread thread;
};

absl::StatusOr<std::unique_ptr<ClusterNode>> ClusterNode::Start(Etcd* etcd, PartitionLog* log,
                                                               server::JobRegistry* registry,
                                                               storage::Store* store,
                                                               Options options) {
  SONDE_ASSIGN_OR_RETURN(std::unique_ptr<Membership> membership,
                         Membership::Join(etcd, options.membership));
  std::unique_ptr<ClusterNode> node(
      new ClusterNode(log, registry, store, std::move(options), std::move(membership)));
  {
    absl::MutexLock lock(&node->gate_->mu);
    node->gate_->node = node.get();
  }
  registry->set_webhook_gate([state = node->gate_](const std::string& job, const v1::Action& a) {
    absl::MutexLock lock(&state->mu);
    return state->node != nullptr && state->node->MayPost(job, a);
  });
  node->placement_ = std::thread([n = node.get()] { n->PlacementLoop(); });
  return node;
}

ClusterNode::ClusterNode(PartitionLog* log, server::JobRegistry* registry,
                         storage::Store* store, Options options,
                         std::unique_ptr<Membership> membership)
    : log_(log),
      registry_(registry),
      store_(store),
      options_(std::move(options)),
      membership_(std::move(membership)) {}

ClusterNode::~ClusterNode() {
  {
    absl::MutexLock lock(&gate_->mu);  // waits for a gate call in progress
    gate_->node = nullptr;
  }
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  placement_.join();
  std::vector<int> partitions = owned();
  for (int p : partitions) Drop(p);
  membership_.reset();  // leaves: the lease is revoked
}

std::vector<int> ClusterNode::owned() const {
  absl::MutexLock lock(&mu_);
  std::vector<int> out;
  for (const auto& [p, o] : owned_) out.push_back(p);
  return out;
}

bool ClusterNode::MayPost(const std::string& job, const v1::Action& action) {
  const int p = JobPartition(job, log_->options().partitions);
  int64_t epoch;
  {
    absl::MutexLock lock(&mu_);
    auto it = owned_.find(p);
    if (it == owned_.end()) return false;  // a standby's or a former owner's replay
    epoch = it->second->epoch;
  }
  const std::string key = absl::StrCat(options_.membership.prefix, "/actions/", job, "/webhook/",
                                       action.rule(), "/", action.step(), "/", action.target());
  absl::StatusOr<bool> fired = membership_->FireOnce(p, epoch, key, action.SerializeAsString());
  if (!fired.ok()) {
    LOG(WARNING) << "job '" << job << "': webhook not posted: " << fired.status();
    return false;
  }
  return *fired;
}

void ClusterNode::PlacementLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stop), options_.placement_interval)) return;
    }
    Place();
  }
}

void ClusterNode::Place() {
  if (!membership_->alive()) {
    // The lease is gone: nothing is ours any more; stop applying.
    for (int p : owned()) Drop(p);
    return;
  }
  const int partitions = log_->options().partitions;
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> live = membership_->LiveNodes();
  absl::StatusOr<std::vector<std::optional<PartitionOwner>>> owners =
      membership_->Owners(partitions);
  if (!live.ok() || !owners.ok()) {
    LOG(WARNING) << "node '" << membership_->node() << "': placement skipped: "
                 << (live.ok() ? owners.status() : live.status());
    return;
  }
  std::vector<std::string> names;
  for (const auto& [name, address] : *live) names.push_back(name);
  for (int p = 0; p < partitions; ++p) {
    const std::vector<std::string> preferred = PreferredNodes(p, names);
    const bool mine = !preferred.empty() && preferred[0] == membership_->node();
    bool owned_here;
    bool gave_up = false;
    {
      absl::MutexLock lock(&mu_);
      auto it = owned_.find(p);
      owned_here = it != owned_.end();
      gave_up = owned_here && it->second->finished.load();
    }
    if (gave_up) {
      LOG(WARNING) << "node '" << membership_->node() << "': releasing partition " << p
                   << ", whose apply loop stopped";
      Drop(p);
      continue;
    }
    const std::optional<PartitionOwner>& owner = (*owners)[p];
    if (!owned_here && owner.has_value() && owner->node == membership_->node()) {
      // Ours in etcd but not applied here (a release that failed): free it.
      membership_->Release(p, owner->epoch).IgnoreError();
      continue;
    }
    if (!mine && owned_here) {
      LOG(INFO) << "node '" << membership_->node() << "': partition " << p << " goes to '"
                << preferred[0] << "'";
      Drop(p);
      continue;
    }
    if (!mine || owned_here || (*owners)[p].has_value()) continue;
    absl::StatusOr<std::optional<int64_t>> epoch = membership_->TryAcquire(p);
    if (!epoch.ok() || !epoch->has_value()) continue;  // taken meanwhile, or etcd unreachable
    auto owned = std::make_unique<Owned>();
    owned->partition = p;
    owned->epoch = **epoch;
    Owned* raw = owned.get();
    LOG(INFO) << "node '" << membership_->node() << "' owns partition " << p << " at epoch "
              << raw->epoch;
    absl::MutexLock lock(&mu_);
    owned_[p] = std::move(owned);
    raw->thread = std::thread([this, raw] { ApplyLoop(raw); });
  }
}

void ClusterNode::Drop(int partition) {
  std::unique_ptr<Owned> owned;
  {
    absl::MutexLock lock(&mu_);
    auto it = owned_.find(partition);
    if (it == owned_.end()) return;
    owned = std::move(it->second);
    owned_.erase(it);
  }
  owned->stop = true;
  owned->thread.join();
  if (membership_->alive()) {
    absl::Status s = membership_->Release(partition, owned->epoch);
    if (!s.ok()) LOG(WARNING) << "releasing partition " << partition << ": " << s;
  }
}

void ClusterNode::ApplyLoop(Owned* owned) {
  const int p = owned->partition;
  PartitionApplier applier(static_cast<uint32_t>(p), registry_, store_, options_.limits);
  absl::StatusOr<uint64_t> from = applier.ReadFrom();
  absl::StatusOr<std::unique_ptr<PartitionLog::Reader>> reader =
      from.ok() ? log_->Read(p, *from) : absl::StatusOr<std::unique_ptr<PartitionLog::Reader>>(
                                             from.status());
  if (!from.ok()) {
    LOG(ERROR) << "partition " << p << ": cannot read the applied position: " << from.status();
    owned->finished = true;
    return;
  }
  while (!owned->stop.load() && !reader.ok()) {
    LOG(WARNING) << "partition " << p << ": cannot read the log yet: " << reader.status();
    absl::SleepFor(absl::Milliseconds(200));
    reader = log_->Read(p, *from);
  }
  uint64_t next_sequence = *from;  // of the entry the reader gives next
  while (!owned->stop.load() && membership_->alive()) {
    absl::StatusOr<std::optional<PartitionLog::Entry>> next =
        (*reader)->Next(absl::Milliseconds(100));
    if (!next.ok()) {
      // The reader may have consumed an entry it could not return: read
      // again from the next one this loop expects.
      LOG(WARNING) << "partition " << p << ": reading the log: " << next.status();
      absl::SleepFor(absl::Milliseconds(100));
      absl::StatusOr<std::unique_ptr<PartitionLog::Reader>> again = log_->Read(p, next_sequence);
      if (again.ok()) reader = std::move(again);
      continue;
    }
    if (!next->has_value()) continue;
    const PartitionLog::Entry& e = **next;
    next_sequence = e.sequence + 1;
    v1::LogEntry entry;
    if (!entry.ParseFromString(e.bytes)) {
      LOG(ERROR) << "partition " << p << ": entry " << e.sequence << " ('" << e.id
                 << "') is not a LogEntry; skipped";
      continue;
    }
    absl::StatusOr<PartitionApplier::Outcome> outcome =
        applier.Apply(e.sequence, entry, e.unix_micros);
    if (!outcome.ok()) {
      // The store is failing: stop applying; another node may do better.
      LOG(ERROR) << "partition " << p << ": cannot apply entry " << e.sequence << ": "
                 << outcome.status();
      owned->finished = true;
      return;
    }
      if (!Forward(p, owned->epoch, e.sequence, entry, *outcome, outcome->replayed)) {
      owned->finished = true;  // fenced: another node owns it now
      return;
    }
  }
}

bool ClusterNode::Forward(int partition, int64_t epoch, uint64_t sequence,
                          const v1::LogEntry& entry, const PartitionApplier::Outcome& outcome,
                          bool replayed) {
  // A hello's answer carries a stop already decided for the job: a worker
  // that reconnects is told again, whoever told it before.
  const bool hello = entry.messages_size() > 0 && entry.messages(0).has_hello();
  if (replayed && hello) return true;  // answered when first applied
  v1::EntryOutcome out;
  out.set_connection(entry.connection());
  out.set_sequence(sequence);
  out.set_code(static_cast<int32_t>(outcome.ended.code()));
  out.set_message(std::string(outcome.ended.message()));
  out.set_response(outcome.response);
  for (const v1::ServerMessage& reply : outcome.replies) {
    // Replayed entries were answered when first applied; only actions,
    // which rules may decide again while the node catches up (and which
    // the node may have died before firing), go out, and only once.
    if (replayed && !reply.has_action()) continue;
    if (reply.has_action() && !hello) {
      // Once per job, worker, rule and step, whoever owns the partition.
      const v1::Action& a = reply.action();
      const std::string key = absl::StrCat(
          options_.membership.prefix, "/actions/", outcome.job, "/", outcome.worker, "/",
          static_cast<int>(a.type()), "/", a.rule(), "/", a.step());
      absl::StatusOr<bool> fired = membership_->FireOnce(partition, epoch, key,
                                                         a.SerializeAsString());
      // etcd briefly unreachable (a member restarting): try again a few
      // times before giving the action up.
      for (absl::Duration pause = absl::Milliseconds(200);
           !fired.ok() && !absl::IsFailedPrecondition(fired.status()) &&
           pause <= absl::Seconds(2);
           pause *= 2) {
        absl::SleepFor(pause);
        fired = membership_->FireOnce(partition, epoch, key, a.SerializeAsString());
      }
      if (!fired.ok()) {
        LOG(WARNING) << "partition " << partition << ": action not sent: " << fired.status();
        if (absl::IsFailedPrecondition(fired.status())) return false;  // fenced
        continue;
      }
      if (!*fired) continue;  // sent before, by this owner or an earlier one
    }
    *out.add_replies() = reply;
  }
  if (replayed) {
    if (out.replies_size() == 0) return true;
    out.set_code(0);
    out.clear_message();
    absl::Status s = log_->Notify(absl::StrCat("out.", entry.gateway()), out.SerializeAsString());
    if (!s.ok()) LOG(WARNING) << "partition " << partition << ": " << s;
    return true;
  }
  for (const PartitionApplier::Outcome::Ended& e : outcome.others_ended) {
    v1::EntryOutcome ended;
    ended.set_connection(e.connection);
    ended.set_sequence(sequence);
    ended.set_code(static_cast<int32_t>(e.status.code()));
    ended.set_message(std::string(e.status.message()));
    absl::Status s = log_->Notify(absl::StrCat("out.", e.gateway), ended.SerializeAsString());
    if (!s.ok()) LOG(WARNING) << "partition " << partition << ": " << s;
  }
  const bool control = entry.control_case() != v1::LogEntry::CONTROL_NOT_SET;
  if (out.replies_size() == 0 && out.code() == 0 && !control) return true;
  absl::Status s = log_->Notify(absl::StrCat("out.", entry.gateway()), out.SerializeAsString());
  if (!s.ok()) LOG(WARNING) << "partition " << partition << ": " << s;
  return true;
}

}  // namespace sonde::cluster
