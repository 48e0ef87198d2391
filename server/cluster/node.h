// A collector node of a Sonde cluster (docs/cluster.md): joins the
// membership, owns the partitions that rank it first among the live nodes,
// applies each one's log to its own JobRegistry and Store, and tells the
// gateways what became of their entries.
//
// It also stands by for the partitions that rank it next (`standbys` of
// them): it applies their log as their owner does, rules included, but
// tells no one. When the owner dies or hands the partition over, the
// standby takes it at a new epoch and goes on from where it is, without a
// replay, then tells what it held back: answers of the last minutes, and
// every action its owner had not fired.
//
// Actions (StopTraining, webhooks, mails) go out only through
// Membership::FireOnce, fenced by the partition's epoch, so each fires once
// per transition even across failovers and replays.
#ifndef SONDE_SERVER_CLUSTER_NODE_H_
#define SONDE_SERVER_CLUSTER_NODE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics/metrics.h"
#include "server/cluster/applier.h"
#include "server/cluster/etcd.h"
#include "server/cluster/job_directory.h"
#include "server/cluster/membership.h"
#include "server/cluster/partition_log.h"
#include "server/ingest_limits.h"
#include "server/job_registry.h"
#include "storage/store.h"

namespace sonde::cluster {

class ClusterNode {
 public:
  struct Options {
    Membership::Options membership;  // prefix, node name, address, lease
    absl::Duration placement_interval = absl::Seconds(1);
    server::IngestLimits limits;
    // How many nodes after the owner apply each partition as standbys.
    int standbys = 1;
  };

  // Joins and starts taking partitions. `etcd`, `log`, `registry` and
  // `store` must outlive the node; the log's partition count is the
  // cluster's.
  static absl::StatusOr<std::unique_ptr<ClusterNode>> Start(Etcd* etcd, PartitionLog* log,
                                                           server::JobRegistry* registry,
                                                           storage::Store* store, Options options);
  // Stops applying and leaves: its partitions are free at once.
  ~ClusterNode();

  // Partitions this node owns now, sorted.
  std::vector<int> owned() const { return Applying(/*as_owner=*/true); }
  // Partitions it applies as a standby, sorted.
  std::vector<int> standing_by() const { return Applying(/*as_owner=*/false); }
  // Log entries applied since the node started, all partitions together
  // (a replay applies entries again).
  uint64_t entries_applied() const { return entries_applied_.load(); }
  // Partitions this node took since it started: with its copy caught up
  // (a warm takeover) or still catching up (it replays while it owns).
  uint64_t takeovers(bool caught_up) const {
    return caught_up ? warm_takeovers_.load() : cold_takeovers_.load();
  }
  bool alive() const { return membership_->alive(); }

 private:
  struct Applied;
  struct Answer;
  std::vector<int> Applying(bool as_owner) const ABSL_LOCKS_EXCLUDED(mu_);
  ClusterNode(Etcd* etcd, PartitionLog* log, server::JobRegistry* registry,
              storage::Store* store, Options options, std::unique_ptr<Membership> membership);
  void RegisterMetrics();
  void PlacementLoop();
  // Records in the JobDirectory the jobs of this node's store that have no
  // record (those from before there was one) where the hash over this
  // node's partitions puts them. True once done.
  bool RecordFormerJobs();
  // One placement pass: apply the partitions that rank this node first or
  // among the next `standbys`; take those that rank it first and are free;
  // hand over those that rank another node first once it has caught up.
  void Place();
  void PlacePartition(int partition, const std::vector<std::string>& preferred,
                      const std::optional<PartitionOwner>& owner);
  void ApplyLoop(Applied* applied);
  // Tells the entry's gateway what became of it; actions only once fired.
  // False when this node is fenced off the partition.
  bool Forward(int partition, int64_t epoch, const Answer& answer);
  // Keeps what a standby did not tell, within bounds (node.cc).
  void HoldBack(Applied* applied, Answer answer);
  // Once the partition is this node's: tells what was held back.
  // False when fenced meanwhile.
  bool TellHeldBack(Applied* applied);
  // Stops applying; releases the partition if this node owned it.
  void Drop(int partition) ABSL_LOCKS_EXCLUDED(mu_);
  // The registry's notification gate: true once per transition, and only while
  // this node owns the job's partition.
  bool MayPost(const std::string& job, const v1::Action& action) ABSL_LOCKS_EXCLUDED(mu_);

  // What the registry's gate calls, cleared when the node goes (rule
  // threads may still hold the gate).
  struct GateState {
    absl::Mutex mu;
    ClusterNode* node ABSL_GUARDED_BY(mu) = nullptr;
  };
  std::shared_ptr<GateState> gate_ = std::make_shared<GateState>();

  PartitionLog* const log_;
  server::JobRegistry* const registry_;
  storage::Store* const store_;
  const Options options_;
  std::unique_ptr<Membership> membership_;
  JobDirectory directory_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<int, std::unique_ptr<Applied>> applied_ ABSL_GUARDED_BY(mu_);
  std::set<int> withdraw_;  // placement thread only: caught-up keys to delete
  std::atomic<uint64_t> entries_applied_{0};
  std::atomic<uint64_t> warm_takeovers_{0};
  std::atomic<uint64_t> cold_takeovers_{0};
  // sonde_cluster_* in metrics::Registry::Default(), labelled with the
  // node's name (reset first when the node goes).
  std::vector<metrics::Registration> metrics_;
  // The partition each job's entries came from (the notification gate's
  // question), as the apply loops met them.
  absl::Mutex jobs_mu_;
  std::map<std::string, int> job_partitions_ ABSL_GUARDED_BY(jobs_mu_);
  std::thread placement_;
};

}  // namespace sonde::cluster

#endif  // SONDE_SERVER_CLUSTER_NODE_H_
