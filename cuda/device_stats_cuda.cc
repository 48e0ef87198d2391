// The device path over the CUDA runtime (linked statically; the runtime
// loads the driver when first called, so a machine without one gets an
// error status here rather than a failure to start).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <deque>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/dtype.h"
#include "cuda/device_stats.h"
#include "cuda/multi_tensor.h"
#include "cuda/stats_kernels.h"

namespace sonde {
namespace {

absl::Status CudaError(cudaError_t e, absl::string_view what) {
  return absl::UnavailableError(
      absl::StrCat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

#define SONDE_CUDA_RETURN(expr, what)            \
  do {                                           \
    const cudaError_t sonde_e = (expr);          \
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

// Makes `device` current for the scope and restores the caller's device.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }

 private:
  int previous_ = -1;
};

struct Job {
  enum Kind { kIdle, kStats, kCopy } kind = kIdle;
  uint64_t ticket = 0;
  cudaEvent_t ready = nullptr;
  cudaEvent_t done = nullptr;
  // Stats: the pinned slot and the layout of its download area.
  int slot = -1;
  uint32_t tensors = 0;
  uint64_t out_offset = 0;
  uint64_t counters_offset = 0;
  std::vector<uint8_t> wants_histogram;
  // Copy: staging buffers in order, bytes in total.
  std::vector<int> staging;
  uint64_t bytes = 0;
  v1::DType copy_dtype = v1::DTYPE_UNSPECIFIED;
};

class CudaDeviceStats final : public DeviceStats {
 public:
  explicit CudaDeviceStats(const DeviceStatsOptions& options) : options_(options) {}

  ~CudaDeviceStats() override {
    Drain().IgnoreError();
    DeviceScope scope(options_.device);
    absl::MutexLock lock(&mu_);
    for (Job& job : jobs_) {
      if (job.ready) cudaEventDestroy(job.ready);
      if (job.done) cudaEventDestroy(job.done);
    }
    for (void* p : slots_) cudaFreeHost(p);
    for (void* p : staging_) cudaFreeHost(p);
    if (stream_) cudaStreamDestroy(stream_);
  }

  absl::Status Init() {
    DeviceScope scope(options_.device);
    absl::MutexLock lock(&mu_);
    params_ = MakeHistogramParams(options_.histogram);
    cudaDeviceProp prop;
    SONDE_CUDA_RETURN(cudaGetDeviceProperties(&prop, options_.device), "cudaGetDeviceProperties");
    name_ = prop.name;
    SONDE_CUDA_RETURN(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                      "cudaStreamCreateWithFlags");
    // Keep freed stream-ordered memory in the pool rather than returning it
    // to the driver at every synchronization.
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, options_.device) == cudaSuccess) {
      uint64_t threshold = UINT64_MAX;
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
    }
    const int job_count = options_.batch_slots + options_.staging_buffers;
    jobs_.resize(job_count);
    for (Job& job : jobs_) {
      SONDE_CUDA_RETURN(cudaEventCreateWithFlags(&job.ready, cudaEventDisableTiming),
                        "cudaEventCreate");
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
    for (int i = 0; i < options_.staging_buffers; ++i) {
      void* p = nullptr;
      SONDE_CUDA_RETURN(cudaHostAlloc(&p, options_.staging_bytes, cudaHostAllocDefault),
                        "cudaHostAlloc (staging)");
      staging_.push_back(p);
      free_staging_.push_back(i);
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
    const uint64_t partials_bytes = AlignUp(std::max<size_t>(plan.chunks.size(), 1) *
                                            sizeof(StatsAccumulator));

    DeviceScope scope(options_.device);
    absl::MutexLock lock(&mu_);
    if (free_slots_.empty()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "all ", options_.batch_slots, " device statistics batches are still in flight"));
    }
    Job* job = FreeJob();
    if (job == nullptr) return absl::ResourceExhaustedError("no free device job record");
    const int slot = free_slots_.front();
    uint8_t* pinned = static_cast<uint8_t*>(slots_[slot]);
    std::memcpy(pinned, plan.tensors.data(), plan.tensors.size() * sizeof(KernelTensor));
    std::memcpy(pinned + tensors_bytes, plan.chunks.data(),
                plan.chunks.size() * sizeof(KernelChunk));

    cudaStream_t producer = static_cast<cudaStream_t>(producer_stream);
    SONDE_CUDA_RETURN(cudaEventRecord(job->ready, producer), "cudaEventRecord");
    SONDE_CUDA_RETURN(cudaStreamWaitEvent(stream_, job->ready, 0), "cudaStreamWaitEvent");
    // Device layout: [tensors][chunks][out][counters][partials].
    uint8_t* dev = nullptr;
    const uint64_t dev_bytes = upload + out_bytes + counters_bytes + partials_bytes;
    SONDE_CUDA_RETURN(cudaMallocAsync(reinterpret_cast<void**>(&dev), dev_bytes, stream_),
                      "cudaMallocAsync");
    SONDE_CUDA_RETURN(cudaMemcpyAsync(dev, pinned, upload, cudaMemcpyHostToDevice, stream_),
                      "cudaMemcpyAsync (tables)");
    if (counters_bytes > 0) {
      SONDE_CUDA_RETURN(cudaMemsetAsync(dev + upload + out_bytes, 0, counters_bytes, stream_),
                        "cudaMemsetAsync");
    }
    const int launched = LaunchStatsBatch(
        reinterpret_cast<const KernelTensor*>(dev), static_cast<uint32_t>(plan.tensors.size()),
        reinterpret_cast<const KernelChunk*>(dev + tensors_bytes),
        static_cast<uint32_t>(plan.chunks.size()), params_,
        reinterpret_cast<StatsAccumulator*>(dev + upload + out_bytes + counters_bytes),
        reinterpret_cast<unsigned long long*>(dev + upload + out_bytes),
        reinterpret_cast<StatsAccumulator*>(dev + upload), stream_);
    if (launched != 0) {
      cudaFreeAsync(dev, stream_);
      return CudaError(static_cast<cudaError_t>(launched), "statistics kernel launch");
    }
    SONDE_CUDA_RETURN(cudaMemcpyAsync(pinned + upload, dev + upload, out_bytes + counters_bytes,
                                      cudaMemcpyDeviceToHost, stream_),
                      "cudaMemcpyAsync (results)");
    SONDE_CUDA_RETURN(cudaFreeAsync(dev, stream_), "cudaFreeAsync");
    SONDE_CUDA_RETURN(cudaEventRecord(job->done, stream_), "cudaEventRecord");
    // Training may not overwrite the tensors before the kernels have read
    // them: its stream waits for ours (on the device, not the host).
    SONDE_CUDA_RETURN(cudaStreamWaitEvent(producer, job->done, 0), "cudaStreamWaitEvent");

    free_slots_.pop_front();
    job->kind = Job::kStats;
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

  absl::StatusOr<uint64_t> EnqueueCopy(const DeviceTensorRef& tensor, v1::DType transfer_dtype,
                                       void* producer_stream) override {
    if (transfer_dtype == v1::DTYPE_UNSPECIFIED) transfer_dtype = tensor.dtype;
    const bool convert = transfer_dtype != tensor.dtype;
    if (convert && ((tensor.dtype != v1::DTYPE_F32 && tensor.dtype != v1::DTYPE_F64) ||
                    (transfer_dtype != v1::DTYPE_F32 && transfer_dtype != v1::DTYPE_F16 &&
                     transfer_dtype != v1::DTYPE_BF16))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device conversion goes from F32/F64 to F32/F16/BF16, not ", DTypeName(tensor.dtype),
          " to ", DTypeName(transfer_dtype)));
    }
    const size_t src_size = DTypeSize(tensor.dtype);
    const size_t dst_size = DTypeSize(transfer_dtype);
    if (src_size == 0 || dst_size == 0) {
      return absl::InvalidArgumentError(absl::StrCat("cannot copy dtype ", DTypeName(tensor.dtype)));
    }
    const uint64_t bytes = tensor.count * dst_size;
    const uint64_t buffers = std::max<uint64_t>(
        1, (bytes + options_.staging_bytes - 1) / options_.staging_bytes);

    DeviceScope scope(options_.device);
    absl::MutexLock lock(&mu_);
    if (buffers > free_staging_.size()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "copying ", bytes, " bytes needs ", buffers, " staging buffers of ",
          options_.staging_bytes, " bytes; ", free_staging_.size(), " of ",
          options_.staging_buffers, " are free"));
    }
    Job* job = FreeJob();
    if (job == nullptr) return absl::ResourceExhaustedError("no free device job record");
    cudaStream_t producer = static_cast<cudaStream_t>(producer_stream);
    SONDE_CUDA_RETURN(cudaEventRecord(job->ready, producer), "cudaEventRecord");
    SONDE_CUDA_RETURN(cudaStreamWaitEvent(stream_, job->ready, 0), "cudaStreamWaitEvent");
    const uint8_t* source = static_cast<const uint8_t*>(tensor.data);
    void* converted = nullptr;
    if (convert && bytes > 0) {
      SONDE_CUDA_RETURN(cudaMallocAsync(&converted, bytes, stream_), "cudaMallocAsync");
      const int e = LaunchConvert(tensor.data, KernelDTypeOf(tensor.dtype), converted,
                                  KernelDTypeOf(transfer_dtype), tensor.count, stream_);
      if (e != 0) {
        cudaFreeAsync(converted, stream_);
        return CudaError(static_cast<cudaError_t>(e), "conversion kernel launch");
      }
      source = static_cast<const uint8_t*>(converted);
    }
    std::vector<int> used;
    for (uint64_t i = 0; i < buffers; ++i) {
      used.push_back(free_staging_.front());
      free_staging_.pop_front();
    }
    for (uint64_t i = 0; i < buffers && bytes > 0; ++i) {
      const uint64_t offset = i * options_.staging_bytes;
      const uint64_t n = std::min<uint64_t>(options_.staging_bytes, bytes - offset);
      const cudaError_t e = cudaMemcpyAsync(staging_[used[i]], source + offset, n,
                                            cudaMemcpyDeviceToHost, stream_);
      if (e != cudaSuccess) {
        for (int b : used) free_staging_.push_back(b);
        return CudaError(e, "cudaMemcpyAsync (tensor)");
      }
    }
    if (converted != nullptr) cudaFreeAsync(converted, stream_);
    SONDE_CUDA_RETURN(cudaEventRecord(job->done, stream_), "cudaEventRecord");
    SONDE_CUDA_RETURN(cudaStreamWaitEvent(producer, job->done, 0), "cudaStreamWaitEvent");
    job->kind = Job::kCopy;
    job->ticket = ++last_ticket_;
    job->staging = std::move(used);
    job->bytes = bytes;
    job->copy_dtype = transfer_dtype;
    return job->ticket;
  }

  std::vector<DeviceCompletion> Collect() override {
    DeviceScope scope(options_.device);
    absl::MutexLock lock(&mu_);
    std::vector<DeviceCompletion> done;
    for (Job& job : jobs_) {
      if (job.kind == Job::kIdle) continue;
      const cudaError_t e = cudaEventQuery(job.done);
      if (e == cudaErrorNotReady) continue;
      done.push_back(Finish(job, e));
    }
    std::sort(done.begin(), done.end(), [](const DeviceCompletion& a, const DeviceCompletion& b) {
      return a.ticket < b.ticket;
    });
    return done;
  }

  absl::Status Drain() override {
    DeviceScope scope(options_.device);
    if (stream_ == nullptr) return absl::OkStatus();
    const cudaError_t e = cudaStreamSynchronize(stream_);
    return e == cudaSuccess ? absl::OkStatus() : CudaError(e, "cudaStreamSynchronize");
  }

  int LastBatchLaunches() const override {
    absl::MutexLock lock(&mu_);
    return last_launches_;
  }
  std::string DeviceName() const override { return name_; }

 private:
  Job* FreeJob() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (Job& job : jobs_) {
      if (job.kind == Job::kIdle) return &job;
    }
    return nullptr;
  }

  DeviceCompletion Finish(Job& job, cudaError_t e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    DeviceCompletion c;
    c.ticket = job.ticket;
    if (e != cudaSuccess) c.status = CudaError(e, "device work failed");
    if (job.kind == Job::kStats) {
      const uint8_t* pinned = static_cast<const uint8_t*>(slots_[job.slot]);
      if (c.status.ok()) {
        c.stats.resize(job.tensors);
        std::memcpy(c.stats.data(), pinned + job.out_offset,
                    job.tensors * sizeof(StatsAccumulator));
        const uint64_t* counters =
            reinterpret_cast<const uint64_t*>(pinned + job.counters_offset);
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
    } else {
      if (c.status.ok()) {
        c.bytes.resize(job.bytes);
        for (size_t i = 0; i < job.staging.size(); ++i) {
          const uint64_t offset = i * options_.staging_bytes;
          const uint64_t n = std::min<uint64_t>(options_.staging_bytes, job.bytes - offset);
          if (n > 0 && offset < job.bytes) std::memcpy(&c.bytes[offset], staging_[job.staging[i]], n);
        }
        c.copy_dtype = job.copy_dtype;
      }
      for (int b : job.staging) free_staging_.push_back(b);
      job.staging.clear();
    }
    job.kind = Job::kIdle;
    return c;
  }

  const DeviceStatsOptions options_;
  HistogramParams params_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  mutable absl::Mutex mu_;
  std::vector<Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<void*> slots_ ABSL_GUARDED_BY(mu_);
  std::deque<int> free_slots_ ABSL_GUARDED_BY(mu_);
  std::vector<void*> staging_ ABSL_GUARDED_BY(mu_);
  std::deque<int> free_staging_ ABSL_GUARDED_BY(mu_);
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
    return absl::UnavailableError(absl::StrCat("CUDA device ", device, " does not exist (",
                                               count, " visible); statistics are computed on the CPU"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DeviceStats>> DeviceStats::Create(
    const DeviceStatsOptions& options) {
  absl::Status probe = Probe(options.device);
  if (!probe.ok()) return probe;
  if (options.batch_slots < 1 || options.staging_buffers < 0 || options.slot_bytes < 4096) {
    return absl::InvalidArgumentError("device statistics options out of range");
  }
  absl::Status spec = options.histogram.kind == kHistogramNone ? absl::OkStatus()
                                                               : ValidateSpec(options.histogram);
  if (!spec.ok()) return spec;
  auto engine = std::make_unique<CudaDeviceStats>(options);
  absl::Status init = engine->Init();
  if (!init.ok()) return init;
  return std::unique_ptr<DeviceStats>(std::move(engine));
}

}  // namespace sonde
