// The stand-in training kernels of gpu_training_bench. Launchers only
// enqueue on `stream` and return the launch's cudaError_t (0: success).
#include <cuda_runtime.h>

#include <cstdint>

namespace sonde::bench {
namespace {

__device__ __forceinline__ uint64_t GlobalTimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Keeps every SM's FMA pipes busy for `ns` nanoseconds, as matrix work
// would, with almost no memory traffic.
__global__ void SpinKernel(uint64_t ns, float* sink) {
  const uint64_t start = GlobalTimer();
  float x = static_cast<float>(threadIdx.x);
  const float y = 1.0000001f;
  while (GlobalTimer() - start < ns) {
#pragma unroll
    for (int i = 0; i < 64; ++i) x = fmaf(x, y, 0.5f);
  }
  if (x == -1.0f) sink[0] = x;  // never true; keeps the loop
}

__global__ void FillKernel(float* p, uint64_t n) {
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    p[i] = 1e-3f * static_cast<float>(i % 4093) - 2.0f;
  }
}

__global__ void GradientKernel(float* g, const float* w, uint64_t n, float phase) {
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    g[i] = 1e-3f * sinf(w[i] + phase);
  }
}

__global__ void OptimizerKernel(float* w, const float* g, uint64_t n, float lr) {
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    w[i] -= lr * g[i];
  }
}

unsigned Blocks(uint64_t n, int sms) {
  const uint64_t want = (n + 255) / 256;
  const uint64_t most = static_cast<uint64_t>(sms) * 16;
  return static_cast<unsigned>(want < most ? (want > 0 ? want : 1) : most);
}

}  // namespace

int LaunchSpin(uint64_t ns, int sms, float* sink, void* stream) {
  SpinKernel<<<sms * 4, 256, 0, static_cast<cudaStream_t>(stream)>>>(ns, sink);
  return static_cast<int>(cudaGetLastError());
}

int LaunchFill(float* p, uint64_t n, int sms, void* stream) {
  FillKernel<<<Blocks(n, sms), 256, 0, static_cast<cudaStream_t>(stream)>>>(p, n);
  return static_cast<int>(cudaGetLastError());
}

int LaunchGradients(float* g, const float* w, uint64_t n, float phase, int sms, void* stream) {
  GradientKernel<<<Blocks(n, sms), 256, 0, static_cast<cudaStream_t>(stream)>>>(g, w, n, phase);
  return static_cast<int>(cudaGetLastError());
}

int LaunchOptimizer(float* w, const float* g, uint64_t n, float lr, int sms, void* stream) {
  OptimizerKernel<<<Blocks(n, sms), 256, 0, static_cast<cudaStream_t>(stream)>>>(w, g, n, lr);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace sonde::bench
