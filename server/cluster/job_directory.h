// Which partition each job of a Sonde cluster lives on (docs/cluster.md).
// A job's partition is chosen when it is first logged (its first hello, or
// rules enabled before it starts) as a hash of its name over the
// partitions the cluster has then, and recorded in etcd at
// <prefix>/jobs/<job>. It never moves afterwards, so the cluster can be
// given more partitions without moving the jobs it has.
//
// Thread-safe. Records are cached: a job's partition never changes.
#ifndef SONDE_SERVER_CLUSTER_JOB_DIRECTORY_H_
#define SONDE_SERVER_CLUSTER_JOB_DIRECTORY_H_

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/cluster/etcd.h"

namespace sonde::cluster {

class JobDirectory {
 public:
  // `etcd` must outlive the directory; `partitions` is the cluster's count
  // now (new jobs are spread over these).
  JobDirectory(Etcd* etcd, std::string prefix, int partitions);

  // The job's recorded partition. A job with none gets one recorded now if
  // `record`; otherwise the partition it would get is returned, unrecorded
  // (a query about a job not started yet goes where it will be).
  absl::StatusOr<int> PartitionOf(const std::string& job, bool record);
  // Every recorded job's partition.
  absl::StatusOr<std::map<std::string, int>> All();

 private:
  absl::StatusOr<int> Parse(const std::string& job, const std::string& value) const;
  std::string Key(const std::string& job) const;

  Etcd* const etcd_;
  const std::string prefix_;
  const int partitions_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, int> cache_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sonde::cluster

#endif  // SONDE_SERVER_CLUSTER_JOB_DIRECTORY_H_
