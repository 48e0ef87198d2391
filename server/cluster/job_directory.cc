#include "server/cluster/job_directory.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/cluster/membership.h"

namespace sonde::cluster {

JobDirectory::JobDirectory(Etcd* etcd, std::string prefix, int partitions)
    : etcd_(etcd), prefix_(std::move(prefix)), partitions_(partitions) {}

std::string JobDirectory::Key(const std::string& job) const {
  return absl::StrCat(prefix_, "/jobs/", job);
}

absl::StatusOr<int> JobDirectory::Parse(const std::string& job, const std::string& value) const {
  int p = -1;
  if (!absl::SimpleAtoi(value, &p) || p < 0) {
    return absl::DataLossError(
        absl::StrCat("job '", job, "': its partition record in etcd is '", value, "'"));
  }
  if (p >= partitions_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job, "' lives on partition ", p, ", but this process knows only ",
        partitions_, " partitions: give every process of the cluster the same --partitions, "
        "never fewer than before"));
  }
  return p;
}

absl::StatusOr<int> JobDirectory::PartitionOf(const std::string& job, bool record) {
  {
    absl::MutexLock lock(&mu_);
    auto it = cache_.find(job);
    if (it != cache_.end()) return it->second;
  }
  const std::string key = Key(job);
  SONDE_ASSIGN_OR_RETURN(std::optional<KeyValue> stored, etcd_->Get(key));
  if (!stored.has_value()) {
    const int chosen = JobPartition(job, partitions_);
    if (!record) return chosen;
    SONDE_ASSIGN_OR_RETURN(Etcd::TxnResult created,
                           etcd_->Txn({Compare::Absent(key)},
                                      {Write::Put(key, absl::StrCat(chosen))}));
    if (!created.succeeded) {
      // Recorded meanwhile by another gateway, perhaps with another count.
      SONDE_ASSIGN_OR_RETURN(stored, etcd_->Get(key));
      if (!stored.has_value()) {
        return absl::UnavailableError(
            absl::StrCat("job '", job, "': its partition record came and went; retry"));
      }
    } else {
      stored = KeyValue{key, absl::StrCat(chosen)};
    }
  }
  SONDE_ASSIGN_OR_RETURN(int p, Parse(job, stored->value));
  absl::MutexLock lock(&mu_);
  cache_[job] = p;
  return p;
}

absl::StatusOr<std::map<std::string, int>> JobDirectory::All() {
  const std::string prefix = absl::StrCat(prefix_, "/jobs/");
  SONDE_ASSIGN_OR_RETURN(std::vector<KeyValue> kvs, etcd_->List(prefix));
  std::map<std::string, int> out;
  for (const KeyValue& kv : kvs) {
    const std::string job = kv.key.substr(prefix.size());
    SONDE_ASSIGN_OR_RETURN(out[job], Parse(job, kv.value));
  }
  return out;
}

}  // namespace sonde::cluster
