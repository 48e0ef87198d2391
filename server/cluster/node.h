// A collector node of a Sonde cluster (docs/cluster.md): joins the
// membership, owns the partitions that rank it first among the live nodes,
// applies each one's log to its own JobRegistry and Store, and tells the
// gateways what became of their entries.
//
// Actions (StopTraining) reach gateways only through Membership::FireOnce,
// fenced by the partition's epoch, so each fires once per transition even
// when a new owner replays the log after a failover.
#ifndef SONDE_SERVER_CLUSTER_NODE_H_
#define SONDE_SERVER_CLUSTER_NODE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/cluster/applier.h"
#include "server/cluster/etcd.h"
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
  };

  // Joins and starts taking partitions. `etcd`, `log`, `registry` and
  // `store` must outlive the node; the log's partition count is the
  // cluster's.
  static absl::StatusOr<std::unique_ptr<ClusterNode>> Start(Etcd* etcd, PartitionLog* log,
                                                           server::JobRegistry* registry,
                                                           storage::Store* store, Options options);
  // Stops applying and leaves: its partitions are free at once.
  ~ClusterNode();

  // Partitions this node applies now, sorted.
  std::vector<int> owned() const;
  bool alive() const { return membership_->alive(); }

 private:
  struct Owned;
  ClusterNode(PartitionLog* log, server::JobRegistry* registry, storage::Store* store,
              Options options, std::unique_ptr<Membership> membership);
  void PlacementLoop();
  // One placement pass: take the partitions that rank this node first and
  // are free, give up those that rank another live node first.
  void Place();
  void ApplyLoop(Owned* owned);
  // Tells the entry's gateway what became of it; actions only once fired.
  // False when this node is fenced off the partition.
  // `replayed`: only the entry's actions go out (rules may decide them
  // again while a restarted node catches up).
  bool Forward(int partition, int64_t epoch, uint64_t sequence, const v1::LogEntry& entry,
               const PartitionApplier::Outcome& outcome, bool replayed);
  void Drop(int partition) ABSL_LOCKS_EXCLUDED(mu_);
  // The registry's webhook gate: true once per transition, and only while
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

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<int, std::unique_ptr<Owned>> owned_ ABSL_GUARDED_BY(mu_);
  std::thread placement_;
};

}  // namespace sonde::cluster

#endif  // SONDE_SERVER_CLUSTER_NODE_H_
