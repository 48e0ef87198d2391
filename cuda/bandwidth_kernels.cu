// The baseline gpu_check compares the statistics kernels with: a plain
// read-only reduction (a sum) over the same bytes, with 16-byte loads,
// several in flight per thread and a grid of a few waves, as a good
// memory-bound kernel reads; with the data it reads and a delay that lets
// the host queue a timed region before it starts. Launchers return the
// launch's cudaError_t.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace sonde {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

__device__ __forceinline__ float Sum4(const uint4& v, int32_t dtype) {
  if (dtype == 1) {  // F32
    return __uint_as_float(v.x) + __uint_as_float(v.y) + __uint_as_float(v.z) +
           __uint_as_float(v.w);
  }
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
  float s = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint16_t lo = static_cast<uint16_t>(words[i] & 0xffff);
    const uint16_t hi = static_cast<uint16_t>(words[i] >> 16);
    if (dtype == 2) {  // F16
      s += __half2float(__ushort_as_half(lo)) + __half2float(__ushort_as_half(hi));
    } else {  // BF16
      s += __uint_as_float(static_cast<uint32_t>(lo) << 16) +
           __uint_as_float(static_cast<uint32_t>(hi) << 16);
    }
  }
  return s;
}

// Sums `words` 16-byte words; the tail (bytes % 16) is left out, which a
// bandwidth baseline can afford.
__global__ void ReadSumKernel(const uint4* p, uint64_t words, int32_t dtype, float* out) {
  float s = 0;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * kThreads * kUnroll;
  for (uint64_t base = blockIdx.x * static_cast<uint64_t>(kThreads) * kUnroll + threadIdx.x;
       base < words; base += stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint64_t i = base + static_cast<uint64_t>(u) * kThreads;
      v[u] = i < words ? __ldg(p + i) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) s += Sum4(v[u], dtype);
  }
  for (int offset = 16; offset > 0; offset /= 2) s += __shfl_down_sync(0xffffffffu, s, offset);
  __shared__ float warps[kThreads / 32];
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    float t = 0;
    for (int w = 0; w < kThreads / 32; ++w) t += warps[w];
    atomicAdd(out, t);
  }
}

// Deterministic pseudo-normal data (a sum of four hashed uniforms, scaled
// like weights: sd 0.02), so that timings see ordinary values spread over
// histogram bins, not one repeated value.
__device__ __forceinline__ uint32_t Hash(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

__global__ void FillKernel(void* p, uint64_t count, int32_t dtype, uint64_t seed) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < count;
       i += stride) {
    const uint64_t h = (seed + i) * 4;
    float u = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) u += Hash(h + k) * (1.0f / 4294967296.0f);
    const float v = (u - 2.0f) * 1.7320508f * 0.02f;  // mean 0, sd 0.02
    if (dtype == 1) {
      static_cast<float*>(p)[i] = v;
    } else if (dtype == 2) {
      static_cast<__half*>(p)[i] = __float2half_rn(v);
    } else {
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
    }
  }
}

// Holds its stream for `ns` nanoseconds of the device's clock, so that the
// host can queue what is timed next before the start event is reached.
// Bounded by the SM's cycle counter too (about 2^33 cycles, seconds at any
// clock), should the global timer not advance.
__global__ void DelayKernel(uint64_t ns) {
  uint64_t start, now;
  const long long cycles = clock64();
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns && clock64() - cycles < (1ll << 33));
}

}  // namespace

int LaunchDelay(uint64_t ns, void* stream) {
  DelayKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(ns);
  return static_cast<int>(cudaGetLastError());
}

int LaunchFill(void* data, uint64_t count, int32_t dtype, uint64_t seed, void* stream) {
  if (count == 0) return 0;
  FillKernel<<<4096, 256, 0, static_cast<cudaStream_t>(stream)>>>(data, count, dtype, seed);
  return static_cast<int>(cudaGetLastError());
}

int LaunchReadSum(const void* data, uint64_t bytes, int32_t dtype, int sms, float* out,
                  void* stream) {
  const uint64_t words = bytes / 16;
  if (words == 0) return 0;
  const uint64_t per_block = static_cast<uint64_t>(kThreads) * kUnroll;
  uint64_t blocks = (words + per_block - 1) / per_block;
  const uint64_t waves = static_cast<uint64_t>(sms) * 8;  // 8 blocks an SM at 256 threads
  if (blocks > waves) blocks = waves;
  ReadSumKernel<<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint4*>(data), words, dtype, out);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace sonde
