// The hook's background half: a bounded queue and one thread that turns
// queued tensors into statistics and chunks and streams them to the
// collector over gRPC, plus a reader thread for acks and actions. The
// training thread only copies bytes into the queue; it never waits for the
// network (except under the "block" policy, for at most its limit).
//
// Nothing is lost silently. Every message stays in memory until the
// collector acknowledges its step as durably stored; on a broken stream the
// sender reconnects with backoff, learns from the hello ack which steps are
// stored, and resends the rest (the collector acknowledges a step it
// already has as a duplicate without storing it twice). Memory is bounded
// by max_queue_bytes (queued plus unacknowledged bytes); beyond it the
// backpressure policy decides: spill tensor values to a local file and
// send them later (default), drop them, or block for a while then drop.
// Drops are counted per step and reported on the step end, so the
// collector records them as gaps.
//
// With a spool directory (the default), every complete entry (a step's
// messages and its end, a profiler batch, the job end) is also written to a
// durable spool on local disk (client/spool/spool.h) and removed when
// acknowledged. While the collector is unreachable the sender keeps moving
// queued items into the spool and out of memory; when Close gives up, what
// is left goes to the spool too, for `sonde sync` or the next hook. A kill
// -9 loses only what had not reached the spool: the open step and items
// still in the memory queue or the spill file. Thread-safe. Internal to
// client/.
#ifndef SONDE_CLIENT_SENDER_H_
#define SONDE_CLIENT_SENDER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/backpressure.h"
#include "client/device_capture.h"
#include "client/queued_tensor.h"
#include "client/spill_budget.h"
#include "client/spill_file.h"
#include "client/spool/spool.h"
#include "common/channel.h"
#include "stats/histogram.h"
#include "proto/collector.grpc.pb.h"

namespace sonde {

struct SenderOptions {
  std::string collector;              // host:port
  ChannelSecurity security;           // TLS and token; default plaintext, none
  v1::Hello hello;                    // job, worker, world size, rules...
  // Bytes of tensor values held in memory: queued and sent-but-unacked.
  uint64_t max_queue_bytes = 256 << 20;
  uint64_t max_chunk_bytes = 1 << 20;    // payload per chunk (the collector may lower it)
  BackpressureOptions backpressure;
  // What the spill file may hold, shared with device values' spill file.
  // Null: a budget of its own of backpressure.max_spill_bytes.
  std::shared_ptr<SpillBudget> spill_budget;
  absl::Duration reconnect_min = absl::Milliseconds(100);
  absl::Duration reconnect_max = absl::Seconds(5);
  std::function<void(const v1::Action&)> on_action;  // called on the reader thread
  std::function<void(const v1::HelloAck&)> on_hello_ack;  // likewise, once per stream
  // The durable spool's directory (client/spool/spool.h). Empty: no spool.
  std::string spool_dir;
  // Most bytes the spool holds. Past it, entries are kept in memory only
  // (subject to max_queue_bytes and the backpressure policy), counted in
  // spool_refused.
  uint64_t max_spool_bytes = uint64_t{4} << 30;
  // Waits for a device tensor's results (set when the hook captures device
  // tensors); the sender thread calls it.
  std::function<absl::Status(const std::shared_ptr<PendingDeviceTensor>&)> await_device;
  // Lets go of a device tensor the sender will never wait for (its spilled
  // record did not read back, or the sender ended first): its snapshot on
  // the device, or its charge on this budget, is freed. Called without the
  // sender's lock held.
  std::function<void(const std::shared_ptr<PendingDeviceTensor>&)> abandon_device;
};

struct SenderCounters {
  uint64_t tensors_queued = 0;
  // Refused by the backpressure policy, past the collector's tensors per
  // step, refused by the collector with their step, or Sonde disabled.
  uint64_t tensors_dropped = 0;
  // Tensors sent with statistics only although their values were saved:
  // lost on the device path, or past the collector's byte limits.
  uint64_t values_dropped = 0;
  // Whole steps: the queue at its item limit, or refused by the collector.
  uint64_t steps_dropped = 0;
  uint64_t tensors_spilled = 0;
  uint64_t bytes_spilled = 0;
  // Device values the capture wrote to its own spill file (CountDeviceSpill).
  uint64_t device_values_spilled = 0;
  uint64_t device_bytes_spilled = 0;
  uint64_t messages_sent = 0;     // on the current stream, resends included
  uint64_t messages_resent = 0;   // since the start
  uint64_t last_acked_seq = 0;    // on the current stream
  uint64_t steps_acked = 0;       // stored by the collector (duplicates excluded)
  uint64_t duplicates_acked = 0;  // resent steps the collector already had
  uint64_t reconnects = 0;
  uint64_t memory_bytes = 0;      // queued + unacked, as counted against max_queue_bytes
  uint64_t spill_file_bytes = 0;  // current size of the spill file
  uint64_t profile_batches_queued = 0;
  uint64_t profile_batches_dropped = 0;  // no room in the queue, or closing
  uint64_t entries_spooled = 0;       // entries written to the durable spool
  uint64_t spool_refused = 0;         // complete entries the spool could not take
  uint64_t spool_bytes = 0;           // bytes in the spool now
  // At the end (Close gave up, or the job was refused): steps left in the
  // spool for `sonde sync`, not lost.
  uint64_t steps_left_in_spool = 0;
};

class Sender {
 public:
  explicit Sender(SenderOptions options);
  ~Sender();  // Close(absl::ZeroDuration()) if not closed

  // Never block on the network (kBlock: at most max_block). Returns false
  // when the tensor was dropped.
  bool EnqueueTensor(QueuedTensor tensor);
  // Several at once, under one lock and one wake-up of the sender thread
  // (the device path queues a step's tensors together), each moved from
  // where it points. The indices of the tensors dropped.
  std::vector<size_t> EnqueueTensors(absl::Span<QueuedTensor* const> tensors);
  // Tensors of the open step that the hook saved but could not queue (the
  // device path refused them): counted and reported as gaps like drops.
  void RecordDropped(const std::string& first_name, uint32_t count, const std::string& why);
  // Charges `bytes` of device values about to be downloaded to the memory
  // budget (max_queue_bytes): true if charged. `force` charges past it.
  // The sender gives them back when it takes the values.
  bool ReserveHost(uint64_t bytes, bool force);
  void ReleaseHost(uint64_t bytes);
  // The device capture wrote one tensor's values (`bytes`) to its spill
  // file: counted here so that step ends report it (ClientCounters).
  void CountDeviceSpill(uint64_t bytes);
  // Ends the open step; a step in which no tensor was enqueued (and none
  // dropped) is not sent, so the collector keeps no duration for it (the
  // profiler's step events time every step).
  void EnqueueStepEnd(int64_t step, v1::Mode mode, int64_t mode_step, double duration);
  // Profiler data, numbered (ProfileBatch.sequence). Never spilled: when
  // the queue is full the batch is dropped (counted). It goes out in queue
  // order, so while tensors are being spilled it may overtake them. The
  // collector stores it on arrival; it is acknowledged with the open step,
  // or at once between steps, and resent after a broken stream like
  // everything else.
  // A batch larger than kMaxProfileBatchBytes (serialized) is dropped.
  bool EnqueueProfile(v1::ProfileBatch batch);
  static constexpr size_t kMaxProfileBatchBytes = 512 << 10;

  // Sends the job end and waits up to `timeout` for the collector to
  // acknowledge everything. DeadlineExceeded if it did not.
  absl::Status Close(const std::string& reason, absl::Duration timeout);

  SenderCounters counters() const;

  // A buffer for a tensor's copy, recycled from tensors already sent when
  // one is free: its pages are already mapped, so copying into it costs a
  // memcpy, not page faults. Thread-safe.
  std::string AcquireBuffer(size_t bytes);

  // Waits until the collector has accepted the hello on the current stream.
  bool WaitForHelloAck(absl::Duration timeout);
  // Waits until everything queued so far has been written and acknowledged.
  bool WaitForAcks(absl::Duration timeout);

  // The spool's directory for this client; empty without a spool.
  std::string spool_path() const;

 private:
  struct Item {
    enum Kind { kTensor, kStepEnd, kJobEnd, kProfile } kind;
    QueuedTensor tensor;
    v1::StepEnd step_end;
    v1::JobEnd job_end;
    v1::ProfileBatch profile;
    uint64_t cost = 0;          // counted in memory_bytes_
  };
  // Messages written (or to be written) but not acknowledged: one entry per
  // step (its tensors, then its step end) or the job end.
  struct Unacked {
    int64_t step = -1;
    bool complete = false;  // ends with the step end (or is the job end)
    bool job_end = false;
    bool profile_only = false;  // a profiler batch sent between steps
    std::vector<v1::ClientMessage> messages;
    uint64_t cost = 0;
    uint64_t end_seq = 0;  // seq of its last message on this stream; 0: not (fully) written
    bool written = false;  // fully written on some stream: the collector may have stored it
    // Not complete, and some of its messages written on the current stream:
    // the collector holds its step open.
    bool partly_written = false;
    uint32_t tensors = 0;  // tensors among the messages (summaries and first chunks)
    uint32_t profile_batches = 0;  // profiler batches among them
    uint64_t spool_index = 0;  // its segment in the spool; 0: not spooled
    bool evicted = false;      // spooled, messages dropped from memory (read back to send)
    // Steps dropped since its end was built, added to its end when first
    // written (not in the spool's copy: added again when read back).
    uint64_t carried_steps_dropped = 0;
  };
  using Stream = grpc::ClientReaderWriter<v1::ClientMessage, v1::ServerMessage>;

  void Run();
  // Hands lost_device_ to abandon_device.
  void AbandonLostDevice() ABSL_LOCKS_EXCLUDED(mu_);
  // Streams until the stream fails or the job end is acked. Returns true
  // when done for good.
  bool StreamOnce();
  // The stream's reader thread: applies hello acks, acks, actions and
  // warnings as they come; marks the stream broken when it ends.
  void ReadServerMessages(Stream* stream);
  // StreamOnce's parts: the channel of one attempt; resending what the
  // collector has not acknowledged (false when the stream broke); sending
  // what is queued until the stream breaks (false) or the job end is
  // acknowledged (true); what a stream's end status means (true: stop).
  absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeStreamChannel() const;
  bool Resend(Stream* stream, const std::vector<Unacked*>& entries);
  bool SendQueued(Stream* stream);
  bool AfterStream(const grpc::Status& status, bool hello_acked);
  // After a hello ack: drops the unacknowledged steps the collector says it
  // stored before the last stream broke (their acks were lost); the rest is
  // sent again.
  void DropStoredLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Turns one queued item into wire messages (without seq). False: skip it.
  bool BuildMessages(Item& item, std::vector<v1::ClientMessage>* out);
  // Writes `entry`'s messages from `from` on, numbering them.
  bool WriteEntry(Stream* stream, Unacked* entry, size_t from);
  // Adds a built item's messages to the last entry (a new one when that is
  // complete), returning it and where its new messages begin; nullptr when
  // the item built nothing (`usable` false).
  Unacked* AppendLocked(Item& item, std::vector<v1::ClientMessage>& messages, bool usable,
                        size_t* from) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // BuildMessages (unlocked), then AppendLocked.
  Unacked* BuildAndAppend(Item& item, size_t* from) ABSL_LOCKS_EXCLUDED(mu_);
  // Writes a complete entry to the spool (sender thread, before the entry
  // is written to a stream, or while disconnected). False if not spooled.
  // Returns its segment index, 0 if not spooled.
  uint64_t SpoolEntry(Unacked* entry) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the messages of the spooled entry `spool_index` from memory.
  void EvictLocked(uint64_t spool_index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads an evicted entry's messages back; false (entry emptied, counted
  // as dropped) when its segment is damaged.
  void LoadEntry(Unacked* entry) ABSL_LOCKS_EXCLUDED(mu_);
  // While disconnected (or at the end, `all`): moves what can be taken
  // from the queue and the spill file into spooled entries, out of memory.
  // True if it moved anything.
  bool DrainToSpool(bool all) ABSL_LOCKS_EXCLUDED(mu_);
  // Removes the segments of entries acknowledged since the last call.
  void RemoveAckedSegments() ABSL_LOCKS_EXCLUDED(mu_);
  bool Admit(uint64_t cost) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool EnqueueTensorLocked(QueuedTensor tensor) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropLocked(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends to the spill file (creating it); false if it cannot.
  bool SpillLocked(const SpillRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool spilling() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return spill_ != nullptr && spill_->records() > 0;
  }
  // The next item to send, if one may be taken now: the memory queue, then
  // the spill file (when the unacked window has room), then the job end.
  bool TakeNextLocked(Item* item) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool CanTakeLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PopAckedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::ClientCounters WireCounters() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the incomplete entry at the back of unacked_ (its step's end
  // was lost), counted; ends the stream if some of it was written.
  void DropEndlessEntryLocked(const char* why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The sender is at `step`'s data (a tensor built, or one lost): the
  // per-step counts start afresh if it is another step than the last.
  void EnterBuiltStepLocked(int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LogOnce(const std::string& key, const std::string& message);
  void LogOnceLocked(const std::string& key, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SenderOptions options_;

  mutable absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  std::deque<Unacked> unacked_ ABSL_GUARDED_BY(mu_);
  uint64_t memory_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t stream_acked_seq_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t resume_step_ ABSL_GUARDED_BY(mu_) = -1;
  uint64_t server_chunk_limit_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t server_tensor_limit_ ABSL_GUARDED_BY(mu_) = 0;  // 0: not said
  uint64_t server_step_limit_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t server_tensor_count_limit_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t open_step_dropped_ ABSL_GUARDED_BY(mu_) = 0;   // tensors of the open step
  // Tensors of the open step that reached EnqueueTensor (sent, spilled or
  // dropped). A step with none is not sent at all.
  uint32_t open_step_tensors_ ABSL_GUARDED_BY(mu_) = 0;
  // Of those, the ones queued or spilled (on their way to the sender): a
  // step with any is never left without its step end.
  uint32_t open_step_queued_ ABSL_GUARDED_BY(mu_) = 0;
  // Steps whose end was lost (the spill file refused it) although some of
  // their tensors were queued or spilled: counted as dropped whole, and
  // their tensors are dropped as the sender reaches them, since the
  // collector refuses a step's data until the previous step has ended.
  std::vector<int64_t> endless_steps_ ABSL_GUARDED_BY(mu_);
  // The spilled step ends, oldest first: the gaps each carries
  // (StepEnd.steps_dropped) and whether its step had tensors, counted if
  // the record does not read back.
  struct SpilledEnd {
    uint64_t steps_dropped = 0;
    bool had_tensors = false;
  };
  std::deque<SpilledEnd> spilled_ends_ ABSL_GUARDED_BY(mu_);
  // Each spilled record's step (where its gap goes if it is lost) and, for
  // a device tensor, its device_id (what to let go of), oldest first.
  struct SpilledRecord {
    int64_t step = 0;
    uint64_t device_id = 0;
  };
  std::deque<SpilledRecord> spilled_records_ ABSL_GUARDED_BY(mu_);
  // Device tensors to let go of (abandon_device) once mu_ is released.
  std::vector<std::shared_ptr<PendingDeviceTensor>> lost_device_ ABSL_GUARDED_BY(mu_);
  uint64_t steps_dropped_pending_ ABSL_GUARDED_BY(mu_) = 0;  // not yet reported
  // Device tensors whose loss the sender thread found while building their
  // messages: added to the next step end it builds (the same step's).
  uint32_t built_tensors_dropped_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t built_values_dropped_ ABSL_GUARDED_BY(mu_) = 0;
  // Bytes of device values charged by ReserveHost and not yet taken.
  uint64_t device_reserved_ ABSL_GUARDED_BY(mu_) = 0;
  // Device tensors whose records are in the spill file, by device_id.
  std::map<uint64_t, std::shared_ptr<PendingDeviceTensor>> spilled_device_ ABSL_GUARDED_BY(mu_);
  uint64_t last_device_id_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t profile_sequence_ ABSL_GUARDED_BY(mu_) = 0;      // of the last batch queued
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;      // the sender thread has exited
  bool job_end_acked_ ABSL_GUARDED_BY(mu_) = false;
  bool give_up_ ABSL_GUARDED_BY(mu_) = false;   // Close timed out: stop retrying
  // A refused stream's job end was kept to be sent again (once only: if
  // the job end itself is what is refused, it is dropped the next time).
  bool job_end_refused_ ABSL_GUARDED_BY(mu_) = false;
  std::string refusal_ ABSL_GUARDED_BY(mu_);    // why the collector refused the job
  bool connected_ ABSL_GUARDED_BY(mu_) = false;  // hello acked on the current stream
  bool broken_ ABSL_GUARDED_BY(mu_) = false;     // the current stream's reader ended
  bool stream_was_accepted_ ABSL_GUARDED_BY(mu_) = false;  // the last stream got a hello ack
  SenderCounters counters_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> logged_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> free_buffers_ ABSL_GUARDED_BY(mu_);  // sent tensors' buffers
  uint64_t free_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // While the spill file holds records, every new item goes there too, so
  // the order of steps is kept: the memory queue is sent first, then the
  // spill file, oldest record first.
  std::unique_ptr<SpillFile> spill_ ABSL_GUARDED_BY(mu_);
  bool spill_failed_ ABSL_GUARDED_BY(mu_) = false;
  // The job end waits until the queue and the spill file are empty.
  std::optional<Item> job_end_item_ ABSL_GUARDED_BY(mu_);

  grpc::ClientContext* active_context_ ABSL_GUARDED_BY(mu_) = nullptr;

  // The durable spool. File work happens under spool_mu_, never under mu_
  // (training threads take mu_); the two are never held together.
  mutable absl::Mutex spool_mu_;
  std::unique_ptr<spool::Spool> spool_ ABSL_GUARDED_BY(spool_mu_);
  bool spooling_ ABSL_GUARDED_BY(mu_) = false;  // spool_ exists
  bool spool_stuck_ ABSL_GUARDED_BY(mu_) = false;  // the last write failed (full)
  // Segments of acknowledged entries, for RemoveAckedSegments.
  std::vector<uint64_t> acked_segments_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> spool_bytes_{0};
  uint64_t next_spool_index_ = 0;  // sender thread only

  // Used by the sender thread only.
  uint64_t seq_ = 0;
  uint64_t chunk_limit_ = 0;
  // The collector's limits on one step, and the values bytes and tensors
  // built into the current step so far. Until a hello ack says them (and
  // where an older collector's ack does not), the collector's defaults:
  // steps built while it was unreachable are then refused only where it
  // was configured below them (server/ingest_limits.h).
  uint64_t tensor_limit_ = uint64_t{1} << 30;
  uint64_t step_limit_ = uint64_t{2} << 30;
  uint32_t tensor_count_limit_ = 100000;
  uint64_t built_step_values_ = 0;
  uint32_t built_step_tensors_ = 0;
  // (Written by the sender thread only, sometimes under mu_:
  // EnterBuiltStepLocked.)
  int64_t built_step_number_ = -1;  // the step those count
  // Its step end was built. Where a step's tensors follow another step's
  // without that step's end, the end was lost: the step is a gap
  // (counted), and the drops counted for it go with it, not with the
  // next step's end.
  bool built_step_ended_ = true;
  // An open step whose end will never come was dropped after some of its
  // messages went out: the stream must end, so the collector lets go of it.
  bool restart_stream_ = false;

  std::thread thread_;
};

}  // namespace sonde

#endif  // SONDE_CLIENT_SENDER_H_
