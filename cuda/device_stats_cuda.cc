// The device path over the CUDA runtime (linked statically; the runtime
// loads the driver when first called, so a machine without one gets an
// error status here rather than a failure to start).
//
// Three streams of the engine's own: `work_` runs what the producer waits
// for (statistics kernels, snapshots: device-speed work); `results_` copies
// each statistics batch's records back to pinned memory once its kernels
// are done, and `copy_` runs the downloads of snapshots through the pinned
// ring (PCIe-speed work the producer never waits for: a later batch's
// kernels, which the producer may wait for, never queue behind a copy to
// the host). Device memory comes from a pool of the engine's own, so the
// process's default pool keeps its settings, and the pool never inserts a
// dependency of `work_` on another stream to reuse memory (that would make
// training wait for PCIe).
//
// Graph captures: work is refused while the producer's stream is captured
// (it would become part of the user's graph), and the calls made on
// Sonde's own threads (Collect, Download, Discard, Drain) switch the
// thread to cudaStreamCaptureModeThreadLocal, so that a capture in global
// mode on a training thread (torch.cuda.graph's default) neither refuses
// them nor is invalidated by them.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "cuda/device_stats.h"
#include "cuda/multi_tensor.h"
#include "cuda/stats_kernels.h"

namespace sonde {
namespace {

absl::Status CudaError(cudaError_t e, absl::string_view what) {
  return absl::UnavailableError(
      absl::StrCat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

#define SONDE_CUDA_RETURN(expr, what)                            \
  do {                                                           \
    const cudaError_t sonde_e = (expr);                          \
    if (sonde_e != cudaSuccess) return CudaError(sonde_e, what); \
  } while (0)

int32_t KernelDTypeOf(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_F32: return kKernelF32;
    case v1::DTYPE_F16: return kKernelF16;
    case v1::DTYPE_BF16: return kKernelBF16;
    case v1::DTYPE_F64: return kKernelF64;
    default: return 0;
  }
}

uint64_t AlignUp(uint64_t n) { return (n + 255) & ~uint64_t{255}; }

constexpr uint64_t kMaxAutoSnapshotBytes = uint64_t{4} << 30;

// Makes `device` current on a thread of Sonde's own (the pump, the sender),
// which has no device of its own to restore: restoring would make device 0
// current there and create a context on GPU 0 (300-500 MB) in every
// process of a multi-GPU job.
void UseDevice(int device) {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != device) cudaSetDevice(device);
}

// Whether `device`'s primary context exists, asked of the driver (the
// runtime has no such call): making a device current creates its context
// (CUDA 12 on). True when the driver cannot say.
bool HasPrimaryContext(int device) {
  using DeviceGet = int (*)(int*, int);
  using PrimaryCtxGetState = int (*)(int, unsigned int*, int*);
  struct Driver {
    DeviceGet device_get = nullptr;
    PrimaryCtxGetState get_state = nullptr;
  };
  static const Driver driver = [] {
    Driver d;
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuDeviceGet", &p, 12000, cudaEnableDefault, &found) ==
            cudaSuccess &&
        found == cudaDriverEntryPointSuccess) {
      d.device_get = reinterpret_cast<DeviceGet>(p);
    }
    if (cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &p, 12000,
                                         cudaEnableDefault, &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess) {
      d.get_state = reinterpret_cast<PrimaryCtxGetState>(p);
    }
    cudaGetLastError();
    return d;
  }();
  if (driver.device_get == nullptr || driver.get_state == nullptr) return true;
  int handle = 0;
  unsigned int flags = 0;
  int active = 0;
  if (driver.device_get(&handle, device) != 0 || driver.get_state(handle, &flags, &active) != 0) {
    return true;
  }
  return active != 0;
}

// Makes `device` current for the scope and restores the caller's device:
// for calls from training code's threads, whose current device is theirs.
// A thread that never chose a device reads as device 0 without a context
// there: it is left on `device` rather than given a context on GPU 0.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current == device) return;
    previous_ = current;  // -1: unknown, nothing to restore
    cudaSetDevice(device);
  }
  ~DeviceScope() {
    if (previous_ >= 0 && HasPrimaryContext(previous_)) cudaSetDevice(previous_);
  }

 private:
  int previous_ = -1;
};

// For calls on Sonde's own threads: a CUDA graph being captured in global
// mode on another thread (torch.cuda.graph's default) would refuse this
// thread's event queries and copies and be invalidated by them; in
// thread-local mode only this thread's own captures (it has none) count.
class ThreadLocalCaptureMode {
 public:
  ThreadLocalCaptureMode() : previous_(cudaStreamCaptureModeThreadLocal) {
    changed_ = cudaThreadExchangeStreamCaptureMode(&previous_) == cudaSuccess;
  }
  ~ThreadLocalCaptureMode() {
    if (changed_) cudaThreadExchangeStreamCaptureMode(&previous_);
  }

 private:
  cudaStreamCaptureMode previous_;
  bool changed_ = false;
};

// An event query's answer that says "not yet": not ready, or a refusal
// because of a graph capture (not sticky; cleared), which says nothing of
// the work behind the event.
bool StillPending(cudaError_t e) {
  switch (e) {
    case cudaErrorNotReady:
      return true;
    case cudaErrorStreamCaptureUnsupported:
    case cudaErrorStreamCaptureInvalidated:
    case cudaErrorStreamCaptureImplicit:
    case cudaErrorStreamCaptureWrongThread:
    case cudaErrorCapturedEvent:
      cudaGetLastError();
      return true;
    default:
      return false;
  }
}

struct StatsJob {
  bool busy = false;
  uint64_t ticket = 0;
  cudaEvent_t done = nullptr;
  int slot = -1;
  uint32_t tensors = 0;
  uint64_t out_offset = 0;
  uint64_t counters_offset = 0;
  std::vector<uint8_t> wants_histogram;
};

struct Snapshot {
  void* device = nullptr;     // in the engine's pool; freed on copy_ after its last piece
  uint64_t bytes = 0;
  bool downloading = false;   // Download was called
  char* destination = nullptr;
  uint64_t issued = 0;        // bytes whose piece copies were started
  uint64_t landed = 0;        // bytes copied out into destination
  absl::Status status;
};

// One pinned ring buffer and the piece it carries.
struct RingBuffer {
  void* pinned = nullptr;
  cudaEvent_t done = nullptr;
  enum State { kFree, kInFlight, kCopying } state = kFree;
  uint64_t ticket = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

class CudaDeviceStats final : public DeviceStats {
 public:
  explicit CudaDeviceStats(const DeviceStatsOptions& options) : options_(options) {}

  ~CudaDeviceStats() override {
    ThreadLocalCaptureMode capture_mode;  // first: before any CUDA call
    DeviceScope scope(options_.device);
    if (work_) cudaStreamSynchronize(work_);
    if (results_) cudaStreamSynchronize(results_);
    if (copy_) cudaStreamSynchronize(copy_);
    absl::MutexLock lock(&mu_);
    for (auto& [ticket, s] : snapshots_) {
      if (s.device != nullptr) cudaFreeAsync(s.device, work_);
    }
    if (work_) cudaStreamSynchronize(work_);
    for (StatsJob& job : jobs_) {
      if (job.done) cudaEventDestroy(job.done);
    }
    for (RingBuffer& r : ring_) {
      if (r.done) cudaEventDestroy(r.done);
      if (r.pinned) cudaFreeHost(r.pinned);
    }
    for (void* p : slots_) cudaFreeHost(p);
    if (ready_) cudaEventDestroy(ready_);
    if (taken_) cudaEventDestroy(taken_);
    if (read_) cudaEventDestroy(read_);
    if (work_) cudaStreamDestroy(work_);
    if (results_) cudaStreamDestroy(results_);
    if (copy_) cudaStreamDestroy(copy_);
    if (pool_) cudaMemPoolDestroy(pool_);
  }

  absl::Status Init() {
    DeviceScope scope(options_.device);
    absl::MutexLock lock(&mu_);
    params_ = MakeHistogramParams(options_.histogram);
    cudaDeviceProp prop;
    SONDE_CUDA_RETURN(cudaGetDeviceProperties(&prop, options_.device), "cudaGetDeviceProperties");
    name_ = prop.name;
    capacity_ = options_.snapshot_bytes;
    if (capacity_ == 0) {
      size_t free = 0, total = 0;
      SONDE_CUDA_RETURN(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
      capacity_ = std::min<uint64_t>(free / 8, kMaxAutoSnapshotBytes);
    }
    SONDE_CUDA_RETURN(cudaStreamCreateWithFlags(&work_, cudaStreamNonBlocking),
                      "cudaStreamCreateWithFlags");
    SONDE_CUDA_RETURN(cudaStreamCreateWithFlags(&results_, cudaStreamNonBlocking),
                      "cudaStreamCreateWithFlags");
    SONDE_CUDA_RETURN(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking),
                      "cudaStreamCreateWithFlags");
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = options_.device;
    SONDE_CUDA_RETURN(cudaMemPoolCreate(&pool_, &props), "cudaMemPoolCreate");
    // Keep what snapshots used (at most their budget) instead of returning
    // it to the driver at every synchronization; never make `work_` wait
    // for `copy_` or `results_` to reuse memory.
    uint64_t threshold = capacity_;
    SONDE_CUDA_RETURN(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold),
                      "cudaMemPoolSetAttribute (release threshold)");
    int no = 0;
    SONDE_CUDA_RETURN(
        cudaMemPoolSetAttribute(pool_, cudaMemPoolReuseAllowInternalDependencies, &no),
        "cudaMemPoolSetAttribute (no internal dependencies)");
    SONDE_CUDA_RETURN(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
    SONDE_CUDA_RETURN(cudaEventCreateWithFlags(&taken_, cudaEventDisableTiming), "cudaEventCreate");
    SONDE_CUDA_RETURN(cudaEventCreateWithFlags(&read_, cudaEventDisableTiming), "cudaEventCreate");
    jobs_.resize(options_.batch_slots);
    for (StatsJob& job : jobs_) {
      SONDE_CUDA_RETURN(cudaEventCreateWithFlags(&job.done, cudaEventDisableTiming),
                        "cudaEventCreate");
    }
    for (int i = 0; i < options_.batch_slots; ++i) {
      void* p = nullptr;
      SONDE_CUDA_RETURN(cudaHostAlloc(&p, options_.slot_bytes, cudaHostAllocDefault),
                        "cudaHostAlloc (batch slots)");
      slots_.push_back(p);
      free_slots_.push_back(i);
    }
    ring_.resize(options_.ring_buffers);
    for (RingBuffer& r : ring_) {
      SONDE_CUDA_RETURN(cudaHostAlloc(&r.pinned, options_.ring_buffer_bytes, cudaHostAllocDefault),
                        "cudaHostAlloc (download ring)");
      SONDE_CUDA_RETURN(cudaEventCreateWithFlags(&r.done, cudaEventDisableTiming),
                        "cudaEventCreate");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<uint64_t> EnqueueStats(absl::Span<const DeviceTensorRef> tensors,
                                        void* producer_stream) override {
    std::vector<KernelTensor> table;
    table.reserve(tensors.size());
    for (const DeviceTensorRef& t : tensors) {
      KernelTensor k;
      k.data = t.data;
      k.count = t.count;
      k.dtype = KernelDTypeOf(t.dtype);
      k.histogram = t.histogram && params_.count > 0 ? 1 : 0;
      if (k.dtype == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "device statistics support F32, F16, BF16 and F64, not ", DTypeName(t.dtype)));
      }
      if (t.count > 0 && t.data == nullptr) {
        return absl::InvalidArgumentError("device tensor has elements but no data pointer");
      }
      table.push_back(k);
    }
    BatchPlan plan = PlanBatch(std::move(table), options_.chunk_elements, params_.count);
    const uint64_t tensors_bytes = AlignUp(plan.tensors.size() * sizeof(KernelTensor));
    const uint64_t chunks_bytes = AlignUp(plan.chunks.size() * sizeof(KernelChunk));
    const uint64_t out_bytes = AlignUp(plan.tensors.size() * sizeof(StatsAccumulator));
    const uint64_t counters_bytes = AlignUp(plan.histogram_counters * sizeof(uint64_t));
    const uint64_t upload = tensors_bytes + chunks_bytes;
    const uint64_t pinned_need = upload + out_bytes + counters_bytes;
    if (pinned_need > options_.slot_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "a batch of ", plan.tensors.size(), " device tensors needs ", pinned_need,
          " bytes of pinned staging; the slot has ", options_.slot_bytes,
          " (raise DeviceStatsOptions::slot_bytes or split the batch)"));
    }
    const uint64_t partials_bytes =
        AlignUp(std::max<size_t>(plan.chunks.size(), 1) * sizeof(StatsAccumulator));

    DeviceScope scope(options_.device);
    cudaStream_t producer = static_cast<cudaStream_t>(producer_stream);
    SONDE_RETURN_IF_ERROR(RefuseGraphCapture(producer));
    absl::MutexLock lock(&mu_);
    if (free_slots_.empty()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "all ", options_.batch_slots, " device statistics batches are still in flight"));
    }
    StatsJob* job = nullptr;
    for (StatsJob& j : jobs_) {
      if (!j.busy) {
        job = &j;
        break;
      }
    }
    if (job == nullptr) return absl::ResourceExhaustedError("no free device job record");
    const int slot = free_slots_.front();
    uint8_t* pinned = static_cast<uint8_t*>(slots_[slot]);
    std::memcpy(pinned, plan.tensors.data(), plan.tensors.size() * sizeof(KernelTensor));
    std::memcpy(pinned + tensors_bytes, plan.chunks.data(),
                plan.chunks.size() * sizeof(KernelChunk));

    cudaGetLastError();  // a stale (non-sticky) error would fail the launch below
    SONDE_CUDA_RETURN(cudaEventRecord(ready_, producer), "cudaEventRecord");
    SONDE_CUDA_RETURN(cudaStreamWaitEvent(work_, ready_, 0), "cudaStreamWaitEvent");
    // Device layout: [tensors][chunks][out][counters][partials].
    uint8_t* dev = nullptr;
    const uint64_t dev_bytes = upload + out_bytes + counters_bytes + partials_bytes;
    const cudaError_t allocated =
        cudaMallocFromPoolAsync(reinterpret_cast<void**>(&dev), dev_bytes, pool_, work_);
    if (allocated != cudaSuccess) {
      // Not sticky: device memory is short now, as for a snapshot, and the
      // caller's backpressure decides (wait for room, or drop and count).
      cudaGetLastError();
      return absl::ResourceExhaustedError(absl::StrCat(
          "no device memory for the tables of a statistics batch (", dev_bytes, " bytes, ",
          cudaGetErrorName(allocated), ")"));
    }
    // Past here work that reads the slot and the tensors is on the stream:
    // a failure waits for it before the slot can be used again and before
    // training may go on writing the tensors.
    auto fail = [&](cudaError_t e, absl::string_view what) {
      cudaFreeAsync(dev, work_);
      cudaStreamSynchronize(work_);
      cudaGetLastError();
      return CudaError(e, what);
    };
    // Past the results' stream's wait, it may copy from `dev` too.
    auto fail_both = [&](cudaError_t e, absl::string_view what) {
      cudaStreamSynchronize(results_);
      return fail(e, what);
    };
    cudaError_t e = cudaMemcpyAsync(dev, pinned, upload, cudaMemcpyHostToDevice, work_);
    if (e != cudaSuccess) return fail(e, "cudaMemcpyAsync (tables)");
    if (counters_bytes > 0) {
      e = cudaMemsetAsync(dev + upload + out_bytes, 0, counters_bytes, work_);
      if (e != cudaSuccess) return fail(e, "cudaMemsetAsync");
    }
    const int launched = LaunchStatsBatch(
        reinterpret_cast<const KernelTensor*>(dev), static_cast<uint32_t>(plan.tensors.size()),
        reinterpret_cast<const KernelChunk*>(dev + tensors_bytes),
        static_cast<uint32_t>(plan.chunks.size()), params_,
        options_.warp_aggregated_histograms ? kHistogramWarpAggregated : kHistogramAtomics,
        reinterpret_cast<StatsAccumulator*>(dev + upload + out_bytes + counters_bytes),
        reinterpret_cast<unsigned long long*>(dev + upload + out_bytes),
        reinterpret_cast<StatsAccumulator*>(dev + upload), work_);
    if (launched != 0) return fail(static_cast<cudaError_t>(launched), "statistics kernel launch");
    // Training may not overwrite the tensors before the kernels have read
    // them: its stream waits for the kernels (on the device, not the host),
    // not for the copy of the results, which may queue behind downloads.
    // Deferred: FenceProducer waits for read_, which each batch records
    // again after its kernels, so the latest recording covers all before.
    e = cudaEventRecord(read_, work_);
    if (e == cudaSuccess && !options_.defer_producer_wait) {
      e = cudaStreamWaitEvent(producer, read_, 0);
    }
    if (e != cudaSuccess) return fail(e, "ordering the producer after the statistics");
    // The records go back on a stream of their own, so that the next
    // batch's kernels (and so the producer) never wait for this copy, which
    // may queue behind download pieces on a copy engine.
    e = cudaStreamWaitEvent(results_, read_, 0);
    if (e != cudaSuccess) return fail(e, "ordering the results after the statistics");
    e = cudaMemcpyAsync(pinned + upload, dev + upload, out_bytes + counters_bytes,
                        cudaMemcpyDeviceToHost, results_);
    if (e != cudaSuccess) return fail_both(e, "cudaMemcpyAsync (results)");
    e = cudaFreeAsync(dev, results_);
    const bool freed = e == cudaSuccess;
    if (e == cudaSuccess) e = cudaEventRecord(job->done, results_);
    if (e != cudaSuccess) {
      cudaStreamSynchronize(results_);
      cudaStreamSynchronize(work_);
      cudaGetLastError();
      if (!freed) cudaFreeAsync(dev, work_);
      return CudaError(e, "finishing the statistics batch");
    }

    free_slots_.pop_front();
    job->busy = true;
    job->ticket = ++last_ticket_;
    job->slot = slot;
    job->tensors = static_cast<uint32_t>(plan.tensors.size());
    job->out_offset = upload;
    job->counters_offset = upload + out_bytes;
    job->wants_histogram.clear();
    for (const KernelTensor& t : plan.tensors) job->wants_histogram.push_back(t.histogram);
    last_launches_ = plan.tensors.empty() ? 0 : (plan.chunks.empty() ? 1 : kLaunchesPerBatch);
    return job->ticket;
  }

  absl::StatusOr<uint64_t> EnqueueSnapshot(const DeviceTensorRef& tensor, v1::DType transfer,
                                           void* producer_stream) override {
    if (transfer == v1::DTYPE_UNSPECIFIED) transfer = tensor.dtype;
    const size_t size = SnapshotElementSize(tensor.dtype, transfer);
    if (size == 0 || KernelDTypeOf(tensor.dtype) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device snapshots convert F32/F64 to F32/F16/BF16, not ", DTypeName(tensor.dtype),
          " to ", DTypeName(transfer)));
    }
    if (tensor.count > 0 && tensor.data == nullptr) {
      return absl::InvalidArgumentError("device tensor has elements but no data pointer");
    }
    const uint64_t bytes = tensor.count * size;
    DeviceScope scope(options_.device);
    cudaStream_t producer = static_cast<cudaStream_t>(producer_stream);
    SONDE_RETURN_IF_ERROR(RefuseGraphCapture(producer));
    absl::MutexLock lock(&mu_);
    if (used_ + bytes > capacity_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "snapshot memory is full: ", used_, " of ", capacity_, " bytes wait for download, ",
          bytes, " more asked"));
    }
    cudaGetLastError();  // a stale (non-sticky) error would fail the launch below
    SONDE_CUDA_RETURN(cudaEventRecord(ready_, producer), "cudaEventRecord");
    SONDE_CUDA_RETURN(cudaStreamWaitEvent(work_, ready_, 0), "cudaStreamWaitEvent");
    void* dev = nullptr;
    if (bytes > 0) {
      const cudaError_t e = cudaMallocFromPoolAsync(&dev, bytes, pool_, work_);
      if (e != cudaSuccess) {
        cudaGetLastError();  // an allocation failure is not sticky; clear it
        return absl::ResourceExhaustedError(absl::StrCat(
            "no device memory for a snapshot of ", bytes, " bytes (", cudaGetErrorName(e), ")"));
      }
    }
    // Past here the copy may read the tensor: a failure waits for it, so
    // training cannot overwrite what is being read, and frees the memory.
    auto fail = [&](cudaError_t e, absl::string_view what) {
      if (dev != nullptr) cudaFreeAsync(dev, work_);
      cudaStreamSynchronize(work_);
      cudaGetLastError();
      return CudaError(e, what);
    };
    cudaError_t e = cudaSuccess;
    if (bytes > 0 && transfer != tensor.dtype) {
      e = static_cast<cudaError_t>(LaunchConvert(tensor.data, KernelDTypeOf(tensor.dtype), dev,
                                                 KernelDTypeOf(transfer), tensor.count, work_));
      if (e != cudaSuccess) return fail(e, "conversion kernel launch");
    } else if (bytes > 0 && options_.snapshot_copy_kernel) {
      e = static_cast<cudaError_t>(LaunchCopy(tensor.data, dev, bytes, work_));
      if (e != cudaSuccess) return fail(e, "copy kernel launch (snapshot)");
    } else if (bytes > 0) {
      e = cudaMemcpyAsync(dev, tensor.data, bytes, cudaMemcpyDeviceToDevice, work_);
      if (e != cudaSuccess) return fail(e, "cudaMemcpyAsync (snapshot)");
    }
    // Downloads read the snapshot after it is taken; training waits for the
    // snapshot only, never for its download.
    e = cudaEventRecord(taken_, work_);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(copy_, taken_, 0);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(producer, taken_, 0);
    if (e != cudaSuccess) return fail(e, "ordering the snapshot");
    const uint64_t ticket = ++last_ticket_;
    Snapshot& snapshot = snapshots_[ticket];
    snapshot.device = dev;
    snapshot.bytes = bytes;
    used_ += bytes;
    return ticket;
  }

  absl::Status Download(uint64_t ticket, char* destination) override {
    ThreadLocalCaptureMode capture_mode;  // first: before any CUDA call
    UseDevice(options_.device);           // the pump's thread
    absl::MutexLock lock(&mu_);
    auto it = snapshots_.find(ticket);
    if (it == snapshots_.end() || it->second.downloading) {
      return absl::NotFoundError(absl::StrCat("no snapshot ", ticket, " waits for download"));
    }
    if (it->second.bytes > 0 && destination == nullptr) {
      return absl::InvalidArgumentError("download without a destination");
    }
    it->second.downloading = true;
    it->second.destination = destination;
    downloads_.push_back(ticket);
    IssuePiecesLocked();
    return absl::OkStatus();
  }

  void Discard(uint64_t ticket) override {
    ThreadLocalCaptureMode capture_mode;  // first: before any CUDA call
    DeviceScope scope(options_.device);
    absl::MutexLock lock(&mu_);
    auto it = snapshots_.find(ticket);
    if (it == snapshots_.end() || it->second.downloading) return;
    if (it->second.device != nullptr) cudaFreeAsync(it->second.device, work_);
    used_ -= it->second.bytes;
    snapshots_.erase(it);
  }

  uint64_t SnapshotBytes(uint64_t ticket) const override {
    absl::MutexLock lock(&mu_);
    auto it = snapshots_.find(ticket);
    return it == snapshots_.end() ? 0 : it->second.bytes;
  }

  std::vector<DeviceCompletion> Collect() override {
    absl::MutexLock collecting(&collect_mu_);
    ThreadLocalCaptureMode capture_mode;  // first: before any CUDA call
    UseDevice(options_.device);           // the pump's thread
    std::vector<DeviceCompletion> done;
    struct Copy {
      int buffer;
      char* to;
    };
    std::vector<Copy> copies;
    {
      absl::MutexLock lock(&mu_);
      for (StatsJob& job : jobs_) {
        if (!job.busy) continue;
        const cudaError_t e = cudaEventQuery(job.done);
        if (StillPending(e)) continue;
        done.push_back(FinishStats(job, e));
      }
      for (size_t b = 0; b < ring_.size(); ++b) {
        RingBuffer& r = ring_[b];
        if (r.state != RingBuffer::kInFlight) continue;
        const cudaError_t e = cudaEventQuery(r.done);
        if (StillPending(e)) continue;
        Snapshot& s = snapshots_[r.ticket];
        if (e != cudaSuccess) {
          s.status.Update(CudaError(e, "download"));
          r.state = RingBuffer::kFree;
          s.landed += r.bytes;
          continue;
        }
        r.state = RingBuffer::kCopying;
        copies.push_back({static_cast<int>(b), s.destination + r.offset});
      }
    }
    // Out of the ring into the caller's memory, without the lock: the
    // training thread's enqueues never wait for these copies.
    for (const Copy& c : copies) std::memcpy(c.to, ring_[c.buffer].pinned, ring_[c.buffer].bytes);
    {
      absl::MutexLock lock(&mu_);
      for (const Copy& c : copies) {
        RingBuffer& r = ring_[c.buffer];
        snapshots_[r.ticket].landed += r.bytes;
        r.state = RingBuffer::kFree;
      }
      // Downloads that have landed whole (or failed and drained).
      for (auto it = snapshots_.begin(); it != snapshots_.end();) {
        Snapshot& s = it->second;
        if (s.downloading && s.issued == s.bytes && s.landed == s.bytes &&
            !InRingLocked(it->first)) {
          DeviceCompletion c;
          c.kind = DeviceCompletion::kValues;
          c.ticket = it->first;
          c.status = s.status;
          done.push_back(std::move(c));
          used_ -= s.bytes;
          it = snapshots_.erase(it);
        } else {
          ++it;
        }
      }
      IssuePiecesLocked();
    }
    std::sort(done.begin(), done.end(), [](const DeviceCompletion& a, const DeviceCompletion& b) {
      return a.ticket < b.ticket;
    });
    return done;
  }

  absl::Status FenceProducer(void* producer_stream) override {
    DeviceScope scope(options_.device);
    // A wait inside a CUDA graph capture would become part of the user's
    // graph: refused; the caller fences again after the capture.
    SONDE_RETURN_IF_ERROR(RefuseGraphCapture(static_cast<cudaStream_t>(producer_stream)));
    absl::MutexLock lock(&mu_);
    if (work_ == nullptr) return absl::OkStatus();
    SONDE_CUDA_RETURN(cudaStreamWaitEvent(static_cast<cudaStream_t>(producer_stream), read_, 0),
                      "cudaStreamWaitEvent (fence)");
    return absl::OkStatus();
  }

  absl::Status Drain() override {
    ThreadLocalCaptureMode capture_mode;  // first: before any CUDA call
    DeviceScope scope(options_.device);
    if (work_ == nullptr) return absl::OkStatus();
    cudaError_t e = cudaStreamSynchronize(work_);
    if (e == cudaSuccess) e = cudaStreamSynchronize(results_);
    if (e == cudaSuccess) e = cudaStreamSynchronize(copy_);
    return e == cudaSuccess ? absl::OkStatus() : CudaError(e, "cudaStreamSynchronize");
  }

  uint64_t snapshot_capacity() const override {
    absl::MutexLock lock(&mu_);
    return capacity_;
  }
  uint64_t snapshot_bytes_used() const override {
    absl::MutexLock lock(&mu_);
    return used_;
  }
  int LastBatchLaunches() const override {
    absl::MutexLock lock(&mu_);
    return last_launches_;
  }
  std::string DeviceName() const override { return name_; }

 private:
  bool InRingLocked(uint64_t ticket) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const RingBuffer& r : ring_) {
      if (r.state != RingBuffer::kFree && r.ticket == ticket) return true;
    }
    return false;
  }

  // Starts piece copies of the waiting downloads, oldest first, into every
  // free ring buffer.
  void IssuePiecesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (!downloads_.empty()) {
      auto it = snapshots_.find(downloads_.front());
      if (it == snapshots_.end()) {
        downloads_.pop_front();
        continue;
      }
      Snapshot& s = it->second;
      if (s.issued == s.bytes) {
        downloads_.pop_front();
        continue;
      }
      int free = -1;
      for (size_t b = 0; b < ring_.size(); ++b) {
        if (ring_[b].state == RingBuffer::kFree) {
          free = static_cast<int>(b);
          break;
        }
      }
      if (free < 0) return;
      RingBuffer& r = ring_[free];
      const uint64_t n = std::min<uint64_t>(options_.ring_buffer_bytes, s.bytes - s.issued);
      r.ticket = it->first;
      r.offset = s.issued;
      r.bytes = n;
      cudaError_t e = cudaMemcpyAsync(r.pinned, static_cast<const char*>(s.device) + s.issued, n,
                                      cudaMemcpyDeviceToHost, copy_);
      s.issued += n;
      if (s.issued == s.bytes && e == cudaSuccess) {
        // Freed in stream order before the last piece's event, so once the
        // event has passed the memory is reusable without any dependency.
        e = cudaFreeAsync(s.device, copy_);
        if (e == cudaSuccess) s.device = nullptr;
      }
      if (e == cudaSuccess) e = cudaEventRecord(r.done, copy_);
      if (e != cudaSuccess) {
        // Nothing more of this snapshot will be copied: it completes with
        // the error once its pieces in flight are back.
        cudaGetLastError();
        if (s.device != nullptr) {
          cudaFreeAsync(s.device, copy_);
          s.device = nullptr;
        }
        s.status.Update(CudaError(e, "download piece"));
        s.landed += s.bytes - s.issued + n;
        s.issued = s.bytes;
        continue;
      }
      r.state = RingBuffer::kInFlight;
    }
  }

  DeviceCompletion FinishStats(StatsJob& job, cudaError_t e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    DeviceCompletion c;
    c.kind = DeviceCompletion::kStats;
    c.ticket = job.ticket;
    if (e != cudaSuccess) c.status = CudaError(e, "device work failed");
    const uint8_t* pinned = static_cast<const uint8_t*>(slots_[job.slot]);
    if (c.status.ok()) {
      c.stats.resize(job.tensors);
      std::memcpy(c.stats.data(), pinned + job.out_offset, job.tensors * sizeof(StatsAccumulator));
      const uint64_t* counters = reinterpret_cast<const uint64_t*>(pinned + job.counters_offset);
      for (uint32_t t = 0; t < job.tensors; ++t) {
        HistogramCounts h;
        if (job.wants_histogram[t]) {
          h = HistogramCounts::Empty(options_.histogram);
          std::memcpy(h.counts.data(), counters, h.counts.size() * sizeof(uint64_t));
          counters += h.counts.size();
          h.nan_count = c.stats[t].nan_count;
          h.pos_inf_count = c.stats[t].pos_inf_count;
          h.neg_inf_count = c.stats[t].neg_inf_count;
        }
        c.histograms.push_back(std::move(h));
      }
    }
    free_slots_.push_back(job.slot);
    job.busy = false;
    return c;
  }

  // Work enqueued while the producer stream is captured into a CUDA graph
  // would become part of the user's graph: refused instead.
  static absl::Status RefuseGraphCapture(cudaStream_t producer) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    const cudaError_t e = cudaStreamIsCapturing(producer, &capture);
    if (e == cudaErrorStreamCaptureImplicit) {
      // The legacy default stream while a blocking stream is captured: it
      // may be neither waited on nor synchronized until the capture ends.
      cudaGetLastError();
      return absl::FailedPreconditionError(
          "the legacy default stream cannot be used while another stream is captured into a "
          "CUDA graph; tensors are not saved during a capture");
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      return CudaError(e, "cudaStreamIsCapturing");
    }
    if (capture != cudaStreamCaptureStatusNone) {
      return absl::FailedPreconditionError(
          "the producer stream is being captured into a CUDA graph; tensors are not saved "
          "during a capture");
    }
    return absl::OkStatus();
  }

  const DeviceStatsOptions options_;
  HistogramParams params_;
  std::string name_;
  cudaStream_t work_ = nullptr;
  cudaStream_t results_ = nullptr;
  cudaStream_t copy_ = nullptr;
  cudaMemPool_t pool_ = nullptr;
  // Serializes Collect calls (the pump's), so pieces are copied out once.
  absl::Mutex collect_mu_;
  mutable absl::Mutex mu_ ABSL_ACQUIRED_AFTER(collect_mu_);
  // Re-recorded by every enqueue: a stream wait uses the record current
  // when it is made, so one event serves every ordering.
  cudaEvent_t ready_ ABSL_GUARDED_BY(mu_) = nullptr;
  cudaEvent_t taken_ ABSL_GUARDED_BY(mu_) = nullptr;
  cudaEvent_t read_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::vector<StatsJob> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<void*> slots_ ABSL_GUARDED_BY(mu_);
  std::deque<int> free_slots_ ABSL_GUARDED_BY(mu_);
  // The ring's pinned memory is written by the device and read by Collect
  // outside mu_ while a buffer is kCopying (only Collect changes that state).
  std::vector<RingBuffer> ring_;
  std::map<uint64_t, Snapshot> snapshots_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> downloads_ ABSL_GUARDED_BY(mu_);
  uint64_t capacity_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_ticket_ ABSL_GUARDED_BY(mu_) = 0;
  int last_launches_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

absl::Status DeviceStats::Probe(int device) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat(
        "no usable CUDA driver or device (", cudaGetErrorName(e), ": ", cudaGetErrorString(e),
        "); statistics are computed on the CPU"));
  }
  if (device < 0 || device >= count) {
    return absl::UnavailableError(absl::StrCat("CUDA device ", device, " does not exist (", count,
                                               " visible); statistics are computed on the CPU"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DeviceStats>> DeviceStats::Create(
    const DeviceStatsOptions& options) {
  absl::Status probe = Probe(options.device);
  if (!probe.ok()) return probe;
  absl::Status valid = ValidateDeviceStatsOptions(options);
  if (!valid.ok()) return valid;
  auto engine = std::make_unique<CudaDeviceStats>(options);
  absl::Status init = engine->Init();
  if (!init.ok()) return init;
  return std::unique_ptr<DeviceStats>(std::move(engine));
}

}  // namespace sonde
