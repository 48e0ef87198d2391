#include "client/hook.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/device_capture.h"
#include "client/hook_config_json.h"
#include "client/sender.h"
#include "client/spill_budget.h"
#include "client/spool/upload.h"
#include "common/dtype.h"
#include "common/names.h"
#include "common/version.h"
#include "glog/logging.h"

namespace sonde {
namespace {

constexpr char kClientVersion[] = "sonde-cpp/" SONDE_VERSION;

// Everything Create checks but the collections (Create builds them once).
absl::Status ValidateScalars(const HookOptions& options) {
  absl::Status s = ValidateJobName(options.job);
  if (!s.ok()) return s;
  if (options.world_size < 1 || options.worker < 0 || options.worker >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("worker ", options.worker,
                                                   " must be in [0, world_size ",
                                                   options.world_size, ")"));
  }
  if (options.collector.empty()) return absl::InvalidArgumentError("no collector address");
  if (options.max_chunk_bytes == 0) {
    return absl::InvalidArgumentError("max_chunk_bytes must be positive");
  }
  if (options.profiler.enabled) return HookProfiler::ValidateOptions(options.profiler);
  return absl::OkStatus();
}

}  // namespace

struct Hook::DeviceScratch {
  std::vector<DeviceCapture::Request> requests;
  std::vector<QueuedTensor> queued;
};

absl::Status Hook::Validate(const HookOptions& options) {
  absl::Status s = ValidateScalars(options);
  if (!s.ok()) return s;
  return CollectionSet::Create(options.config).status();
}

absl::StatusOr<std::unique_ptr<Hook>> Hook::Create(HookOptions options) {
  absl::Status s = ValidateScalars(options);
  if (!s.ok()) return s;
  auto collections = CollectionSet::Create(options.config);
  if (!collections.ok()) return collections.status();
  std::unique_ptr<Hook> hook(new Hook(std::move(options), std::move(*collections)));

  SenderOptions so;
  so.collector = hook->options_.collector;
  so.security = hook->options_.security;
  so.hello.set_job(hook->options_.job);
  so.hello.set_worker(hook->options_.worker);
  so.hello.set_world_size(hook->options_.world_size);
  so.hello.set_client_version(kClientVersion);
  for (const auto& [k, v] : hook->options_.metadata) (*so.hello.mutable_metadata())[k] = v;
  for (const auto& r : hook->options_.rules) *so.hello.add_rules() = r;
  so.max_queue_bytes = hook->options_.max_queue_bytes;
  so.backpressure = hook->options_.backpressure;
  so.spill_budget = hook->spill_budget_;
  so.max_chunk_bytes = hook->options_.max_chunk_bytes;
  so.spool_dir = hook->options_.spool_dir;
  so.max_spool_bytes = hook->options_.max_spool_bytes;
  Hook* raw = hook.get();
  so.on_action = [raw](const v1::Action& action) {
    if (action.type() != v1::ACTION_STOP_TRAINING) return;
    {
      absl::MutexLock lock(&raw->mu_);
      if (raw->stop_action_.has_value()) return;
      raw->stop_action_ = action;
    }
    LOG(WARNING) << "sonde: rule " << action.rule() << " asks to stop training: "
                 << action.reason();
    raw->stop_ = true;
    if (raw->options_.on_stop) raw->options_.on_stop(action);
  };
  so.on_hello_ack = [raw](const v1::HelloAck& ack) { raw->ApplyHelloAck(ack); };
  so.await_device = [raw](const std::shared_ptr<PendingDeviceTensor>& p) {
    return raw->AwaitDevice(p);
  };
  so.abandon_device = [raw](const std::shared_ptr<PendingDeviceTensor>& p) {
    if (std::shared_ptr<DeviceCapture> capture = raw->Capture()) capture->Abandon(p);
  };
  hook->sender_ = std::make_unique<Sender>(std::move(so));
  if (!hook->options_.spool_dir.empty() && hook->options_.upload_left_spools) {
    hook->uploader_ = std::thread([raw] { raw->UploadLeftSpools(); });
  }
  if (hook->options_.profiler.enabled) {
    auto profiler = HookProfiler::Start(
        hook->options_.profiler, [raw](v1::ProfileBatch batch) { raw->SaveProfile(std::move(batch)); });
    if (profiler.ok()) {
      hook->profiler_ = std::move(*profiler);
    } else {
      LOG(WARNING) << "sonde: the profiler did not start: " << profiler.status();
    }
  }
  return hook;
}

absl::StatusOr<std::unique_ptr<Hook>> Hook::CreateFromJsonFile(const std::string& path,
                                                               HookOptions base) {
  absl::StatusOr<HookOptions> options = ApplyJsonFile(path, std::move(base));
  if (!options.ok()) return options.status();
  return Create(std::move(*options));
}

absl::StatusOr<HookOptions> Hook::ApplyJsonFile(const std::string& path, HookOptions base) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read hook config '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  auto parsed = ParseHookConfigJson(text.str());
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", parsed.status().message()));
  }
  base.config = parsed->config;
  auto c = parsed->sonde_parameters.find("collector");
  if (c != parsed->sonde_parameters.end()) base.collector = c->second;
  auto j = parsed->sonde_parameters.find("job");
  if (j != parsed->sonde_parameters.end()) base.job = j->second;
  // SageMaker writes it when a TensorBoardOutputConfig is given: the
  // collector writes this job's event files (docs/tensorboard.md).
  auto tb = parsed->sonde_parameters.find("export_tensorboard");
  if (tb != parsed->sonde_parameters.end() && tb->second == "true") {
    base.metadata.emplace("sonde.tensorboard", "on");  // an explicit value stays
  }
  return base;
}

Hook::Hook(HookOptions options, CollectionSet collections)
    : options_(std::move(options)),
      spill_budget_(std::make_shared<SpillBudget>(options_.backpressure.max_spill_bytes)),
      collections_(std::move(collections)) {}

Hook::~Hook() {
  Close().IgnoreError();
  closing_uploads_ = true;
  if (uploader_.joinable()) uploader_.join();
}

void Hook::UploadLeftSpools() {
  const std::string own = sender_->spool_path();
  for (const spool::LeftSpool& left : spool::FindLeft(options_.spool_dir)) {
    if (closing_uploads_) return;
    if (left.path == own || left.collector != options_.collector) continue;
    spool::UploadOptions uo;
    uo.collector = options_.collector;
    uo.security = options_.security;
    uo.cancel = &closing_uploads_;
    spool::UploadResult result;
    absl::Status s = spool::Upload(left, uo, &result);
    if (s.ok()) {
      ++left_spools_uploaded_;
      left_steps_uploaded_ += result.steps_stored;
      LOG(INFO) << "sonde: uploaded the spool an earlier client left (job '" << left.hello.job()
                << "', worker " << left.hello.worker() << "): " << result.steps_stored
                << " steps stored, " << result.steps_duplicate << " already there";
    } else if (absl::IsDataLoss(s)) {
      // What could be read was stored; the damaged rest stays for a person.
      left_steps_uploaded_ += result.steps_stored;
      LOG(WARNING) << "sonde: the spool an earlier client left (job '" << left.hello.job()
                   << "'): " << result.steps_stored << " steps stored; " << s.message();
    } else if (!absl::IsCancelled(s)) {
      LOG(WARNING) << "sonde: the spool " << left.path << " an earlier client left was not "
                   << "uploaded: " << s.message() << " (`sonde sync "
                   << options_.spool_dir << "` retries)";
    }
  }
}

void Hook::LogOnce(const std::string& key, const std::string& message) {
  {
    absl::MutexLock lock(&mu_);
    if (std::find(logged_.begin(), logged_.end(), key) != logged_.end()) return;
    logged_.push_back(key);
  }
  LOG(WARNING) << "sonde: " << message << " (logged once)";
}

void Hook::ApplyHelloAck(const v1::HelloAck& ack) {
  for (const v1::CollectionRequest& request : ack.collections()) {
    absl::Status s;
    {
      absl::MutexLock lock(&mu_);
      s = collections_.Require(request);
      ++collections_version_;
    }
    if (!s.ok()) {
      LogOnce(absl::StrCat("request:", request.name()),
              absl::StrCat("rule ", request.rule(), " asked for collection '", request.name(),
                           "': ", s.message()));
    } else {
      VLOG(1) << "sonde: rule " << request.rule() << " needs collection '" << request.name()
              << "'" << (request.values() ? " with values" : "");
    }
  }
}

void Hook::StartStepLocked() {
  EndStepLocked();
  ++step_;
  step_names_.clear();
  auto [it, fresh] = mode_steps_.emplace(mode_, 0);
  if (!fresh) ++it->second;
  step_open_ = true;
  step_started_ = absl::Now();
  // Only the first step ends the initialisation: no profiler call on the others.
  if (profiler_ != nullptr && step_ == 0) profiler_->RecordInit(step_started_, mode_);
}

void Hook::FenceDevice() {
  absl::MutexLock lock(&mu_);
  FenceDeviceLocked();
}

// The capture knows which streams have unfenced reads; the hook only says
// when to fence, and logs a failure once.
void Hook::FenceDeviceLocked() {
  if (!options_.device.defer_producer_wait) return;
  std::shared_ptr<DeviceCapture> capture = Capture();
  if (capture != nullptr) LogFenceLocked(capture->FenceAll());
}

void Hook::FenceStreamLocked(void* stream) {
  if (!options_.device.defer_producer_wait) return;
  std::shared_ptr<DeviceCapture> capture = Capture();
  if (capture != nullptr) LogFenceLocked(capture->Fence(stream));
}

void Hook::LogFenceLocked(const absl::Status& s) {
  if (absl::IsFailedPrecondition(s)) return;  // a CUDA graph capture: fenced later
  if (!s.ok() && std::find(logged_.begin(), logged_.end(), "device-fence") == logged_.end()) {
    logged_.push_back("device-fence");
    LOG(WARNING) << "sonde: cannot order the training stream after the deferred device "
                 << "reads (" << s.message() << "); the hook waited for the device instead "
                 << "(logged once)";
  }
}

void Hook::EndStepLocked() {
  FenceDeviceLocked();  // before the early return: saves between steps too
  if (!step_open_) return;
  step_open_ = false;
  ++steps_;
  const absl::Time now = absl::Now();
  sender_->EnqueueStepEnd(step_, mode_, mode_steps_[mode_],
                          absl::ToDoubleSeconds(now - step_started_));
  if (profiler_ != nullptr) {
    v1::TraceEvent e;
    e.set_kind(v1::TraceEvent::KIND_STEP);
    e.set_mode(mode_);
    e.set_step(step_);
    e.set_mode_step(mode_steps_[mode_]);
    e.set_start_unix_micros(absl::ToUnixMicros(step_started_));
    e.set_end_unix_micros(absl::ToUnixMicros(now));
    profiler_->Record(std::move(e));
  }
}

void Hook::StartStep() {
  absl::MutexLock lock(&mu_);
  if (closed_) return;
  StartStepLocked();
}

void Hook::EndStep() {
  absl::MutexLock lock(&mu_);
  EndStepLocked();
}

void Hook::SetMode(v1::Mode mode) {
  absl::MutexLock lock(&mu_);
  if (mode == v1::MODE_UNSPECIFIED) mode = v1::MODE_GLOBAL;
  if (mode == mode_) return;
  EndStepLocked();
  mode_ = mode;
}

v1::Mode Hook::mode() const {
  absl::MutexLock lock(&mu_);
  return mode_;
}

int64_t Hook::step() const {
  absl::MutexLock lock(&mu_);
  return step_;
}

int64_t Hook::mode_step() const {
  absl::MutexLock lock(&mu_);
  auto it = mode_steps_.find(mode_);
  return it == mode_steps_.end() ? -1 : it->second;
}

int64_t Hook::CurrentOrNextModeStepLocked() {
  auto it = mode_steps_.find(mode_);
  if (it == mode_steps_.end()) return 0;
  return step_open_ ? it->second : it->second + 1;
}

bool Hook::ShouldSave(const std::string& name, const std::vector<std::string>& collections) {
  absl::MutexLock lock(&mu_);
  if (closed_) return false;
  return collections_.Decide(name, collections, mode_, CurrentOrNextModeStepLocked()).save;
}

bool Hook::StepMaySave() {
  absl::MutexLock lock(&mu_);
  if (closed_) return false;
  return collections_.AnyDue(mode_, CurrentOrNextModeStepLocked());
}

absl::StatusOr<uint64_t> Hook::CheckTensor(const std::string& name, const TensorView& tensor) {
  absl::Status valid = ValidateTensorName(name);
  if (!valid.ok()) {
    LogOnce("bad-name", absl::StrCat("tensor not saved: ", valid.message()));
    return valid;
  }
  auto bytes = TensorBytes(tensor.dtype, tensor.shape);
  if (!bytes.ok()) {
    absl::Status s = absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "': ", bytes.status().message()));
    LogOnce(absl::StrCat("bad-tensor:", name), std::string(s.message()));
    return s;
  }
  if (*bytes > 0 && tensor.data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has no data"));
  }
  return *bytes;
}

absl::Status Hook::SaveTensor(const std::string& name, const TensorView& tensor,
                              const std::vector<std::string>& collections) {
  if (tensor.device != Device::kHost) {
    const NamedTensor one{name, tensor, collections};
    return SaveDeviceTensors({&one});
  }
  absl::StatusOr<uint64_t> bytes = CheckTensor(name, tensor);
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::FailedPreconditionError("the hook is closed");
  if (!bytes.ok()) {
    RecordRefusedLocked(name, collections, "an invalid tensor (see the error it returned)");
    return bytes.status();
  }
  if (!step_open_) StartStepLocked();
  const int64_t mode_step = mode_steps_[mode_];
  SaveDecision d = collections_.Decide(name, collections, mode_, mode_step);
  if (!d.save) return absl::OkStatus();
  if (!step_names_.insert(name).second) return SavedTwice(name);
  if (*bytes > options_.max_queue_bytes) {
    // Host values are copied whole into the queue: one larger than all of
    // it cannot be kept. (Device tensors travel in pieces.)
    const std::string why = absl::StrCat("tensor '", name, "' has ", *bytes,
                                         " bytes, more than max_queue_bytes ",
                                         options_.max_queue_bytes);
    sender_->RecordDropped(name, 1, "a host tensor larger than max_queue_bytes");
    return absl::ResourceExhaustedError(why);
  }
  QueuedTensor q;
  q.name = name;
  q.collections = std::move(d.collections);
  q.dtype = tensor.dtype;
  q.shape = tensor.shape;
  q.bytes = sender_->AcquireBuffer(*bytes);
  q.bytes.assign(static_cast<const char*>(tensor.data), *bytes);
  q.send_values = d.values;
  q.histogram = d.histogram;
  q.histogram_spec = options_.histogram;
  q.step = step_;
  q.mode = mode_;
  q.mode_step = mode_step;
  sender_->EnqueueTensor(std::move(q));
  return absl::OkStatus();
}

absl::Status Hook::SaveTensors(const std::vector<NamedTensor>& tensors) {
  absl::Status first;
  // Device tensors grouped by (device, stream), one batch per group.
  std::map<std::pair<int, void*>, std::vector<const NamedTensor*>> groups;
  for (const NamedTensor& t : tensors) {
    if (t.tensor.device == Device::kHost) {
      first.Update(SaveTensor(t.name, t.tensor, t.collections));
    } else {
      groups[{t.tensor.device_index, t.tensor.stream}].push_back(&t);
    }
  }
  for (const auto& [key, group] : groups) first.Update(SaveDeviceTensors(group));
  return first;
}

absl::Status Hook::SaveDeviceTensors(const std::vector<const NamedTensor*>& tensors) {
  // Invalid tensors are refused with the reason (and counted as dropped
  // when due: the collector sees the gap); the others are saved.
  absl::Status status;
  std::vector<const NamedTensor*> valid;
  std::vector<const NamedTensor*> refused;
  valid.reserve(tensors.size());
  for (const NamedTensor* t : tensors) {
    absl::StatusOr<uint64_t> bytes = CheckTensor(t->name, t->tensor);
    const v1::DType d = t->tensor.dtype;
    if (!bytes.ok()) {
      status.Update(bytes.status());
    } else if (d != v1::DTYPE_F32 && d != v1::DTYPE_F16 && d != v1::DTYPE_BF16 &&
               d != v1::DTYPE_F64) {
      status.Update(absl::InvalidArgumentError(absl::StrCat(
          "device tensor '", t->name, "' is ", DTypeName(d),
          "; device statistics take F32, F16, BF16 or F64")));
    } else {
      valid.push_back(t);
      continue;
    }
    refused.push_back(t);
  }
  std::string log_key;
  absl::Status saved;
  {
    absl::MutexLock lock(&mu_);
    // Every save call on a stream is a fence point for its earlier deferred
    // reads, whether or not this one saves anything (not due, refused).
    if (!tensors.empty()) FenceStreamLocked(tensors[0]->tensor.stream);
    if (!closed_) {
      for (const NamedTensor* t : refused) {
        RecordRefusedLocked(t->name, t->collections,
                            "an invalid device tensor (see the error it returned)");
      }
    }
    saved = SaveDeviceTensorsLocked(valid, &log_key);
  }
  if (!log_key.empty()) LogOnce(log_key, std::string(saved.message()));
  status.Update(saved);
  return status;
}

absl::Status Hook::SaveDeviceTensorsLocked(const std::vector<const NamedTensor*>& tensors,
                                           std::string* log_key) {
  if (closed_) return absl::FailedPreconditionError("the hook is closed");
  if (tensors.empty()) return absl::OkStatus();
  if (!step_open_) StartStepLocked();
  const int64_t mode_step = mode_steps_[mode_];
  // Most steps save nothing (values every 100 steps, say): then no tensor
  // needs a decision of its own, which would cost the training thread
  // about a microsecond a tensor.
  if (!collections_.AnyDue(mode_, mode_step)) return absl::OkStatus();
  absl::Status status;
  if (device_scratch_ == nullptr) device_scratch_ = std::make_unique<DeviceScratch>();
  std::vector<DeviceCapture::Request>& requests = device_scratch_->requests;
  std::vector<QueuedTensor>& queued = device_scratch_->queued;
  requests.clear();
  queued.clear();
  for (const NamedTensor* t : tensors) {
    SaveDecision d = collections_.Decide(t->name, t->collections, mode_, mode_step);
    if (!d.save) continue;
    if (!step_names_.insert(t->name).second) {
      status.Update(SavedTwice(t->name));
      continue;
    }
    // The shape passed CheckTensor, so its element count is valid.
    const uint64_t count = *ElementCount(t->tensor.shape);
    DeviceCapture::Request r;
    r.ref = DeviceTensorRef{t->tensor.data, t->tensor.dtype, count, d.histogram};
    r.values = d.values;
    r.transfer_dtype = options_.device_transfer_dtype;
    requests.push_back(r);
    QueuedTensor q;
    q.name = t->name;
    q.collections = std::move(d.collections);
    q.dtype = t->tensor.dtype;
    q.shape = t->tensor.shape;
    q.send_values = d.values;
    q.histogram = d.histogram;
    q.histogram_spec = options_.histogram;
    q.step = step_;
    q.mode = mode_;
    q.mode_step = mode_step;
    queued.push_back(std::move(q));
  }
  if (requests.empty()) return status;

  const int device_index = tensors[0]->tensor.device_index;
  if (!capture_tried_) {
    capture_tried_ = true;
    capture_device_ = device_index;
    DeviceCaptureOptions co;
    co.engine = options_.device;
    co.engine.device = device_index;
    co.engine.histogram = options_.histogram;
    co.factory = options_.device_factory;
    co.policy = options_.backpressure.policy;
    co.max_block = options_.backpressure.max_block;
    co.spill_dir = options_.backpressure.spill_dir;
    co.max_spill_bytes = options_.backpressure.max_spill_bytes;
    co.value_pool_bytes = options_.max_queue_bytes;
    co.spill_budget = spill_budget_;
    Sender* sender = sender_.get();
    co.reserve_host = [sender](uint64_t bytes, bool force) {
      return sender->ReserveHost(bytes, force);
    };
    co.release_host = [sender](uint64_t bytes) { sender->ReleaseHost(bytes); };
    co.spilled = [sender](uint64_t bytes) { sender->CountDeviceSpill(bytes); };
    absl::StatusOr<std::unique_ptr<DeviceCapture>> capture = DeviceCapture::Create(std::move(co));
    if (capture.ok()) {
      absl::MutexLock ptr(&capture_mu_);
      capture_ = std::move(*capture);
    } else {
      capture_status_ = capture.status();
    }
  }
  std::shared_ptr<DeviceCapture> capture = Capture();
  if (capture == nullptr) {
    // Counted: the caller saved them and they will not be stored.
    sender_->RecordDropped(queued[0].name, static_cast<uint32_t>(queued.size()),
                           "no usable CUDA device");
    *log_key = "device";
    return absl::UnavailableError(
        absl::StrCat("device tensors are not saved: ", capture_status_.message()));
  }
  if (device_index != capture_device_) {
    sender_->RecordDropped(queued[0].name, static_cast<uint32_t>(queued.size()),
                           "a second CUDA device");
    return absl::InvalidArgumentError(absl::StrCat(
        "this hook captures tensors of CUDA device ", capture_device_, ", not ", device_index));
  }
  // Each tensor goes to the sender as soon as its device work is enqueued,
  // so the sender can take what came first while later ones wait for room.
  std::vector<std::shared_ptr<PendingDeviceTensor>> abandoned;
  DeviceCapture::Enqueued e = capture->Enqueue(
      requests, tensors[0]->tensor.stream,
      [&](const std::vector<size_t>& ready,
          const std::vector<std::shared_ptr<PendingDeviceTensor>>& pending) {
        // Pointers, not a vector of the tensors: a step's few hundred would
        // be a fresh allocation (and fresh pages) on every save.
        std::vector<QueuedTensor*> batch;
        batch.reserve(ready.size());
        for (size_t i : ready) {
          queued[i].pending = pending[i];
          batch.push_back(&queued[i]);
        }
        for (size_t k : sender_->EnqueueTensors(batch)) {
          abandoned.push_back(pending[ready[k]]);
        }
      });
  for (const auto& pending : abandoned) capture->Abandon(pending);
  std::string first_dropped;
  for (size_t i = 0; i < queued.size() && first_dropped.empty(); ++i) {
    if (e.pending[i] == nullptr) first_dropped = queued[i].name;
  }
  if (e.dropped > 0) {
    sender_->RecordDropped(first_dropped, e.dropped, std::string(e.status.message()));
    *log_key = "device-enqueue";
    status.Update(absl::Status(e.status.code(), absl::StrCat("device tensors dropped: ",
                                                             e.status.message())));
  }
  return status;
}

void Hook::RecordRefusedLocked(const std::string& name,
                               const std::vector<std::string>& collections,
                               const std::string& why) {
  if (!step_open_) StartStepLocked();
  const SaveDecision d = collections_.Decide(name, collections, mode_, mode_steps_[mode_]);
  if (d.save) sender_->RecordDropped(name, 1, why);
}

absl::Status Hook::SavedTwice(const std::string& name) {
  sender_->RecordDropped(name, 1, "a tensor saved twice in one step");
  return absl::InvalidArgumentError(absl::StrCat(
      "tensor '", name, "' was already saved at step ", step_,
      "; the second save is dropped (counted)"));
}

std::shared_ptr<DeviceCapture> Hook::Capture() const {
  absl::MutexLock lock(&capture_mu_);
  return capture_;
}

absl::Status Hook::AwaitDevice(const std::shared_ptr<PendingDeviceTensor>& pending) {
  std::shared_ptr<DeviceCapture> capture = Capture();
  if (capture == nullptr) return absl::FailedPreconditionError("no device capture");
  return capture->Await(pending, options_.device_timeout);
}

absl::Status Hook::SaveScalar(const std::string& name, double value,
                              const std::vector<std::string>& collections) {
  return SaveTensor(name, TensorView{&value, v1::DTYPE_F64, {}, Device::kHost, 0}, collections);
}

bool Hook::SaveProfile(v1::ProfileBatch batch) { return sender_->EnqueueProfile(std::move(batch)); }

void Hook::AddToCollection(const std::string& collection, const std::string& name) {
  absl::MutexLock lock(&mu_);
  collections_.AddToCollection(collection, name);
  ++collections_version_;
}

void Hook::IncludeCollection(const std::string& collection) {
  absl::MutexLock lock(&mu_);
  collections_.Include(collection);
  ++collections_version_;
}

std::vector<std::string> Hook::DueCollections() {
  absl::MutexLock lock(&mu_);
  if (closed_) return {};
  return collections_.DueCollections(mode_, CurrentOrNextModeStepLocked());
}

std::vector<std::vector<std::string>> Hook::CollectionsOf(const std::vector<std::string>& names) {
  absl::MutexLock lock(&mu_);
  std::vector<std::vector<std::string>> out;
  out.reserve(names.size());
  for (const std::string& n : names) out.push_back(collections_.Members(n));
  return out;
}

uint64_t Hook::collections_version() const {
  absl::MutexLock lock(&mu_);
  return collections_version_;
}

absl::Status Hook::WaitUntilConnected(absl::Duration timeout) {
  if (sender_->WaitForHelloAck(timeout)) return absl::OkStatus();
  return absl::DeadlineExceededError(absl::StrCat("not connected to collector ",
                                                  options_.collector, " within ",
                                                  absl::FormatDuration(timeout)));
}

absl::Status Hook::Flush(absl::Duration timeout) {
  {
    absl::MutexLock lock(&mu_);
    EndStepLocked();
  }
  if (sender_->WaitForAcks(timeout)) return absl::OkStatus();
  return absl::DeadlineExceededError(absl::StrCat("the collector did not acknowledge "
                                                  "everything within ",
                                                  absl::FormatDuration(timeout)));
}

std::optional<v1::Action> Hook::stop_action() const {
  absl::MutexLock lock(&mu_);
  return stop_action_;
}

absl::Status Hook::Close() {
  std::string reason = "finished";
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return absl::OkStatus();
    EndStepLocked();
    closed_ = true;
    if (stop_action_.has_value()) {
      reason = absl::StrCat("stopped by rule ", stop_action_->rule());
    }
  }
  if (profiler_ != nullptr) profiler_->Stop();  // its last batch goes before the job end
  absl::Status s = sender_->Close(reason, options_.close_timeout);
  if (!s.ok()) LOG(WARNING) << "sonde: close: " << s;
  return s;
}

void Hook::SetProfilerGauge(const std::string& name, double value) {
  if (profiler_ != nullptr) profiler_->SetGauge(name, value);
}

void Hook::RecordEvent(v1::TraceEvent event) {
  if (profiler_ == nullptr) return;
  if (event.step() < 0 || event.mode() == v1::MODE_UNSPECIFIED) {
    absl::MutexLock lock(&mu_);
    if (event.mode() == v1::MODE_UNSPECIFIED) event.set_mode(mode_);
    if (event.step() < 0 && step_open_) {
      event.set_step(step_);
      event.set_mode_step(mode_steps_[mode_]);
    }
  }
  profiler_->Record(std::move(event));
}

Hook::ScopedEvent::ScopedEvent(Hook* hook, v1::TraceEvent::Kind kind, std::string name)
    : hook_(hook->profiler_ != nullptr ? hook : nullptr) {
  if (hook_ == nullptr) return;
  event_.set_kind(kind);
  event_.set_name(std::move(name));
  event_.set_step(-1);
  event_.set_start_unix_micros(absl::ToUnixMicros(absl::Now()));
}

Hook::ScopedEvent::ScopedEvent(ScopedEvent&& other) noexcept
    : hook_(other.hook_), event_(std::move(other.event_)) {
  other.hook_ = nullptr;
}

Hook::ScopedEvent::~ScopedEvent() {
  if (hook_ == nullptr) return;
  event_.set_end_unix_micros(absl::ToUnixMicros(absl::Now()));
  hook_->RecordEvent(std::move(event_));
}

Hook::Counters Hook::counters() const {
  SenderCounters sc = sender_->counters();
  Counters c;
  c.tensors_saved = sc.tensors_queued;
  c.tensors_dropped = sc.tensors_dropped;
  c.values_dropped = sc.values_dropped;
  c.steps_dropped = sc.steps_dropped;
  c.tensors_spilled = sc.tensors_spilled;
  c.bytes_spilled = sc.bytes_spilled;
  c.messages_sent = sc.messages_sent;
  c.messages_resent = sc.messages_resent;
  c.last_acked_seq = sc.last_acked_seq;
  c.steps_acked = sc.steps_acked;
  c.duplicates_acked = sc.duplicates_acked;
  c.reconnects = sc.reconnects;
  c.memory_bytes = sc.memory_bytes;
  c.profile_batches_queued = sc.profile_batches_queued;
  c.profile_batches_dropped = sc.profile_batches_dropped;
  c.entries_spooled = sc.entries_spooled;
  c.spool_refused = sc.spool_refused;
  c.spool_bytes = sc.spool_bytes;
  c.steps_left_in_spool = sc.steps_left_in_spool;
  c.left_spools_uploaded = left_spools_uploaded_;
  c.left_steps_uploaded = left_steps_uploaded_;
  {
    absl::MutexLock lock(&mu_);
    c.steps = steps_;
  }
  std::shared_ptr<DeviceCapture> capture = Capture();
  if (capture != nullptr) {
    const DeviceCapture::Counters d = capture->counters();
    c.device_batches = d.batches;
    c.device_waits = d.waits;
    c.device_waited = d.waited;
    c.device_snapshot_bytes_peak = d.snapshot_bytes_peak;
    c.device_bytes_downloaded = d.bytes_downloaded;
    c.device_values_spilled = d.values_spilled;
    c.device_bytes_spilled = d.bytes_spilled;
    c.device_enqueue_time = d.enqueue_time;
    c.device_engine_time = d.engine_time;
    c.device_handover_time = d.handover_time;
  }
  return c;
}

}  // namespace sonde
