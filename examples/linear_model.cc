#include "examples/linear_model.h"

#include <cmath>

namespace sonde::examples {

StepOutput LinearModel::Step() {
  constexpr float kBeta1 = 0.9f;
  constexpr float kBeta2 = 0.999f;
  constexpr float kEpsilon = 1e-8f;
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  StepOutput out;
  out.weight = w_;
  float loss = 0;
  std::array<float, 2> grad{0, 0};
  for (int i = 0; i < batch_; ++i) {
    const float x0 = uniform(rng_) * scale_;
    const float x1 = uniform(rng_) * scale_;
    const float y = x0 * 1.0f + x1 * 1.0f;
    const float err = x0 * w_[0] + x1 * w_[1] - y;
    loss += err * err;
    grad[0] += 2.0f * err * x0;
    grad[1] += 2.0f * err * x1;
  }
  out.loss = loss / static_cast<float>(batch_);
  for (float& g : grad) g /= static_cast<float>(batch_);
  out.gradient = grad;
  ++t_;
  const float lr_t = lr_ * std::sqrt(1.0f - std::pow(kBeta2, static_cast<float>(t_))) /
                     (1.0f - std::pow(kBeta1, static_cast<float>(t_)));
  for (int k = 0; k < 2; ++k) {
    m_[k] += (grad[k] - m_[k]) * (1.0f - kBeta1);
    v_[k] += (grad[k] * grad[k] - v_[k]) * (1.0f - kBeta2);
    w_[k] -= lr_t * m_[k] / (std::sqrt(v_[k]) + kEpsilon);
  }
  return out;
}

}  // namespace sonde::examples
