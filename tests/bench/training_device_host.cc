// The host stand-in: loops over host memory, "compute" as a sleep.
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/time/clock.h"
#include "tests/bench/training_device.h"

namespace sonde::bench {
namespace {

class HostTrainingDevice final : public TrainingDevice {
 public:
  float* Alloc(size_t floats) override {
    buffers_.emplace_back(floats);
    std::vector<float>& b = buffers_.back();
    for (size_t i = 0; i < floats; ++i) b[i] = 1e-3f * static_cast<float>(i % 4093) - 2.0f;
    return b.data();
  }
  void Compute(double ms) override { absl::SleepFor(absl::Microseconds(ms * 1000)); }
  void Gradients(float* grads, const float* weights, size_t n, int64_t step) override {
    const float phase = 1e-3f * static_cast<float>(step);
    for (size_t i = 0; i < n; ++i) grads[i] = 1e-3f * std::sin(weights[i] + phase);
  }
  void Optimizer(float* weights, const float* grads, size_t n, float lr) override {
    for (size_t i = 0; i < n; ++i) weights[i] -= lr * grads[i];
  }
  void CopyToHost(void* host, const float* device, size_t floats) override {
    std::memcpy(host, device, floats * sizeof(float));
  }
  void Sync() override {}
  void* stream() override { return nullptr; }
  std::string Name() const override { return "host memory (emulated device engine)"; }
  bool is_gpu() const override { return false; }

 private:
  std::vector<std::vector<float>> buffers_;
};

}  // namespace

std::unique_ptr<TrainingDevice> MakeHostTrainingDevice() {
  return std::make_unique<HostTrainingDevice>();
}

}  // namespace sonde::bench
