#include "client/sender.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/dtype.h"
#include "common/tensor_chunks.h"
#include "stats/cpu_stats.h"
#include "stats/histogram.h"
#include "stats/statistics.h"
#include "glog/logging.h"
#include "grpcpp/create_channel.h"

namespace sonde {
namespace {

// Room for a chunk's descriptive fields on top of its payload.
constexpr int kMessageOverhead = 1 << 20;
// Memory charged per queued item or wire message besides its values.
constexpr uint64_t kItemOverhead = 256;
// Most items the queue holds, whatever their size (spilled tensors and step
// ends cost memory too).
constexpr size_t kMaxQueuedItems = 1 << 20;

bool Permanent(grpc::StatusCode code) {
  return code == grpc::StatusCode::INVALID_ARGUMENT || code == grpc::StatusCode::NOT_FOUND ||
         code == grpc::StatusCode::FAILED_PRECONDITION ||
         code == grpc::StatusCode::PERMISSION_DENIED ||
         code == grpc::StatusCode::UNAUTHENTICATED || code == grpc::StatusCode::UNIMPLEMENTED;
}

// The options with a client id: random, nonzero, fixed for the sender's life.
SenderOptions WithClientId(SenderOptions options) {
  if (options.hello.client_id() != 0) return options;
  std::random_device rd;
  uint64_t id = 0;
  while (id == 0) id = (uint64_t{rd()} << 32) ^ rd();
  options.hello.set_client_id(id);
  return options;
}

uint64_t MessageCost(const v1::ClientMessage& m) {
  return kItemOverhead + (m.has_chunk() ? m.chunk().payload().size() : 0);
}

}  // namespace

Sender::Sender(SenderOptions options) : options_(WithClientId(std::move(options))) {
  chunk_limit_ = options_.max_chunk_bytes;  // until a stream says otherwise
  if (!options_.spool_dir.empty()) {
    auto made = spool::Spool::Create(options_.spool_dir, options_.hello, options_.collector,
                                     options_.max_spool_bytes);
    if (made.ok()) {
      absl::MutexLock spool_lock(&spool_mu_);
      spool_ = std::move(*made);
      absl::MutexLock lock(&mu_);
      spooling_ = true;
    } else {
      LOG(WARNING) << "sonde: no durable spool (" << made.status().message()
                   << "); what the collector has not acknowledged when the process ends "
                      "will be lost";
    }
  }
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
  absl::MutexLock lock(&mu_);
  LogOnceLocked(key, message);
}

void Sender::LogOnceLocked(const std::string& key, const std::string& message) {
  if (std::find(logged_.begin(), logged_.end(), key) != logged_.end()) return;
  logged_.push_back(key);
  LOG(WARNING) << "sonde: " << message << " (logged once)";
}

bool Sender::Admit(uint64_t cost) {
  return memory_bytes_ + cost <= options_.max_queue_bytes && queue_.size() < kMaxQueuedItems;
}

void Sender::DropLocked(const std::string& name) {
  ++counters_.tensors_dropped;
  ++open_step_dropped_;
  LogOnceLocked("dropped", absl::StrCat("dropping tensors (first: '", name,
                                        "'): the collector is slower than training or "
                                        "unreachable and the send queue (",
                                        options_.max_queue_bytes, " bytes) is full; drops "
                                        "are counted and reported to the collector"));
}

bool Sender::SpillLocked(const SpillRecord& record) {
  if (spill_failed_) return false;
  if (spill_ == nullptr) {
    auto file = SpillFile::Create(
        SpillDirOrTemp(options_.backpressure.spill_dir),
        options_.spill_budget != nullptr
            ? options_.spill_budget
            : std::make_shared<SpillBudget>(options_.backpressure.max_spill_bytes));
    if (!file.ok()) {
      spill_failed_ = true;
      LogOnceLocked("spill-open", absl::StrCat(file.status().message(), "; dropping instead"));
      return false;
    }
    spill_ = std::move(*file);
  }
  absl::Status s = spill_->Append(record);
  if (!s.ok()) {
    LogOnceLocked(absl::StrCat("spill:", s.code()),
                  absl::StrCat("cannot spill: ", s.message(), "; dropping instead"));
    return false;
  }
  spilled_records_.push_back(record.is_step_end
                                 ? SpilledRecord{record.step_end.step(), 0}
                                 : SpilledRecord{record.tensor.step, record.tensor.device_id});
  if (!record.is_step_end) {
    ++counters_.tensors_spilled;
    counters_.bytes_spilled += record.tensor.bytes.size();
  }
  LogOnceLocked("spilling", absl::StrCat("the send queue is full (", options_.max_queue_bytes,
                                         " bytes): spilling to a local file until the "
                                         "collector catches up"));
  return true;
}

bool Sender::EnqueueProfile(v1::ProfileBatch batch) {
  absl::MutexLock lock(&mu_);
  Item item{Item::kProfile, {}, {}, {}, std::move(batch)};
  const size_t bytes = item.profile.ByteSizeLong();
  if (bytes > kMaxProfileBatchBytes) {
    // Past a stream's message limit it would be refused at every
    // reconnect, and all behind it would wait forever.
    ++counters_.profile_batches_dropped;
    LogOnceLocked("profile-too-big",
                  absl::StrCat("dropping a profiler batch of ", bytes, " bytes: the most one "
                               "message carries is ", kMaxProfileBatchBytes,
                               " (HookProfiler cuts its batches to 256 KiB)"));
    return false;
  }
  item.cost = kItemOverhead + bytes;
  if (closing_ || give_up_ || !Admit(item.cost)) {
    ++counters_.profile_batches_dropped;
    LogOnceLocked("profile-dropped", "dropping profiler data: the send queue is full or the "
                                     "hook is closing");
    return false;
  }
  item.profile.set_sequence(++profile_sequence_);
  memory_bytes_ += item.cost;
  ++counters_.profile_batches_queued;
  queue_.push_back(std::move(item));
  return true;
}

bool Sender::EnqueueTensor(QueuedTensor tensor) {
  absl::MutexLock lock(&mu_);
  return EnqueueTensorLocked(std::move(tensor));
}

std::vector<size_t> Sender::EnqueueTensors(absl::Span<QueuedTensor* const> tensors) {
  std::vector<size_t> dropped;
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!EnqueueTensorLocked(std::move(*tensors[i]))) dropped.push_back(i);
  }
  return dropped;
}

bool Sender::EnqueueTensorLocked(QueuedTensor tensor) {
  ++open_step_tensors_;
  if (closing_ || give_up_) {
    ++counters_.tensors_dropped;
    return false;
  }
  Item item{Item::kTensor, std::move(tensor), {}, {}};
  // A device tensor's values arrive later, and are charged to the budget
  // when they do (ReserveHost): only its bookkeeping is charged here, and
  // it is never refused for memory (the device path has its own limits).
  const bool device = item.tensor.pending != nullptr;
  item.cost = kItemOverhead + (device ? 0 : item.tensor.bytes.size());
  bool admitted = !spilling() && (device ? queue_.size() < kMaxQueuedItems : Admit(item.cost));
  if (!admitted) {
    switch (options_.backpressure.policy) {
      case BackpressurePolicy::kBlock: {
        auto room = [this, &item]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return Admit(item.cost) || closing_ || give_up_;
        };
        admitted = mu_.AwaitWithTimeout(absl::Condition(&room), options_.backpressure.max_block) &&
                   Admit(item.cost) && !closing_ && !give_up_;
        break;
      }
      case BackpressurePolicy::kSpill: {
        // A device tensor's record holds an id; its results stay in memory
        // (or on the device) under that id until the record is read back.
        SpillRecord record;
        record.tensor = std::move(item.tensor);
        std::shared_ptr<PendingDeviceTensor> pending = std::move(record.tensor.pending);
        record.tensor.pending = nullptr;
        if (device) record.tensor.device_id = ++last_device_id_;
        const bool spilled = SpillLocked(record);
        item.tensor = std::move(record.tensor);
        item.tensor.pending = pending;
        if (spilled) {
          ++counters_.tensors_queued;
          ++open_step_queued_;
          if (device) spilled_device_[item.tensor.device_id] = std::move(pending);
          // The values are on disk: recycle the memory.
          std::string& buf = item.tensor.bytes;
          if (buf.capacity() > 0 && free_bytes_ + buf.capacity() <= options_.max_queue_bytes / 4) {
            free_bytes_ += buf.capacity();
            free_buffers_.push_back(std::move(buf));
          }
          return true;
        }
        break;
      }
      case BackpressurePolicy::kDrop:
        break;
    }
  }
  if (!admitted) {
    DropLocked(item.tensor.name);
    return false;
  }
  memory_bytes_ += item.cost;
  ++counters_.tensors_queued;
  ++open_step_queued_;
  queue_.push_back(std::move(item));
  return true;
}

void Sender::RecordDropped(const std::string& first_name, uint32_t count,
                           const std::string& why) {
  if (count == 0) return;
  absl::MutexLock lock(&mu_);
  open_step_tensors_ += count;
  open_step_dropped_ += count;
  counters_.tensors_dropped += count;
  LogOnceLocked(absl::StrCat("recorded-dropped:", why),
                absl::StrCat("dropping tensors (first: '", first_name, "'): ", why,
                             "; drops are counted and reported to the collector"));
}

bool Sender::ReserveHost(uint64_t bytes, bool force) {
  absl::MutexLock lock(&mu_);
  if (!force && memory_bytes_ + bytes > options_.max_queue_bytes) return false;
  memory_bytes_ += bytes;
  device_reserved_ += bytes;
  return true;
}

void Sender::ReleaseHost(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  bytes = std::min(bytes, device_reserved_);
  device_reserved_ -= bytes;
  memory_bytes_ -= std::min(memory_bytes_, bytes);
}

void Sender::CountDeviceSpill(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  ++counters_.device_values_spilled;
  counters_.device_bytes_spilled += bytes;
}

void Sender::EnqueueStepEnd(int64_t step, v1::Mode mode, int64_t mode_step, double duration) {
  absl::MutexLock lock(&mu_);
  if (closing_ || give_up_) return;
  // A step that saved nothing (most steps, at save_interval 100) costs the
  // collector a commit and both sides a wake-up for no data: it is not
  // sent. Completion still works, since a worker's later step passes it.
  if (open_step_tensors_ == 0 && steps_dropped_pending_ == 0) return;
  const bool had_tensors = open_step_tensors_ > 0;
  open_step_tensors_ = 0;
  // A step with tensors on their way gets its end whatever the item limit
  // (its tensors were admitted below it, so the queue passes it by one
  // at most): without its end, they would reach the collector as part of
  // the next step, which it refuses.
  const bool has_queued = open_step_queued_ > 0;
  open_step_queued_ = 0;
  if (queue_.size() >= kMaxQueuedItems && !has_queued && !spilling()) {
    // Even the step end does not fit: the whole step is a gap, reported
    // with the next step end that gets through.
    ++counters_.steps_dropped;
    ++steps_dropped_pending_;
    open_step_dropped_ = 0;
    LogOnceLocked("steps-dropped", "dropping whole steps: the send queue holds too many items");
    return;
  }
  Item item{Item::kStepEnd, {}, {}, {}};
  item.step_end.set_step(step);
  item.step_end.set_mode(mode);
  item.step_end.set_mode_step(mode_step);
  item.step_end.set_duration_seconds(duration);
  item.step_end.set_tensors_dropped(open_step_dropped_);
  item.step_end.set_steps_dropped(steps_dropped_pending_);
  if (spilling()) {
    SpillRecord record;
    record.is_step_end = true;
    record.step_end = item.step_end;
    if (SpillLocked(record)) {
      // What this end carries, should it not read back.
      spilled_ends_.push_back({steps_dropped_pending_, had_tensors});
    } else {
      // The step's end does not fit in the spill file: the step is a gap,
      // and the tensors of it that are queued or spilled are dropped when
      // the sender reaches them (counted).
      ++counters_.steps_dropped;
      ++steps_dropped_pending_;
      open_step_dropped_ = 0;
      if (has_queued) endless_steps_.push_back(step);
      return;
    }
  } else {
    item.cost = kItemOverhead;
    memory_bytes_ += item.cost;
    queue_.push_back(std::move(item));
  }
  open_step_dropped_ = 0;
  steps_dropped_pending_ = 0;
}

absl::Status Sender::Close(const std::string& reason, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (!closing_) {
    closing_ = true;
    Item item{Item::kJobEnd, {}, {}, {}};
    item.job_end.set_reason(reason);
    job_end_item_ = std::move(item);
  }
  auto finished = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&finished), timeout)) {
    give_up_ = true;
    if (active_context_ != nullptr) active_context_->TryCancel();
    const size_t left = queue_.size();
    const size_t unacked = unacked_.size();
    mu_.Await(absl::Condition(&finished));
    return absl::DeadlineExceededError(absl::StrCat(
        "the collector did not acknowledge everything within ", absl::FormatDuration(timeout),
        "; ", left, " queued items unsent and ", unacked, " steps unacknowledged"));
  }
  if (!job_end_acked_) {
    return absl::UnavailableError(refusal_.empty()
                                      ? "the collector did not accept the job; see the log"
                                      : refusal_);
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
    return give_up_ || (queue_.empty() && !spilling() && unacked_.empty() && connected_);
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

std::string Sender::spool_path() const {
  absl::MutexLock lock(&spool_mu_);
  return spool_ != nullptr ? spool_->path() : "";
}

SenderCounters Sender::counters() const {
  absl::MutexLock lock(&mu_);
  SenderCounters c = counters_;
  c.spool_bytes = spool_bytes_.load();
  c.memory_bytes = memory_bytes_;
  c.spill_file_bytes = spill_ != nullptr ? spill_->file_bytes() : 0;
  return c;
}

v1::ClientCounters Sender::WireCounters() {
  v1::ClientCounters c;
  c.set_tensors_dropped(counters_.tensors_dropped);
  c.set_values_dropped(counters_.values_dropped);
  c.set_steps_dropped(counters_.steps_dropped);
  c.set_tensors_spilled(counters_.tensors_spilled);
  c.set_bytes_spilled(counters_.bytes_spilled);
  c.set_device_values_spilled(counters_.device_values_spilled);
  c.set_device_bytes_spilled(counters_.device_bytes_spilled);
  c.set_messages_resent(counters_.messages_resent);
  c.set_reconnects(counters_.reconnects);
  return c;
}

void Sender::PopAckedLocked() {
  while (!unacked_.empty() && unacked_.front().end_seq != 0 &&
         unacked_.front().end_seq <= stream_acked_seq_) {
    memory_bytes_ -= unacked_.front().cost;
    if (unacked_.front().spool_index != 0) {
      acked_segments_.push_back(unacked_.front().spool_index);
    }
    if (unacked_.front().job_end) job_end_acked_ = true;
    unacked_.pop_front();
  }
}

bool Sender::CanTakeLocked() const {
  if (!queue_.empty()) return true;
  if (spilling()) {
    // A spilled record is read back only when the unacknowledged window has
    // room for it, or when nothing waits for an ack (the open step must be
    // able to finish, or nothing would ever be acknowledged).
    // Entries complete in order: only the last one may be open.
    const bool awaiting_ack = !unacked_.empty() && unacked_.front().complete;
    return !awaiting_ack || memory_bytes_ + spill_->NextSize() <= options_.max_queue_bytes;
  }
  return job_end_item_.has_value();
}

bool Sender::TakeNextLocked(Item* item) {
  if (!queue_.empty()) {
    *item = std::move(queue_.front());
    queue_.pop_front();
    return true;
  }
  if (spilling()) {
    const bool step_end = spill_->NextIsStepEnd();
    std::optional<SpilledRecord> spilled;
    if (!spilled_records_.empty()) {
      spilled = spilled_records_.front();
      spilled_records_.pop_front();
    }
    SpilledEnd carried;
    if (step_end && !spilled_ends_.empty()) {
      carried = spilled_ends_.front();
      spilled_ends_.pop_front();
    }
    absl::StatusOr<SpillRecord> record = spill_->ReadNext();
    if (!record.ok()) {
      if (step_end) {
        // The step is a gap (if it had tensors: an end sent only to carry
        // earlier gaps is not a step): its tensors taken so far are
        // dropped when the next step's data comes (DropEndlessEntryLocked).
        // It, and the gaps the end carried, are reported with the next
        // step end that gets through.
        counters_.steps_dropped += carried.had_tensors;
        steps_dropped_pending_ += carried.had_tensors + carried.steps_dropped;
      } else {
        // A gap in its step (the sender is at that step's data now).
        // A device tensor's results are let go of: nothing will read them.
        if (spilled.has_value()) {
          EnterBuiltStepLocked(spilled->step);
          auto it = spilled_device_.find(spilled->device_id);
          if (spilled->device_id != 0 && it != spilled_device_.end()) {
            lost_device_.push_back(std::move(it->second));
            spilled_device_.erase(it);
          }
        }
        ++counters_.tensors_dropped;
        ++built_tensors_dropped_;
      }
      LogOnceLocked("spill-read", absl::StrCat("a spilled ", step_end ? "step end" : "tensor",
                                               " is lost: ", record.status().message()));
      return false;
    }
    if (record->is_step_end) {
      *item = Item{Item::kStepEnd, {}, std::move(record->step_end), {}};
    } else {
      *item = Item{Item::kTensor, std::move(record->tensor), {}, {}};
      if (item->tensor.device_id != 0) {
        auto it = spilled_device_.find(item->tensor.device_id);
        if (it == spilled_device_.end()) {
          EnterBuiltStepLocked(item->tensor.step);  // a gap in its own step
          ++counters_.tensors_dropped;
          ++built_tensors_dropped_;
          LogOnceLocked("spill-device", "a spilled device tensor's results are missing");
          return false;
        }
        item->tensor.pending = std::move(it->second);
        spilled_device_.erase(it);
      }
    }
    item->cost = kItemOverhead + item->tensor.bytes.size();
    memory_bytes_ += item->cost;
    return true;
  }
  if (job_end_item_.has_value()) {
    *item = std::move(*job_end_item_);
    job_end_item_.reset();
    item->job_end.set_steps_dropped(steps_dropped_pending_);
    steps_dropped_pending_ = 0;
    return true;
  }
  return false;
}

void Sender::Run() {
  absl::Duration backoff = options_.reconnect_min;
  bool stop = false;
  while (!stop) {
    if (StreamOnce()) break;
    RemoveAckedSegments();
    {
      absl::MutexLock lock(&mu_);
      ++counters_.reconnects;
      // A stream that got as far as the hello ack starts the backoff afresh.
      if (stream_was_accepted_) backoff = options_.reconnect_min;
    }
    // While disconnected, what waits moves into the spool, out of memory.
    const absl::Time until = absl::Now() + backoff;
    while (true) {
      const bool moved = DrainToSpool(false);
      absl::MutexLock lock(&mu_);
      (void)moved;
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return give_up_ || (spooling_ && !spool_stuck_ && CanTakeLocked());
      };
      mu_.AwaitWithDeadline(absl::Condition(&wake), until);
      if (give_up_) {
        stop = true;
        break;
      }
      if (absl::Now() >= until) break;
    }
    backoff = std::min(backoff * 2, options_.reconnect_max);
  }
  bool refused;
  {
    absl::MutexLock lock(&mu_);
    refused = !refusal_.empty();
  }
  if (refused) {
    // Nothing of this client can be stored there: counted as lost below,
    // not kept to be refused again.
    absl::MutexLock spool_lock(&spool_mu_);
    if (spool_ != nullptr) spool_->RemoveAll();
    spool_bytes_.store(0);
    absl::MutexLock lock(&mu_);
    for (Unacked& u : unacked_) u.spool_index = 0;
    spooling_ = false;
  } else {
    // What is left goes to the spool, for `sonde sync` or the next hook.
    DrainToSpool(true);
  }
  RemoveAckedSegments();
  std::string spool_path;
  {
    absl::MutexLock spool_lock(&spool_mu_);
    if (spool_ != nullptr) spool_path = spool_->path();
    // Unlocked (and removed when empty): `sonde sync` and later hooks may
    // take what is left while this process lives on.
    spool_.reset();
  }
  {
    absl::MutexLock lock(&mu_);
    // Whatever was not stored nor spooled is lost now (the collector refused
    // the job, or Close gave up): counted, never silent.
    uint64_t tensors = 0, steps = 0, spooled_steps = 0;
    for (const Item& item : queue_) {
      tensors += item.kind == Item::kTensor;
      steps += item.kind == Item::kStepEnd;
    }
    for (const Unacked& u : unacked_) {
      const bool step = u.complete && !u.job_end && !u.profile_only;
      if (u.spool_index != 0) {
        spooled_steps += step;
        continue;
      }
      tensors += u.tensors;
      steps += step;
    }
    if (std::any_of(unacked_.begin(), unacked_.end(),
                    [](const Unacked& u) { return u.spool_index != 0; })) {
      counters_.steps_left_in_spool += spooled_steps;
      LOG(WARNING) << "sonde: " << spooled_steps << " steps the collector has not stored are kept "
                   << "in the spool " << spool_path << "; `sonde sync " << options_.spool_dir
                   << "` (or the next hook with the same spool) "
                   << "uploads them";
    }
    if (spill_ != nullptr) {
      steps += spill_->step_end_records();
      tensors += spill_->records() - spill_->step_end_records();
    }
    if (tensors + steps > 0) {
      counters_.tensors_dropped += tensors;
      counters_.steps_dropped += steps;
      LogOnceLocked("lost-at-end", absl::StrCat(tensors, " tensors in ", steps,
                                                " steps were never stored: the collector refused "
                                                "the job or did not acknowledge them in time"));
    }
    // Device tensors still waiting here are let go of (the hook, and its
    // capture, may live on after a refused job).
    for (Item& item : queue_) {
      if (item.tensor.pending != nullptr) lost_device_.push_back(std::move(item.tensor.pending));
    }
    queue_.clear();
    unacked_.clear();
    job_end_item_.reset();
    spill_.reset();
    spilled_records_.clear();
    spilled_ends_.clear();
    for (auto& [id, pending] : spilled_device_) lost_device_.push_back(std::move(pending));
    spilled_device_.clear();
    memory_bytes_ = 0;
    device_reserved_ = 0;
  }
  AbandonLostDevice();
  absl::MutexLock lock(&mu_);
  done_ = true;
}

void Sender::AbandonLostDevice() {
  std::vector<std::shared_ptr<PendingDeviceTensor>> lost;
  {
    absl::MutexLock lock(&mu_);
    lost.swap(lost_device_);
  }
  if (!options_.abandon_device) return;
  for (const auto& pending : lost) options_.abandon_device(pending);
}

Sender::Unacked* Sender::BuildAndAppend(Item& item, size_t* from) {
  std::vector<v1::ClientMessage> messages;
  const bool usable = BuildMessages(item, &messages);
  absl::MutexLock lock(&mu_);
  return AppendLocked(item, messages, usable, from);
}

void Sender::EnterBuiltStepLocked(int64_t step) {
  if (step == built_step_number_) return;
  if (!built_step_ended_) {
    // The step built before lost its end: it is a gap, counted where its
    // end was lost, and its drops go with it.
    built_tensors_dropped_ = 0;
    built_values_dropped_ = 0;
  }
  built_step_number_ = step;
  built_step_ended_ = false;
  built_step_values_ = 0;
  built_step_tensors_ = 0;
}

void Sender::DropEndlessEntryLocked(const char* why) {
  Unacked& open = unacked_.back();
  counters_.tensors_dropped += open.tensors;
  counters_.profile_batches_dropped += open.profile_batches;
  LogOnceLocked("endless-step",
                absl::StrCat(open.tensors, " tensors of step ", open.step, " dropped: ", why,
                             "; counted and reported to the collector"));
  if (open.partly_written) restart_stream_ = true;
  memory_bytes_ -= open.cost;
  unacked_.pop_back();
}

Sender::Unacked* Sender::AppendLocked(Item& item, std::vector<v1::ClientMessage>& messages,
                                      bool usable, size_t* from) {
  Unacked* entry = nullptr;
  memory_bytes_ -= item.cost;
  if (item.kind == Item::kTensor) {
    // Keep the buffer for the next copy, within a quarter of the queue's budget.
    std::string& bytes = item.tensor.bytes;
    if (bytes.capacity() > 0 && free_bytes_ + bytes.capacity() <= options_.max_queue_bytes / 4) {
      free_bytes_ += bytes.capacity();
      free_buffers_.push_back(std::move(bytes));
    }
  }
  if (!usable) return nullptr;
  if (item.kind == Item::kTensor || item.kind == Item::kStepEnd) {
    const int64_t step = item.kind == Item::kTensor ? item.tensor.step : item.step_end.step();
    // Steps before this one are behind the sender: their tensors are all
    // taken.
    endless_steps_.erase(std::remove_if(endless_steps_.begin(), endless_steps_.end(),
                                        [step](int64_t s) { return s < step; }),
                         endless_steps_.end());
    const bool endless = item.kind == Item::kTensor &&
                         std::find(endless_steps_.begin(), endless_steps_.end(), step) !=
                             endless_steps_.end();
    if (!unacked_.empty() && !unacked_.back().complete &&
        (endless || unacked_.back().step != step)) {
      // The open entry's step will never end (its end was lost): another
      // step's data behind it would be refused.
      DropEndlessEntryLocked(endless ? "its step end did not fit in the spill file"
                                     : "its step end was lost");
    }
    if (endless) {
      ++counters_.tensors_dropped;
      return nullptr;
    }
  }
  if (unacked_.empty() || unacked_.back().complete) {
    unacked_.emplace_back();
    unacked_.back().step = item.kind == Item::kTensor ? item.tensor.step : -1;
    if (item.kind == Item::kProfile) {
      // Between steps: an entry of its own, acknowledged on its own.
      // (Within a step it joins the step's entry and its ack.)
      unacked_.back().profile_only = true;
      unacked_.back().complete = true;
    }
  }
  entry = &unacked_.back();
  *from = entry->messages.size();
  if (item.kind == Item::kStepEnd) {
    // The step's tensors are the entry's summaries and first chunks,
    // whichever stream carried them.
    v1::StepEnd* end = messages[0].mutable_step_end();
    if (!built_step_ended_ && built_step_number_ != end->step()) {
      // The step built last lost its end, and no tensor of this step came
      // to say so (BuildMessages): its drops go with it, not with this end.
      built_tensors_dropped_ = 0;
      built_values_dropped_ = 0;
    }
    end->set_tensor_count(entry->tensors);
    end->set_tensors_dropped(end->tensors_dropped() + built_tensors_dropped_);
    end->set_values_dropped(end->values_dropped() + built_values_dropped_);
    built_tensors_dropped_ = 0;
    built_values_dropped_ = 0;
    built_step_ended_ = true;
    *end->mutable_counters() = WireCounters();
    entry->step = end->step();
    entry->complete = true;
  } else if (item.kind == Item::kJobEnd) {
    if (!entry->messages.empty()) {
      // Tensors saved after the last step end have no step end: they
      // cannot be stored, and are counted. (The hook always ends the step
      // first; the end of a step may have been lost on the way.)
      DropEndlessEntryLocked("no step end came before the job end");
      unacked_.emplace_back();
      entry = &unacked_.back();
      *from = 0;
    }
    *messages[0].mutable_job_end()->mutable_counters() = WireCounters();
    entry->job_end = true;
    entry->complete = true;
  }
  for (v1::ClientMessage& m : messages) {
    entry->cost += MessageCost(m);
    memory_bytes_ += MessageCost(m);
    entry->tensors += m.has_summary() || (m.has_chunk() && m.chunk().chunk_index() == 0);
    entry->profile_batches += m.has_profile();
    entry->messages.push_back(std::move(m));
  }
  return entry;
}

uint64_t Sender::SpoolEntry(Unacked* entry) {
  // Only this thread touches the messages of an entry not yet written (or
  // written and not acknowledged, whose end_seq was reset for a resend).
  const uint64_t index = ++next_spool_index_;
  absl::Status written;
  {
    absl::MutexLock spool_lock(&spool_mu_);
    if (spool_ == nullptr) return 0;
    written = spool_->Write(index, entry->messages);
    spool_bytes_.store(spool_->bytes());
  }
  absl::MutexLock lock(&mu_);
  spool_stuck_ = !written.ok();
  if (!written.ok()) {
    ++counters_.spool_refused;
    LogOnceLocked(absl::StrCat("spool:", written.code()),
                  absl::StrCat("not spooled: ", written.message(),
                               "; such steps are kept in memory only"));
    return 0;
  }
  entry->spool_index = index;
  ++counters_.entries_spooled;
  return index;
}

void Sender::EvictLocked(uint64_t spool_index) {
  for (Unacked& u : unacked_) {
    if (u.spool_index != spool_index) continue;
    if (!u.evicted) {
      memory_bytes_ -= u.cost;
      u.cost = 0;
      std::vector<v1::ClientMessage>().swap(u.messages);
      u.evicted = true;
    }
    return;
  }
}

void Sender::LoadEntry(Unacked* entry) {
  absl::StatusOr<std::vector<v1::ClientMessage>> messages =
      absl::NotFoundError("no spool");
  {
    absl::MutexLock spool_lock(&spool_mu_);
    if (spool_ != nullptr) messages = spool_->Read(entry->spool_index);
  }
  absl::MutexLock lock(&mu_);
  entry->evicted = false;
  if (!messages.ok()) {
    // Written as nothing: the next ack passes it. Its step is a gap the
    // next step end reports; its segment goes (it is counted here, not
    // left in the spool).
    const bool step = entry->complete && !entry->job_end && !entry->profile_only;
    counters_.tensors_dropped += entry->tensors;
    counters_.steps_dropped += step;
    steps_dropped_pending_ += step;
    entry->tensors = 0;
    acked_segments_.push_back(entry->spool_index);
    entry->spool_index = 0;
    LogOnceLocked("spool-read", absl::StrCat("a spooled step is lost: ",
                                             messages.status().message()));
    return;
  }
  entry->messages = std::move(*messages);
  for (v1::ClientMessage& m : entry->messages) {
    // The spool's copy predates the drops its end carried when written.
    if (m.has_step_end()) {
      m.mutable_step_end()->set_steps_dropped(m.step_end().steps_dropped() +
                                              entry->carried_steps_dropped);
    } else if (m.has_job_end()) {
      m.mutable_job_end()->set_steps_dropped(m.job_end().steps_dropped() +
                                             entry->carried_steps_dropped);
    }
    entry->cost += MessageCost(m);
  }
  memory_bytes_ += entry->cost;
}

bool Sender::DrainToSpool(bool all) {
  bool moved = false;
  while (true) {
    Item item;
    bool taken = false;
    {
      absl::MutexLock lock(&mu_);
      if (!spooling_) return moved;
      const bool can = all ? !queue_.empty() || spilling() || job_end_item_.has_value()
                           : !give_up_ && CanTakeLocked();
      if (!can) return moved;
      taken = TakeNextLocked(&item);
    }
    if (!taken) {
      AbandonLostDevice();
      continue;
    }
    size_t from = 0;
    Unacked* entry = BuildAndAppend(item, &from);
    moved = true;
    if (entry == nullptr || !entry->complete) continue;
    const uint64_t index = SpoolEntry(entry);
    if (index == 0) return moved;  // the spool is full or failing: the rest stays put
    absl::MutexLock lock(&mu_);
    EvictLocked(index);
  }
}

void Sender::RemoveAckedSegments() {
  std::vector<uint64_t> acked;
  {
    absl::MutexLock lock(&mu_);
    acked.swap(acked_segments_);
  }
  if (acked.empty()) return;
  {
    absl::MutexLock spool_lock(&spool_mu_);
    if (spool_ == nullptr) return;
    for (uint64_t index : acked) spool_->Remove(index);
    spool_bytes_.store(spool_->bytes());
  }
  absl::MutexLock lock(&mu_);
  spool_stuck_ = false;  // room again, perhaps
}

bool Sender::BuildMessages(Item& item, std::vector<v1::ClientMessage>* out) {
  v1::ClientMessage msg;
  switch (item.kind) {
    case Item::kTensor: {
      QueuedTensor& queued = item.tensor;
      if (queued.step != built_step_number_) {
        absl::MutexLock lock(&mu_);
        EnterBuiltStepLocked(queued.step);
      }
      absl::StatusOr<v1::Statistics> stats;
      std::optional<v1::Histogram> histogram;
      absl::string_view values = queued.bytes;
      v1::DType dtype = queued.dtype;
      bool send_values = queued.send_values;
      if (queued.pending != nullptr) {
        // A device tensor: statistics from the device, values (if wanted)
        // from its download.
        absl::Status ready = options_.await_device
                                 ? options_.await_device(queued.pending)
                                 : absl::FailedPreconditionError("no device capture");
        const PendingDeviceTensor& p = *queued.pending;
        // Past a timeout the pump may still write the pending: read nothing.
        const bool timed_out = ready.code() == absl::StatusCode::kDeadlineExceeded;
        const bool have_values = send_values && !timed_out && p.values_ok();
        {
          absl::MutexLock lock(&mu_);
          const uint64_t reserved = timed_out ? 0 : std::min(p.host_reserved, device_reserved_);
          device_reserved_ -= reserved;
          memory_bytes_ -= std::min(memory_bytes_, reserved);
          if (!ready.ok() && !have_values) {
            // Neither statistics nor values: the tensor is a gap.
            ++counters_.tensors_dropped;
            ++built_tensors_dropped_;
            LogOnceLocked(absl::StrCat("device-lost:", ready.code()),
                          absl::StrCat("device tensor '", queued.name, "' dropped: ",
                                       ready.ToString(), "; drops are counted and reported"));
            return false;
          }
          if (send_values && !have_values) {
            ++counters_.values_dropped;
            ++built_values_dropped_;
            LogOnceLocked(absl::StrCat("values-lost:", p.values_status.code()),
                          absl::StrCat("values of device tensor '", queued.name,
                                       "' dropped, statistics kept: ", p.values_status.ToString(),
                                       "; counted and reported to the collector"));
          }
        }
        send_values = have_values;
        if (send_values) {
          values = absl::string_view(p.values.get(), p.values_bytes);
          dtype = p.values_dtype;
        }
        if (ready.ok()) {
          stats = ToProto(p.stats);
          if (p.want_histogram) histogram = ToProto(p.histogram);
        } else {
          // The values arrived but their statistics did not: the collector
          // computes them from the values.
          stats = v1::Statistics();
        }
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
      if (tensor_count_limit_ > 0 && built_step_tensors_ >= tensor_count_limit_) {
        // The collector would refuse the step (and the stream with it).
        // (Checked here, once a device tensor's wait has released what it held.)
        absl::MutexLock lock(&mu_);
        ++counters_.tensors_dropped;
        ++built_tensors_dropped_;
        LogOnceLocked("tensors-over-limit",
                      absl::StrCat("tensor '", queued.name, "' of step ", queued.step,
                                   " dropped: the collector takes at most ", tensor_count_limit_,
                                   " tensors per step; counted and reported to the collector"));
        return false;
      }
      if (send_values) {
        // Values the collector would refuse (and end the stream, losing
        // the unacknowledged steps) go as statistics only, counted.
        std::string why;
        if (tensor_limit_ > 0 && values.size() > tensor_limit_) {
          why = absl::StrCat("its ", values.size(), " bytes pass the collector's limit of ",
                             tensor_limit_, " per tensor (--max_tensor_bytes)");
        } else if (step_limit_ > 0 && built_step_values_ + values.size() > step_limit_) {
          why = absl::StrCat("step ", queued.step, "'s values would pass the collector's limit of ",
                             step_limit_, " bytes per step (--max_step_bytes)");
        }
        if (why.empty()) {
          built_step_values_ += values.size();
        } else {
          if (queued.pending != nullptr && !queued.pending->status.ok()) {
            // The device's statistics failed: take them from the values.
            stats = ComputeStatistics(values, dtype);
          }
          send_values = false;
          if (queued.pending != nullptr) queued.pending->values.reset();
          absl::MutexLock lock(&mu_);
          ++counters_.values_dropped;
          ++built_values_dropped_;
          LogOnceLocked("values-over-limit",
                        absl::StrCat("values of tensor '", queued.name, "' not sent, statistics "
                                     "kept: ", why, "; counted and reported to the collector"));
        }
      }
      const bool computed_by_collector =
          queued.pending != nullptr && send_values && !queued.pending->status.ok();
      const QueuedTensor& t = queued;
      if (!stats.ok()) {
        absl::MutexLock lock(&mu_);
        ++counters_.tensors_dropped;
        ++built_tensors_dropped_;  // a gap in its step, as every drop
        LogOnceLocked("bad-tensor", absl::StrCat("tensor '", t.name, "' dropped: ",
                                                 stats.status().ToString(),
                                                 "; counted and reported to the collector"));
        return false;
      }
      if (!send_values) {
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
        out->push_back(std::move(msg));
      } else {
        v1::TensorChunk header;
        header.set_step(t.step);
        header.set_mode(t.mode);
        header.set_mode_step(t.mode_step);
        header.set_tensor_name(t.name);
        for (const auto& c : t.collections) header.add_collections(c);
        header.set_dtype(dtype);
        for (int64_t d : t.shape) header.add_shape(d);
        if (!computed_by_collector) *header.mutable_statistics() = *stats;
        if (histogram.has_value()) *header.mutable_histogram() = std::move(*histogram);
        for (v1::TensorChunk& chunk : SplitIntoChunks(header, values, chunk_limit_)) {
          msg.Clear();
          *msg.mutable_chunk() = std::move(chunk);
          out->push_back(std::move(msg));
        }
        if (queued.pending != nullptr) queued.pending->values.reset();  // now in the messages
      }
      ++built_step_tensors_;
      return true;
    }
    case Item::kStepEnd:
      built_step_values_ = 0;
      built_step_tensors_ = 0;
      *msg.mutable_step_end() = item.step_end;
      out->push_back(std::move(msg));
      return true;
    case Item::kJobEnd:
      *msg.mutable_job_end() = item.job_end;
      out->push_back(std::move(msg));
      return true;
    case Item::kProfile:
      *msg.mutable_profile() = std::move(item.profile);
      out->push_back(std::move(msg));
      return true;
  }
  return false;
}

bool Sender::WriteEntry(Stream* stream, Unacked* entry, size_t from) {
  // Only this thread touches the messages of an entry whose end_seq is 0;
  // the reader pops an entry only once end_seq is set.
  for (size_t i = from; i < entry->messages.size(); ++i) {
    v1::ClientMessage& m = entry->messages[i];
    if (m.has_step_end() || m.has_job_end()) {
      // The counters as they are now (built earlier, perhaps while
      // disconnected or on an earlier stream), and the steps dropped
      // since it was built (a spooled step that could not be read back).
      absl::MutexLock lock(&mu_);
      if (m.has_step_end()) {
        v1::StepEnd* end = m.mutable_step_end();
        *end->mutable_counters() = WireCounters();
        // A step end written before may be stored already when the hello
        // vouched for nothing (resume step -1: another or no client id);
        // the collector then acknowledges the resend as a duplicate and
        // ignores its count, so new drops wait for the next step end or the
        // job end. With a resume step, what was not dropped as stored is
        // not stored: the resend carries them.
        if (!entry->written || resume_step_ >= 0) {
          end->set_steps_dropped(end->steps_dropped() + steps_dropped_pending_);
          entry->carried_steps_dropped += steps_dropped_pending_;
          steps_dropped_pending_ = 0;
        }
      } else {
        // The job end is the last message: what is pending goes with it.
        // (A resent job end the collector stored already is ignored, its
        // count with it: the same race as above, with nothing after it.)
        v1::JobEnd* end = m.mutable_job_end();
        *end->mutable_counters() = WireCounters();
        end->set_steps_dropped(end->steps_dropped() + steps_dropped_pending_);
        entry->carried_steps_dropped += steps_dropped_pending_;
        steps_dropped_pending_ = 0;
      }
    }
    m.set_seq(++seq_);
    if (!stream->Write(m)) return false;
  }
  absl::MutexLock lock(&mu_);
  counters_.messages_sent = seq_;
  if (entry->complete) {
    entry->end_seq = seq_;
    entry->written = true;
    PopAckedLocked();  // its ack may already have come
  } else if (from < entry->messages.size()) {
    entry->partly_written = true;
  }
  return true;
}

void Sender::DropStoredLocked() {
  // Profile-only entries before a stored step went out before it on the
  // old stream, which the collector reads in order: they are stored too.
  size_t stored = 0;
  for (size_t i = 0; i < unacked_.size(); ++i) {
    const Unacked& u = unacked_[i];
    if (!u.written || u.job_end) break;
    if (!u.profile_only) {
      if (u.step > resume_step_) break;
      stored = i + 1;
    }
  }
  for (size_t i = 0; i < stored; ++i) {
    memory_bytes_ -= unacked_.front().cost;
    if (unacked_.front().spool_index != 0) {
      acked_segments_.push_back(unacked_.front().spool_index);
    }
    unacked_.pop_front();
  }
}

void Sender::ReadServerMessages(Stream* stream) {
  v1::ServerMessage in;
  while (stream->Read(&in)) {
    switch (in.kind_case()) {
      case v1::ServerMessage::kHelloAck:
        if (options_.on_hello_ack) options_.on_hello_ack(in.hello_ack());
        {
          absl::MutexLock lock(&mu_);
          server_chunk_limit_ = in.hello_ack().max_chunk_bytes();
          server_tensor_limit_ = in.hello_ack().max_tensor_bytes();
          server_step_limit_ = in.hello_ack().max_step_bytes();
          server_tensor_count_limit_ = in.hello_ack().max_tensors_per_step();
          resume_step_ = in.hello_ack().resume_step();
          connected_ = true;
        }
        break;
      case v1::ServerMessage::kAck: {
        absl::MutexLock lock(&mu_);
        stream_acked_seq_ = std::max(stream_acked_seq_, in.ack().acked_seq());
        counters_.last_acked_seq = stream_acked_seq_;
        // Steps' acks carry their mode; the job end's and profiler
        // batches' do not.
        if (in.ack().mode() != v1::MODE_UNSPECIFIED) {
          ++(in.ack().duplicate() ? counters_.duplicates_acked : counters_.steps_acked);
        }
        PopAckedLocked();
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
    if (in.has_ack()) RemoveAckedSegments();
  }
  absl::MutexLock lock(&mu_);  // wakes the writer's Await
  broken_ = true;
  connected_ = false;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> Sender::MakeStreamChannel() const {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(static_cast<int>(options_.max_chunk_bytes) + kMessageOverhead);
  args.SetMaxReceiveMessageSize(kMessageOverhead);
  // A channel of its own for every attempt, with gRPC's reconnect backoff
  // kept under ours: otherwise subchannels shared across channels remember
  // failures and back off for up to two minutes after a collector restart.
  // (GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is left alone: it is also the
  // shortest connect timeout, and 100 ms failed handshakes on a busy host.)
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options_.reconnect_min)));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options_.reconnect_max)));
  return MakeChannel(options_.collector, options_.security, args);
}

bool Sender::Resend(Stream* stream, const std::vector<Unacked*>& entries) {
  for (Unacked* u : entries) {
    // Resending does not end an entry's wait in the spool: read back, it
    // goes out and leaves memory again.
    const bool evicted = u->evicted;
    const uint64_t index = u->spool_index;  // once written, `u` may be acked and gone
    if (evicted) LoadEntry(u);
    {
      // Counted first, so the step ends written now report them.
      absl::MutexLock lock(&mu_);
      counters_.messages_resent += u->messages.size();
    }
    const bool ok = WriteEntry(stream, u, 0);
    if (evicted) {
      absl::MutexLock lock(&mu_);
      EvictLocked(index);
    }
    if (!ok) return false;
  }
  return true;
}

bool Sender::SendQueued(Stream* stream) {
  while (true) {
    Item item;
    bool taken = false;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return CanTakeLocked() || give_up_ || broken_ || (job_end_acked_ && unacked_.empty());
      };
      mu_.Await(absl::Condition(&ready));
      if (job_end_acked_ && unacked_.empty()) return true;
      if (give_up_ || broken_) return false;
      taken = TakeNextLocked(&item);
    }
    if (!taken) {
      AbandonLostDevice();
      continue;
    }
    size_t from = 0;
    Unacked* entry = BuildAndAppend(item, &from);
    if (restart_stream_) {
      // What it built stays unacknowledged and goes on the next stream
      // (spooled first if it is complete, as every complete entry).
      restart_stream_ = false;
      if (entry != nullptr && entry->complete) SpoolEntry(entry);
      return false;
    }
    if (entry == nullptr) continue;
    const uint64_t spooled = entry->complete ? SpoolEntry(entry) : 0;
    const bool ok = WriteEntry(stream, entry, from);
    if (spooled != 0) {
      // Written and on disk: past half the memory budget its messages wait
      // for their ack in the spool only.
      absl::MutexLock lock(&mu_);
      if (memory_bytes_ > options_.max_queue_bytes / 2) EvictLocked(spooled);
    }
    if (!ok) return false;
  }
}

bool Sender::AfterStream(const grpc::Status& status, bool hello_acked) {
  if (!status.ok() && status.error_code() != grpc::StatusCode::CANCELLED) {
    LogOnce(absl::StrCat("stream:", status.error_code()),
            absl::StrCat("stream to collector ", options_.collector, " failed: ",
                         status.error_message(), " (code ", status.error_code(), ")"));
    if (hello_acked && Permanent(status.error_code())) {
      // The collector refused what was sent (a bug or a mismatch, not the
      // network): sending it again would be refused again. Drop what is
      // unacknowledged, counted, and go on with what is queued.
      absl::MutexLock lock(&mu_);
      std::deque<Unacked> kept;
      for (Unacked& u : unacked_) {
        if (u.job_end && !job_end_refused_) {
          // The refusal was of a step before it, most likely: the job end
          // goes again once (with the drops in its counters), or the job
          // would never end at the collector and Close would wait in vain.
          job_end_refused_ = true;
          kept.push_back(std::move(u));
          continue;
        }
        if (u.job_end) {
          // Refused again: it is the job end itself the collector will not
          // take. Nothing is left to send; Close says why at once.
          refusal_ = absl::StrCat("the collector refused the end of job '", options_.hello.job(),
                                  "' twice: ", status.error_message(), " (code ",
                                  status.error_code(), ")");
          give_up_ = true;
        }
        counters_.tensors_dropped += u.tensors;
        if (!u.complete) {
          // The open step's tensors sent so far: the collector let go of
          // them with the stream. The rest of the step goes on a new
          // stream, its end counting these as a gap; its limits start
          // afresh there.
          built_tensors_dropped_ += u.tensors;
          built_step_values_ = 0;
          built_step_tensors_ = 0;
        }
        const bool step = u.complete && !u.job_end && !u.profile_only;
        counters_.steps_dropped += step;
        steps_dropped_pending_ += step;
        memory_bytes_ -= u.cost;
        // Sent again later it would be refused again.
        if (u.spool_index != 0) acked_segments_.push_back(u.spool_index);
      }
      unacked_ = std::move(kept);
      LogOnceLocked(absl::StrCat("refused:", status.error_code()),
                    absl::StrCat("the collector refused data (", status.error_message(),
                                 "); the unacknowledged steps are dropped and counted"));
    }
    if (!hello_acked && Permanent(status.error_code())) {
      absl::MutexLock lock(&mu_);
      if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION && queue_.empty() &&
          !spilling() && unacked_.size() == 1 && unacked_.front().job_end) {
        // The job end was stored but its ack was lost: the collector now
        // says the job has finished.
        job_end_acked_ = true;
        unacked_.clear();
        return true;
      }
      refusal_ = absl::StrCat("the collector refused job '", options_.hello.job(), "': ",
                              status.error_message(), " (code ", status.error_code(), ")");
      LogOnceLocked("disabled", absl::StrCat(refusal_, "; Sonde is disabled for this run"));
      give_up_ = true;
      return true;
    }
  }
  absl::MutexLock lock(&mu_);
  return give_up_;
}

bool Sender::StreamOnce() {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> made = MakeStreamChannel();
  if (!made.ok()) {
    LogOnce("channel", absl::StrCat("cannot connect to collector ", options_.collector, ": ",
                                    made.status().message()));
    return false;
  }
  auto channel = std::move(*made);
  auto stub = v1::Collector::NewStub(channel);
  grpc::ClientContext context;
  {
    absl::MutexLock lock(&mu_);
    if (give_up_) return true;
    active_context_ = &context;
    // Acks count messages of this stream only.
    counters_.messages_sent = 0;
    counters_.last_acked_seq = 0;
    stream_acked_seq_ = 0;
    connected_ = false;
    broken_ = false;
    stream_was_accepted_ = false;
    for (Unacked& u : unacked_) {
      u.end_seq = 0;
      u.partly_written = false;
    }
  }
  restart_stream_ = false;
  auto stream = stub->Stream(&context);
  seq_ = 0;
  chunk_limit_ = options_.max_chunk_bytes;

  std::thread reader([this, &stream] { ReadServerMessages(stream.get()); });

  v1::ClientMessage hello;
  *hello.mutable_hello() = options_.hello;
  hello.set_seq(++seq_);
  bool ok = stream->Write(hello);
  bool hello_acked = false;
  bool finished_job = false;
  std::vector<Unacked*> resend;
  if (ok) {
    // Wait for the hello ack: it says which steps are stored already.
    absl::MutexLock lock(&mu_);
    auto answered = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return connected_ || broken_ || give_up_;
    };
    mu_.Await(absl::Condition(&answered));
    hello_acked = connected_;
    stream_was_accepted_ = connected_;
    ok = connected_ && !give_up_;
    if (ok) {
      if (server_chunk_limit_ > 0) {
        chunk_limit_ = std::min<uint64_t>(chunk_limit_, server_chunk_limit_);
      }
      if (server_tensor_limit_ > 0) tensor_limit_ = server_tensor_limit_;
      if (server_step_limit_ > 0) step_limit_ = server_step_limit_;
      if (server_tensor_count_limit_ > 0) tensor_count_limit_ = server_tensor_count_limit_;
      DropStoredLocked();
      for (Unacked& u : unacked_) resend.push_back(&u);
    }
  }
  if (ok) ok = Resend(stream.get(), resend);
  if (ok) finished_job = SendQueued(stream.get());
  if (finished_job) stream->WritesDone();
  {
    absl::MutexLock lock(&mu_);
    // Cancel only a call that is still open (to end the reader): cancelling
    // one the collector already ended would replace its status (say, the
    // refusal of a hello) with CANCELLED.
    if (give_up_ || (!finished_job && !broken_)) context.TryCancel();
  }
  reader.join();
  grpc::Status status = stream->Finish();
  {
    absl::MutexLock lock(&mu_);
    active_context_ = nullptr;
    connected_ = false;
  }
  if (finished_job) return true;
  return AfterStream(status, hello_acked);
}

}  // namespace sonde
