// The device a benchmark's training loop runs on: a stand-in for a real
// framework's kernels, in CUDA (a GPU) or in host memory (the emulated
// engine, so the benchmark's checks also run where there is no GPU).
// Every operation is ordered on one stream; Sync waits for it, as
// `loss.item()` does once per step in a PyTorch loop.
#ifndef SONDE_TESTS_BENCH_TRAINING_DEVICE_H_
#define SONDE_TESTS_BENCH_TRAINING_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace sonde::bench {

class TrainingDevice {
 public:
  virtual ~TrainingDevice() = default;
  // `floats` of device memory, filled with a deterministic pattern.
  virtual float* Alloc(size_t floats) = 0;
  // The matrix work of a step: about `ms` milliseconds of compute that
  // occupies every SM (no memory traffic to speak of).
  virtual void Compute(double ms) = 0;
  // Backward's output: grads[i] = f(weights[i], step).
  virtual void Gradients(float* grads, const float* weights, size_t n, int64_t step) = 0;
  // The optimizer: weights -= lr * grads.
  virtual void Optimizer(float* weights, const float* grads, size_t n, float lr) = 0;
  // Copies device memory to host memory, ordered on the stream.
  virtual void CopyToHost(void* host, const float* device, size_t floats) = 0;
  virtual void Sync() = 0;
  virtual void* stream() = 0;  // cudaStream_t, or null
  virtual std::string Name() const = 0;
  virtual bool is_gpu() const = 0;
};

// CUDA device 0, or Unavailable saying why (no toolkit in the build, no
// driver, no device).
absl::StatusOr<std::unique_ptr<TrainingDevice>> MakeCudaTrainingDevice();
// Host memory and loops, for the emulated engine.
std::unique_ptr<TrainingDevice> MakeHostTrainingDevice();

}  // namespace sonde::bench

#endif  // SONDE_TESTS_BENCH_TRAINING_DEVICE_H_
