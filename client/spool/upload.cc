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
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      MakeChannel(target, options.security, args);
  if (!channel.ok()) return channel.status();
  auto stub = v1::Collector::NewStub(*channel);
  grpc::ClientContext context;
  auto stream = stub->Stream(&context);
  Acks acks;
  std::thread reader([&] {
    v1::ServerMessage in;
    while (stream->Read(&in)) {
      absl::MutexLock l(&acks.mu);
      if (in.has_hello_ack()) {
        acks.hello_acked = true;
      } else if (in.has_ack()) {
        acks.acked_seq = std::max(acks.acked_seq, in.ack().acked_seq());
        // Steps' acks carry their mode; the job end's and profiler
        // batches' do not.
        if (in.ack().mode() != v1::MODE_UNSPECIFIED) {
          ++(in.ack().duplicate() ? acks.duplicates : acks.stored);
        }
      }
    }
    absl::MutexLock l(&acks.mu);
    acks.broken = true;
  });
  auto cancelled = [&] { return options.cancel != nullptr && options.cancel->load(); };
  // Waits until `done` holds: false when the stream breaks, on cancel, or
  // after `timeout` without an ack.
  auto await = [&](auto done) {
    absl::MutexLock l(&acks.mu);
    absl::Time last_progress = absl::Now();
    uint64_t seen = acks.acked_seq;
    while (!done()) {
      if (acks.broken || cancelled()) return false;
      if (acks.acked_seq != seen) {
        seen = acks.acked_seq;
        last_progress = absl::Now();
      }
      if (absl::Now() - last_progress >= options.timeout) return false;
      auto wake = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(acks.mu) {
        return done() || acks.broken || acks.acked_seq != seen;
      };
      acks.mu.AwaitWithTimeout(absl::Condition(&wake), absl::Milliseconds(200));
    }
    return true;
  };

  uint64_t seq = 0;
  // (segment index, seq of its last message), in order of sending.
  std::vector<std::pair<uint64_t, uint64_t>> sent;
  size_t removed_upto = 0;
  auto remove_acked = [&] {
    uint64_t acked;
    {
      absl::MutexLock l(&acks.mu);
      acked = acks.acked_seq;
    }
    while (removed_upto < sent.size() && sent[removed_upto].second <= acked) {
      RemoveSegment(left.path, sent[removed_upto].first);
      ++removed_upto;
      ++result->segments_sent;
    }
  };
  auto finish = [&](absl::Status status) {
    context.TryCancel();
    reader.join();
    grpc::Status end = stream->Finish();
    remove_acked();
    {
      absl::MutexLock l(&acks.mu);
      result->steps_stored = acks.stored;
      result->steps_duplicate = acks.duplicates;
    }
    if (status.ok()) return status;
    if (!end.ok() && end.error_code() != grpc::StatusCode::CANCELLED) {
      if (end.error_code() == grpc::StatusCode::FAILED_PRECONDITION &&
          absl::StrContains(end.error_message(), "already finished")) {
        return absl::FailedPreconditionError(end.error_message());
      }
      return absl::UnavailableError(absl::StrCat("collector ", target, ": ", end.error_message(),
                                                 " (code ", end.error_code(), ")"));
    }
    return status;
  };

  v1::ClientMessage hello;
  *hello.mutable_hello() = left.hello;
  hello.set_seq(++seq);
  bool ok = stream->Write(hello);
  if (ok) {
    ok = await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(acks.mu) { return acks.hello_acked; });
  }
  if (!ok) {
    absl::Status status = finish(absl::UnavailableError(
        cancelled() ? "cancelled" : absl::StrCat("collector ", target, " did not accept the spool's hello")));
    if (absl::IsFailedPrecondition(status)) {
      // The job has finished. If all that is left is its job end, every
      // step was stored (only the job end's ack was lost).
      bool only_job_end = left.segments.size() == 1;
      if (only_job_end) {
        absl::StatusOr<std::vector<v1::ClientMessage>> last =
            ReadSegment(left.path, left.segments.back());
        only_job_end = last.ok() && last->size() == 1 && (*last)[0].has_job_end();
      }
      if (only_job_end || left.segments.empty()) {
        RemoveLeft(left.path);
        result->removed = true;
        return absl::OkStatus();
      }
      return absl::FailedPreconditionError(absl::StrCat(
          status.message(), "; the ", left.segments.size(),
          " entries left in the spool cannot be stored there (the spool is kept: ", left.path,
          ")"));
    }
    return status;
  }

  bool job_end = false;
  std::string first_damage;
  for (uint64_t index : left.segments) {
    if (cancelled()) return finish(absl::CancelledError("cancelled"));
    absl::StatusOr<std::vector<v1::ClientMessage>> messages = ReadSegment(left.path, index);
    if (!messages.ok()) {
      // A damaged segment cannot be stored. It is counted, kept in the
      // spool for inspection, and makes the upload fail below, so the
      // loss is never silent; the rest is uploaded all the same.
      ++result->segments_damaged;
      if (first_damage.empty()) first_damage = std::string(messages.status().message());
      continue;
    }
    job_end = job_end || HasJobEnd(*messages);
    for (v1::ClientMessage& m : *messages) {
      if (m.has_job_end()) {
        // The steps of damaged entries before it are gaps the job shows.
        m.mutable_job_end()->set_steps_dropped(m.job_end().steps_dropped() +
                                               result->segments_damaged);
      }
      m.set_seq(++seq);
      if (!stream->Write(m)) return finish(absl::UnavailableError("the stream broke"));
    }
    sent.emplace_back(index, seq);
    remove_acked();
  }
  if (!job_end && options.end_job) {
    v1::ClientMessage end;
    end.mutable_job_end()->set_reason(kKilledReason);
    end.mutable_job_end()->set_steps_dropped(result->segments_damaged);
    end.set_seq(++seq);
    if (!stream->Write(end)) return finish(absl::UnavailableError("the stream broke"));
  }
  const uint64_t last = seq;
  if (!await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(acks.mu) { return acks.acked_seq >= last; })) {
    return finish(absl::UnavailableError(
        cancelled() ? "cancelled"
                    : absl::StrCat("collector ", target, " did not acknowledge the spool within ",
                                   absl::FormatDuration(options.timeout))));
  }
  stream->WritesDone();
  reader.join();
  stream->Finish();
  remove_acked();
  {
    absl::MutexLock l(&acks.mu);
    result->steps_stored = acks.stored;
    result->steps_duplicate = acks.duplicates;
  }
  if (result->segments_damaged > 0) {
    return absl::DataLossError(absl::StrCat(
        result->segments_damaged, " of the spool's entries are damaged and were not stored (",
        first_damage, "); they are kept in ", left.path,
        " for inspection; remove it by hand once looked at"));
  }
  RemoveLeft(left.path);
  result->removed = true;
  return absl::OkStatus();
}

}  // namespace sonde::spool
