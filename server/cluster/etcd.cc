#include "server/cluster/etcd.h"

#include <algorithm>
#include <atomic>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "third_party/etcd/etcdserverpb/rpc.grpc.pb.h"

namespace sonde::cluster {

namespace pb = etcdserverpb;

std::string PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    const unsigned char last = static_cast<unsigned char>(end.back());
    if (last < 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();  // 0xff: carry into the byte before
  }
  return std::string(1, '\0');
}

namespace {

KeyValue FromPb(const mvccpb::KeyValue& kv) {
  KeyValue out;
  out.key = kv.key();
  out.value = kv.value();
  out.create_revision = kv.create_revision();
  out.mod_revision = kv.mod_revision();
  out.lease = kv.lease();
  return out;
}

absl::Status Annotate(const grpc::Status& s, absl::string_view what) {
  absl::Status status = FromGrpcStatus(s);
  return absl::Status(status.code(), absl::StrCat("etcd ", what, ": ", status.message()));
}

}  // namespace

// One channel and stub per member. Calls start at the member that last
// answered and move on when one is unreachable (UNAVAILABLE: the request
// was not taken, so even a write is safe to send to the next).
struct Etcd::Members {
  struct Member {
    std::string endpoint;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<pb::KV::Stub> kv;
    std::unique_ptr<pb::Lease::Stub> lease;
    std::unique_ptr<pb::Watch::Stub> watch;
  };
  std::vector<Member> members;
  std::atomic<size_t> preferred{0};

  template <typename Call>
  grpc::Status Try(absl::Duration timeout, Call call) {
    grpc::Status last;
    const size_t first = preferred.load();
    for (size_t i = 0; i < members.size(); ++i) {
      const size_t at = (first + i) % members.size();
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
      last = call(members[at], context);
      if (last.error_code() != grpc::StatusCode::UNAVAILABLE) {
        preferred.store(at);
        return last;
      }
    }
    return last;
  }
};

Etcd::Etcd(const Options& options, std::unique_ptr<Members> members)
    : options_(options), members_(std::move(members)) {}

Etcd::~Etcd() = default;

namespace {

absl::StatusOr<std::string> ReadPem(const std::string& what, const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) return absl::NotFoundError(absl::StrCat("etcd: cannot read ", what, " '", path, "'"));
  return text.str();
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> Credentials(
    const Etcd::Options& options) {
  if (options.tls_ca_file.empty()) {
    if (!options.tls_cert_file.empty() || !options.tls_key_file.empty()) {
      return absl::InvalidArgumentError("etcd: a client certificate needs the CA (tls_ca_file)");
    }
    return grpc::InsecureChannelCredentials();
  }
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("etcd: a client certificate needs its key, and the key its certificate");
  }
  grpc::SslCredentialsOptions ssl;
  SONDE_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPem("CA", options.tls_ca_file));
  if (!options.tls_cert_file.empty()) {
    SONDE_ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadPem("certificate", options.tls_cert_file));
    SONDE_ASSIGN_OR_RETURN(ssl.pem_private_key, ReadPem("key", options.tls_key_file));
  }
  return grpc::SslCredentials(ssl);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Etcd>> Etcd::Connect(const Options& options) {
  if (options.endpoints.empty()) return absl::InvalidArgumentError("etcd: no endpoints given");
  SONDE_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                         Credentials(options));
  auto members = std::make_unique<Members>();
  for (const std::string& endpoint : options.endpoints) {
    if (endpoint.empty()) return absl::InvalidArgumentError("etcd: an empty endpoint");
    Members::Member m;
    m.endpoint = endpoint;
    grpc::ChannelArguments args;
    // Reconnect quickly after a member restarts (gRPC's default backoff
    // grows to 120 s). A channel that first connected while its member
    // was starting (before /health said true) answers only ~10 s later
    // (measured, etcd 3.4.23); calls meanwhile go to the other members.
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    m.channel = grpc::CreateCustomChannel(endpoint, credentials, args);
    m.kv = pb::KV::NewStub(m.channel);
    m.lease = pb::Lease::NewStub(m.channel);
    m.watch = pb::Watch::NewStub(m.channel);
    members->members.push_back(std::move(m));
  }
  return std::unique_ptr<Etcd>(new Etcd(options, std::move(members)));
}

absl::StatusOr<std::optional<KeyValue>> Etcd::Get(const std::string& key) {
  pb::RangeRequest request;
  request.set_key(key);
  pb::RangeResponse response;
  grpc::Status s = members_->Try(options_.timeout, [&](Members::Member& m, grpc::ClientContext& c) {
    return m.kv->Range(&c, request, &response);
  });
  if (!s.ok()) return Annotate(s, absl::StrCat("get '", key, "'"));
  if (response.kvs_size() == 0) return std::nullopt;
  return FromPb(response.kvs(0));
}

absl::StatusOr<std::vector<KeyValue>> Etcd::List(const std::string& prefix, int64_t* revision) {
  pb::RangeRequest request;
  request.set_key(prefix.empty() ? std::string(1, '\0') : prefix);
  request.set_range_end(PrefixEnd(prefix));
  request.set_sort_order(pb::RangeRequest::ASCEND);
  request.set_sort_target(pb::RangeRequest::KEY);
  pb::RangeResponse response;
  grpc::Status s = members_->Try(options_.timeout, [&](Members::Member& m, grpc::ClientContext& c) {
    return m.kv->Range(&c, request, &response);
  });
  if (!s.ok()) return Annotate(s, absl::StrCat("list '", prefix, "'"));
  std::vector<KeyValue> out;
  out.reserve(response.kvs_size());
  for (const mvccpb::KeyValue& kv : response.kvs()) out.push_back(FromPb(kv));
  if (revision != nullptr) *revision = response.header().revision();
  return out;
}

absl::StatusOr<int64_t> Etcd::Put(const std::string& key, const std::string& value,
                                  int64_t lease) {
  pb::PutRequest request;
  request.set_key(key);
  request.set_value(value);
  request.set_lease(lease);
  pb::PutResponse response;
  grpc::Status s = members_->Try(options_.timeout, [&](Members::Member& m, grpc::ClientContext& c) {
    return m.kv->Put(&c, request, &response);
  });
  if (!s.ok()) return Annotate(s, absl::StrCat("put '", key, "'"));
  return response.header().revision();
}

absl::StatusOr<Etcd::TxnResult> Etcd::Txn(const std::vector<Compare>& conditions,
                                          const std::vector<Write>& writes) {
  pb::TxnRequest request;
  for (const Compare& c : conditions) {
    pb::Compare* cmp = request.add_compare();
    cmp->set_key(c.key);
    cmp->set_result(pb::Compare::EQUAL);
    cmp->set_target(pb::Compare::CREATE);
    cmp->set_create_revision(c.create_revision);
  }
  for (const Write& w : writes) {
    pb::RequestOp* op = request.add_success();
    if (w.erase) {
      op->mutable_request_delete_range()->set_key(w.key);
    } else {
      pb::PutRequest* put = op->mutable_request_put();
      put->set_key(w.key);
      put->set_value(w.value);
      put->set_lease(w.lease);
    }
  }
  pb::TxnResponse response;
  grpc::Status s = members_->Try(options_.timeout, [&](Members::Member& m, grpc::ClientContext& c) {
    return m.kv->Txn(&c, request, &response);
  });
  if (!s.ok()) {
    return Annotate(s, absl::StrCat("transaction on '",
                                    writes.empty() ? std::string() : writes.front().key, "'"));
  }
  return TxnResult{response.succeeded(), response.header().revision()};
}

absl::StatusOr<int64_t> Etcd::GrantLease(absl::Duration ttl) {
  pb::LeaseGrantRequest request;
  request.set_ttl(std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(ttl, absl::Seconds(1)))));
  pb::LeaseGrantResponse response;
  grpc::Status s = members_->Try(options_.timeout, [&](Members::Member& m, grpc::ClientContext& c) {
    return m.lease->LeaseGrant(&c, request, &response);
  });
  if (!s.ok()) return Annotate(s, "lease grant");
  if (!response.error().empty()) {
    return absl::UnavailableError(absl::StrCat("etcd lease grant: ", response.error()));
  }
  return response.id();
}

absl::Status Etcd::KeepAlive(int64_t lease) {
  pb::LeaseKeepAliveResponse response;
  bool answered = false;
  grpc::Status s = members_->Try(options_.timeout, [&](Members::Member& m, grpc::ClientContext& c) {
    auto stream = m.lease->LeaseKeepAlive(&c);
    pb::LeaseKeepAliveRequest request;
    request.set_id(lease);
    answered = stream->Write(request) && stream->Read(&response);
    stream->WritesDone();
    grpc::Status finished = stream->Finish();
    if (answered) return grpc::Status::OK;
    return finished.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "no keep-alive answer")
                         : finished;
  });
  if (!s.ok()) return Annotate(s, absl::StrCat("keep-alive of lease ", lease));
  if (response.ttl() <= 0) {
    return absl::NotFoundError(absl::StrCat("etcd lease ", lease, " has expired"));
  }
  return absl::OkStatus();
}

absl::Status Etcd::RevokeLease(int64_t lease) {
  pb::LeaseRevokeRequest request;
  request.set_id(lease);
  pb::LeaseRevokeResponse response;
  grpc::Status s = members_->Try(options_.timeout, [&](Members::Member& m, grpc::ClientContext& c) {
    return m.lease->LeaseRevoke(&c, request, &response);
  });
  if (!s.ok()) return Annotate(s, absl::StrCat("revoke of lease ", lease));
  return absl::OkStatus();
}

namespace {

class PrefixWatch : public Etcd::Watch {
 public:
  PrefixWatch(Etcd::Members* members, std::string prefix, int64_t after_revision,
              std::function<void(const std::vector<Event>&)> on_events,
              std::function<void(const absl::Status&)> on_lost)
      : members_(members),
        prefix_(std::move(prefix)),
        next_revision_(after_revision + 1),
        on_events_(std::move(on_events)),
        on_lost_(std::move(on_lost)) {
    thread_ = std::thread([this] { Run(); });
  }

  ~PrefixWatch() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      if (context_ != nullptr) context_->TryCancel();
    }
    thread_.join();
  }

 private:
  void Run() {
    size_t member = members_->preferred.load();
    while (true) {
      grpc::ClientContext context;
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) return;
        context_ = &context;
      }
      const absl::Status lost = WatchOnce(members_->members[member], context);
      {
        absl::MutexLock lock(&mu_);
        context_ = nullptr;
        if (stopping_) return;
      }
      if (!lost.ok()) {
        on_lost_(lost);
        return;
      }
      // The member went away or the stream broke: the next one, shortly.
      member = (member + 1) % members_->members.size();
      absl::MutexLock lock(&mu_);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
      mu_.AwaitWithTimeout(absl::Condition(&stop), absl::Milliseconds(100));
    }
  }

  // OK when the stream ended and may be reopened; an error when the watch
  // cannot go on (etcd compacted past next_revision_, or refused it).
  absl::Status WatchOnce(Etcd::Members::Member& member, grpc::ClientContext& context) {
    auto stream = member.watch->Watch(&context);
    etcdserverpb::WatchRequest request;
    auto* create = request.mutable_create_request();
    create->set_key(prefix_.empty() ? std::string(1, '\0') : prefix_);
    create->set_range_end(PrefixEnd(prefix_));
    create->set_start_revision(next_revision_);
    if (!stream->Write(request)) return absl::OkStatus();
    etcdserverpb::WatchResponse response;
    while (stream->Read(&response)) {
      if (response.compact_revision() > 0) {
        return absl::OutOfRangeError(absl::StrCat(
            "etcd watch of '", prefix_, "': revision ", next_revision_,
            " is compacted (oldest kept: ", response.compact_revision(), ")"));
      }
      if (response.canceled()) {
        return absl::AbortedError(absl::StrCat("etcd watch of '", prefix_,
                                               "' canceled: ", response.cancel_reason()));
      }
      if (response.events_size() == 0) continue;
      std::vector<Event> events;
      events.reserve(response.events_size());
      for (const mvccpb::Event& e : response.events()) {
        Event out;
        out.type = e.type() == mvccpb::Event::DELETE ? Event::Type::kDelete : Event::Type::kPut;
        out.kv = FromPb(e.kv());
        next_revision_ = std::max(next_revision_, e.kv().mod_revision() + 1);
        events.push_back(std::move(out));
      }
      on_events_(events);
    }
    stream->Finish();  // the next stream says what became of the member
    return absl::OkStatus();
  }

  Etcd::Members* const members_;
  const std::string prefix_;
  int64_t next_revision_;  // only the watch thread touches it
  const std::function<void(const std::vector<Event>&)> on_events_;
  const std::function<void(const absl::Status&)> on_lost_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread thread_;
};

}  // namespace

std::unique_ptr<Etcd::Watch> Etcd::WatchPrefix(
    const std::string& prefix, int64_t after_revision,
    std::function<void(const std::vector<Event>&)> on_events,
    std::function<void(const absl::Status&)> on_lost) {
  return std::make_unique<PrefixWatch>(members_.get(), prefix, after_revision, std::move(on_events),
                                       std::move(on_lost));
}

}  // namespace sonde::cluster
