// Sonde's client hook: the object training code talks to. Modeled on
// smdebug's Hook: collections, a save config, reductions, modes with global
// and per-mode step counters, save_scalar, close(), and a stop flag that a
// rule's StopTraining action sets.
//
//   auto hook = sonde::Hook::Create(options);          // or CreateFromJsonFile
//   hook->SetMode(sonde::v1::MODE_TRAIN);
//   for (...) {
//     hook->StartStep();
//     hook->SaveTensor("fc1.weight", sonde::HostTensor(w, {64, 32}), {"weights"});
//     hook->SaveScalar("loss", loss, {"losses"});
//     if (hook->should_stop()) break;
//   }
//   hook->Close();
//
// The training thread never waits for the network: SaveTensor copies the
// values into a bounded queue that a background thread streams to the
// collector. Failures inside Sonde are logged once and contained; the
// methods return a status for callers that care, and never throw.
// Thread-safe, though a training loop normally uses it from one thread.
#ifndef SONDE_CLIENT_HOOK_H_
#define SONDE_CLIENT_HOOK_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/backpressure.h"
#include "client/collections.h"
#include "client/hook_profiler.h"
#include "cuda/device_stats.h"
#include "math/histogram_math.h"
#include "client/save_config.h"
#include "client/spool/spool.h"
#include "client/tensor_view.h"
#include "common/channel.h"
#include "proto/collector.pb.h"
#include "proto/rule.pb.h"

namespace sonde {

class DeviceCapture;
class Sender;
class SpillBudget;
struct PendingDeviceTensor;

struct HookOptions {
  // Collector address, host:port. Default: a collector on this machine.
  std::string collector = "127.0.0.1:7070";
  // TLS (CA to trust, client certificate) and bearer token for a collector
  // that asks for them (common/channel.h). Default: plaintext, no token.
  ChannelSecurity security;
  // Job name: [A-Za-z0-9._-]{1,128}. Required.
  std::string job;
  // This process's rank and the number of training processes.
  int32_t worker = 0;
  int32_t world_size = 1;
  // Free-form run metadata stored with the job (hyperparameters, ...).
  std::map<std::string, std::string> metadata;
  // Rules to run for this job in addition to the collector's defaults.
  std::vector<v1::RuleSpec> rules;
  // What to save and when (smdebug's hook parameters).
  HookConfig config;
  // Bytes of copied tensor values held in memory, waiting to be sent or
  // acknowledged (everything stays until the collector has stored it, and
  // is resent after a broken stream). Beyond it `backpressure` decides.
  // Default 256 MiB.
  uint64_t max_queue_bytes = 256 << 20;
  // When the queue is full: spill values to a local file and catch up later
  // (default), drop (counted, and stored by the collector as gaps), or block
  // the save for at most max_block, then drop.
  BackpressureOptions backpressure;
  // Largest chunk payload sent. Default 1 MiB.
  uint64_t max_chunk_bytes = 1 << 20;
  // How long Close() waits for the collector to acknowledge everything.
  // Default 30 s.
  absl::Duration close_timeout = absl::Seconds(30);
  // The durable spool (client/spool/spool.h): each step is also written
  // here until the collector acknowledges it, so that what is not stored
  // when the process ends (Close timing out, kill -9) stays on disk for
  // `sonde sync`. Default spool::DefaultDir() ($SONDE_SPOOL_DIR, else
  // $XDG_CACHE_HOME/sonde/spool, else ~/.cache/sonde/spool); empty: no spool.
  std::string spool_dir = spool::DefaultDir();
  // Most bytes this client's spool holds; past it steps are kept in memory
  // only (counted in spool_refused). Default 4 GiB.
  uint64_t max_spool_bytes = uint64_t{4} << 30;
  // At start, upload in the background the spools that earlier clients of
  // the same collector left in spool_dir (one pass). Default true.
  bool upload_left_spools = true;
  // Called once, on a background thread, when a rule asks to stop training.
  std::function<void(const v1::Action&)> on_stop;
  // Bins of the histograms sent for collections with save_histogram.
  // Default: sign-aware log2 bins, 4 per octave, 2^-32..2^32.
  HistogramSpecHD histogram = DefaultExponentialSpec();
  // Device tensors (cuda/device_stats.h): statistics batches in flight,
  // snapshot memory on the device for values waiting to be downloaded
  // (default: an eighth of the free device memory, at most 4 GiB), and the
  // pinned ring they are downloaded through. When batch slots or snapshot
  // memory run out, `backpressure` decides as for host tensors: drop at
  // once, or (block, spill) wait up to max_block for the device to finish
  // work, then drop. Under spill, values the send queue has no room for
  // are also written to a second file in spill_dir (both files together
  // hold at most max_spill_bytes) once snapshot memory is half full or a save waits for
  // it, so device memory comes back; a value lost keeps its tensor's statistics, and every
  // loss is counted (Counters::tensors_dropped, values_dropped) and shown
  // by the collector (StepInfo). The device is the one of the first device
  // tensor saved (`device.device` is ignored); one hook captures one device.
  DeviceStatsOptions device;
  // The dtype F32 and F64 device values travel in (F16 or BF16 halves the
  // transfer of F32; converted on the device). Default: unchanged.
  v1::DType device_transfer_dtype = v1::DTYPE_UNSPECIFIED;
  // Longest the sender waits for one device tensor's results before
  // counting it dropped. Default 60 s.
  absl::Duration device_timeout = absl::Seconds(60);
  // The device engine; default DeviceStats::Create. Tests plug in
  // EmulatedDeviceStats to run the device path without a GPU.
  std::function<absl::StatusOr<std::unique_ptr<DeviceStats>>(const DeviceStatsOptions&)>
      device_factory;
  // The profiler: system metrics and framework timings streamed beside the
  // tensors (client/hook_profiler.h). Off by default.
  ProfilerOptions profiler;
};

// One tensor of a batch for Hook::SaveTensors.
struct NamedTensor {
  std::string name;
  TensorView tensor;
  std::vector<std::string> collections;
};

class Hook {
 public:
  // Validates the options and starts the background sender. Returns
  // InvalidArgument for bad options; never fails because the collector is
  // unreachable (that is logged, and the hook keeps trying).
  static absl::StatusOr<std::unique_ptr<Hook>> Create(HookOptions options);

  // Options from a SageMaker-style hook config JSON file (see
  // hook_config_json.h) on top of `base`: the file's HookParameters and
  // CollectionConfigurations replace base.config; its "collector" and
  // "job" parameters, when present, replace base's.
  static absl::StatusOr<std::unique_ptr<Hook>> CreateFromJsonFile(const std::string& path,
                                                                  HookOptions base);

  // The checks Create makes, without starting anything.
  static absl::Status Validate(const HookOptions& options);
  // `base` with a hook config JSON file applied, as CreateFromJsonFile does.
  static absl::StatusOr<HookOptions> ApplyJsonFile(const std::string& path, HookOptions base);

  ~Hook();  // Close() if not closed

  // Steps. StartStep ends the open step (if any) and begins the next: the
  // global step and the current mode's step both advance (the first step is
  // 0). SaveTensor before any StartStep starts step 0.
  void StartStep();
  // Ends the open step now (otherwise the next StartStep or Close does).
  // With HookOptions::device.defer_producer_wait, ending a step also makes
  // every stream its device tensors came on wait (on the device) for their
  // reads; so call EndStep before the next step writes them (zeroing
  // gradients, copying inputs), not only StartStep.
  void EndStep();
  // With device.defer_producer_wait: the streams of device tensors saved
  // since the last fence wait, on the device, for their reads now, as at a
  // step's end or at any save call on the stream (whatever it saves).
  // Call it before overwriting a saved tensor between save calls within a
  // step. The wait is on the saving stream only: other streams (NCCL, side
  // streams) that write the tensors must wait for that stream after this.
  // Nothing to do without deferral.
  void FenceDevice();
  // Changes mode (ending the open step); smdebug's set_mode.
  void SetMode(v1::Mode mode);

  v1::Mode mode() const;
  int64_t step() const;       // global step, -1 before the first
  int64_t mode_step() const;  // step of the current mode, -1 before its first

  // Would a tensor of this name (and these collections) be saved at the
  // current step? Lets callers skip preparing tensors that are not due.
  bool ShouldSave(const std::string& name, const std::vector<std::string>& collections = {});

  // Would anything be saved at the current (or, between steps, the next)
  // step? False lets framework hooks skip a step's tensors at the cost of
  // one call. Rules that ask for collections later can turn it true.
  bool StepMaySave();
  // The collections due at the current (or, between steps, the next) step,
  // and the collections a tensor name belongs to: framework hooks use them
  // to hook only what can be saved. collections_version() changes whenever
  // either answer may have changed for a name (AddToCollection,
  // IncludeCollection, a rule's collection request).
  std::vector<std::string> DueCollections();
  std::vector<std::vector<std::string>> CollectionsOf(const std::vector<std::string>& names);
  uint64_t collections_version() const;

  // Saves a tensor at the current step if its collections say so.
  // Host values are copied before returning. Device tensors are measured on
  // the device, asynchronously: the call only enqueues work ordered after
  // the tensor's stream and never synchronizes (see cuda/device_stats.h).
  // InvalidArgument for bad names, dtypes or shapes; Unavailable for a
  // device tensor where no GPU is usable (logged once); ResourceExhausted
  // when the device path's buffers are all in flight (the tensor is
  // dropped and counted, training goes on).
  absl::Status SaveTensor(const std::string& name, const TensorView& tensor,
                          const std::vector<std::string>& collections = {});
  // Saves many tensors at once: all device tensors of one device and stream
  // share statistics batches (two kernel launches each; one batch unless
  // the step overflows a batch slot's chunk table). Returns the
  // first error; the other tensors are still saved.
  absl::Status SaveTensors(const std::vector<NamedTensor>& tensors);
  // A scalar (float64, shape {}); collections default to "scalars".
  absl::Status SaveScalar(const std::string& name, double value,
                          const std::vector<std::string>& collections = {"scalars"});
  // Profiler data (proto/profile.proto: metric snapshots, trace events),
  // streamed in order with the tensors and stored by the collector as it
  // arrives. Never blocks; false when the batch was dropped (the queue is
  // full, the hook closed, or the batch passes 512 KiB: send larger ones in
  // parts), which is counted.
  bool SaveProfile(v1::ProfileBatch batch);

  // Framework timings for the profiler (no-ops while it is off): an event
  // of any kind with its times; the hook fills in the current mode and step
  // when they are unset (step < 0). An event the collector would refuse
  // (an empty span name, say) is dropped and logged once.
  void RecordEvent(v1::TraceEvent event);
  // A framework gauge for the profiler, sent with every system sample from
  // now on (e.g. "framework.dataloader_workers"). No-op while it is off.
  void SetProfilerGauge(const std::string& name, double value);
  // A named span from now until the returned object is destroyed (which
  // must happen before the hook's):
  //   { auto span = hook->Span("augment"); ... }
  class ScopedEvent {
   public:
    ScopedEvent(Hook* hook, v1::TraceEvent::Kind kind, std::string name);
    ~ScopedEvent();
    ScopedEvent(ScopedEvent&& other) noexcept;
    ScopedEvent(const ScopedEvent&) = delete;
    ScopedEvent& operator=(const ScopedEvent&) = delete;

   private:
    Hook* hook_;
    v1::TraceEvent event_;
  };
  ScopedEvent Span(std::string name) { return ScopedEvent(this, v1::TraceEvent::KIND_SPAN, std::move(name)); }
  // Time spent waiting for the next batch, until the object is destroyed.
  ScopedEvent DataWait() { return ScopedEvent(this, v1::TraceEvent::KIND_DATA_WAIT, ""); }

  // Puts a tensor name in a collection (smdebug's add_to_collection).
  void AddToCollection(const std::string& collection, const std::string& name);
  // Saves this collection from now on, as if in include_collections.
  void IncludeCollection(const std::string& collection);

  // Waits until the collector has accepted this process (and told it what
  // its rules need saved). Training never has to call this; it is for
  // programs that want their first step judged with the rules' collections.
  // DeadlineExceeded if not connected within `timeout`.
  absl::Status WaitUntilConnected(absl::Duration timeout);

  // Ends the open step and waits until everything saved so far is stored
  // (acknowledged by the collector). DeadlineExceeded after `timeout`.
  absl::Status Flush(absl::Duration timeout);

  // True once a rule's StopTraining action has reached this process.
  bool should_stop() const { return stop_.load(); }
  std::optional<v1::Action> stop_action() const;

  // Ends the open step and the job, and waits (up to close_timeout) until
  // the collector has stored everything. Idempotent.
  absl::Status Close();

  struct Counters {
    uint64_t tensors_saved = 0;    // queued for sending
    // Refused by the backpressure policy, past the collector's tensors per
    // step, refused by the collector with their step, or Sonde disabled.
    uint64_t tensors_dropped = 0;
    // Tensors stored with statistics only although their values were saved:
    // lost on the device path (snapshot memory full under the policy, a
    // device error) or past the collector's --max_tensor_bytes or
    // --max_step_bytes.
    uint64_t values_dropped = 0;
    // Whole steps: the queue at its item limit, or refused by the collector.
    uint64_t steps_dropped = 0;
    uint64_t tensors_spilled = 0;  // values written to the spill file
    uint64_t bytes_spilled = 0;
    uint64_t steps = 0;
    uint64_t messages_sent = 0;    // on the current stream
    uint64_t messages_resent = 0;  // after broken streams
    uint64_t last_acked_seq = 0;
    uint64_t steps_acked = 0;
    uint64_t duplicates_acked = 0;  // resent steps the collector already had
    uint64_t reconnects = 0;
    uint64_t memory_bytes = 0;     // held now (queued + unacknowledged)
    uint64_t profile_batches_queued = 0;
    uint64_t profile_batches_dropped = 0;  // the queue was full, the hook closing, or too big
    // The device path (zero until a device tensor is saved).
    uint64_t device_batches = 0;       // statistics batches enqueued
    uint64_t device_waits = 0;         // saves that waited for the device (slots, memory)
    absl::Duration device_waited;      // their total wait
    uint64_t device_snapshot_bytes_peak = 0;
    uint64_t device_bytes_downloaded = 0;
    // Under kSpill, values moved to the local disk while the host budget
    // was full, to free snapshot memory (sent later, like spilled tensors).
    uint64_t device_values_spilled = 0;
    uint64_t device_bytes_spilled = 0;
    // The training thread's time in the device capture's enqueues, of it
    // in the engine's calls and in handing tensors to the sender (the rest
    // of a save's time is the hook's own: deciding, validating, queuing).
    absl::Duration device_enqueue_time;
    absl::Duration device_engine_time;
    absl::Duration device_handover_time;
    // The durable spool.
    uint64_t entries_spooled = 0;      // steps (and job end, profiler batches) written
    uint64_t spool_refused = 0;        // not written: the spool was full or failing
    uint64_t spool_bytes = 0;          // on disk now
    uint64_t steps_left_in_spool = 0;  // at the end: kept for `sonde sync`
    uint64_t left_spools_uploaded = 0; // earlier clients' spools uploaded at start
    uint64_t left_steps_uploaded = 0;  // their steps stored (duplicates excluded)
  };
  Counters counters() const;

 private:
  Hook(HookOptions options, CollectionSet collections);
  void EndStepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FenceDeviceLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FenceStreamLocked(void* stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LogFenceLocked(const absl::Status& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyHelloAck(const v1::HelloAck& ack);
  void StartStepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t CurrentOrNextModeStepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LogOnce(const std::string& key, const std::string& message);
  // Validation shared by host and device tensors; the tensor's byte count.
  absl::StatusOr<uint64_t> CheckTensor(const std::string& name, const TensorView& tensor);
  absl::Status SaveDeviceTensors(const std::vector<const NamedTensor*>& tensors);
  absl::Status SaveDeviceTensorsLocked(const std::vector<const NamedTensor*>& tensors,
                                       std::string* log_key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AwaitDevice(const std::shared_ptr<PendingDeviceTensor>& pending);
  std::shared_ptr<DeviceCapture> Capture() const ABSL_LOCKS_EXCLUDED(capture_mu_);
  // Counts a second save of `name` in the open step as dropped; the error.
  absl::Status SavedTwice(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A tensor refused as invalid is counted as dropped if it was due this
  // step, so the step shows the gap (the caller gets the reason).
  void RecordRefusedLocked(const std::string& name, const std::vector<std::string>& collections,
                           const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The background upload of spools left by earlier clients.
  void UploadLeftSpools();

  const HookOptions options_;
  // max_spill_bytes, shared by the sender's spill file and device values'.
  const std::shared_ptr<SpillBudget> spill_budget_;
  std::unique_ptr<Sender> sender_;
  std::atomic<bool> closing_uploads_{false};
  std::atomic<uint64_t> left_spools_uploaded_{0};
  std::atomic<uint64_t> left_steps_uploaded_{0};
  std::thread uploader_;
  std::atomic<bool> stop_{false};

  mutable absl::Mutex mu_;
  CollectionSet collections_ ABSL_GUARDED_BY(mu_);
  uint64_t collections_version_ ABSL_GUARDED_BY(mu_) = 0;
  v1::Mode mode_ ABSL_GUARDED_BY(mu_) = v1::MODE_GLOBAL;
  int64_t step_ ABSL_GUARDED_BY(mu_) = -1;
  std::map<v1::Mode, int64_t> mode_steps_ ABSL_GUARDED_BY(mu_);
  bool step_open_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time step_started_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t steps_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<v1::Action> stop_action_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> logged_ ABSL_GUARDED_BY(mu_);
  // Names saved in the open step: a second save of a name is refused (and
  // counted), so no tensor reaches the collector twice in a step.
  absl::flat_hash_set<std::string> step_names_ ABSL_GUARDED_BY(mu_);
  // SaveDeviceTensorsLocked's work lists, kept between calls: a step's few
  // hundred tensors would otherwise be fresh allocations, and fresh pages,
  // on every save.
  struct DeviceScratch;
  std::unique_ptr<DeviceScratch> device_scratch_ ABSL_GUARDED_BY(mu_);
  // The device path, created on the first device tensor (or its failure,
  // under mu_). The sender thread reads it without mu_: a save waiting for
  // device room holds mu_, and the room comes from the sender taking
  // earlier tensors.
  mutable absl::Mutex capture_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::shared_ptr<DeviceCapture> capture_ ABSL_GUARDED_BY(capture_mu_);
  absl::Status capture_status_ ABSL_GUARDED_BY(mu_);
  bool capture_tried_ ABSL_GUARDED_BY(mu_) = false;
  int capture_device_ ABSL_GUARDED_BY(mu_) = 0;  // the device of the first device tensor
  // The profiler; null while off.
  std::unique_ptr<HookProfiler> profiler_;
};

}  // namespace sonde

#endif  // SONDE_CLIENT_HOOK_H_
