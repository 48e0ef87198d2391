// A partitioned, replicated log on NATS JetStream (Debian's nats-server and
// its C client, libnats): the data path of a Sonde cluster. Each partition
// is one stream, "<name>_P<p>" with the subject "<name>.p<p>", kept in files
// on `replicas` servers (Raft). An append is acknowledged once a quorum of
// them has it, and carries an id (Nats-Msg-Id) that the stream uses to drop
// a repeat within the duplicate window: a gateway that resends after a lost
// acknowledgement appends once.
//
// Durability (docs/cluster.md): nats-server 2.9 writes each message to the
// quorum's files but has no option to fsync every write (Debian's 2.9.10
// refuses `sync_interval` as an unknown field; it fsyncs on a timer), so
// an acknowledged entry survives any process crash (kill -9 of any number
// of servers) and the loss of a minority of machines, but not the loss of
// power on a majority at once. Production wants nats-server >= 2.10.23
// with `sync_interval: always`.
#ifndef SONDE_SERVER_CLUSTER_PARTITION_LOG_H_
#define SONDE_SERVER_CLUSTER_PARTITION_LOG_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace sonde::cluster {

class PartitionLog {
 public:
  struct Options {
    // nats://host:port of the servers; the client reconnects among them.
    std::vector<std::string> servers;
    std::string name = "SONDE";  // stream names "<name>_P<p>"; [A-Z0-9_]+
    int partitions = 16;
    int replicas = 3;
    absl::Duration duplicate_window = absl::Minutes(10);
    absl::Duration timeout = absl::Seconds(5);  // each append, each admin call
    // Larger entries are refused (nats-server's default limit is 1 MiB;
    // its authors advise at most 8 MiB): callers chunk tensors below it.
    int64_t max_entry_bytes = 1 << 20;
    // TLS: the CA of the servers' certificates (PEM file), and a client
    // certificate and key for servers that verify clients. Empty:
    // plaintext.
    std::string tls_ca_file;
    std::string tls_cert_file;
    std::string tls_key_file;
  };

  // Connects and creates the partitions' streams where they do not exist
  // yet (a stream that exists is checked to have the replicas asked for).
  static absl::StatusOr<std::unique_ptr<PartitionLog>> Open(const Options& options);
  ~PartitionLog();

  const Options& options() const { return options_; }

  struct Appended {
    uint64_t sequence = 0;   // the entry's place in its partition, from 1
    bool duplicate = false;  // the id was appended before: nothing new stored
  };
  // Appends `bytes` with `id` (unique per entry; a repeat within the
  // duplicate window is dropped). UNAVAILABLE or DEADLINE_EXCEEDED when no
  // quorum acknowledged it in time; the caller retries with the same id.
  absl::StatusOr<Appended> Append(int partition, const std::string& id, absl::string_view bytes);

  struct Entry {
    uint64_t sequence = 0;
    std::string id;
    std::string bytes;
    // When the stream stored it (JetStream's timestamp, set by the stream's
    // leader and replicated with the entry: every reader sees the same).
    int64_t unix_micros = 0;
  };
  // Entries of one partition in order, from a sequence on.
  class Reader {
   public:
    virtual ~Reader() = default;
    // The next entry; nullopt if none arrived within `timeout`.
    virtual absl::StatusOr<std::optional<Entry>> Next(absl::Duration timeout) = 0;
  };
  absl::StatusOr<std::unique_ptr<Reader>> Read(int partition, uint64_t from_sequence);

  // The last sequence stored in the partition (0 when empty).
  absl::StatusOr<uint64_t> LastSequence(int partition);

  // Plain NATS messages beside the log, for answers that need no
  // durability (a node telling a gateway what became of an entry): sent to
  // whoever listens now, lost if no one does. Subjects are "<name>.<topic>".
  absl::Status Notify(const std::string& topic, absl::string_view bytes);
  class Listener {
   public:
    virtual ~Listener() = default;
  };
  // Calls `on_message` (from a libnats thread, one message at a time) with
  // every message on `topic` until the Listener is destroyed.
  absl::StatusOr<std::unique_ptr<Listener>> Listen(
      const std::string& topic, std::function<void(absl::string_view)> on_message);

  std::string StreamName(int partition) const;
  std::string Subject(int partition) const;

  struct Connection;  // libnats handles (partition_log.cc)

 private:
  PartitionLog(const Options& options, std::unique_ptr<Connection> connection);
  absl::Status EnsureStream(int partition);

  const Options options_;
  std::unique_ptr<Connection> connection_;
};

}  // namespace sonde::cluster

#endif  // SONDE_SERVER_CLUSTER_PARTITION_LOG_H_
