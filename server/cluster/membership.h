// One node's membership in a Sonde cluster, the partitions it owns, and
// fenced writes, all kept in etcd under a prefix (e.g. "/sonde/prod"):
//
//   <prefix>/nodes/<node>          the node's address, under its lease
//   <prefix>/owners/<partition>    the owning node's name, under its lease
//
// A node is alive while its lease is: a node that crashes or is cut off
// from etcd loses its membership and every partition it owned one lease
// TTL later, and another node may then take them.
//
// A partition's epoch is the create_revision of its owner key. etcd's
// revision only grows, so each new ownership has a larger epoch than every
// earlier one, and a write made on condition that the owner key was created
// at epoch E fails as soon as anyone else owns the partition: the fencing
// token that keeps a stale owner (paused, or cut off, past its lease) from
// acting. FireOnce builds on it: an action fires once per key, by the
// partition's current owner only, even across failovers.
#ifndef SONDE_SERVER_CLUSTER_MEMBERSHIP_H_
#define SONDE_SERVER_CLUSTER_MEMBERSHIP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/cluster/etcd.h"

namespace sonde::cluster {

struct PartitionOwner {
  std::string node;
  int64_t epoch = 0;
};

class Membership {
 public:
  struct Options {
    std::string prefix;   // e.g. "/sonde/prod"; no trailing slash
    std::string node;     // unique in the cluster; [A-Za-z0-9._-]+
    std::string address;  // where the node serves (host:port)
    // How long the node's claims outlive it. Renewed every third of it.
    absl::Duration lease_ttl = absl::Seconds(5);
    // Called once, from the keep-alive thread, when the lease is lost:
    // etcd said it expired, or no renewal succeeded for a whole TTL (etcd
    // may have expired it). The node must stop acting for its partitions.
    std::function<void(const absl::Status&)> on_lost;
  };

  // Registers the node (fails with ALREADY_EXISTS if a live node has the
  // name) and keeps its lease alive until destroyed.
  static absl::StatusOr<std::unique_ptr<Membership>> Join(Etcd* etcd, Options options);
  // Leaves cleanly: revokes the lease, so the node's partitions are free at
  // once rather than after a TTL.
  ~Membership();

  const std::string& node() const { return options_.node; }
  // False once the lease is lost; nothing owned is owned any more.
  bool alive() const;

  // Takes `partition` if no live node owns it: its new epoch, or nullopt
  // when another node owns it. The node's own earlier claim is returned as is.
  absl::StatusOr<std::optional<int64_t>> TryAcquire(int partition);
  // Gives `partition` up (if still owned at `epoch`), e.g. to hand it over.
  absl::Status Release(int partition, int64_t epoch);
  absl::StatusOr<std::optional<PartitionOwner>> OwnerOf(int partition);
  // Every partition's owner, by partition.
  absl::StatusOr<std::vector<std::optional<PartitionOwner>>> Owners(int partitions);
  // The live nodes' names and addresses, sorted by name.
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> LiveNodes();

  // Writes `writes` only if this node still owns `partition` at `epoch` and
  // every one of `conditions` holds. FAILED_PRECONDITION "fenced" when the
  // partition has another owner (or none); false when only a condition
  // failed.
  absl::StatusOr<bool> FencedTxn(int partition, int64_t epoch,
                                 const std::vector<Compare>& conditions,
                                 const std::vector<Write>& writes);
  // Records `key` = `value` if the key is absent, fenced as above: true when
  // this call fired it, false when it had fired before (by this owner or an
  // earlier one). For actions that must happen once per transition.
  absl::StatusOr<bool> FireOnce(int partition, int64_t epoch, const std::string& key,
                                const std::string& value);
  // Whether `key` was fired (by any owner).
  absl::StatusOr<bool> Fired(const std::string& key);

  // Says, for as long as this node lives, that its copy of `partition` has
  // caught up with the log (true), or withdraws that (false). The owner
  // hands a partition to the node that ranks first only once that node
  // says so, so a hand-over never waits on a cold replay.
  absl::Status SetCaughtUp(int partition, bool caught_up);
  absl::StatusOr<bool> CaughtUp(int partition, const std::string& node);

  std::string OwnerKey(int partition) const;

 private:
  Membership(Etcd* etcd, Options options, int64_t lease);
  void KeepAliveLoop();

  Etcd* const etcd_;
  const Options options_;
  const int64_t lease_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool lost_ ABSL_GUARDED_BY(mu_) = false;
  std::thread keep_alive_;
};

// Rendezvous (highest-random-weight) order of `nodes` for `partition`: the
// first is where the partition belongs, the second its standby. Adding or
// removing a node moves only the partitions whose first choice it is or was.
std::vector<std::string> PreferredNodes(int partition, std::vector<std::string> nodes);

// The partition of a job: a hash of its name that every process computes
// the same way.
int JobPartition(const std::string& job, int partitions);

}  // namespace sonde::cluster

#endif  // SONDE_SERVER_CLUSTER_MEMBERSHIP_H_
