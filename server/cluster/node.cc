#include "server/cluster/node.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "proto/cluster.pb.h"

namespace sonde::cluster {
namespace {

// How long, in log time, a standby keeps the answers it held back: a
// gateway waits 30 s for a hello's answer, so one the owner died before
// sending is still awaited when the standby takes over.
constexpr int64_t kRetellMicros = 120'000'000;
// At most this many answers, and as many notifications, are held back per
// partition; past it the oldest answers go, and new notifications (each action
// given up is logged).
constexpr size_t kMaxHeldBack = 100'000;
// A copy is caught up while it is at most this many entries behind the
// log's last one, or has applied every entry the log held at the check
// before (about a second ago: a busy partition is never 100 behind).
constexpr uint64_t kCaughtUpLag = 100;

std::string ActionKey(const std::string& prefix, const std::string& job, int32_t worker,
                      const v1::Action& a) {
  return absl::StrCat(prefix, "/actions/", job, "/", worker, "/", static_cast<int>(a.type()),
                      "/", a.rule(), "/", a.step());
}

std::string NotificationKey(const std::string& prefix, const std::string& job, const v1::Action& a) {
  return absl::StrCat(prefix, "/actions/", job,
                      a.type() == v1::ACTION_EMAIL ? "/email/" : "/webhook/", a.rule(), "/",
                      a.step(), "/", a.target());
}

}  // namespace

// What applying one entry told its stream, kept until told (by a standby,
// until it takes the partition over).
struct ClusterNode::Answer {
  uint64_t sequence = 0;
  int64_t log_micros = 0;  // when the log stored the entry
  std::string gateway;
  uint64_t connection = 0;
  bool hello = false;
  bool control = false;
  // Applied before this run (a restarted node's replay) or held back so
  // long that only its actions are still worth sending.
  bool replayed = false;
  PartitionApplier::Outcome outcome;
};

// A partition this node applies: as its owner (epoch > 0) or standing by
// (epoch 0), and the thread applying it.
struct ClusterNode::Applied {
  int partition = 0;
  std::atomic<bool> stop{false};
  // The apply loop gave up (storage failing, or fenced): the next
  // placement pass drops the partition, so it can be taken again.
  std::atomic<bool> finished{false};
  // The copy was at most kCaughtUpLag entries behind the log's end when
  // last checked.
  std::atomic<bool> caught_up{false};
  absl::Time lag_checked = absl::InfinitePast();  // apply thread only
  uint64_t last_seen = 0;  // the log's last sequence at that check
  bool announced = false;  // placement thread only: CaughtUp said in etcd
  std::atomic<size_t> held{0};  // recent + aged, for the metrics

  absl::Mutex mu;
  int64_t epoch ABSL_GUARDED_BY(mu) = 0;
  // Notifications (webhooks, mails) held back while standing by (rule threads add).
  std::deque<std::pair<std::string, v1::Action>> notifications ABSL_GUARDED_BY(mu);

  // Apply thread only: answers held back, those of the last kRetellMicros
  // whole, older ones reduced to their actions.
  std::deque<Answer> recent;
  std::deque<Answer> aged;
  absl::Time pruned = absl::InfinitePast();

  int64_t Epoch() ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    return epoch;
  }
  // Apply thread only (recent and aged are its own; notifications need mu).
  bool HoldsBack() ABSL_LOCKS_EXCLUDED(mu) {
    if (!recent.empty() || !aged.empty()) return true;
    absl::MutexLock lock(&mu);
    return !notifications.empty();
  }

  std::thread thread;
};

absl::StatusOr<std::unique_ptr<ClusterNode>> ClusterNode::Start(Etcd* etcd, PartitionLog* log,
                                                               server::JobRegistry* registry,
                                                               storage::Store* store,
                                                               Options options) {
  SONDE_ASSIGN_OR_RETURN(std::unique_ptr<Membership> membership,
                         Membership::Join(etcd, options.membership));
  std::unique_ptr<ClusterNode> node(
      new ClusterNode(etcd, log, registry, store, std::move(options), std::move(membership)));
  {
    absl::MutexLock lock(&node->gate_->mu);
    node->gate_->node = node.get();
  }
  registry->set_notification_gate([state = node->gate_](const std::string& job, const v1::Action& a) {
    absl::MutexLock lock(&state->mu);
    return state->node != nullptr && state->node->MayPost(job, a);
  });
  node->RegisterMetrics();
  node->placement_ = std::thread([n = node.get()] { n->PlacementLoop(); });
  return node;
}

ClusterNode::ClusterNode(Etcd* etcd, PartitionLog* log, server::JobRegistry* registry,
                         storage::Store* store, Options options,
                         std::unique_ptr<Membership> membership)
    : log_(log),
      registry_(registry),
      store_(store),
      options_(std::move(options)),
      membership_(std::move(membership)),
      directory_(etcd, options_.membership.prefix, log->options().partitions) {}

void ClusterNode::RegisterMetrics() {
  metrics::Registry& r = metrics::Registry::Default();
  const std::string name = membership_->node();
  metrics_.push_back(r.AddCallback(
      metrics::MetricType::kGauge, "sonde_cluster_partitions",
      "Partitions this node applies, as their owner or as a standby.", {"node", "role"},
      [this, name] {
        const double owner = static_cast<double>(Applying(true).size());
        const double standby = static_cast<double>(Applying(false).size());
        return std::vector<metrics::Sample>{{{name, "owner"}, owner}, {{name, "standby"}, standby}};
      }));
  metrics_.push_back(r.AddCallback(
      metrics::MetricType::kCounter, "sonde_cluster_entries_applied_total",
      "Log entries this node applied (replays included).", {"node"}, [this, name] {
        return std::vector<metrics::Sample>{{{name}, static_cast<double>(entries_applied())}};
      }));
  metrics_.push_back(r.AddCallback(
      metrics::MetricType::kCounter, "sonde_cluster_takeovers_total",
      "Partitions this node took over: with its copy caught up (a warm standby) or still "
      "catching up (it replays while hellos wait).",
      {"node", "copy"}, [this, name] {
        return std::vector<metrics::Sample>{
            {{name, "caught_up"}, static_cast<double>(takeovers(true))},
            {{name, "catching_up"}, static_cast<double>(takeovers(false))}};
      }));
  metrics_.push_back(r.AddCallback(
      metrics::MetricType::kGauge, "sonde_cluster_held_back_answers",
      "Answers and actions a standby holds back until it owns their partition.", {"node"},
      [this, name] {
        double held = 0;
        absl::MutexLock lock(&mu_);
        for (const auto& [p, a] : applied_) held += static_cast<double>(a->held.load());
        return std::vector<metrics::Sample>{{{name}, held}};
      }));
}

ClusterNode::~ClusterNode() {
  metrics_.clear();  // no scrape reads the node from here on
  {
    absl::MutexLock lock(&gate_->mu);  // waits for a gate call in progress
    gate_->node = nullptr;
  }
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  placement_.join();
  std::vector<int> partitions;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [p, a] : applied_) partitions.push_back(p);
  }
  for (int p : partitions) Drop(p);
  membership_.reset();  // leaves: the lease is revoked
}

std::vector<int> ClusterNode::Applying(bool as_owner) const {
  absl::MutexLock lock(&mu_);
  std::vector<int> out;
  for (const auto& [p, a] : applied_) {
    if ((a->Epoch() > 0) == as_owner) out.push_back(p);
  }
  return out;
}

bool ClusterNode::MayPost(const std::string& job, const v1::Action& action) {
  int p;
  {
    absl::MutexLock lock(&jobs_mu_);
    auto it = job_partitions_.find(job);
    if (it == job_partitions_.end()) return false;  // no session of it here
    p = it->second;
  }
  int64_t epoch;
  {
    absl::MutexLock lock(&mu_);
    auto it = applied_.find(p);
    if (it == applied_.end()) return false;  // a former owner's copy
    Applied& a = *it->second;
    absl::MutexLock hold(&a.mu);
    epoch = a.epoch;
    if (epoch == 0) {
      // Standing by: posted when this node takes the partition, unless its
      // owner did meanwhile.
      if (a.notifications.size() >= kMaxHeldBack) {
        // Only the apply thread removes held notifications (HoldBack counts on it).
        LOG(ERROR) << "partition " << p << ": " << kMaxHeldBack
                   << " notifications held back already; that of " << action.rule() << " at step "
                   << action.step() << " is given up";
        return false;
      }
      a.notifications.emplace_back(job, action);
      return false;
    }
  }
  absl::StatusOr<bool> fired = membership_->FireOnce(
      p, epoch, NotificationKey(options_.membership.prefix, job, action), action.SerializeAsString());
  if (!fired.ok()) {
    LOG(WARNING) << "job '" << job << "': notification not sent: " << fired.status();
    return false;
  }
  return *fired;
}

void ClusterNode::PlacementLoop() {
  bool recorded = false;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stop), options_.placement_interval)) return;
    }
    Place();
    if (!recorded) recorded = RecordFormerJobs();  // after placing: never delays it
  }
}

bool ClusterNode::RecordFormerJobs() {
  absl::StatusOr<std::map<std::string, int>> recorded = directory_.All();
  absl::StatusOr<std::vector<v1::JobInfo>> jobs = store_->ListJobs();
  if (!recorded.ok() || !jobs.ok()) {
    LOG(WARNING) << "node '" << membership_->node() << "': former jobs not recorded yet: "
                 << (recorded.ok() ? jobs.status() : recorded.status());
    return false;
  }
  int added = 0;
  for (const v1::JobInfo& job : *jobs) {
    if (recorded->count(job.job()) > 0) continue;
    absl::StatusOr<int> p = directory_.PartitionOf(job.job(), /*record=*/true);
    if (!p.ok()) {
      LOG(WARNING) << "job '" << job.job() << "': " << p.status();
      return false;
    }
    ++added;
  }
  if (added > 0) {
    LOG(INFO) << "node '" << membership_->node() << "': recorded the partitions of " << added
              << " jobs from before the job directory";
  }
  return true;
}

void ClusterNode::Place() {
  if (!membership_->alive()) {
    // The lease is gone: nothing is ours any more; stop applying.
    std::vector<int> partitions;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [p, a] : applied_) partitions.push_back(p);
    }
    for (int p : partitions) Drop(p);
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
  for (int p = 0; p < partitions; ++p) PlacePartition(p, PreferredNodes(p, names), (*owners)[p]);
  // Caught-up keys of partitions dropped while etcd was unreachable: a
  // stale one would draw reads and hand-overs to a copy no longer applied.
  for (auto it = withdraw_.begin(); it != withdraw_.end();) {
    bool applied;
    {
      absl::MutexLock lock(&mu_);
      applied = applied_.count(*it) > 0;
    }
    if (applied || membership_->SetCaughtUp(*it, false).ok()) {
      it = withdraw_.erase(it);
    } else {
      ++it;
    }
  }
}

void ClusterNode::PlacePartition(int p, const std::vector<std::string>& preferred,
                                 const std::optional<PartitionOwner>& owner) {
  const std::string& me = membership_->node();
  const auto at = std::find(preferred.begin(), preferred.end(), me);
  const int rank = at == preferred.end() ? -1 : static_cast<int>(at - preferred.begin());
  const bool first = rank == 0;
  const bool keep = rank >= 0 && rank <= options_.standbys;
  Applied* a = nullptr;  // stays valid: only this thread drops partitions
  {
    absl::MutexLock lock(&mu_);
    auto it = applied_.find(p);
    if (it != applied_.end()) a = it->second.get();
  }
  const int64_t epoch = a == nullptr ? 0 : a->Epoch();
  if (a != nullptr && a->finished.load()) {
    LOG(WARNING) << "node '" << me << "': dropping partition " << p << ", whose apply loop stopped";
    Drop(p);
    return;
  }
  if (epoch == 0 && owner.has_value() && owner->node == me) {
    // Ours in etcd but not applied as ours (a release that failed): free it.
    membership_->Release(p, owner->epoch).IgnoreError();
    return;
  }
  if (epoch > 0) {
    if (first) return;
    // Another node ranks first. It gets the partition once its copy has
    // caught up, so hellos never wait on its replay; until then this node
    // keeps answering.
    absl::StatusOr<bool> ready = membership_->CaughtUp(p, preferred[0]);
    if (!ready.ok() || !*ready) return;
    LOG(INFO) << "node '" << me << "': partition " << p << " goes to '" << preferred[0] << "'";
    if (!keep) {
      Drop(p);
      return;
    }
    {
      absl::MutexLock lock(&a->mu);
      a->epoch = 0;  // standing by from now on
    }
    absl::Status s = membership_->Release(p, epoch);
    if (!s.ok()) LOG(WARNING) << "releasing partition " << p << ": " << s;
    return;
  }
  if (!keep) {
    if (a != nullptr) Drop(p);
    return;
  }
  if (a == nullptr) {
    auto applied = std::make_unique<Applied>();
    applied->partition = p;
    // A key left from an earlier copy is this copy's to keep or withdraw.
    applied->announced = withdraw_.erase(p) > 0;
    a = applied.get();
    absl::MutexLock lock(&mu_);
    applied_[p] = std::move(applied);
    a->thread = std::thread([this, a] { ApplyLoop(a); });
  }
  if (a->caught_up.load() != a->announced) {
    // Said while the copy is near the log's end; withdrawn if it falls
    // behind, so a hand-over never lands on a lagging copy.
    absl::Status s = membership_->SetCaughtUp(p, !a->announced);
    if (s.ok()) {
      a->announced = !a->announced;
    } else {
      LOG(WARNING) << "partition " << p << ": " << s;
    }
  }
  if (owner.has_value()) return;
  // Free (its owner died). The best-ranked node whose copy has caught up
  // takes it, so hellos do not wait on a replay: a restarted first choice
  // lets a caught-up standby own it until it has caught up itself (then
  // the standby hands it back). With no copy caught up, the first choice.
  const bool caught_up = a->caught_up.load();
  if (!first && !caught_up) return;
  const int last = first && !caught_up ? std::min<int>(options_.standbys,
                                                       static_cast<int>(preferred.size()) - 1)
                                       : rank - 1;
  for (int r = first ? 1 : 0; r <= last; ++r) {
    if (r == rank) continue;
    absl::StatusOr<bool> ready = membership_->CaughtUp(p, preferred[r]);
    if (!ready.ok() || *ready) return;  // theirs (or etcd is unreachable)
  }
  absl::StatusOr<std::optional<int64_t>> took = membership_->TryAcquire(p);
  if (!took.ok() || !took->has_value()) return;  // taken meanwhile, or etcd unreachable
  const bool warm = a->caught_up.load();
  (warm ? warm_takeovers_ : cold_takeovers_).fetch_add(1);
  LOG(INFO) << "node '" << me << "' owns partition " << p << " at epoch " << **took
            << (warm ? " (its copy had caught up)" : " (its copy is catching up)");
  absl::MutexLock lock(&a->mu);
  a->epoch = **took;
}

void ClusterNode::Drop(int partition) {
  std::unique_ptr<Applied> a;
  {
    absl::MutexLock lock(&mu_);
    auto it = applied_.find(partition);
    if (it == applied_.end()) return;
    a = std::move(it->second);
    applied_.erase(it);
  }
  a->stop = true;
  a->thread.join();
  if (!membership_->alive()) return;
  if (const int64_t epoch = a->Epoch(); epoch > 0) {
    absl::Status s = membership_->Release(partition, epoch);
    if (!s.ok()) LOG(WARNING) << "releasing partition " << partition << ": " << s;
  }
  if (a->announced && !membership_->SetCaughtUp(partition, false).ok()) {
    withdraw_.insert(partition);  // tried again each placement pass
  }
}

void ClusterNode::ApplyLoop(Applied* a) {
  const int p = a->partition;
  PartitionApplier applier(static_cast<uint32_t>(p), registry_, store_, options_.limits);
  absl::StatusOr<uint64_t> from = applier.ReadFrom();
  if (!from.ok()) {
    LOG(ERROR) << "partition " << p << ": cannot read the applied position: " << from.status();
    a->finished = true;
    return;
  }
  absl::StatusOr<std::unique_ptr<PartitionLog::Reader>> reader = log_->Read(p, *from);
  while (!a->stop.load() && !reader.ok()) {
    LOG(WARNING) << "partition " << p << ": cannot read the log yet: " << reader.status();
    absl::SleepFor(absl::Milliseconds(200));
    reader = log_->Read(p, *from);
  }
  // Fenced at `epoch` while still holding the partition at it: stop.
  auto fenced = [a](int64_t epoch) { return a->Epoch() == epoch; };
  uint64_t next_sequence = *from;  // of the entry the reader gives next
  std::string last_job;            // the job last recorded in job_partitions_
  while (!a->stop.load() && membership_->alive()) {
    if (const int64_t epoch = a->Epoch(); epoch > 0 && a->HoldsBack()) {
      if (!TellHeldBack(a) && fenced(epoch)) {
        a->finished = true;
        return;
      }
    }
    absl::StatusOr<std::optional<PartitionLog::Entry>> next =
        (*reader)->Next(absl::Milliseconds(100));
    if (!next.ok()) {
      // The reader may have consumed an entry it could not return: read
      // again from the next one this loop expects.
      LOG(WARNING) << "partition " << p << ": reading the log: " << next.status();
      a->caught_up = false;  // not while it cannot read
      absl::SleepFor(absl::Milliseconds(100));
      absl::StatusOr<std::unique_ptr<PartitionLog::Reader>> again = log_->Read(p, next_sequence);
      if (again.ok()) reader = std::move(again);
      continue;
    }
    if (absl::Now() - a->lag_checked >= absl::Seconds(1)) {
      // Caught up by the log's own count, not by a quiet moment (a leader
      // election pauses the reader too).
      a->lag_checked = absl::Now();
      absl::StatusOr<uint64_t> last = log_->LastSequence(p);
      // Unknown counts as behind: a copy cut off from the log must not be
      // handed partitions or reads.
      a->caught_up = last.ok() && (*last < next_sequence + kCaughtUpLag ||
                                   (a->last_seen > 0 && next_sequence > a->last_seen));
      a->last_seen = last.ok() ? *last : 0;
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
      a->finished = true;
      return;
    }
    entries_applied_.fetch_add(1);
    if (!outcome->job.empty() && outcome->job != last_job) {
      last_job = outcome->job;
      absl::MutexLock lock(&jobs_mu_);
      job_partitions_[last_job] = p;
    }
    Answer answer;
    answer.sequence = e.sequence;
    answer.log_micros = e.unix_micros;
    answer.gateway = entry.gateway();
    answer.connection = entry.connection();
    answer.hello = entry.messages_size() > 0 && entry.messages(0).has_hello();
    answer.control = entry.control_case() != v1::LogEntry::CONTROL_NOT_SET;
    answer.replayed = outcome->replayed;
    answer.outcome = *std::move(outcome);
    const int64_t epoch = a->Epoch();
    if (epoch == 0 || !Forward(p, epoch, answer)) {
      if (epoch > 0 && fenced(epoch)) {
        a->finished = true;  // another node owns it now
        return;
      }
      HoldBack(a, std::move(answer));  // standing by (or just handed over)
    }
  }
}

void ClusterNode::HoldBack(Applied* a, Answer answer) {
  // Only what a gateway still uses: the hello's whole answer; of other
  // entries their warnings and actions (the gateway acknowledged their
  // steps when the log stored them), an ended stream, a control's answer.
  if (!answer.hello) {
    auto& replies = answer.outcome.replies;
    replies.erase(std::remove_if(replies.begin(), replies.end(),
                                 [](const v1::ServerMessage& r) { return r.has_ack(); }),
                  replies.end());
  }
  const int64_t now = answer.log_micros;
  if (!answer.outcome.replies.empty() || !answer.outcome.ended.ok() ||
      !answer.outcome.others_ended.empty() || answer.control) {
    a->recent.push_back(std::move(answer));
  }
  // Past the window, or over the bound: only actions are still worth
  // sending (a hello's were in its answer, already given or awaited no more).
  while (!a->recent.empty() && (a->recent.front().log_micros < now - kRetellMicros ||
                                a->recent.size() > kMaxHeldBack)) {
    Answer old = std::move(a->recent.front());
    a->recent.pop_front();
    if (old.hello) continue;
    auto& replies = old.outcome.replies;
    replies.erase(std::remove_if(replies.begin(), replies.end(),
                                 [](const v1::ServerMessage& r) { return !r.has_action(); }),
                  replies.end());
    if (replies.empty()) continue;
    old.replayed = true;
    if (a->aged.size() >= kMaxHeldBack) {
      LOG(ERROR) << "partition " << a->partition << ": actions of entry "
                 << a->aged.front().sequence << " held back too long; given up";
      a->aged.pop_front();
    }
    a->aged.push_back(std::move(old));
  }
  a->held = a->recent.size() + a->aged.size();
  // Now and then, forget what the owner has fired since (etcd says).
  if (absl::Now() - a->pruned < absl::Seconds(1)) return;
  a->pruned = absl::Now();
  const std::string& prefix = options_.membership.prefix;
  // The oldest few, each on its own: one the owner never fired must not
  // keep the others.
  for (size_t i = 0, checked = 0; i < a->aged.size() && checked < 16; ++checked) {
    const Answer& old = a->aged[i];
    bool all = true;
    for (const v1::ServerMessage& r : old.outcome.replies) {
      absl::StatusOr<bool> fired =
          membership_->Fired(ActionKey(prefix, old.outcome.job, old.outcome.worker, r.action()));
      all = all && fired.ok() && *fired;
    }
    if (all) {
      a->aged.erase(a->aged.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  std::vector<std::pair<std::string, v1::Action>> front;
  {
    absl::MutexLock lock(&a->mu);
    for (size_t i = 0; i < a->notifications.size() && i < 16; ++i) front.push_back(a->notifications[i]);
  }
  std::vector<size_t> fired_before;
  for (size_t i = 0; i < front.size(); ++i) {
    absl::StatusOr<bool> fired =
        membership_->Fired(NotificationKey(prefix, front[i].first, front[i].second));
    if (fired.ok() && *fired) fired_before.push_back(i);
  }
  a->held = a->recent.size() + a->aged.size();
  absl::MutexLock lock(&a->mu);
  // Only this thread removes notifications (others append), so the first ones
  // are still those checked.
  for (auto it = fired_before.rbegin(); it != fired_before.rend(); ++it) {
    a->notifications.erase(a->notifications.begin() + static_cast<std::ptrdiff_t>(*it));
  }
}

bool ClusterNode::TellHeldBack(Applied* a) {
  int64_t epoch;
  std::deque<std::pair<std::string, v1::Action>> notifications;
  {
    absl::MutexLock lock(&a->mu);
    epoch = a->epoch;
    if (epoch == 0) return true;
    notifications.swap(a->notifications);
  }
  const int p = a->partition;
  LOG(INFO) << "partition " << p << ": telling what was held back while standing by: "
            << a->aged.size() + a->recent.size() << " answers, " << notifications.size()
            << " notifications";
  bool ok = true;
  for (std::deque<Answer>* held : {&a->aged, &a->recent}) {
    while (ok && !held->empty()) {
      ok = Forward(p, epoch, held->front());
      if (ok) held->pop_front();
    }
  }
  while (ok && !notifications.empty()) {
    const auto& [job, action] = notifications.front();
    absl::StatusOr<bool> fired = membership_->FireOnce(
        p, epoch, NotificationKey(options_.membership.prefix, job, action), action.SerializeAsString());
    if (!fired.ok() && absl::IsFailedPrecondition(fired.status())) {
      ok = false;
      break;
    }
    if (!fired.ok()) {
      LOG(WARNING) << "job '" << job << "': notification not sent: " << fired.status();
    } else if (*fired) {
      registry_->PostNotification(action);
    }
    notifications.pop_front();
  }
  a->held = a->recent.size() + a->aged.size();
  if (!notifications.empty()) {
    // Fenced: keep them for whoever this node is next.
    absl::MutexLock lock(&a->mu);
    a->notifications.insert(a->notifications.begin(), notifications.begin(), notifications.end());
  }
  return ok;
}

bool ClusterNode::Forward(int partition, int64_t epoch, const Answer& answer) {
  const PartitionApplier::Outcome& outcome = answer.outcome;
  const bool replayed = answer.replayed;
  // A hello's answer carries a stop already decided for the job: a worker
  // that reconnects is told again, whoever told it before.
  if (replayed && answer.hello) return true;  // answered when first applied
  v1::EntryOutcome out;
  out.set_connection(answer.connection);
  out.set_sequence(answer.sequence);
  out.set_code(static_cast<int32_t>(outcome.ended.code()));
  out.set_message(std::string(outcome.ended.message()));
  out.set_response(outcome.response);
  for (const v1::ServerMessage& reply : outcome.replies) {
    // Replayed entries were answered when first applied; only actions,
    // which rules may decide again while the node catches up (and which
    // the node may have died before firing), go out, and only once.
    if (replayed && !reply.has_action()) continue;
    // The gateway acknowledged the steps when the log stored them.
    if (!answer.hello && reply.has_ack()) continue;
    if (reply.has_action() && !answer.hello) {
      // Once per job, worker, rule and step, whoever owns the partition.
      const v1::Action& a = reply.action();
      const std::string key =
          ActionKey(options_.membership.prefix, outcome.job, outcome.worker, a);
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
    absl::Status s = log_->Notify(absl::StrCat("out.", answer.gateway), out.SerializeAsString());
    if (!s.ok()) LOG(WARNING) << "partition " << partition << ": " << s;
    return true;
  }
  for (const PartitionApplier::Outcome::Ended& e : outcome.others_ended) {
    v1::EntryOutcome ended;
    ended.set_connection(e.connection);
    ended.set_sequence(answer.sequence);
    ended.set_code(static_cast<int32_t>(e.status.code()));
    ended.set_message(std::string(e.status.message()));
    absl::Status s = log_->Notify(absl::StrCat("out.", e.gateway), ended.SerializeAsString());
    if (!s.ok()) LOG(WARNING) << "partition " << partition << ": " << s;
  }
  if (out.replies_size() == 0 && out.code() == 0 && !answer.control) return true;
  absl::Status s = log_->Notify(absl::StrCat("out.", answer.gateway), out.SerializeAsString());
  if (!s.ok()) LOG(WARNING) << "partition " << partition << ": " << s;
  return true;
}

}  // namespace sonde::cluster
