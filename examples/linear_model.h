// The seed blog's training program in C++: fit y = x . w0 (w0 = [1, 1]) with
// a 2-D linear model from w = [10, 10], mean squared error, and Adam in
// float32 with TensorFlow's fused update (v += (g*g - v) * (1 - beta2)).
// With lr=100 and inputs scaled by 1e11 the squared gradient overflows to
// inf at step 0, inf - inf makes v NaN at step 1, and the weights and loss
// are NaN from step 2, as in the blog's log. Not thread-safe.
#ifndef SONDE_EXAMPLES_LINEAR_MODEL_H_
#define SONDE_EXAMPLES_LINEAR_MODEL_H_

#include <array>
#include <cstdint>
#include <random>
#include <vector>

namespace sonde::examples {

struct StepOutput {
  float loss = 0;
  std::array<float, 2> weight{};    // before the update
  std::array<float, 2> gradient{};
};

class LinearModel {
 public:
  LinearModel(float lr, float scale, int batch, uint64_t seed)
      : lr_(lr), scale_(scale), batch_(batch), rng_(seed) {}

  // One optimisation step on a fresh random batch.
  StepOutput Step();

 private:
  const float lr_;
  const float scale_;
  const int batch_;
  std::mt19937_64 rng_;
  std::array<float, 2> w_{10.0f, 10.0f};
  std::array<float, 2> m_{0, 0};
  std::array<float, 2> v_{0, 0};
  int t_ = 0;
};

}  // namespace sonde::examples

#endif  // SONDE_EXAMPLES_LINEAR_MODEL_H_
