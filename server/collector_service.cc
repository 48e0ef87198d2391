#include "server/collector_service.h"

#include <deque>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "server/access.h"
#include "server/rpc_metrics.h"
#include "grpcpp/support/byte_buffer.h"
#include "glog/logging.h"

namespace sonde::server {

class IngestReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                            public StreamHandle {
 public:
  IngestReactor(CollectorService* service)
      : service_(service), session_(service->registry_, service->limits_) {}

  void Begin() { Read(); }
  // The stream's token (null without authentication); set before Begin.
  void SetGrant(const TokenGrant* grant, std::string peer) {
    grant_ = grant;
    peer_ = std::move(peer);
  }

  void OnReadDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      if (finishing_) return;  // aborted meanwhile: nothing more is processed
      if (ok) in_storage_ = true;  // cleared by AfterStorage if no storage work follows
    }
    if (!ok) {
      // The client half-closed or the stream broke. An open step is dropped.
      FinishOnce(grpc::Status::OK);
      return;
    }
    ++received_;
    if (!Parse()) {
      const grpc::Status refused(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("message ", received_, " of the stream (", raw_bytes_,
                       " bytes) is not a sonde.v1.ClientMessage: garbage, a truncated "
                       "message or a string field that is not UTF-8"));
      LOG(WARNING) << "ending stream: " << refused.error_message();
      AfterStorage(refused);
      return;
    }
    metrics_.Received(in_, raw_bytes_);
    auto next = session_.OnMessage(in_);
    if (!next.ok()) {
      LOG(WARNING) << "ending stream: " << next.status();
      AfterStorage(ToGrpcStatus(next.status()));
      return;
    }
    switch (*next) {
      case IngestSession::Next::kRead:
        AfterStorage();
        return;
      case IngestSession::Next::kHello:
        if (grant_ != nullptr) {
          absl::Status allowed = Authorize(*grant_, "/sonde.v1.Collector/Stream", in_, peer_);
          if (!allowed.ok()) {
            AfterStorage(ToGrpcStatus(allowed));
            return;
          }
        }
        service_->storage_pool_->Schedule([this] {
          auto joined = session_.Join(this);
          if (!joined.ok()) {
            AfterStorage(ToGrpcStatus(joined.status()));
            return;
          }
          v1::ServerMessage ack;
          *ack.mutable_hello_ack() = joined->ack;
          Send(ack);
          for (const std::string& w : joined->warnings) {
            v1::ServerMessage warning;
            warning.mutable_warning()->set_message(w);
            Send(warning);
          }
          if (joined->pending_stop.has_value()) {
            v1::ServerMessage stop;
            *stop.mutable_action() = *joined->pending_stop;
            Send(stop);
          }
          AfterStorage();
        });
        return;
      case IngestSession::Next::kProfile:
        RunStorage([this] { return session_.StoreProfile(); });
        return;
      case IngestSession::Next::kCommit:
        RunStorage([this] { return session_.Commit(); });
        return;
      case IngestSession::Next::kEndJob:
        RunStorage([this] { return session_.EndJob(); });
        return;
    }
  }

  // Runs `work` (a session call returning StatusOr<Ack> or
  // StatusOr<optional<Ack>>) on the storage pool, sends its ack if there is
  // one, then reads on; an error ends the stream.
  template <typename Work>
  void RunStorage(Work work) {
    service_->storage_pool_->Schedule([this, work = std::move(work)] {
      auto ack = work();
      if (!ack.ok()) {
        LOG(WARNING) << "ending stream: " << ack.status();
        AfterStorage(ToGrpcStatus(ack.status()));
        return;
      }
      if (std::optional<v1::Ack> sent = *std::move(ack); sent.has_value()) {
        v1::ServerMessage msg;
        *msg.mutable_ack() = *std::move(sent);
        Send(msg);
      }
      AfterStorage();
    });
  }

  void Send(const v1::ServerMessage& message) override {
    grpc::ByteBuffer buffer;
    bool own = false;
    if (!grpc::SerializationTraits<v1::ServerMessage>::Serialize(message, &buffer, &own).ok()) {
      LOG(ERROR) << "cannot serialize a server message";
      return;
    }
    absl::MutexLock lock(&mu_);
    if (finishing_) return;
    metrics_.Sent(message);
    out_.push_back(std::move(buffer));
    if (!writing_) {
      writing_ = true;
      StartWrite(&out_.front());
    }
  }

  void Abort(const absl::Status& status) override {
    LOG(WARNING) << "ending stream: " << status;
    FinishOnce(ToGrpcStatus(status));
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    out_.pop_front();
    if (!ok) out_.clear();  // the stream is broken; the read side will end it
    if (!out_.empty() && !finished_) {
      StartWrite(&out_.front());
      return;
    }
    writing_ = false;
    if (finishing_ && !finished_) {
      finished_ = true;
      Finish(final_status_);
    }
  }

  // Ends the stream. While the session is busy (a message being processed
  // or storage work in flight) the end waits for it: the reactor must not
  // be done (and deleted) under its feet.
  void FinishOnce(grpc::Status status) {
    absl::MutexLock lock(&mu_);
    if (in_storage_) {
      if (!deferred_finish_.has_value()) deferred_finish_ = std::move(status);
      return;
    }
    FinishLocked(std::move(status));
  }

  // The session's work for the last message is done: read the next one, or
  // end the stream (with `error`, or a finish that arrived meanwhile).
  void AfterStorage(std::optional<grpc::Status> error = std::nullopt) {
    absl::MutexLock lock(&mu_);
    in_storage_ = false;
    if (error.has_value()) {
      FinishLocked(std::move(*error));
    } else if (deferred_finish_.has_value()) {
      FinishLocked(std::move(*deferred_finish_));
    } else if (!finishing_) {
      StartRead(&raw_in_);
    }
  }

  void FinishLocked(grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finishing_) return;
    finishing_ = true;
    final_status_ = std::move(status);
    if (!writing_) {
      finished_ = true;
      Finish(final_status_);
    }
  }

  void OnDone() override {
    // Leaving the job may write the job record: do it on the storage pool.
    service_->storage_pool_->Schedule([this] {
      session_.Close(this);
      service_->Remove(this);
      delete this;
    });
  }

 private:
  // The message just read, from raw_in_ into in_.
  bool Parse() {
    raw_bytes_ = raw_in_.Length();
    in_.Clear();
    return grpc::SerializationTraits<v1::ClientMessage>::Deserialize(&raw_in_, &in_).ok();
  }

  void Read() {
    absl::MutexLock lock(&mu_);
    if (finishing_) return;
    StartRead(&raw_in_);
  }

  CollectorService* const service_;
  const TokenGrant* grant_ = nullptr;
  std::string peer_;  // for the log of a refusal
  IngestSession session_;
  grpc::ByteBuffer raw_in_;
  v1::ClientMessage in_;
  uint64_t received_ = 0;  // messages read (the reactor reads one at a time)
  size_t raw_bytes_ = 0;   // of the last one
  IngestStreamMetrics metrics_;
  absl::Mutex mu_;
  std::deque<grpc::ByteBuffer> out_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool in_storage_ ABSL_GUARDED_BY(mu_) = false;  // the session is working on a message
  std::optional<grpc::Status> deferred_finish_ ABSL_GUARDED_BY(mu_);
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
};

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* CollectorService::Stream(
    grpc::CallbackServerContext* context) {
  auto* reactor = new IngestReactor(this);
  bool closing;
  {
    absl::MutexLock lock(&mu_);
    closing = closing_;
    reactors_.insert(reactor);
  }
  absl::StatusOr<const TokenGrant*> grant(static_cast<const TokenGrant*>(nullptr));
  if (tokens_ != nullptr && !closing) grant = AuthenticateCall(*tokens_, *context);
  if (closing) {
    reactor->FinishOnce(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                     "the collector is shutting down"));
  } else if (!grant.ok()) {
    reactor->FinishOnce(ToGrpcStatus(grant.status()));
  } else {
    reactor->SetGrant(*grant, context->peer());
    reactor->Begin();
  }
  return reactor;
}

void CollectorService::FinishAll() {
  absl::MutexLock lock(&mu_);
  closing_ = true;
  for (IngestReactor* r : reactors_) {
    r->FinishOnce(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               "the collector is shutting down"));
  }
}

void CollectorService::Remove(IngestReactor* reactor) {
  absl::MutexLock lock(&mu_);
  reactors_.erase(reactor);
}

void CollectorService::WaitForStreams() {
  absl::MutexLock lock(&mu_);
  auto empty = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return reactors_.empty(); };
  mu_.Await(absl::Condition(&empty));
}

}  // namespace sonde::server
