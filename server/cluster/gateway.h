// The cluster's ingest front (docs/cluster.md): serves the Collector stream
// the hook already speaks, logs each stream's messages to its job's
// partition, and acknowledges a step as soon as the log has stored it, with
// the configured replication. A hello waits for the partition owner's
// answer (HelloAck, or a refusal), which the node sends back over NATS;
// actions come the same way. Stateless: any gateway serves any client.
//
// This first version uses gRPC's synchronous API (a thread per open
// stream); the single-node collector's callback reactor is the model for
// the next.
#ifndef SONDE_SERVER_CLUSTER_GATEWAY_H_
#define SONDE_SERVER_CLUSTER_GATEWAY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/cluster.pb.h"
#include "proto/collector.grpc.pb.h"
#include "server/auth.h"
#include "server/cluster/etcd.h"
#include "server/cluster/job_directory.h"
#include "server/cluster/partition_log.h"

namespace sonde::cluster {

class Gateway final : public v1::Collector::Service {
 public:
  struct Options {
    std::string name;  // unique among the cluster's gateways; [A-Za-z0-9_-]+
    // How long a hello waits for the partition owner's answer.
    absl::Duration hello_timeout = absl::Seconds(30);
    // How long an append is retried (same id) before the stream is ended
    // with UNAVAILABLE and the client reconnects.
    absl::Duration append_timeout = absl::Seconds(30);
    // How often the gateway logs a heartbeat to each partition it has open
    // streams on; nodes take it for dead after PartitionApplier's
    // gateway_timeout (1 min) without one.
    absl::Duration heartbeat_interval = absl::Seconds(10);
    // Bearer tokens (server/auth.h), checked as sonde-collector checks
    // them: a stream's token must grant writing its hello's job. Null:
    // no authentication.
    const server::TokenTable* tokens = nullptr;
    // The cluster's etcd and prefix: with them, the gateway also watches
    // the actions fired (<prefix>/actions/<job>/<worker>/..., one watch for
    // all its streams) and passes each to its worker's streams. The nodes' NATS answers may be lost
    // while a log server restarts; the keys in etcd are not, and a worker
    // that reconnects is told again. Null: actions come over NATS only.
    Etcd* etcd = nullptr;
    std::string prefix;
  };

  static absl::StatusOr<std::unique_ptr<Gateway>> Create(PartitionLog* log, Options options);
  ~Gateway() override;

  grpc::Status Stream(grpc::ServerContext* context,
                      grpc::ServerReaderWriter<v1::ServerMessage, v1::ClientMessage>* stream)
      override;

  // The partition of `job`: with etcd, as the cluster's JobDirectory
  // records it (recorded now if `record` and the job has none); without,
  // a stable hash of its name.
  absl::StatusOr<int> PartitionOf(const std::string& job, bool record);

  // Logs `control` (EnableRules, PostRuleResult) to `job`'s partition as an
  // entry of its own and waits for the owner node's answer: the call's
  // status in code and message, its answer in response. UNAVAILABLE if no
  // node answered within hello_timeout.
  absl::StatusOr<v1::EntryOutcome> LogControl(const std::string& job, v1::LogEntry control);

 private:
  struct Mailbox;
  Gateway(PartitionLog* log, Options options);
  void OnOutcome(absl::string_view bytes);
  // Appends one entry, retrying with the same id until append_timeout.
  absl::StatusOr<uint64_t> AppendEntry(int partition, const v1::LogEntry& entry);

  void HeartbeatLoop();
  // The one watch of <prefix>/actions/: each fired action goes to the
  // mailboxes of the streams of its job and worker.
  void WatchActions();

  PartitionLog* const log_;
  const Options options_;
  std::unique_ptr<JobDirectory> directory_;  // with etcd
  std::atomic<uint64_t> next_connection_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, std::shared_ptr<Mailbox>> mailboxes_ ABSL_GUARDED_BY(mu_);
  std::map<int, int> open_per_partition_ ABSL_GUARDED_BY(mu_);
  // Streams by (job, worker), for the actions watch.
  std::map<std::pair<std::string, int32_t>, std::set<uint64_t>> watched_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Etcd::Watch> actions_watch_ ABSL_GUARDED_BY(mu_);
  bool actions_watch_lost_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread heartbeat_;
  std::unique_ptr<PartitionLog::Listener> listener_;
};

}  // namespace sonde::cluster

#endif  // SONDE_SERVER_CLUSTER_GATEWAY_H_
