#include "server/cluster/membership.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace sonde::cluster {

namespace {

absl::Status ValidateName(const std::string& what, const std::string& name) {
  if (name.empty() || name.size() > 128) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be 1 to 128 characters"));
  }
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " '", name, "' may hold only letters, digits, '.', '_' and '-'"));
    }
  }
  return absl::OkStatus();
}

// FNV-1a, then a 64-bit finalizer (splitmix64's): stable across processes
// and builds, unlike absl::Hash, so every node ranks the same way.
uint64_t StableHash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

}  // namespace

int JobPartition(const std::string& job, int partitions) {
  if (partitions <= 1) return 0;
  return static_cast<int>(StableHash(absl::StrCat("job/", job)) % static_cast<uint64_t>(partitions));
}

std::vector<std::string> PreferredNodes(int partition, std::vector<std::string> nodes) {
  std::vector<std::pair<uint64_t, std::string>> ranked;
  ranked.reserve(nodes.size());
  for (std::string& n : nodes) {
    ranked.emplace_back(StableHash(absl::StrCat(n, "/", partition)), std::move(n));
  }
  std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  std::vector<std::string> out;
  out.reserve(ranked.size());
  for (auto& [score, n] : ranked) out.push_back(std::move(n));
  return out;
}

absl::StatusOr<std::unique_ptr<Membership>> Membership::Join(Etcd* etcd, Options options) {
  SONDE_RETURN_IF_ERROR(ValidateName("node name", options.node));
  if (options.prefix.empty() || options.prefix.front() != '/' || options.prefix.back() == '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "cluster prefix '", options.prefix, "' must start with '/' and not end with one"));
  }
  if (options.lease_ttl < absl::Seconds(1)) {
    return absl::InvalidArgumentError("the node lease must be at least 1 s");
  }
  SONDE_ASSIGN_OR_RETURN(int64_t lease, etcd->GrantLease(options.lease_ttl));
  const std::string key = absl::StrCat(options.prefix, "/nodes/", options.node);
  absl::StatusOr<Etcd::TxnResult> joined =
      etcd->Txn({Compare::Absent(key)}, {Write::Put(key, options.address, lease)});
  if (!joined.ok() || !joined->succeeded) {
    etcd->RevokeLease(lease).IgnoreError();
    if (!joined.ok()) return joined.status();
    return absl::AlreadyExistsError(
        absl::StrCat("a live node of the cluster at '", options.prefix, "' is already named '",
                     options.node, "'"));
  }
  return std::unique_ptr<Membership>(new Membership(etcd, std::move(options), lease));
}

Membership::Membership(Etcd* etcd, Options options, int64_t lease)
    : etcd_(etcd), options_(std::move(options)), lease_(lease) {
  keep_alive_ = std::thread([this] { KeepAliveLoop(); });
}

Membership::~Membership() {
  bool lost;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    lost = lost_;
  }
  keep_alive_.join();
  if (!lost) {
    absl::Status s = etcd_->RevokeLease(lease_);
    if (!s.ok()) LOG(WARNING) << "node '" << options_.node << "' left without revoking: " << s;
  }
}

bool Membership::alive() const {
  absl::MutexLock lock(&mu_);
  return !lost_;
}

void Membership::KeepAliveLoop() {
  const absl::Duration interval = options_.lease_ttl / 3;
  absl::Time last_renewed = absl::Now();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stop), interval)) return;
    }
    absl::Status s = etcd_->KeepAlive(lease_);
    if (s.ok()) {
      last_renewed = absl::Now();
      continue;
    }
    if (!absl::IsNotFound(s) && absl::Now() - last_renewed < options_.lease_ttl) {
      LOG(WARNING) << "node '" << options_.node << "': lease renewal failed, retrying: " << s;
      continue;
    }
    const absl::Status lost = absl::IsNotFound(s)
        ? s
        : absl::UnavailableError(absl::StrCat("no lease renewal for ",
                                              absl::FormatDuration(absl::Now() - last_renewed),
                                              " (lease TTL ",
                                              absl::FormatDuration(options_.lease_ttl),
                                              "): ", s.message()));
    LOG(ERROR) << "node '" << options_.node << "' lost its membership: " << lost;
    {
      absl::MutexLock lock(&mu_);
      lost_ = true;
    }
    if (options_.on_lost) options_.on_lost(lost);
    return;
  }
}

std::string Membership::OwnerKey(int partition) const {
  return absl::StrCat(options_.prefix, "/owners/", partition);
}

absl::StatusOr<std::optional<int64_t>> Membership::TryAcquire(int partition) {
  if (partition < 0) return absl::InvalidArgumentError("negative partition");
  if (!alive()) {
    return absl::FailedPreconditionError(
        absl::StrCat("node '", options_.node, "' has lost its membership"));
  }
  const std::string key = OwnerKey(partition);
  SONDE_ASSIGN_OR_RETURN(Etcd::TxnResult took,
                         etcd_->Txn({Compare::Absent(key)}, {Write::Put(key, options_.node, lease_)}));
  if (took.succeeded) return took.revision;  // created at the transaction's revision
  SONDE_ASSIGN_OR_RETURN(std::optional<KeyValue> owner, etcd_->Get(key));
  if (owner.has_value() && owner->value == options_.node && owner->lease == lease_) {
    return owner->create_revision;
  }
  return std::nullopt;
}

absl::Status Membership::Release(int partition, int64_t epoch) {
  const std::string key = OwnerKey(partition);
  SONDE_ASSIGN_OR_RETURN(Etcd::TxnResult released,
                         etcd_->Txn({Compare::CreatedAt(key, epoch)}, {Write::Delete(key)}));
  if (!released.succeeded) {
    return absl::FailedPreconditionError(absl::StrCat(
        "partition ", partition, " is no longer owned at epoch ", epoch, " by '",
        options_.node, "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<PartitionOwner>> Membership::OwnerOf(int partition) {
  SONDE_ASSIGN_OR_RETURN(std::optional<KeyValue> owner, etcd_->Get(OwnerKey(partition)));
  if (!owner.has_value()) return std::nullopt;
  return PartitionOwner{owner->value, owner->create_revision};
}

absl::StatusOr<std::vector<std::optional<PartitionOwner>>> Membership::Owners(int partitions) {
  SONDE_ASSIGN_OR_RETURN(std::vector<KeyValue> kvs,
                         etcd_->List(absl::StrCat(options_.prefix, "/owners/")));
  std::vector<std::optional<PartitionOwner>> out(static_cast<size_t>(std::max(partitions, 0)));
  const size_t skip = options_.prefix.size() + std::string("/owners/").size();
  for (const KeyValue& kv : kvs) {
    int p = -1;
    if (!absl::SimpleAtoi(kv.key.substr(skip), &p) || p < 0 || p >= partitions) continue;
    out[static_cast<size_t>(p)] = PartitionOwner{kv.value, kv.create_revision};
  }
  return out;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> Membership::LiveNodes() {
  SONDE_ASSIGN_OR_RETURN(std::vector<KeyValue> kvs,
                         etcd_->List(absl::StrCat(options_.prefix, "/nodes/")));
  std::vector<std::pair<std::string, std::string>> out;
  const size_t skip = options_.prefix.size() + std::string("/nodes/").size();
  for (const KeyValue& kv : kvs) out.emplace_back(kv.key.substr(skip), kv.value);
  return out;
}

absl::StatusOr<bool> Membership::FencedTxn(int partition, int64_t epoch,
                                           const std::vector<Compare>& conditions,
                                           const std::vector<Write>& writes) {
  std::vector<Compare> all = conditions;
  all.push_back(Compare::CreatedAt(OwnerKey(partition), epoch));
  SONDE_ASSIGN_OR_RETURN(Etcd::TxnResult result, etcd_->Txn(all, writes));
  if (result.succeeded) return true;
  SONDE_ASSIGN_OR_RETURN(std::optional<PartitionOwner> owner, OwnerOf(partition));
  if (!owner.has_value() || owner->epoch != epoch) {
    return absl::FailedPreconditionError(absl::StrCat(
        "fenced: node '", options_.node, "' wrote for partition ", partition, " at epoch ", epoch,
        ", but ",
        owner.has_value() ? absl::StrCat("'", owner->node, "' owns it at epoch ", owner->epoch)
                          : std::string("no node owns it")));
  }
  return false;
}

absl::StatusOr<bool> Membership::FireOnce(int partition, int64_t epoch, const std::string& key,
                                          const std::string& value) {
  return FencedTxn(partition, epoch, {Compare::Absent(key)}, {Write::Put(key, value)});
}

absl::StatusOr<bool> Membership::Fired(const std::string& key) {
  SONDE_ASSIGN_OR_RETURN(std::optional<KeyValue> kv, etcd_->Get(key));
  return kv.has_value();
}

namespace {
std::string CaughtUpKey(const std::string& prefix, int partition, const std::string& node) {
  return absl::StrCat(prefix, "/caught_up/", partition, "/", node);
}
}  // namespace

absl::Status Membership::SetCaughtUp(int partition, bool caught_up) {
  const std::string key = CaughtUpKey(options_.prefix, partition, options_.node);
  if (caught_up) return etcd_->Put(key, "", lease_).status();
  SONDE_ASSIGN_OR_RETURN(Etcd::TxnResult done, etcd_->Txn({}, {Write::Delete(key)}));
  (void)done;
  return absl::OkStatus();
}

absl::StatusOr<bool> Membership::CaughtUp(int partition, const std::string& node) {
  SONDE_ASSIGN_OR_RETURN(std::optional<KeyValue> kv,
                         etcd_->Get(CaughtUpKey(options_.prefix, partition, node)));
  return kv.has_value();
}

}  // namespace sonde::cluster
