// A client of an etcd v3 cluster (etcd 3.4 and later, over its gRPC API):
// the key-value operations, transactions, leases and watches a Sonde
// cluster keeps its membership, partition ownership and fired actions in.
// Control data only: etcd takes at most 1.5 MiB per request.
//
// Every call is linearizable (etcd's default) and bounded by
// Options::timeout. Errors come back as etcd's gRPC status, with the
// operation and key in the message; UNAVAILABLE or DEADLINE_EXCEEDED when
// no member answered.
#ifndef SONDE_SERVER_CLUSTER_ETCD_H_
#define SONDE_SERVER_CLUSTER_ETCD_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sonde::cluster {

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;  // the revision that created the key
  int64_t mod_revision = 0;     // the revision of its last change
  int64_t lease = 0;            // 0: the key outlives every lease
};

// One condition of a transaction: the key was created at `revision` (an
// absent key has create_revision 0).
struct Compare {
  std::string key;
  int64_t create_revision = 0;
  static Compare Absent(std::string key) { return {std::move(key), 0}; }
  static Compare CreatedAt(std::string key, int64_t revision) { return {std::move(key), revision}; }
};

// One write of a transaction: a put (with an optional lease) or a delete.
struct Write {
  std::string key;
  std::string value;
  int64_t lease = 0;
  bool erase = false;
  static Write Put(std::string key, std::string value, int64_t lease = 0) {
    return {std::move(key), std::move(value), lease, false};
  }
  static Write Delete(std::string key) { return {std::move(key), {}, 0, true}; }
};

struct Event {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  KeyValue kv;  // for a delete: the key and the deleting revision
};

class Etcd {
 public:
  struct Options {
    // host:port of each member; calls go to any member that answers.
    std::vector<std::string> endpoints;
    absl::Duration timeout = absl::Seconds(5);
    // TLS: the CA that signed the members' certificates (PEM file); with
    // it, calls go over TLS. A client certificate and key for members that
    // require one (--client-cert-auth). Empty: plaintext.
    std::string tls_ca_file;
    std::string tls_cert_file;
    std::string tls_key_file;
  };

  static absl::StatusOr<std::unique_ptr<Etcd>> Connect(const Options& options);
  ~Etcd();

  struct Members;  // each member's channel and stubs (etcd.cc)

  // The key's state; nullopt when absent.
  absl::StatusOr<std::optional<KeyValue>> Get(const std::string& key);
  // Every key starting with `prefix`, sorted by key, and the store's
  // revision when they were read (a watch from revision + 1 misses nothing).
  absl::StatusOr<std::vector<KeyValue>> List(const std::string& prefix, int64_t* revision = nullptr);
  // Returns the revision of the write.
  absl::StatusOr<int64_t> Put(const std::string& key, const std::string& value, int64_t lease = 0);
  // Whether every condition held and the writes were made (atomically, as
  // one revision); the revision either way.
  struct TxnResult {
    bool succeeded = false;
    int64_t revision = 0;
  };
  absl::StatusOr<TxnResult> Txn(const std::vector<Compare>& conditions,
                                const std::vector<Write>& writes);

  // A lease of `ttl` (whole seconds, at least 1): keys put under it are
  // deleted when it expires or is revoked.
  absl::StatusOr<int64_t> GrantLease(absl::Duration ttl);
  // Renews the lease; NOT_FOUND once it has expired.
  absl::Status KeepAlive(int64_t lease);
  absl::Status RevokeLease(int64_t lease);

  // Calls `on_events` with each change to keys under `prefix` after
  // `after_revision`, in revision order, from a thread of its own, until
  // the Watch is destroyed. A broken stream is reopened after the last
  // revision seen. If etcd has compacted past that revision, `on_events`
  // gets nothing more and `on_lost` is called once with the error: the
  // caller must List again.
  class Watch {
   public:
    virtual ~Watch() = default;
  };
  std::unique_ptr<Watch> WatchPrefix(const std::string& prefix, int64_t after_revision,
                                     std::function<void(const std::vector<Event>&)> on_events,
                                     std::function<void(const absl::Status&)> on_lost);

 private:
  explicit Etcd(const Options& options, std::unique_ptr<Members> members);
  const Options options_;
  std::unique_ptr<Members> members_;
};

// The smallest key after every key starting with `prefix` (etcd's
// range_end for a prefix); "\0" for the empty prefix (every key).
std::string PrefixEnd(const std::string& prefix);

}  // namespace sonde::cluster

#endif  // SONDE_SERVER_CLUSTER_ETCD_H_
