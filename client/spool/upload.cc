#include "client/spool/upload.h"

#include <unistd.h>

#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "glog/logging.h"
#include "grpcpp/grpcpp.h"
#include "proto/collector.grpc.pb.h"

namespace sonde::spool {
namespace {

constexpr char kKilledReason[] =
    "the client ended without closing; its spooled steps were uploaded later";

bool HasJobEnd(const std::vector<v1::ClientMessage>& messages) {
  for (const v1::ClientMessage& m : messages) {
    if (m.has_job_end()) return true;
  }
  return false;
}

// What the reader thread learns from the collector.
struct Acks {
  absl::Mutex mu;
  bool hello_acked ABSL_GUARDED_BY(mu) = false;
  bool broken ABSL_GUARDED_BY(mu) = false;
  uint64_t acked_seq ABSL_GUARDED_BY(mu) = 0;
  uint64_t stored ABSL_GUARDED_BY(mu) = 0;
  uint64_t duplicates ABSL_GUARDED_BY(mu) = 0;
};

// One upload of a left spool over one stream: the hello, the segments in
// order (each removed once acknowledged), a job end if asked, then the
// wait for the last ack.
class Uploader {
 public:
  Uploader(const LeftSpool& left, const UploadOptions& options, UploadResult* result,
           std::string target)
      : left_(left), options_(options), result_(result), target_(std::move(target)) {}
  ~Uploader() {
    if (reader_.joinable()) {
      context_.TryCancel();
      reader_.join();
    }
  }

  absl::Status Run() {
    if (absl::Status s = Connect(); !s.ok()) return s;
    absl::StatusOr<bool> go_on = SendHello();
    if (!go_on.ok()) return go_on.status();
    if (!*go_on) return absl::OkStatus();  // nothing of the spool was left to store
    bool job_end = false;
    std::string first_damage;
    if (absl::Status s = SendSegments(&job_end, &first_damage); !s.ok()) return s;
    if (!job_end && options_.end_job) {
      v1::ClientMessage end;
      end.mutable_job_end()->set_reason(kKilledReason);
      end.mutable_job_end()->set_steps_dropped(result_->segments_damaged);
      end.set_seq(++seq_);
      if (!stream_->Write(end)) return Finish(absl::UnavailableError("the stream broke"));
    }
    const uint64_t last = seq_;
    if (!Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(acks_.mu) { return acks_.acked_seq >= last; })) {
      return Finish(absl::UnavailableError(
          Cancelled() ? "cancelled"
                      : absl::StrCat("collector ", target_,
                                     " did not acknowledge the spool within ",
                                     absl::FormatDuration(options_.timeout))));
    }
    stream_->WritesDone();
    reader_.join();
    stream_->Finish();
    RemoveAcked();
    TakeCounts();
    if (result_->segments_damaged > 0) {
      return absl::DataLossError(absl::StrCat(
          result_->segments_damaged, " of the spool's entries are damaged and were not stored (",
          first_damage, "); they are kept in ", left_.path,
          " for inspection; remove it by hand once looked at"));
    }
    RemoveLeft(left_.path);
    result_->removed = true;
    return absl::OkStatus();
  }

 private:
  absl::Status Connect() {
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(-1);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        MakeChannel(target_, options_.security, args);
    if (!channel.ok()) return channel.status();
    stub_ = v1::Collector::NewStub(*channel);
    stream_ = stub_->Stream(&context_);
    reader_ = std::thread([this] { Read(); });
    return absl::OkStatus();
  }

  void Read() {
    v1::ServerMessage in;
    while (stream_->Read(&in)) {
      absl::MutexLock l(&acks_.mu);
      if (in.has_hello_ack()) {
        acks_.hello_acked = true;
      } else if (in.has_ack()) {
        acks_.acked_seq = std::max(acks_.acked_seq, in.ack().acked_seq());
        // Steps' acks carry their mode; the job end's and profiler
        // batches' do not.
        if (in.ack().mode() != v1::MODE_UNSPECIFIED) {
          ++(in.ack().duplicate() ? acks_.duplicates : acks_.stored);
        }
      }
    }
    absl::MutexLock l(&acks_.mu);
    acks_.broken = true;
  }

  bool Cancelled() const { return options_.cancel != nullptr && options_.cancel->load(); }

  // Waits until `done` holds: false when the stream breaks, on cancel, or
  // after options_.timeout without an ack.
  template <typename Done>
  bool Await(Done done) {
    absl::MutexLock l(&acks_.mu);
    absl::Time last_progress = absl::Now();
    uint64_t seen = acks_.acked_seq;
    while (!done()) {
      if (acks_.broken || Cancelled()) return false;
      if (acks_.acked_seq != seen) {
        seen = acks_.acked_seq;
        last_progress = absl::Now();
      }
      if (absl::Now() - last_progress >= options_.timeout) return false;
      auto wake = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(acks_.mu) {
        return done() || acks_.broken || acks_.acked_seq != seen;
      };
      acks_.mu.AwaitWithTimeout(absl::Condition(&wake), absl::Milliseconds(200));
    }
    return true;
  }

  // Removes the segments the collector has acknowledged, in order.
  void RemoveAcked() {
    uint64_t acked;
    {
      absl::MutexLock l(&acks_.mu);
      acked = acks_.acked_seq;
    }
    while (removed_upto_ < sent_.size() && sent_[removed_upto_].second <= acked) {
      RemoveSegment(left_.path, sent_[removed_upto_].first);
      ++removed_upto_;
      ++result_->segments_sent;
    }
  }

  void TakeCounts() {
    absl::MutexLock l(&acks_.mu);
    result_->steps_stored = acks_.stored;
    result_->steps_duplicate = acks_.duplicates;
  }

  // Ends the stream early: `status`, or what the collector said when it
  // ended the stream.
  absl::Status Finish(absl::Status status) {
    context_.TryCancel();
    reader_.join();
    grpc::Status end = stream_->Finish();
    RemoveAcked();
    TakeCounts();
    if (status.ok()) return status;
    if (!end.ok() && end.error_code() != grpc::StatusCode::CANCELLED) {
      if (end.error_code() == grpc::StatusCode::FAILED_PRECONDITION &&
          absl::StrContains(end.error_message(), "already finished")) {
        return absl::FailedPreconditionError(end.error_message());
      }
      return absl::UnavailableError(absl::StrCat("collector ", target_, ": ",
                                                 end.error_message(), " (code ",
                                                 end.error_code(), ")"));
    }
    return status;
  }

  // True when the collector accepted the hello; false when the job has
  // finished and nothing of the spool was left to store (removed).
  absl::StatusOr<bool> SendHello() {
    v1::ClientMessage hello;
    *hello.mutable_hello() = left_.hello;
    hello.set_seq(++seq_);
    bool ok = stream_->Write(hello);
    if (ok) {
      ok = Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(acks_.mu) { return acks_.hello_acked; });
    }
    if (ok) return true;
    absl::Status status = Finish(absl::UnavailableError(
        Cancelled() ? "cancelled"
                    : absl::StrCat("collector ", target_, " did not accept the spool's hello")));
    if (!absl::IsFailedPrecondition(status)) return status;
    // The job has finished. If all that is left is its job end, every step
    // was stored (only the job end's ack was lost).
    bool only_job_end = left_.segments.size() == 1;
    if (only_job_end) {
      absl::StatusOr<std::vector<v1::ClientMessage>> last =
          ReadSegment(left_.path, left_.segments.back());
      only_job_end = last.ok() && last->size() == 1 && (*last)[0].has_job_end();
    }
    if (only_job_end || left_.segments.empty()) {
      RemoveLeft(left_.path);
      result_->removed = true;
      return false;
    }
    return absl::FailedPreconditionError(absl::StrCat(
        status.message(), "; the ", left_.segments.size(),
        " entries left in the spool cannot be stored there (the spool is kept: ", left_.path,
        ")"));
  }

  absl::Status SendSegments(bool* job_end, std::string* first_damage) {
    for (uint64_t index : left_.segments) {
      if (Cancelled()) return Finish(absl::CancelledError("cancelled"));
      absl::StatusOr<std::vector<v1::ClientMessage>> messages = ReadSegment(left_.path, index);
      if (!messages.ok()) {
        // A damaged segment cannot be stored. It is counted, kept in the
        // spool for inspection, and makes the upload fail, so the loss is
        // never silent; the rest is uploaded all the same.
        ++result_->segments_damaged;
        if (first_damage->empty()) *first_damage = std::string(messages.status().message());
        continue;
      }
      *job_end = *job_end || HasJobEnd(*messages);
      for (v1::ClientMessage& m : *messages) {
        if (m.has_job_end()) {
          // The steps of damaged entries before it are gaps the job shows.
          m.mutable_job_end()->set_steps_dropped(m.job_end().steps_dropped() +
                                                 result_->segments_damaged);
        }
        m.set_seq(++seq_);
        if (!stream_->Write(m)) return Finish(absl::UnavailableError("the stream broke"));
      }
      sent_.emplace_back(index, seq_);
      RemoveAcked();
    }
    return absl::OkStatus();
  }

  const LeftSpool& left_;
  const UploadOptions& options_;
  UploadResult* const result_;
  const std::string target_;
  std::unique_ptr<v1::Collector::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::ClientMessage, v1::ServerMessage>> stream_;
  std::thread reader_;
  Acks acks_;
  uint64_t seq_ = 0;
  // (segment index, seq of its last message), in order of sending.
  std::vector<std::pair<uint64_t, uint64_t>> sent_;
  size_t removed_upto_ = 0;
};

}  // namespace

absl::Status Upload(const LeftSpool& left, const UploadOptions& options, UploadResult* result) {
  *result = UploadResult();
  absl::StatusOr<int> lock = LockLeft(left.path);
  if (!lock.ok()) return lock.status();
  absl::Cleanup unlock = [fd = *lock] { ::close(fd); };
  if (left.segments.empty() && !options.end_job) {
    RemoveLeft(left.path);  // its client ended before any step was complete
    result->removed = true;
    return absl::OkStatus();
  }
  const std::string target = options.collector.empty() ? left.collector : options.collector;
  if (target.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the spool ", left.path, " names no collector; give one"));
  }
  Uploader uploader(left, options, result, target);
  return uploader.Run();
}

}  // namespace sonde::spool
