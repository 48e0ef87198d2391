// A small real network for examples and rule tests: input -> dense ->
// activation (relu, tanh or sigmoid) -> dense -> softmax cross-entropy,
// trained with SGD on a synthetic classification task (Gaussian blobs, one
// per class). Knobs reproduce classic failures: a huge learning rate, a
// bad initialisation (dead ReLUs, saturated tanh), a frozen first layer.
// Every tensor a debugger would save is exposed after each step.
// Not thread-safe.
#ifndef SONDE_EXAMPLES_MLP_H_
#define SONDE_EXAMPLES_MLP_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace sonde::examples {

struct MlpConfig {
  int inputs = 8;
  int hidden = 32;
  int classes = 3;
  int batch = 64;
  std::string activation = "relu";  // "relu", "tanh" or "sigmoid"
  float learning_rate = 0.05f;
  float init_scale = 1.0f;   // multiplies the He/Xavier initial weights
  float hidden_bias = 0.0f;  // initial bias of the hidden layer
  float input_scale = 1.0f;  // multiplies the inputs (unnormalised data)
  float input_shift = 0.0f;  // added to the inputs
  bool freeze_first_layer = false;
  uint64_t seed = 7;
};

// Row-major tensors of one step (values before the update).
struct MlpStep {
  std::vector<float> inputs;            // [batch, inputs]
  std::vector<int64_t> labels;          // [batch]
  std::vector<float> w1, b1, w2, b2;    // [inputs, hidden], [hidden], [hidden, classes], [classes]
  std::vector<float> g_w1, g_b1, g_w2, g_b2;
  std::vector<float> activation_input;   // [batch, hidden] (pre-activation)
  std::vector<float> activation_output;  // [batch, hidden]
  std::vector<int64_t> predictions;      // [batch] argmax
  float loss = 0;
};

class Mlp {
 public:
  explicit Mlp(MlpConfig config);
  const MlpConfig& config() const { return config_; }
  // One SGD step on a fresh batch.
  MlpStep Step();

 private:
  float Activate(float x) const;
  float ActivateGrad(float pre, float post) const;

  MlpConfig config_;
  std::mt19937_64 rng_;
  std::vector<std::vector<float>> centres_;  // one per class
  std::vector<float> w1_, b1_, w2_, b2_;
};

}  // namespace sonde::examples

#endif  // SONDE_EXAMPLES_MLP_H_
