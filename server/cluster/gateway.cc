#include "server/cluster/gateway.h"

#include <algorithm>
#include <deque>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/grpc_status.h"
#include "common/metrics/metrics.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "server/access.h"
#include "server/cluster/membership.h"

namespace sonde::cluster {

// What the nodes said about one stream's entries, waiting for its handler.
struct Gateway::Mailbox {
  absl::Mutex mu;
  std::deque<v1::EntryOutcome> outcomes ABSL_GUARDED_BY(mu);
  bool closed ABSL_GUARDED_BY(mu) = false;

  // The outcome of the entry at `sequence`, or nullopt after `timeout`.
  // Outcomes of other entries met on the way stay queued.
  std::optional<v1::EntryOutcome> WaitFor(uint64_t sequence, absl::Duration timeout) {
    absl::MutexLock lock(&mu);
    // The condition only looks (Await may evaluate it more than once).
    auto find = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return std::find_if(outcomes.begin(), outcomes.end(),
                          [&](const v1::EntryOutcome& o) { return o.sequence() == sequence; });
    };
    auto arrived = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return closed || find() != outcomes.end();
    };
    mu.AwaitWithTimeout(absl::Condition(&arrived), timeout);
    auto it = find();
    if (it == outcomes.end()) return std::nullopt;
    v1::EntryOutcome found = std::move(*it);
    outcomes.erase(it);
    return found;
  }

  // The next outcome of any entry, or nullopt once closed.
  std::optional<v1::EntryOutcome> Next() {
    absl::MutexLock lock(&mu);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return closed || !outcomes.empty(); };
    mu.Await(absl::Condition(&ready));
    if (outcomes.empty()) return std::nullopt;
    v1::EntryOutcome o = std::move(outcomes.front());
    outcomes.pop_front();
    return o;
  }
};

namespace {

// What a gateway does, for operators (metrics::Registry::Default(), served
// by sonde-cluster --role=gateway --metrics_listen).
struct GatewayMetrics {
  metrics::Gauge* streams;
  metrics::Counter* appended;
  metrics::Counter* append_bytes;
  metrics::Counter* append_retries;
  metrics::Counter* append_failures;
  metrics::Histogram* append_latency;
  metrics::Histogram* hello_latency;
  metrics::Counter* hellos_unanswered;

  GatewayMetrics() {
    metrics::Registry& r = metrics::Registry::Default();
    streams = r.AddGauge("sonde_gateway_streams", "Client streams open on this gateway.");
    appended = r.AddCounter("sonde_gateway_entries_appended_total",
                            "Log entries the log acknowledged (replicated).");
    append_bytes = r.AddCounter("sonde_gateway_appended_bytes_total",
                                "Bytes of the log entries acknowledged.");
    append_retries = r.AddCounter(
        "sonde_gateway_append_retries_total",
        "Appends tried again with the same id (a log server down, a leader election).");
    append_failures = r.AddCounter(
        "sonde_gateway_append_failures_total",
        "Appends given up after append_timeout: their streams ended with UNAVAILABLE and the "
        "clients resend.");
    append_latency = r.AddHistogram("sonde_gateway_append_latency_seconds",
                                    "From the first try of an append to the log's ack.",
                                    metrics::LatencyBuckets());
    hello_latency = r.AddHistogram(
        "sonde_gateway_hello_latency_seconds",
        "From logging a hello to the owner node's answer: long while a partition fails over.",
        metrics::LatencyBuckets());
    hellos_unanswered = r.AddCounter(
        "sonde_gateway_hellos_unanswered_total",
        "Hellos no owner answered within hello_timeout (the client reconnects).");
  }
};

const GatewayMetrics& Metrics() {
  static const GatewayMetrics* const m = new GatewayMetrics();
  return *m;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Gateway>> Gateway::Create(PartitionLog* log, Options options) {
  if (options.name.empty()) return absl::InvalidArgumentError("a gateway needs a name");
  for (char c : options.name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') {
      return absl::InvalidArgumentError(absl::StrCat(
          "gateway name '", options.name, "' may hold only letters, digits, '_' and '-'"));
    }
  }
  Metrics();  // exported from the start, at 0
  std::unique_ptr<Gateway> gateway(new Gateway(log, std::move(options)));
  if (gateway->options_.etcd != nullptr) {
    gateway->directory_ = std::make_unique<JobDirectory>(
        gateway->options_.etcd, gateway->options_.prefix, log->options().partitions);
    gateway->WatchActions();
  }
  gateway->heartbeat_ = std::thread([g = gateway.get()] { g->HeartbeatLoop(); });
  SONDE_ASSIGN_OR_RETURN(gateway->listener_,
                         log->Listen(absl::StrCat("out.", gateway->options_.name),
                                     [g = gateway.get()](absl::string_view bytes) {
                                       g->OnOutcome(bytes);
                                     }));
  return gateway;
}

// Connection numbers start at the gateway's start time in microseconds, so
// a restarted gateway of the same name never reuses one a node may still
// hold open.
Gateway::Gateway(PartitionLog* log, Options options)
    : log_(log),
      options_(std::move(options)),
      next_connection_(static_cast<uint64_t>(absl::ToUnixMicros(absl::Now()))) {}

Gateway::~Gateway() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  heartbeat_.join();
  std::unique_ptr<Etcd::Watch> watch;
  {
    absl::MutexLock lock(&mu_);
    watch = std::move(actions_watch_);
  }
  watch.reset();
  listener_.reset();
}

void Gateway::WatchActions() {
  const std::string prefix = absl::StrCat(options_.prefix, "/actions/");
  int64_t revision = 0;
  absl::StatusOr<std::vector<KeyValue>> now = options_.etcd->List(prefix, &revision);
  if (!now.ok()) {
    LOG(WARNING) << "gateway: cannot watch fired actions yet: " << now.status();
    absl::MutexLock lock(&mu_);
    actions_watch_lost_ = true;  // the heartbeat loop tries again
    return;
  }
  auto watch = options_.etcd->WatchPrefix(
      prefix, revision,
      [this, prefix](const std::vector<Event>& events) {
        for (const Event& e : events) {
          if (e.type != Event::Type::kPut) continue;
          // <job>/<worker>/...: webhooks and mails (<job>/webhook/...,
          // <job>/email/...) are not streamed.
          std::vector<std::string> parts =
              absl::StrSplit(absl::string_view(e.kv.key).substr(prefix.size()), '/');
          int32_t worker = 0;
          if (parts.size() < 3 || !absl::SimpleAtoi(parts[1], &worker)) continue;
          v1::EntryOutcome delivery;
          if (!delivery.add_replies()->mutable_action()->ParseFromString(e.kv.value)) continue;
          absl::MutexLock lock(&mu_);
          auto streams = watched_.find({parts[0], worker});
          if (streams == watched_.end()) continue;
          for (uint64_t connection : streams->second) {
            auto box = mailboxes_.find(connection);
            if (box == mailboxes_.end()) continue;
            delivery.set_connection(connection);
            absl::MutexLock box_lock(&box->second->mu);
            box->second->outcomes.push_back(delivery);
          }
        }
      },
      [this](const absl::Status& s) {
        LOG(WARNING) << "gateway: the watch of fired actions ended: " << s;
        absl::MutexLock lock(&mu_);
        actions_watch_lost_ = true;
      });
  absl::MutexLock lock(&mu_);
  actions_watch_ = std::move(watch);
  actions_watch_lost_ = false;
}

void Gateway::HeartbeatLoop() {
  while (true) {
    std::vector<int> partitions;
    bool lost = false;
    {
      absl::MutexLock lock(&mu_);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stop), options_.heartbeat_interval)) return;
      for (const auto& [p, open] : open_per_partition_) {
        if (open > 0) partitions.push_back(p);
      }
      lost = actions_watch_lost_;
    }
    if (lost) {
      std::unique_ptr<Etcd::Watch> old;
      {
        absl::MutexLock lock(&mu_);
        old = std::move(actions_watch_);
      }
      old.reset();  // outside mu_: its thread may be waiting for it
      WatchActions();
    }
    // All at once: one slow partition must not hold the others' beats
    // past the nodes' timeout.
    std::vector<std::thread> beats;
    for (int p : partitions) {
      beats.emplace_back([this, p] {
        v1::LogEntry beat;
        beat.set_gateway(options_.name);
        beat.set_heartbeat(true);
        beat.set_unix_micros(absl::ToUnixMicros(absl::Now()));
        absl::StatusOr<PartitionLog::Appended> appended =
            log_->Append(p, absl::StrCat(options_.name, "/beat/", p, "/", beat.unix_micros()),
                         beat.SerializeAsString());
        if (!appended.ok()) {
          LOG(WARNING) << "gateway heartbeat to partition " << p << ": " << appended.status();
        }
      });
    }
    for (std::thread& t : beats) t.join();
  }
}

absl::StatusOr<int> Gateway::PartitionOf(const std::string& job, bool record) {
  if (directory_ == nullptr) return JobPartition(job, log_->options().partitions);
  return directory_->PartitionOf(job, record);
}

void Gateway::OnOutcome(absl::string_view bytes) {
  v1::EntryOutcome outcome;
  if (!outcome.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    LOG(WARNING) << "gateway '" << options_.name << "': an outcome that does not parse";
    return;
  }
  std::shared_ptr<Mailbox> box;
  {
    absl::MutexLock lock(&mu_);
    auto it = mailboxes_.find(outcome.connection());
    if (it == mailboxes_.end()) return;  // the stream is gone
    box = it->second;
  }
  absl::MutexLock lock(&box->mu);
  box->outcomes.push_back(std::move(outcome));
}


absl::StatusOr<uint64_t> Gateway::AppendEntry(int partition, const v1::LogEntry& entry) {
  const std::string id =
      absl::StrCat(options_.name, "/", entry.connection(), "/",
                   entry.messages_size() > 0 ? entry.messages(0).seq() : 0, entry.closed() ? "c" : "");
  const std::string bytes = entry.SerializeAsString();
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + options_.append_timeout;
  absl::Duration pause = absl::Milliseconds(20);
  while (true) {
    absl::StatusOr<PartitionLog::Appended> appended = log_->Append(partition, id, bytes);
    if (appended.ok()) {
      Metrics().appended->Increment();
      Metrics().append_bytes->Increment(bytes.size());
      Metrics().append_latency->Observe(absl::ToDoubleSeconds(absl::Now() - start));
      return appended->sequence;
    }
    if (absl::IsInvalidArgument(appended.status()) || absl::Now() + pause > deadline) {
      Metrics().append_failures->Increment();
      return appended.status();
    }
    Metrics().append_retries->Increment();
    absl::SleepFor(pause);  // a log server down, or a leader election
    pause = std::min(pause * 2, absl::Milliseconds(500));
  }
}

absl::StatusOr<v1::EntryOutcome> Gateway::LogControl(const std::string& job,
                                                      v1::LogEntry control) {
  const uint64_t connection = next_connection_.fetch_add(1);
  auto box = std::make_shared<Mailbox>();
  {
    absl::MutexLock lock(&mu_);
    mailboxes_[connection] = box;
  }
  control.set_gateway(options_.name);
  control.set_connection(connection);
  control.set_closed(true);  // nothing follows it: no session stays open
  control.set_unix_micros(absl::ToUnixMicros(absl::Now()));
  // Rules enabled before a job starts register it; other changes to a
  // job never logged find no session anyway.
  absl::StatusOr<int> partition = PartitionOf(job, control.has_enable_rules());
  absl::StatusOr<uint64_t> at =
      partition.ok() ? AppendEntry(*partition, control) : absl::StatusOr<uint64_t>(partition.status());
  std::optional<v1::EntryOutcome> answer;
  if (at.ok()) answer = box->WaitFor(*at, options_.hello_timeout);
  {
    absl::MutexLock lock(&mu_);
    mailboxes_.erase(connection);
  }
  if (!at.ok()) return at.status();
  if (!answer.has_value()) {
    return absl::UnavailableError(absl::StrCat(
        "no collector node answered within ", absl::FormatDuration(options_.hello_timeout),
        " (partition ", *partition, "); the change is logged and will be applied"));
  }
  return *std::move(answer);
}

grpc::Status Gateway::Stream(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::ServerMessage, v1::ClientMessage>* stream) {
  const uint64_t connection = next_connection_.fetch_add(1);
  auto box = std::make_shared<Mailbox>();
  {
    absl::MutexLock lock(&mu_);
    mailboxes_[connection] = box;
  }
  Metrics().streams->Increment();
  struct Closed {
    ~Closed() { Metrics().streams->Decrement(); }
  } closed;
  absl::Mutex write_mu;
  auto write = [&](const v1::ServerMessage& m) {
    absl::MutexLock lock(&write_mu);
    return stream->Write(m);
  };
  absl::Mutex ended_mu;
  absl::Status ended;  // set by the outcome thread when a node ended the stream
  std::thread outcomes;
  std::function<void()> unwatch;  // run before the stream ends
  int partition = -1;
  auto log_entry = [&](std::vector<v1::ClientMessage> messages, bool closed) {
    v1::LogEntry entry;
    entry.set_gateway(options_.name);
    entry.set_connection(connection);
    for (v1::ClientMessage& m : messages) *entry.add_messages() = std::move(m);
    entry.set_closed(closed);
    entry.set_unix_micros(absl::ToUnixMicros(absl::Now()));
    return AppendEntry(partition, entry);
  };
  // However the stream ends: the node closes its session, and the
  // outcome thread stops.
  auto finish = [&](grpc::Status status) {
    if (unwatch) unwatch();
    if (partition >= 0) {
      absl::Status closed = log_entry({}, true).status();
      if (!closed.ok()) LOG(WARNING) << "gateway: close of stream " << connection << ": " << closed;
    }
    {
      absl::MutexLock lock(&mu_);
      mailboxes_.erase(connection);
      if (partition >= 0) --open_per_partition_[partition];
    }
    {
      absl::MutexLock lock(&box->mu);
      box->closed = true;
    }
    if (outcomes.joinable()) outcomes.join();
    absl::MutexLock lock(&ended_mu);
    return ended.ok() ? status : ToGrpcStatus(ended);
  };

  v1::ClientMessage m;
  if (!stream->Read(&m)) return finish(grpc::Status::OK);
  if (!m.has_hello()) {
    return finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                               "the first message of a stream must be a hello"));
  }
  if (options_.tokens != nullptr) {
    absl::StatusOr<const server::TokenGrant*> grant =
        server::AuthenticateCall(*options_.tokens, *context);
    absl::Status allowed = grant.ok() ? server::Authorize(**grant, "/sonde.v1.Collector/Stream",
                                                          m, context->peer())
                                      : grant.status();
    if (!allowed.ok()) return finish(ToGrpcStatus(allowed));
  }
  {
    absl::StatusOr<int> of = PartitionOf(m.hello().job(), /*record=*/true);
    if (!of.ok()) return finish(ToGrpcStatus(of.status()));
    partition = *of;
  }
  {
    absl::MutexLock lock(&mu_);
    ++open_per_partition_[partition];  // heartbeats to it from now on
  }
  absl::StatusOr<uint64_t> hello_at = log_entry({m}, false);
  if (!hello_at.ok()) {
    // The hello may have been stored all the same (a timeout): the close
    // finish logs lets the node end the session it may have opened.
    return finish(ToGrpcStatus(hello_at.status()));
  }
  const absl::Time hello_logged = absl::Now();
  std::optional<v1::EntryOutcome> answer = box->WaitFor(*hello_at, options_.hello_timeout);
  if (answer.has_value()) {
    Metrics().hello_latency->Observe(absl::ToDoubleSeconds(absl::Now() - hello_logged));
  } else {
    Metrics().hellos_unanswered->Increment();
  }
  if (!answer.has_value()) {
    return finish(grpc::Status(
        grpc::StatusCode::UNAVAILABLE,
        absl::StrCat("no collector node answered the hello within ",
                     absl::FormatDuration(options_.hello_timeout), " (partition ", partition,
                     ")")));
  }
  if (answer->code() != 0) {
    return finish(grpc::Status(static_cast<grpc::StatusCode>(answer->code()), answer->message()));
  }
  for (const v1::ServerMessage& reply : answer->replies()) write(reply);
  if (options_.etcd != nullptr) {
    // From now on the gateway's one watch of fired actions hands this
    // worker's to this stream; those fired before are read once here (one
    // fired meanwhile may come twice: the hook acts on it once).
    const std::pair<std::string, int32_t> worker{m.hello().job(), m.hello().worker()};
    {
      absl::MutexLock lock(&mu_);
      watched_[worker].insert(connection);
    }
    unwatch = [this, worker, connection] {
      absl::MutexLock lock(&mu_);
      auto it = watched_.find(worker);
      if (it == watched_.end()) return;
      it->second.erase(connection);
      if (it->second.empty()) watched_.erase(it);
    };
    absl::StatusOr<std::vector<KeyValue>> before = options_.etcd->List(absl::StrCat(
        options_.prefix, "/actions/", worker.first, "/", worker.second, "/"));
    if (before.ok()) {
      for (const KeyValue& kv : *before) {
        v1::ServerMessage msg;
        if (msg.mutable_action()->ParseFromString(kv.value)) write(msg);
      }
    } else {
      LOG(WARNING) << "gateway: stream " << connection << " cannot list its actions: "
                   << before.status();
    }
  }
  // Later outcomes: actions to pass on, or a node ending the stream.
  outcomes = std::thread([&] {
    while (std::optional<v1::EntryOutcome> o = box->Next()) {
      for (const v1::ServerMessage& reply : o->replies()) {
        // Actions come from the etcd watch where there is one (its
        // deliveries have sequence 0); a node's NATS answer may be lost.
        const bool from_watch = o->sequence() == 0;
        if (reply.has_warning() || (reply.has_action() && (options_.etcd == nullptr || from_watch))) {
          write(reply);
        }
      }
      if (o->code() != 0) {
        absl::MutexLock lock(&ended_mu);
        ended = absl::Status(static_cast<absl::StatusCode>(o->code()), o->message());
        context->TryCancel();
        return;
      }
    }
  });

  std::vector<v1::ClientMessage> pending;
  size_t pending_bytes = 0;
  bool in_step = false;
  const size_t flush_at = static_cast<size_t>(log_->options().max_entry_bytes) / 2;
  while (stream->Read(&m)) {
    const bool step_end = m.has_step_end();
    const bool job_end = m.has_job_end();
    const bool profile = m.has_profile();
    if (m.has_chunk() || m.has_summary()) in_step = true;
    const size_t size = m.ByteSizeLong();
    if (!pending.empty() && pending_bytes + size > flush_at) {
      absl::StatusOr<uint64_t> at = log_entry(std::exchange(pending, {}), false);
      pending_bytes = 0;
      if (!at.ok()) return finish(ToGrpcStatus(at.status()));
    }
    v1::Ack ack;
    ack.set_acked_seq(m.seq());
    if (step_end) {
      ack.set_step(m.step_end().step());
      ack.set_mode(m.step_end().mode());
      ack.set_tensors(m.step_end().tensor_count());
    } else {
      ack.set_step(-1);
    }
    pending_bytes += size;
    pending.push_back(std::move(m));
    if (!step_end && !job_end && !profile) continue;
    absl::StatusOr<uint64_t> at = log_entry(std::exchange(pending, {}), false);
    pending_bytes = 0;
    if (!at.ok()) return finish(ToGrpcStatus(at.status()));
    // Stored with its replicas: the client may forget it. A profile batch
    // inside a step is covered by the step's ack.
    if (profile && in_step) continue;
    if (step_end) in_step = false;
    v1::ServerMessage reply;
    *reply.mutable_ack() = ack;
    if (!write(reply)) break;
  }
  // A step cut off by the disconnect is not logged: the node's session,
  // closed below, would drop it as the single-node collector does.
  return finish(grpc::Status::OK);
}

}  // namespace sonde::cluster
