#include "client/sender.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/tensor_chunks.h"
#include "cuda/cpu_stats.h"
#include "cuda/histogram.h"
#include "cuda/statistics.h"
#include "glog/logging.h"
#include "grpcpp/create_channel.h"

namespace sonde {
namespace {

// Room for a chunk's descriptive fields on top of its payload.
constexpr int kMessageOverhead = 1 << 20;

bool Permanent(grpc::StatusCode code) {
  return code == grpc::StatusCode::INVALID_ARGUMENT || code == grpc::StatusCode::NOT_FOUND ||
         code == grpc::StatusCode::FAILED_PRECONDITION ||
         code == grpc::StatusCode::PERMISSION_DENIED ||
         code == grpc::StatusCode::UNAUTHENTICATED || code == grpc::StatusCode::UNIMPLEMENTED;
}

}  // namespace

Sender::Sender(SenderOptions options) : options_(std::move(options)) {
  thread_ = std::thread([this] { Run(); });
}

Sender::~Sender() {
  bool closed;
  {
    absl::MutexLock lock(&mu_);
    closed = closing_;
  }
  if (!closed) Close("client destroyed without close", absl::ZeroDuration()).IgnoreError();
  if (thread_.joinable()) thread_.join();
}

void Sender::LogOnce(const std::string& key, const std::string& message) {
  {
    absl::MutexLock lock(&mu_);
    if (std::find(logged_.begin(), logged_.end(), key) != logged_.end()) return;
    logged_.push_back(key);
  }
  LOG(WARNING) << "sonde: " << message << " (logged once)";
}

bool Sender::EnqueueTensor(QueuedTensor tensor) {
  bool dropped = false;
  {
    absl::MutexLock lock(&mu_);
    if (closing_ || give_up_ ||
        queued_bytes_ + tensor.bytes.size() > options_.max_queue_bytes) {
      ++counters_.tensors_dropped;
      dropped = true;
    } else {
      queued_bytes_ += tensor.bytes.size();
      ++counters_.tensors_queued;
      Item item{Item::kTensor, std::move(tensor), {}, {}};
      queue_.push_back(std::move(item));
    }
  }
  if (dropped) {
    LogOnce("queue-full", absl::StrCat("send queue full (", options_.max_queue_bytes,
                                       " bytes) or closed: dropping tensors; the "
                                       "collector is slower than training"));
  }
  return !dropped;
}

void Sender::EnqueueStepEnd(int64_t step, v1::Mode mode, int64_t mode_step, double duration) {
  Item item{Item::kStepEnd, {}, {}, {}};
  item.step_end.set_step(step);
  item.step_end.set_mode(mode);
  item.step_end.set_mode_step(mode_step);
  item.step_end.set_duration_seconds(duration);
  absl::MutexLock lock(&mu_);
  if (closing_ || give_up_) return;
  queue_.push_back(std::move(item));
}

absl::Status Sender::Close(const std::string& reason, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (!closing_) {
    closing_ = true;
    Item item{Item::kJobEnd, {}, {}, {}};
    item.job_end.set_reason(reason);
    queue_.push_back(std::move(item));
  }
  auto finished = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&finished), timeout)) {
    give_up_ = true;
    if (active_context_ != nullptr) active_context_->TryCancel();
    const size_t left = queue_.size();
    mu_.Await(absl::Condition(&finished));
    return absl::DeadlineExceededError(
        absl::StrCat("the collector did not acknowledge everything within ",
                     absl::FormatDuration(timeout), "; ", left, " queued messages unsent"));
  }
  if (!job_end_acked_) {
    return absl::UnavailableError("the collector did not accept the job; see the log");
  }
  return absl::OkStatus();
}

bool Sender::WaitForHelloAck(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return connected_ || give_up_; };
  return mu_.AwaitWithTimeout(absl::Condition(&ready), timeout) && connected_;
}

bool Sender::WaitForAcks(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto flushed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return give_up_ || (queue_.empty() && connected_ &&
                        counters_.last_acked_seq >= counters_.messages_sent);
  };
  return mu_.AwaitWithTimeout(absl::Condition(&flushed), timeout) && !give_up_;
}

std::string Sender::AcquireBuffer(size_t bytes) {
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < free_buffers_.size(); ++i) {
      if (free_buffers_[i].capacity() >= bytes) {
        std::string buf = std::move(free_buffers_[i]);
        free_buffers_[i] = std::move(free_buffers_.back());
        free_buffers_.pop_back();
        free_bytes_ -= buf.capacity();
        buf.clear();
        return buf;
      }
    }
  }
  std::string buf;
  buf.reserve(bytes);
  return buf;
}

SenderCounters Sender::counters() const {
  absl::MutexLock lock(&mu_);
  return counters_;
}

void Sender::Run() {
  absl::Duration backoff = options_.reconnect_min;
  while (true) {
    if (StreamOnce()) break;
    absl::MutexLock lock(&mu_);
    ++counters_.reconnects;
    auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return give_up_; };
    if (mu_.AwaitWithTimeout(absl::Condition(&stop), backoff)) break;
    backoff = std::min(backoff * 2, options_.reconnect_max);
  }
  absl::MutexLock lock(&mu_);
  queue_.clear();
  queued_bytes_ = 0;
  done_ = true;
}

bool Sender::WriteItem(grpc::ClientReaderWriter<v1::ClientMessage, v1::ServerMessage>* stream,
                       const Item& item) {
  v1::ClientMessage msg;
  switch (item.kind) {
    case Item::kTensor: {
      const QueuedTensor& queued = item.tensor;
      QueuedTensor resolved;
      absl::StatusOr<v1::Statistics> stats;
      std::optional<v1::Histogram> histogram;
      if (queued.pending != nullptr) {
        // A device tensor: statistics from the device, values (if any) from
        // its pinned staging copy.
        absl::Status ready = options_.await_device
                                 ? options_.await_device(queued.pending)
                                 : absl::FailedPreconditionError("no device capture");
        if (!ready.ok()) {
          LogOnce("device-results",
                  absl::StrCat("device tensor '", queued.name, "' skipped: ", ready.ToString()));
          return true;
        }
        resolved = queued;
        resolved.send_values = queued.send_values && queued.pending->want_copy;
        if (resolved.send_values) {
          resolved.bytes = std::move(queued.pending->bytes);
          resolved.dtype = queued.pending->bytes_dtype;
        }
        stats = ToProto(queued.pending->stats);
        if (queued.pending->want_histogram) histogram = ToProto(queued.pending->histogram);
      } else {
        stats = ComputeStatistics(queued.bytes, queued.dtype);
        if (queued.histogram && stats.ok()) {
          HistogramCounts h = HistogramCounts::Empty(queued.histogram_spec);
          const uint64_t count = queued.bytes.size() / std::max<size_t>(1, DTypeSize(queued.dtype));
          if (!CpuAccumulate(nullptr, &h, queued.bytes.data(), queued.dtype, count).ok()) {
            // Integer and bool tensors take the scalar path.
            AccumulateHistogramScalar(h, queued.bytes.data(), queued.dtype, count);
          }
          histogram = ToProto(h);
        }
      }
      const QueuedTensor& t = queued.pending != nullptr ? resolved : queued;
      if (!stats.ok()) {
        LogOnce("bad-tensor", absl::StrCat("tensor '", t.name, "' skipped: ", stats.status().ToString()));
        return true;
      }
      if (!t.send_values) {
        v1::TensorSummary* s = msg.mutable_summary();
        s->set_step(t.step);
        s->set_mode(t.mode);
        s->set_mode_step(t.mode_step);
        s->set_tensor_name(t.name);
        for (const auto& c : t.collections) s->add_collections(c);
        s->set_dtype(t.dtype);
        for (int64_t d : t.shape) s->add_shape(d);
        *s->mutable_statistics() = *stats;
        if (histogram.has_value()) *s->mutable_histogram() = std::move(*histogram);
        msg.set_seq(++seq_);
        if (!stream->Write(msg)) return false;
      } else {
        v1::TensorChunk header;
        header.set_step(t.step);
        header.set_mode(t.mode);
        header.set_mode_step(t.mode_step);
        header.set_tensor_name(t.name);
        for (const auto& c : t.collections) header.add_collections(c);
        header.set_dtype(t.dtype);
        for (int64_t d : t.shape) header.add_shape(d);
        *header.mutable_statistics() = *stats;
        if (histogram.has_value()) *header.mutable_histogram() = std::move(*histogram);
        for (v1::TensorChunk& chunk : SplitIntoChunks(header, t.bytes, chunk_limit_)) {
          msg.Clear();
          *msg.mutable_chunk() = std::move(chunk);
          msg.set_seq(++seq_);
          if (!stream->Write(msg)) return false;
        }
      }
      ++step_tensors_;
      break;
    }
    case Item::kStepEnd:
      *msg.mutable_step_end() = item.step_end;
      msg.mutable_step_end()->set_tensor_count(step_tensors_);
      msg.set_seq(++seq_);
      if (!stream->Write(msg)) return false;
      step_tensors_ = 0;
      break;
    case Item::kJobEnd:
      *msg.mutable_job_end() = item.job_end;
      msg.set_seq(++seq_);
      job_end_seq_ = seq_;
      if (!stream->Write(msg)) return false;
      break;
  }
  absl::MutexLock lock(&mu_);
  counters_.messages_sent = seq_;
  return true;
}

bool Sender::StreamOnce() {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(static_cast<int>(options_.max_chunk_bytes) + kMessageOverhead);
  args.SetMaxReceiveMessageSize(kMessageOverhead);
  auto channel = grpc::CreateCustomChannel(options_.collector,
                                           grpc::InsecureChannelCredentials(), args);
  auto stub = v1::Collector::NewStub(channel);
  grpc::ClientContext context;
  {
    absl::MutexLock lock(&mu_);
    if (give_up_) return true;
    active_context_ = &context;
  }
  auto stream = stub->Stream(&context);
  {
    // Acks count messages of this stream only.
    absl::MutexLock lock(&mu_);
    counters_.messages_sent = 0;
    counters_.last_acked_seq = 0;
  }
  seq_ = 0;
  job_end_seq_ = 0;
  step_tensors_ = 0;
  chunk_limit_ = options_.max_chunk_bytes;
  std::atomic<bool> hello_acked{false};
  std::atomic<bool> broken{false};
  std::atomic<uint64_t> server_chunk_limit{0};

  std::thread reader([&] {
    v1::ServerMessage in;
    while (stream->Read(&in)) {
      switch (in.kind_case()) {
        case v1::ServerMessage::kHelloAck:
          server_chunk_limit = in.hello_ack().max_chunk_bytes();
          if (options_.on_hello_ack) options_.on_hello_ack(in.hello_ack());
          hello_acked = true;
          {
            absl::MutexLock lock(&mu_);
            connected_ = true;
          }
          break;
        case v1::ServerMessage::kAck: {
          absl::MutexLock lock(&mu_);
          counters_.last_acked_seq = in.ack().acked_seq();
          ++counters_.steps_acked;
          if (job_end_seq_ != 0 && in.ack().acked_seq() >= job_end_seq_) job_end_acked_ = true;
          break;
        }
        case v1::ServerMessage::kAction:
          if (options_.on_action) options_.on_action(in.action());
          break;
        case v1::ServerMessage::kWarning:
          LogOnce(absl::StrCat("warning:", in.warning().message()),
                  absl::StrCat("collector warns: ", in.warning().message()));
          break;
        default:
          break;
      }
    }
    broken = true;
    absl::MutexLock lock(&mu_);  // wakes the writer's Await
    connected_ = false;
  });

  v1::ClientMessage hello;
  *hello.mutable_hello() = options_.hello;
  hello.set_seq(++seq_);
  bool ok = stream->Write(hello);
  bool finished_job = false;
  while (ok) {
    if (server_chunk_limit > 0) chunk_limit_ = std::min<uint64_t>(chunk_limit_, server_chunk_limit);
    const Item* item;  // stays valid: only this thread pops, deque push_back keeps references
    {
      absl::MutexLock lock(&mu_);
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || give_up_ || broken;
      };
      mu_.Await(absl::Condition(&ready));
      if (give_up_ || broken) break;
      item = &queue_.front();
    }
    ok = WriteItem(stream.get(), *item);
    if (!ok) break;
    const bool job_end = item->kind == Item::kJobEnd;
    if (!job_end) {
      absl::MutexLock lock(&mu_);
      if (item->kind == Item::kTensor) {
        queued_bytes_ -= item->tensor.bytes.size();
        // Keep the buffer for the next copy, within a quarter of the queue's budget.
        std::string& bytes = queue_.front().tensor.bytes;
        if (bytes.capacity() > 0 && free_bytes_ + bytes.capacity() <= options_.max_queue_bytes / 4) {
          free_bytes_ += bytes.capacity();
          free_buffers_.push_back(std::move(bytes));
        }
      }
      queue_.pop_front();
    }
    if (job_end) {
      absl::MutexLock lock(&mu_);
      auto acked = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return job_end_acked_ || give_up_ || broken;
      };
      mu_.Await(absl::Condition(&acked));
      finished_job = job_end_acked_;
      if (finished_job) queue_.clear();
      break;
    }
  }
  if (finished_job) stream->WritesDone();
  {
    absl::MutexLock lock(&mu_);
    if (give_up_) context.TryCancel();
  }
  reader.join();
  grpc::Status status = stream->Finish();
  {
    absl::MutexLock lock(&mu_);
    active_context_ = nullptr;
  }
  if (finished_job) return true;
  if (!status.ok() && status.error_code() != grpc::StatusCode::CANCELLED) {
    LogOnce(absl::StrCat("stream:", status.error_code()),
            absl::StrCat("stream to collector ", options_.collector, " failed: ",
                         status.error_message(), " (code ", status.error_code(), ")"));
    if (!hello_acked && Permanent(status.error_code())) {
      LogOnce("disabled", absl::StrCat("the collector refused job '", options_.hello.job(),
                                       "'; Sonde is disabled for this run"));
      absl::MutexLock lock(&mu_);
      give_up_ = true;
      return true;
    }
  }
  absl::MutexLock lock(&mu_);
  return give_up_;
}

}  // namespace sonde
