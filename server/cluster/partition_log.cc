#include "server/cluster/partition_log.h"

#include <nats/nats.h>

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/status_macros.h"

namespace sonde::cluster {

namespace {

constexpr jsErrCode kNoJsError = static_cast<jsErrCode>(0);

// libnats' status (and JetStream's error code, when the server gave one) as
// an absl::Status with what was being done.
absl::Status FromNats(natsStatus s, jsErrCode js_error, absl::string_view what) {
  if (s == NATS_OK) return absl::OkStatus();
  const char* detail = nats_GetLastError(nullptr);
  const std::string message =
      absl::StrCat("NATS ", what, ": ", natsStatus_GetText(s),
                   js_error != 0 ? absl::StrCat(" (JetStream error ", js_error, ")") : "",
                   detail != nullptr && *detail != '\0' ? absl::StrCat(": ", detail) : "");
  switch (s) {
    case NATS_TIMEOUT:
      return absl::DeadlineExceededError(message);
    case NATS_NO_RESPONDERS:
    case NATS_NO_SERVER:
    case NATS_CONNECTION_CLOSED:
    case NATS_CONNECTION_DISCONNECTED:
    case NATS_STALE_CONNECTION:
      return absl::UnavailableError(message);
    case NATS_NOT_FOUND:
      return absl::NotFoundError(message);
    case NATS_MAX_PAYLOAD:
    case NATS_INVALID_ARG:
      return absl::InvalidArgumentError(message);
    default:
      return absl::UnavailableError(message);
  }
}

int64_t Millis(absl::Duration d) { return absl::ToInt64Milliseconds(d); }

}  // namespace

struct PartitionLog::Connection {
  natsOptions* options = nullptr;
  natsConnection* connection = nullptr;
  jsCtx* js = nullptr;
  ~Connection() {
    if (js != nullptr) jsCtx_Destroy(js);
    if (connection != nullptr) natsConnection_Destroy(connection);
    if (options != nullptr) natsOptions_Destroy(options);
  }
};

PartitionLog::PartitionLog(const Options& options, std::unique_ptr<Connection> connection)
    : options_(options), connection_(std::move(connection)) {}

PartitionLog::~PartitionLog() = default;

std::string PartitionLog::StreamName(int partition) const {
  return absl::StrCat(options_.name, "_P", partition);
}

std::string PartitionLog::Subject(int partition) const {
  return absl::StrCat(options_.name, ".p", partition);
}

absl::StatusOr<std::unique_ptr<PartitionLog>> PartitionLog::Open(const Options& options) {
  if (options.servers.empty()) return absl::InvalidArgumentError("NATS: no servers given");
  if (options.name.empty()) return absl::InvalidArgumentError("NATS: empty log name");
  for (char c : options.name) {
    if (!absl::ascii_isupper(static_cast<unsigned char>(c)) &&
        !absl::ascii_isdigit(static_cast<unsigned char>(c)) && c != '_') {
      return absl::InvalidArgumentError(absl::StrCat(
          "log name '", options.name, "' may hold only A-Z, 0-9 and '_' (a stream name prefix)"));
    }
  }
  if (options.partitions < 1) return absl::InvalidArgumentError("the log needs a partition");
  if (options.replicas < 1 || options.replicas > 5) {
    return absl::InvalidArgumentError("JetStream replicas must be 1 to 5");
  }
  if (options.max_entry_bytes < 1 || options.max_entry_bytes > (64 << 20)) {
    return absl::InvalidArgumentError("max_entry_bytes must be 1 byte to 64 MiB");
  }
  auto c = std::make_unique<Connection>();
  std::vector<const char*> servers;
  for (const std::string& s : options.servers) servers.push_back(s.c_str());
  natsStatus s = natsOptions_Create(&c->options);
  if (s == NATS_OK) {
    s = natsOptions_SetServers(c->options, servers.data(), static_cast<int>(servers.size()));
  }
  if (s == NATS_OK) s = natsOptions_SetMaxReconnect(c->options, -1);  // forever
  if (s == NATS_OK) s = natsOptions_SetReconnectWait(c->options, 100);
  if (s == NATS_OK) s = natsOptions_SetTimeout(c->options, Millis(options.timeout));
  if (!options.tls_ca_file.empty()) {
    if (s == NATS_OK) s = natsOptions_SetSecure(c->options, true);
    if (s == NATS_OK) {
      s = natsOptions_LoadCATrustedCertificates(c->options, options.tls_ca_file.c_str());
    }
    if (s == NATS_OK && !options.tls_cert_file.empty()) {
      s = natsOptions_LoadCertificatesChain(c->options, options.tls_cert_file.c_str(),
                                            options.tls_key_file.c_str());
    }
    SONDE_RETURN_IF_ERROR(FromNats(s, kNoJsError, "TLS set-up"));
  } else if (!options.tls_cert_file.empty()) {
    return absl::InvalidArgumentError("NATS: a client certificate needs the CA (tls_ca_file)");
  }
  if (s == NATS_OK) s = natsConnection_Connect(&c->connection, c->options);
  SONDE_RETURN_IF_ERROR(FromNats(s, kNoJsError, "connect"));
  jsOptions jo;
  jsOptions_Init(&jo);
  jo.Wait = Millis(options.timeout);
  SONDE_RETURN_IF_ERROR(
      FromNats(natsConnection_JetStream(&c->js, c->connection, &jo), kNoJsError, "JetStream context"));
  std::unique_ptr<PartitionLog> log(new PartitionLog(options, std::move(c)));
  for (int p = 0; p < options.partitions; ++p) SONDE_RETURN_IF_ERROR(log->EnsureStream(p));
  return log;
}

absl::Status PartitionLog::EnsureStream(int partition) {
  const std::string name = StreamName(partition);
  const std::string subject = Subject(partition);
  for (int attempt = 0; attempt < 2; ++attempt) {
    jsStreamInfo* info = nullptr;
    jsErrCode error = kNoJsError;
    natsStatus s = js_GetStreamInfo(&info, connection_->js, name.c_str(), nullptr, &error);
    if (s == NATS_OK) {
      const int64_t replicas = info->Config->Replicas;
      jsStreamInfo_Destroy(info);
      if (replicas != options_.replicas) {
        return absl::FailedPreconditionError(absl::StrCat(
            "stream ", name, " has ", replicas, " replicas, not the ", options_.replicas,
            " asked for"));
      }
      return absl::OkStatus();
    }
    if (s != NATS_NOT_FOUND) return FromNats(s, error, absl::StrCat("info of stream ", name));
    jsStreamConfig config;
    jsStreamConfig_Init(&config);
    config.Name = name.c_str();
    const char* subjects[] = {subject.c_str()};
    config.Subjects = subjects;
    config.SubjectsLen = 1;
    config.Storage = js_FileStorage;
    config.Replicas = options_.replicas;
    config.Duplicates = absl::ToInt64Nanoseconds(options_.duplicate_window);
    config.MaxMsgSize = static_cast<int32_t>(options_.max_entry_bytes);
    s = js_AddStream(&info, connection_->js, &config, nullptr, &error);
    if (info != nullptr) jsStreamInfo_Destroy(info);
    if (s == NATS_OK) return absl::OkStatus();
    // Another node created it meanwhile: check it on the next pass.
    if (error != JSStreamNameExistErr) {
      return FromNats(s, error, absl::StrCat("creating stream ", name));
    }
  }
  return absl::AbortedError(absl::StrCat("stream ", name, " keeps changing"));
}

absl::StatusOr<PartitionLog::Appended> PartitionLog::Append(int partition, const std::string& id,
                                                            absl::string_view bytes) {
  if (partition < 0 || partition >= options_.partitions) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition ", partition, " is not in [0, ", options_.partitions, ")"));
  }
  if (id.empty()) return absl::InvalidArgumentError("a log entry needs an id");
  if (static_cast<int64_t>(bytes.size()) > options_.max_entry_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("log entry '", id, "' of ", bytes.size(),
                                                   " bytes exceeds the limit of ",
                                                   options_.max_entry_bytes));
  }
  const std::string subject = Subject(partition);
  const std::string stream = StreamName(partition);
  jsPubOptions po;
  jsPubOptions_Init(&po);
  po.MsgId = id.c_str();
  po.ExpectStream = stream.c_str();
  po.MaxWait = Millis(options_.timeout);
  jsPubAck* ack = nullptr;
  jsErrCode error = kNoJsError;
  natsStatus s = js_Publish(&ack, connection_->js, subject.c_str(), bytes.data(),
                            static_cast<int>(bytes.size()), &po, &error);
  if (s != NATS_OK) {
    if (ack != nullptr) jsPubAck_Destroy(ack);
    return FromNats(s, error, absl::StrCat("append of '", id, "' to ", stream));
  }
  Appended out{ack->Sequence, ack->Duplicate};
  jsPubAck_Destroy(ack);
  return out;
}

namespace {

class StreamReader : public PartitionLog::Reader {
 public:
  explicit StreamReader(natsSubscription* sub) : sub_(sub) {}
  ~StreamReader() override {
    natsSubscription_Unsubscribe(sub_);
    natsSubscription_Destroy(sub_);
  }

  absl::StatusOr<std::optional<PartitionLog::Entry>> Next(absl::Duration timeout) override {
    natsMsg* msg = nullptr;
    natsStatus s = natsSubscription_NextMsg(&msg, sub_, Millis(timeout));
    if (s == NATS_TIMEOUT) return std::nullopt;
    SONDE_RETURN_IF_ERROR(FromNats(s, kNoJsError, "read"));
    PartitionLog::Entry entry;
    jsMsgMetaData* meta = nullptr;
    s = natsMsg_GetMetaData(&meta, msg);
    if (s == NATS_OK) {
      entry.sequence = meta->Sequence.Stream;
      entry.unix_micros = meta->Timestamp / 1000;
      jsMsgMetaData_Destroy(meta);
    }
    const char* id = nullptr;
    if (natsMsgHeader_Get(msg, "Nats-Msg-Id", &id) == NATS_OK && id != nullptr) entry.id = id;
    entry.bytes.assign(natsMsg_GetData(msg), static_cast<size_t>(natsMsg_GetDataLength(msg)));
    natsMsg_Destroy(msg);
    SONDE_RETURN_IF_ERROR(FromNats(s, kNoJsError, "entry metadata"));
    return entry;
  }

 private:
  natsSubscription* const sub_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PartitionLog::Reader>> PartitionLog::Read(int partition,
                                                                         uint64_t from_sequence) {
  if (partition < 0 || partition >= options_.partitions) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition ", partition, " is not in [0, ", options_.partitions, ")"));
  }
  const std::string subject = Subject(partition);
  const std::string stream = StreamName(partition);
  jsSubOptions so;
  jsSubOptions_Init(&so);
  so.Stream = stream.c_str();
  // An ordered consumer: in sequence, no acks, recreated by the client
  // from the last sequence seen if the server it was on goes away.
  so.Ordered = true;
  so.Config.DeliverPolicy = js_DeliverByStartSequence;
  so.Config.OptStartSeq = std::max<uint64_t>(from_sequence, 1);
  natsSubscription* sub = nullptr;
  jsErrCode error = kNoJsError;
  natsStatus s = js_SubscribeSync(&sub, connection_->js, subject.c_str(), nullptr, &so, &error);
  SONDE_RETURN_IF_ERROR(FromNats(s, error, absl::StrCat("reading ", stream)));
  return std::unique_ptr<Reader>(new StreamReader(sub));
}

absl::Status PartitionLog::Notify(const std::string& topic, absl::string_view bytes) {
  const std::string subject = absl::StrCat(options_.name, ".", topic);
  return FromNats(natsConnection_Publish(connection_->connection, subject.c_str(), bytes.data(),
                                         static_cast<int>(bytes.size())),
                  kNoJsError, absl::StrCat("notify on ", subject));
}

namespace {

class SubjectListener : public PartitionLog::Listener {
 public:
  explicit SubjectListener(std::function<void(absl::string_view)> on_message)
      : on_message_(std::move(on_message)) {}
  ~SubjectListener() override {
    if (sub_ == nullptr) return;
    // Destroy does not wait for a callback in progress; the on-complete
    // callback comes once none runs any more, so the closure may go.
    if (natsSubscription_Unsubscribe(sub_) == NATS_OK && completion_set_) {
      done_.WaitForNotificationWithTimeout(absl::Seconds(10));
    }
    natsSubscription_Destroy(sub_);
  }
  static void OnComplete(void* closure) { static_cast<SubjectListener*>(closure)->done_.Notify(); }
  static void OnMessage(natsConnection*, natsSubscription*, natsMsg* msg, void* closure) {
    auto* self = static_cast<SubjectListener*>(closure);
    self->on_message_(absl::string_view(natsMsg_GetData(msg),
                                        static_cast<size_t>(natsMsg_GetDataLength(msg))));
    natsMsg_Destroy(msg);
  }
  natsSubscription* sub_ = nullptr;
  bool completion_set_ = false;

 private:
  const std::function<void(absl::string_view)> on_message_;
  absl::Notification done_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PartitionLog::Listener>> PartitionLog::Listen(
    const std::string& topic, std::function<void(absl::string_view)> on_message) {
  const std::string subject = absl::StrCat(options_.name, ".", topic);
  auto listener = std::make_unique<SubjectListener>(std::move(on_message));
  SONDE_RETURN_IF_ERROR(FromNats(
      natsConnection_Subscribe(&listener->sub_, connection_->connection, subject.c_str(),
                               &SubjectListener::OnMessage, listener.get()),
      kNoJsError, absl::StrCat("listening on ", subject)));
  listener->completion_set_ = natsSubscription_SetOnCompleteCB(
                                  listener->sub_, &SubjectListener::OnComplete,
                                  listener.get()) == NATS_OK;
  // Subscribed on the server before this returns, so nothing sent after
  // is missed.
  SONDE_RETURN_IF_ERROR(FromNats(
      natsConnection_FlushTimeout(connection_->connection, Millis(options_.timeout)), kNoJsError,
      absl::StrCat("listening on ", subject)));
  return std::unique_ptr<Listener>(std::move(listener));
}

absl::StatusOr<uint64_t> PartitionLog::LastSequence(int partition) {
  const std::string stream = StreamName(partition);
  jsStreamInfo* info = nullptr;
  jsErrCode error = kNoJsError;
  natsStatus s = js_GetStreamInfo(&info, connection_->js, stream.c_str(), nullptr, &error);
  SONDE_RETURN_IF_ERROR(FromNats(s, error, absl::StrCat("info of stream ", stream)));
  const uint64_t last = info->State.LastSeq;
  jsStreamInfo_Destroy(info);
  return last;
}

}  // namespace sonde::cluster
