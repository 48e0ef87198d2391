#include "examples/mlp.h"

#include <algorithm>
#include <cmath>

namespace sonde::examples {

Mlp::Mlp(MlpConfig config) : config_(std::move(config)), rng_(config_.seed) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int in = config_.inputs, h = config_.hidden, c = config_.classes;
  for (int k = 0; k < c; ++k) {
    std::vector<float> centre(in);
    for (auto& x : centre) x = 2.0f * normal(rng_);
    centres_.push_back(centre);
  }
  const float s1 = config_.init_scale *
                   (config_.activation == "relu" ? std::sqrt(2.0f / in) : std::sqrt(1.0f / in));
  const float s2 = config_.init_scale * std::sqrt(1.0f / h);
  w1_.resize(in * h);
  for (auto& w : w1_) w = s1 * normal(rng_);
  b1_.assign(h, config_.hidden_bias);
  w2_.resize(h * c);
  for (auto& w : w2_) w = s2 * normal(rng_);
  b2_.assign(c, 0.0f);
}

float Mlp::Activate(float x) const {
  if (config_.activation == "tanh") return std::tanh(x);
  if (config_.activation == "sigmoid") return 1.0f / (1.0f + std::exp(-x));
  return x > 0 ? x : 0.0f;
}

float Mlp::ActivateGrad(float pre, float post) const {
  if (config_.activation == "tanh") return 1.0f - post * post;
  if (config_.activation == "sigmoid") return post * (1.0f - post);
  return pre > 0 ? 1.0f : 0.0f;
}

MlpStep Mlp::Step() {
  const int in = config_.inputs, h = config_.hidden, c = config_.classes, n = config_.batch;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, c - 1);
  MlpStep s;
  s.w1 = w1_;
  s.b1 = b1_;
  s.w2 = w2_;
  s.b2 = b2_;
  s.inputs.resize(n * in);
  s.labels.resize(n);
  for (int i = 0; i < n; ++i) {
    const int y = pick(rng_);
    s.labels[i] = y;
    for (int j = 0; j < in; ++j) {
      s.inputs[i * in + j] =
          config_.input_scale * (centres_[y][j] + normal(rng_)) + config_.input_shift;
    }
  }
  // Forward.
  s.activation_input.assign(n * h, 0.0f);
  s.activation_output.assign(n * h, 0.0f);
  std::vector<float> probs(n * c);
  for (int i = 0; i < n; ++i) {
    for (int k = 0; k < h; ++k) {
      float z = b1_[k];
      for (int j = 0; j < in; ++j) z += s.inputs[i * in + j] * w1_[j * h + k];
      s.activation_input[i * h + k] = z;
      s.activation_output[i * h + k] = Activate(z);
    }
    float top = -INFINITY;
    for (int k = 0; k < c; ++k) {
      float z = b2_[k];
      for (int j = 0; j < h; ++j) z += s.activation_output[i * h + j] * w2_[j * c + k];
      probs[i * c + k] = z;
      top = std::max(top, z);
    }
    float sum = 0;
    for (int k = 0; k < c; ++k) sum += probs[i * c + k] = std::exp(probs[i * c + k] - top);
    for (int k = 0; k < c; ++k) probs[i * c + k] /= sum;
    s.loss -= std::log(std::max(probs[i * c + s.labels[i]], 1e-30f)) / n;
    s.predictions.push_back(std::max_element(probs.begin() + i * c, probs.begin() + (i + 1) * c) -
                            (probs.begin() + i * c));
  }
  // Backward.
  s.g_w1.assign(in * h, 0.0f);
  s.g_b1.assign(h, 0.0f);
  s.g_w2.assign(h * c, 0.0f);
  s.g_b2.assign(c, 0.0f);
  for (int i = 0; i < n; ++i) {
    std::vector<float> dz2(c);
    for (int k = 0; k < c; ++k) dz2[k] = (probs[i * c + k] - (k == s.labels[i] ? 1.0f : 0.0f)) / n;
    for (int k = 0; k < c; ++k) {
      s.g_b2[k] += dz2[k];
      for (int j = 0; j < h; ++j) s.g_w2[j * c + k] += s.activation_output[i * h + j] * dz2[k];
    }
    for (int j = 0; j < h; ++j) {
      float da = 0;
      for (int k = 0; k < c; ++k) da += w2_[j * c + k] * dz2[k];
      const float dz1 = da * ActivateGrad(s.activation_input[i * h + j], s.activation_output[i * h + j]);
      s.g_b1[j] += dz1;
      for (int q = 0; q < in; ++q) s.g_w1[q * h + j] += s.inputs[i * in + q] * dz1;
    }
  }
  // SGD update.
  const float lr = config_.learning_rate;
  if (!config_.freeze_first_layer) {
    for (size_t k = 0; k < w1_.size(); ++k) w1_[k] -= lr * s.g_w1[k];
    for (size_t k = 0; k < b1_.size(); ++k) b1_[k] -= lr * s.g_b1[k];
  }
  for (size_t k = 0; k < w2_.size(); ++k) w2_[k] -= lr * s.g_w2[k];
  for (size_t k = 0; k < b2_.size(); ++k) b2_[k] -= lr * s.g_b2[k];
  return s;
}

}  // namespace sonde::examples
