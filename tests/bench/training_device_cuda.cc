// The CUDA stand-in: the kernels of training_kernels.cu on a stream of its
// own. Errors end the benchmark (it is not training code).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cuda/device_stats.h"
#include "tests/bench/training_device.h"

namespace sonde::bench {

int LaunchSpin(uint64_t ns, int sms, float* sink, void* stream);
int LaunchFill(float* p, uint64_t n, int sms, void* stream);
int LaunchGradients(float* g, const float* w, uint64_t n, float phase, int sms, void* stream);
int LaunchOptimizer(float* w, const float* g, uint64_t n, float lr, int sms, void* stream);

namespace {

void Check(int e, const char* what) {
  if (e != 0) {
    std::fprintf(stderr, "gpu_training_bench: %s: %s\n", what,
                 cudaGetErrorString(static_cast<cudaError_t>(e)));
    std::exit(2);
  }
}

class CudaTrainingDevice final : public TrainingDevice {
 public:
  CudaTrainingDevice() {
    cudaDeviceProp prop;
    Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    name_ = prop.name;
    sms_ = prop.multiProcessorCount;
    Check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    Check(cudaMalloc(reinterpret_cast<void**>(&sink_), sizeof(float)), "cudaMalloc");
  }
  ~CudaTrainingDevice() override {
    cudaStreamSynchronize(stream_);
    for (void* p : buffers_) cudaFree(p);
    cudaFree(sink_);
    cudaStreamDestroy(stream_);
  }
  float* Alloc(size_t floats) override {
    void* p = nullptr;
    Check(cudaMalloc(&p, floats * sizeof(float)), "cudaMalloc");
    buffers_.push_back(p);
    Check(LaunchFill(static_cast<float*>(p), floats, sms_, stream_), "fill");
    Check(cudaStreamSynchronize(stream_), "fill");
    return static_cast<float*>(p);
  }
  void Compute(double ms) override {
    Check(LaunchSpin(static_cast<uint64_t>(ms * 1e6), sms_, sink_, stream_), "compute");
  }
  void Gradients(float* grads, const float* weights, size_t n, int64_t step) override {
    Check(LaunchGradients(grads, weights, n, 1e-3f * static_cast<float>(step), sms_, stream_),
          "gradients");
  }
  void Optimizer(float* weights, const float* grads, size_t n, float lr) override {
    Check(LaunchOptimizer(weights, grads, n, lr, sms_, stream_), "optimizer");
  }
  void CopyToHost(void* host, const float* device, size_t floats) override {
    Check(cudaMemcpyAsync(host, device, floats * sizeof(float), cudaMemcpyDeviceToHost, stream_),
          "cudaMemcpyAsync");
  }
  void Sync() override { Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }
  void* stream() override { return stream_; }
  std::string Name() const override { return name_; }
  bool is_gpu() const override { return true; }

 private:
  std::string name_;
  int sms_ = 1;
  cudaStream_t stream_ = nullptr;
  float* sink_ = nullptr;
  std::vector<void*> buffers_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TrainingDevice>> MakeCudaTrainingDevice() {
  absl::Status probe = DeviceStats::Probe(0);
  if (!probe.ok()) return probe;
  return std::unique_ptr<TrainingDevice>(new CudaTrainingDevice());
}

}  // namespace sonde::bench
