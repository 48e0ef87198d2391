#include "rules/stats_rules.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "stats/statistics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "rules/builtin_rules.h"

namespace sonde::rules {
namespace {

using ::sonde::testing::IsOk;
using ::sonde::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// ---------------------------------------------------------------------------
// A tiny fully connected network trained by gradient descent on a squared
// error, recording what a Sonde hook would save: every hidden layer's
// pre-activation ("fc<l>/relu_input" or "fc<l>/sigmoid_input"), the
// per-sample losses ("MSELoss_output_0", collection "losses") and every
// parameter's gradient ("gradient/fc<l>.weight", "gradient/fc<l>.bias",
// collection "gradients"), in that order.

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  double Uniform() { return (static_cast<double>(gen_() >> 11) + 0.5) / 9007199254740992.0; }
  double Normal() {  // Box-Muller: same numbers on every standard library
    return std::sqrt(-2 * std::log(Uniform())) * std::cos(2 * M_PI * Uniform());
  }

 private:
  std::mt19937_64 gen_;
};

struct Dataset {
  std::vector<std::vector<double>> x;
  std::vector<double> y;
};

// y = sin(x0) + 0.5 x1 - x2 x3 / 2 + noise, x ~ N(0, 1)^4. random_targets:
// y ~ N(0, 1) unrelated to x (only memorisable).
Dataset MakeData(int n, uint64_t seed, double noise = 0, bool random_targets = false,
                 double target_scale = 1) {
  Rng rng(seed);
  Dataset d;
  for (int i = 0; i < n; ++i) {
    std::vector<double> x(4);
    for (double& v : x) v = rng.Normal();
    double y = std::sin(x[0]) + 0.5 * x[1] - 0.5 * x[2] * x[3];
    if (random_targets) y = rng.Normal();
    d.x.push_back(x);
    d.y.push_back(target_scale * y + noise * rng.Normal());
  }
  return d;
}

struct NetConfig {
  std::vector<int> sizes = {4, 16, 16, 1};  // input, hidden..., output
  bool sigmoid = false;                     // else ReLU
  std::vector<double> init_scale;           // per layer, times He/Glorot; default 1
  double hidden_bias = 0;
  uint64_t seed = 1;
};

// Raw values of one step, as floats (what the client would send).
struct StepValues {
  std::vector<std::vector<float>> pre;  // per hidden layer, [n, width]
  std::vector<float> losses;            // per sample
  std::vector<std::vector<float>> grad_w, grad_b;
  double loss = 0;  // mean, in double
  std::vector<std::vector<double>> exact_grad_w,
      exact_grad_b;  // for the update
};

class Net {
 public:
  explicit Net(NetConfig c) : c_(std::move(c)) {
    Rng rng(c_.seed);
    const size_t layers = c_.sizes.size() - 1;
    for (size_t l = 0; l < layers; ++l) {
      const int in = c_.sizes[l], out = c_.sizes[l + 1];
      const double std = c_.sigmoid ? std::sqrt(2.0 / (in + out)) : std::sqrt(2.0 / in);
      const double scale = l < c_.init_scale.size() ? c_.init_scale[l] : 1.0;
      std::vector<double> w(static_cast<size_t>(in) * out);
      for (double& v : w) v = scale * std * rng.Normal();
      w_.push_back(w);
      b_.push_back(std::vector<double>(out, l + 1 < layers ? c_.hidden_bias : 0.0));
    }
  }

  // Forward (and, if `backward`, backward) pass over the whole dataset.
  StepValues Run(const Dataset& d, bool backward = true) const {
    const size_t layers = w_.size(), n = d.x.size();
    std::vector<std::vector<std::vector<double>>> a(layers + 1), z(layers);
    a[0] = d.x;
    StepValues out;
    for (size_t l = 0; l < layers; ++l) {
      const int in = c_.sizes[l], width = c_.sizes[l + 1];
      const bool hidden = l + 1 < layers;
      std::vector<float> pre;
      for (size_t s = 0; s < n; ++s) {
        std::vector<double> zs(width), as(width);
        for (int i = 0; i < width; ++i) {
          double v = b_[l][i];
          for (int j = 0; j < in; ++j) v += w_[l][i * in + j] * a[l][s][j];
          zs[i] = v;
          as[i] = !hidden ? v : c_.sigmoid ? 1 / (1 + std::exp(-v)) : std::max(0.0, v);
          if (hidden) pre.push_back(static_cast<float>(v));
        }
        z[l].push_back(zs);
        a[l + 1].push_back(as);
      }
      if (hidden) out.pre.push_back(pre);
    }
    std::vector<std::vector<double>> delta(n, std::vector<double>(1));
    for (size_t s = 0; s < n; ++s) {
      const double e = a[layers][s][0] - d.y[s];
      out.losses.push_back(static_cast<float>(e * e));
      out.loss += e * e / n;
      delta[s][0] = 2 * e / n;
    }
    if (!backward) return out;
    out.grad_w.resize(layers);
    out.grad_b.resize(layers);
    out.exact_grad_w.resize(layers);
    out.exact_grad_b.resize(layers);
    for (size_t l = layers; l-- > 0;) {
      const int in = c_.sizes[l], width = c_.sizes[l + 1];
      std::vector<double> gw(static_cast<size_t>(in) * width, 0), gb(width, 0);
      for (size_t s = 0; s < n; ++s) {
        for (int i = 0; i < width; ++i) {
          gb[i] += delta[s][i];
          for (int j = 0; j < in; ++j) gw[i * in + j] += delta[s][i] * a[l][s][j];
        }
      }
      out.exact_grad_w[l] = gw;
      out.exact_grad_b[l] = gb;
      out.grad_w[l].assign(gw.begin(), gw.end());
      out.grad_b[l].assign(gb.begin(), gb.end());
      if (l == 0) break;
      std::vector<std::vector<double>> prev(n, std::vector<double>(in, 0));
      for (size_t s = 0; s < n; ++s) {
        for (int j = 0; j < in; ++j) {
          double v = 0;
          for (int i = 0; i < width; ++i) v += w_[l][i * in + j] * delta[s][i];
          const double zz = z[l - 1][s][j];
          const double sig = 1 / (1 + std::exp(-zz));
          prev[s][j] = v * (c_.sigmoid ? sig * (1 - sig) : (zz > 0 ? 1.0 : 0.0));
        }
      }
      delta = prev;
    }
    return out;
  }

  // One gradient-descent step with the gradients of `v`.
  void Update(const StepValues& v, double lr) {
    for (size_t l = 0; l < w_.size(); ++l) {
      for (size_t i = 0; i < w_[l].size(); ++i) w_[l][i] -= lr * v.exact_grad_w[l][i];
      for (size_t i = 0; i < b_[l].size(); ++i) b_[l][i] -= lr * v.exact_grad_b[l][i];
    }
  }

  const NetConfig& config() const { return c_; }

 private:
  NetConfig c_;
  std::vector<std::vector<double>> w_, b_;
};

// ---------------------------------------------------------------------------
// Records and steps.

v1::TensorRecord Tensor(const std::string& name, const std::vector<float>& values,
                        std::vector<std::string> collections = {}, int32_t worker = 0) {
  v1::TensorRecord r;
  r.set_tensor_name(name);
  r.set_worker(worker);
  r.set_dtype(v1::DTYPE_F32);
  r.add_shape(static_cast<int64_t>(values.size()));
  for (auto& c : collections) r.add_collections(c);
  *r.mutable_statistics() = *ComputeStatistics(
      std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4), v1::DTYPE_F32);
  return r;
}

v1::TensorRecord Loss(float value, int32_t worker = 0, const std::string& name = "loss") {
  return Tensor(name, {value}, {"losses"}, worker);
}

StepData Step(int64_t step, std::vector<v1::TensorRecord> tensors, v1::Mode mode = v1::MODE_TRAIN,
              std::optional<int64_t> mode_step = std::nullopt) {
  StepData d;
  d.step = step;
  d.mode = mode;
  d.mode_step = mode_step.value_or(step);
  d.tensors = std::move(tensors);
  for (auto& t : d.tensors) {
    t.set_step(step);
    t.set_mode(mode);
    t.set_mode_step(d.mode_step);
  }
  return d;
}

// One tensor a hook would save, with its raw values.
struct RawTensor {
  std::string name;
  std::vector<float> values;
  std::vector<std::string> collections;
};

// What a hook saves for one step of `net`, in recording order.
std::vector<RawTensor> RawTensors(const Net& net, const StepValues& v) {
  std::vector<RawTensor> out;
  for (size_t l = 0; l < v.pre.size(); ++l) {
    out.push_back({absl::StrCat("fc", l, net.config().sigmoid ? "/sigmoid_input" : "/relu_input"),
                   v.pre[l],
                   {}});
  }
  out.push_back({"MSELoss_output_0", v.losses, {"losses"}});
  for (size_t l = 0; l < v.grad_w.size(); ++l) {
    out.push_back({absl::StrCat("gradient/fc", l, ".weight"), v.grad_w[l], {"gradients"}});
    out.push_back({absl::StrCat("gradient/fc", l, ".bias"), v.grad_b[l], {"gradients"}});
  }
  return out;
}

std::vector<v1::TensorRecord> Record(const Net& net, const StepValues& v) {
  std::vector<v1::TensorRecord> out;
  for (const RawTensor& t : RawTensors(net, v)) {
    out.push_back(Tensor(t.name, t.values, t.collections));
  }
  return out;
}

// Trains `net` on `data` for `steps` full-batch steps; returns each step's
// raw values (before its update) and the recorded steps.
struct Trace {
  std::vector<StepValues> values;
  std::vector<StepData> steps;
};

Trace Train(Net& net, const Dataset& data, int steps, double lr) {
  Trace run;
  for (int s = 0; s < steps; ++s) {
    StepValues v = net.Run(data);
    run.steps.push_back(Step(s, Record(net, v)));
    run.values.push_back(v);
    net.Update(v, lr);
  }
  return run;
}

const RuleFactory& Factory() {
  static const RuleFactory* factory = BuiltinRuleFactory().release();
  return *factory;
}

absl::StatusOr<std::unique_ptr<Rule>> Create(const std::string& type,
                                             std::map<std::string, std::string> params = {}) {
  v1::RuleSpec spec;
  spec.set_rule_type(type);
  for (auto& [k, v] : params) (*spec.mutable_parameters())[k] = v;
  return Factory().Create(spec);
}

std::unique_ptr<Rule> Make(const std::string& type,
                           std::map<std::string, std::string> params = {}) {
  auto rule = Create(type, std::move(params));
  EXPECT_THAT(rule, IsOk());
  return rule.ok() ? std::move(*rule) : nullptr;
}

struct Fired {
  size_t index;  // into the steps fed
  Finding finding;
};

// Feeds steps in order until the rule fires.
std::optional<Fired> FirstFiring(Rule& rule, const std::vector<StepData>& steps) {
  for (size_t i = 0; i < steps.size(); ++i) {
    auto r = rule.OnStep(steps[i]);
    EXPECT_THAT(r, IsOk());
    if (r.ok() && r->has_value()) return Fired{i, **r};
  }
  return std::nullopt;
}

std::optional<Finding> Feed(Rule& rule, const StepData& step) {
  auto r = rule.OnStep(step);
  EXPECT_THAT(r, IsOk());
  return r.ok() ? *r : std::nullopt;
}

double AbsMean(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += std::fabs(x);
  return s / v.size();
}

double Variance(const std::vector<float>& v) {
  double m = 0, s = 0;
  for (float x : v) m += x;
  m /= v.size();
  for (float x : v) s += (x - m) * (x - m);
  return s / v.size();
}

double Norm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// n samples of `d` from `from` on, wrapping around.
Dataset Slice(const Dataset& d, size_t from, size_t n) {
  Dataset out;
  for (size_t i = 0; i < n; ++i) {
    out.x.push_back(d.x[(from + i) % d.x.size()]);
    out.y.push_back(d.y[(from + i) % d.y.size()]);
  }
  return out;
}

// Minibatch SGD: each step uses the next `batch` samples of `data`.
Trace TrainMinibatches(Net& net, const Dataset& data, size_t batch, int steps, double lr) {
  Trace run;
  for (int s = 0; s < steps; ++s) {
    StepValues v = net.Run(Slice(data, s * batch, batch));
    run.steps.push_back(Step(s, Record(net, v)));
    run.values.push_back(v);
    net.Update(v, lr);
  }
  return run;
}

// Epochs of one TRAIN step (then the update) and one EVAL step.
struct Epochs {
  std::vector<StepData> steps;  // TRAIN, EVAL, TRAIN, EVAL, ...
  std::vector<double> train, eval;
};

Epochs TrainAndEvaluate(Net& net, const Dataset& train, const Dataset& eval, int epochs,
                        double lr) {
  Epochs out;
  for (int e = 0; e < epochs; ++e) {
    StepValues v = net.Run(train);
    out.steps.push_back(Step(2 * e, Record(net, v), v1::MODE_TRAIN, e));
    out.train.push_back(v.loss);
    net.Update(v, lr);
    StepValues ev = net.Run(eval, /*backward=*/false);
    out.steps.push_back(Step(2 * e + 1, Record(net, ev), v1::MODE_EVAL, e));
    out.eval.push_back(ev.loss);
  }
  return out;
}

NetConfig Healthy() { return NetConfig(); }  // He-initialised ReLU, 4-16-16-1

NetConfig DeepSigmoid() {
  NetConfig c;
  c.sizes = {4, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 1};
  c.sigmoid = true;
  return c;
}

NetConfig Linear() {
  NetConfig c;
  c.sizes = {4, 1};
  return c;
}

StepData TrainStep(int64_t step, std::vector<v1::TensorRecord> tensors) {
  return Step(step, std::move(tensors), v1::MODE_TRAIN);
}

// Loss-only steps: TRAIN step i has loss losses[i].
std::vector<StepData> LossSteps(const std::vector<float>& losses, v1::Mode mode = v1::MODE_TRAIN) {
  std::vector<StepData> out;
  for (size_t i = 0; i < losses.size(); ++i) {
    out.push_back(Step(static_cast<int64_t>(i), {Loss(losses[i])}, mode));
  }
  return out;
}

// ===========================================================================
// VanishingGradient

TEST(VanishingGradient, FiresAtTheFirstStepOfADeepSigmoidNetwork) {
  Net net(DeepSigmoid());
  Trace run = Train(net, MakeData(32, 7), 1, 0.1);
  std::vector<std::string> expected;  // from the raw values
  int gradients = 0;
  for (const RawTensor& t : RawTensors(net, run.values[0])) {
    if (t.collections != std::vector<std::string>{"gradients"}) continue;
    ++gradients;
    if (AbsMean(t.values) < 1e-7) expected.push_back(t.name);
  }
  ASSERT_GE(expected.size(), 3u);
  ASSERT_EQ(expected[0], "gradient/fc0.weight");
  const double abs_mean = AbsMean(run.values[0].grad_w[0]);

  auto rule = Make("VanishingGradient");
  std::optional<Finding> f = Feed(*rule, run.steps[0]);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->tensors, expected);
  EXPECT_NEAR(f->observed, abs_mean, 1e-6 * abs_mean);
  EXPECT_EQ(f->threshold, 1e-7);
  EXPECT_EQ(f->message,
            absl::StrFormat("gradient 'gradient/fc0.weight' at TRAIN step 0 has mean |g| %.3g, "
                            "below threshold 1e-07 (%d of %d gradients are)",
                            abs_mean, expected.size(), gradients));
}

TEST(VanishingGradient, FiresAtTheStepALinearModelsGradientsFallBelowTheThreshold) {
  Net net(Linear());
  Trace run = Train(net, MakeData(32, 7, 0.3), 80, 0.1);
  // The first step where a gradient's mean |g|, from the raw values, is < 1e-3.
  std::optional<size_t> expected;
  for (size_t s = 0; s < run.values.size() && !expected.has_value(); ++s) {
    for (const RawTensor& t : RawTensors(net, run.values[s])) {
      if (t.collections == std::vector<std::string>{"gradients"} && AbsMean(t.values) < 1e-3) {
        expected = s;
      }
    }
  }
  ASSERT_TRUE(expected.has_value());
  ASSERT_GT(*expected, 30u);  // the gradients shrink as the model converges

  auto rule = Make("VanishingGradient", {{"threshold", "1e-3"}});
  std::optional<Fired> fired = FirstFiring(*rule, run.steps);
  ASSERT_TRUE(fired.has_value());
  EXPECT_EQ(fired->index, *expected);
  EXPECT_EQ(fired->finding.tensors, std::vector<std::string>{"gradient/fc0.weight"});
  EXPECT_LT(fired->finding.observed, 1e-3);
}

TEST(VanishingGradient, QuietWhileAHeInitialisedReluNetworkTrains) {
  Net net(Healthy());
  Trace run = Train(net, MakeData(32, 7), 40, 0.05);
  auto rule = Make("VanishingGradient");
  EXPECT_FALSE(FirstFiring(*rule, run.steps).has_value());
}

TEST(VanishingGradient, ReadsGradientsByCollectionOrNameAndSkipsTensorsWithoutFiniteValues) {
  auto rule = Make("VanishingGradient");
  const std::vector<float> zeros(8, 0.0f);
  EXPECT_FALSE(Feed(*rule, TrainStep(0, {Tensor("fc.weight", zeros, {"weights"})})).has_value());
  EXPECT_FALSE(
      Feed(*rule, TrainStep(1, {Tensor("gradient/fc.weight", {kNaN, kInf}, {"gradients"})}))
          .has_value());
  // TensorFlow's name, no collection.
  std::optional<Finding> f = Feed(*rule, TrainStep(2, {Tensor("gradients/dense/kernel", zeros)}));
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->tensors, std::vector<std::string>{"gradients/dense/kernel"});
  EXPECT_EQ(f->observed, 0);
}

TEST(VanishingGradient, RejectsAThresholdThatIsNotAPositiveNumber) {
  EXPECT_THAT(Create("VanishingGradient", {{"threshold", "0"}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "VanishingGradient: threshold=0 must be positive"));
  EXPECT_THAT(Create("VanishingGradient", {{"threshold", "tiny"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "threshold='tiny' is not a number"));
  EXPECT_THAT(Create("VanishingGradient", {{"threshold", "inf"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "must be a finite number"));
  EXPECT_THAT(Create("VanishingGradient", {{"collection_names", "gradients"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown parameter 'collection_names'"));
}

// ===========================================================================
// AllZero

TEST(AllZero, RequiresCollectionNamesOrTensorRegexAndAPercentage) {
  EXPECT_THAT(Create("AllZero"), StatusIs(absl::StatusCode::kInvalidArgument,
                                          "AllZero: give collection_names or tensor_regex"));
  EXPECT_THAT(Create("AllZero", {{"threshold", "50"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "give collection_names"));
  EXPECT_THAT(Create("AllZero", {{"tensor_regex", "w"}, {"threshold", "150"}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "threshold=150 must be a percentage in (0, 100]"));
  EXPECT_THAT(Create("AllZero", {{"tensor_regex", "w"}, {"threshold", "0"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "(0, 100]"));
  EXPECT_THAT(Create("AllZero", {{"tensor_regex", "(w"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a valid RE2 pattern"));
}

TEST(AllZero, FiresOnTheGradientsOfANetworkWhoseReLUsAreAllDead) {
  NetConfig c = Healthy();
  c.hidden_bias = -10;  // every hidden pre-activation is negative
  Net net(c);
  Trace run = Train(net, MakeData(32, 7), 1, 0.05);
  auto rule = Make("AllZero", {{"collection_names", "gradients"}});
  std::optional<Finding> f = Feed(*rule, run.steps[0]);
  ASSERT_TRUE(f.has_value());
  // Only the output bias, fed by the error directly, still gets a gradient.
  EXPECT_THAT(f->tensors,
              ElementsAre("gradient/fc0.weight", "gradient/fc0.bias", "gradient/fc1.weight",
                          "gradient/fc1.bias", "gradient/fc2.weight"));
  EXPECT_EQ(f->observed, 100);
  EXPECT_EQ(f->threshold, 100);
  EXPECT_EQ(f->message,
            "tensor 'gradient/fc0.weight' at TRAIN step 0 is 100% zeros (64 of 64 "
            "values), at "
            "least threshold 100%; also 'gradient/fc0.bias', 'gradient/fc1.weight', "
            "'gradient/fc1.bias', 'gradient/fc2.weight'");
}

TEST(AllZero, QuietOnTheGradientsOfAHealthyNetwork) {
  Net net(Healthy());
  Trace run = Train(net, MakeData(32, 7), 20, 0.05);
  auto rule = Make("AllZero", {{"collection_names", "gradients"}});
  EXPECT_FALSE(FirstFiring(*rule, run.steps).has_value());
}

TEST(AllZero, ThresholdIsAPercentageOfAllValuesNaNIncluded) {
  const std::vector<float> three_of_four = {0, 0, -0.0f, 1.5f};
  auto at75 = Make("AllZero", {{"tensor_regex", "^w$"}, {"threshold", "75"}});
  // "w2" is not selected, though all zero.
  EXPECT_FALSE(Feed(*at75, TrainStep(0, {Tensor("w2", {0, 0})})).has_value());
  std::optional<Finding> f = Feed(*at75, TrainStep(1, {Tensor("w", three_of_four)}));
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->observed, 75);
  EXPECT_EQ(f->threshold, 75);
  EXPECT_THAT(f->message, HasSubstr("is 75% zeros (3 of 4 values)"));

  auto at80 = Make("AllZero", {{"tensor_regex", "^w$"}, {"threshold", "80"}});
  EXPECT_FALSE(Feed(*at80, TrainStep(0, {Tensor("w", three_of_four)})).has_value());
  auto all = Make("AllZero", {{"tensor_regex", "^w$"}});
  EXPECT_FALSE(Feed(*all, TrainStep(0, {Tensor("w", {0, 0, 0, kNaN})})).has_value());
  EXPECT_FALSE(Feed(*all, TrainStep(1, {Tensor("w", {})})).has_value());
  EXPECT_TRUE(Feed(*all, TrainStep(2, {Tensor("w", {0, -0.0f})})).has_value());
}

// ===========================================================================
// TensorVariance

TEST(TensorVariance, RequiresASelectorAndAtLeastOneThreshold) {
  EXPECT_THAT(Create("TensorVariance", {{"max_threshold", "1"}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "TensorVariance: give collection_names or tensor_regex"));
  EXPECT_THAT(Create("TensorVariance", {{"tensor_regex", "x"}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "TensorVariance: give max_threshold or min_threshold (or both)"));
  EXPECT_THAT(Create("TensorVariance", {{"tensor_regex", "x"}, {"max_threshold", "None"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "give max_threshold or min_threshold"));
  EXPECT_THAT(
      Create("TensorVariance",
             {{"tensor_regex", "x"}, {"max_threshold", "1"}, {"min_threshold", "2"}}),
      StatusIs(absl::StatusCode::kInvalidArgument, "min_threshold=2 is above max_threshold=1"));
  EXPECT_THAT(Create("TensorVariance", {{"tensor_regex", "x"}, {"max_threshold", "big"}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "parameter max_threshold='big' is not a number"));
  EXPECT_THAT(Create("TensorVariance", {{"collection_names", "weights"}, {"min_threshold", "0"}}),
              IsOk());
}

TEST(TensorVariance, FiresOnTheActivationInputsOfAnOverscaledLayer) {
  NetConfig c = Healthy();
  c.init_scale = {1, 10, 1};  // the second layer's weights start 10x too large
  Net net(c);
  Trace run = Train(net, MakeData(32, 7), 1, 0.05);
  ASSERT_LT(Variance(run.values[0].pre[0]), 10);
  const double variance = Variance(run.values[0].pre[1]);
  ASSERT_GT(variance, 10);

  auto rule = Make("TensorVariance", {{"tensor_regex", "relu_input"}, {"max_threshold", "10"}});
  std::optional<Finding> f = Feed(*rule, run.steps[0]);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->tensors, std::vector<std::string>{"fc1/relu_input"});
  EXPECT_NEAR(f->observed, variance, 1e-6 * variance);
  EXPECT_EQ(f->threshold, 10);
  EXPECT_EQ(f->message, absl::StrFormat("tensor 'fc1/relu_input' at TRAIN step 0 has variance "
                                        "%.4g, above max_threshold 10",
                                        f->observed));
}

TEST(TensorVariance, FiresWhenAConvergingModelsGradientVarianceFallsBelowMinThreshold) {
  Net net(Linear());
  Trace run = Train(net, MakeData(32, 7, 0.3), 80, 0.1);
  std::optional<size_t> expected;  // from the raw values
  for (size_t s = 0; s < run.values.size() && !expected.has_value(); ++s) {
    if (Variance(run.values[s].grad_w[0]) < 1e-6) expected = s;
  }
  ASSERT_TRUE(expected.has_value());
  ASSERT_GT(*expected, 10u);

  // min only ("None" is SageMaker's spelling of not set).
  auto rule = Make("TensorVariance", {{"collection_names", "gradients"},
                                      {"tensor_regex", "weight"},
                                      {"max_threshold", "None"},
                                      {"min_threshold", "1e-6"}});
  // Selected by collection as well: the one-element bias gradient has
  // variance 0, so the rule fires at once...
  std::optional<Fired> at_once = FirstFiring(*rule, run.steps);
  ASSERT_TRUE(at_once.has_value());
  EXPECT_EQ(at_once->index, 0u);
  EXPECT_EQ(at_once->finding.tensors, std::vector<std::string>{"gradient/fc0.bias"});
  // ...while the regex alone picks the weight gradient.
  auto weights = Make("TensorVariance", {{"tensor_regex", "weight"}, {"min_threshold", "1e-6"}});
  std::optional<Fired> fired = FirstFiring(*weights, run.steps);
  ASSERT_TRUE(fired.has_value());
  EXPECT_EQ(fired->index, *expected);
  EXPECT_EQ(fired->finding.threshold, 1e-6);
  EXPECT_THAT(fired->finding.message, HasSubstr("below min_threshold 1e-06"));
}

TEST(TensorVariance, QuietWhileActivationInputsStayWithinBounds) {
  Net net(Healthy());
  Trace run = Train(net, MakeData(32, 7), 20, 0.05);
  auto rule =
      Make("TensorVariance",
           {{"tensor_regex", "relu_input"}, {"max_threshold", "10"}, {"min_threshold", "0.1"}});
  EXPECT_FALSE(FirstFiring(*rule, run.steps).has_value());
}

// ===========================================================================
// Overfit

TEST(Overfit, FiresWhenANetworkMemorisesItsTrainingSet) {
  NetConfig c = Healthy();
  c.sizes = {4, 32, 32, 1};
  Net net(c);
  // 8 training samples with random targets: only memorisable.
  Epochs run = TrainAndEvaluate(net, MakeData(8, 11, 0, true), MakeData(64, 12, 0, true), 20, 0.05);
  auto ratio = [&](int e) { return (run.eval[e] - run.train[e]) / run.train[e]; };
  ASSERT_GT(ratio(0), 0.1);                               // noise at the start...
  ASSERT_LT(ratio(1), 0.1);                               // ...ends the streak...
  for (int e = 2; e <= 4; ++e) ASSERT_GT(ratio(e), 0.1);  // ...then the gap only grows

  auto rule = Make("Overfit", {{"patience", "3"}});
  std::optional<Fired> fired = FirstFiring(*rule, run.steps);
  ASSERT_TRUE(fired.has_value());
  EXPECT_EQ(fired->index, 9u);  // EVAL step 4
  EXPECT_NEAR(fired->finding.observed, ratio(4), 1e-5 * ratio(4));
  EXPECT_GT(fired->finding.observed, 1);  // eval loss over twice the train loss
  EXPECT_EQ(fired->finding.threshold, 0.1);
  EXPECT_EQ(fired->finding.tensors, std::vector<std::string>{"MSELoss_output_0"});
  EXPECT_THAT(fired->finding.message, HasSubstr("at step 9 (EVAL step 4) vs TRAIN loss"));
  EXPECT_THAT(fired->finding.message, HasSubstr("for 3 consecutive evaluation(s)"));
}

TEST(Overfit, QuietWhenAModelTooSmallToMemoriseIsEvaluated) {
  Net net(Linear());
  Epochs run = TrainAndEvaluate(net, MakeData(256, 11, 0.3), MakeData(256, 12, 0.3), 100, 0.1);
  for (size_t e = 0; e < run.eval.size(); ++e) {
    ASSERT_LT((run.eval[e] - run.train[e]) / run.train[e], 0.1) << e;
  }
  auto rule = Make("Overfit");
  EXPECT_FALSE(FirstFiring(*rule, run.steps).has_value());
}

TEST(Overfit, PatienceCountsConsecutiveEvaluationsAboveTheRatio) {
  auto rule = Make("Overfit", {{"patience", "2"}});
  // Ratios 0.2, 0.05 (ends the streak), 0.2, 0.3.
  const std::vector<StepData> steps = {
      Step(0, {Loss(1.0f)}, v1::MODE_TRAIN, 0), Step(1, {Loss(1.2f)}, v1::MODE_EVAL, 0),
      Step(2, {Loss(1.0f)}, v1::MODE_TRAIN, 1), Step(3, {Loss(1.05f)}, v1::MODE_EVAL, 1),
      Step(4, {Loss(1.0f)}, v1::MODE_TRAIN, 2), Step(5, {Loss(1.2f)}, v1::MODE_EVAL, 2),
      Step(6, {Loss(1.0f)}, v1::MODE_TRAIN, 3), Step(7, {Loss(1.3f)}, v1::MODE_EVAL, 3),
  };
  std::optional<Fired> fired = FirstFiring(*rule, steps);
  ASSERT_TRUE(fired.has_value());
  EXPECT_EQ(fired->index, 7u);
  EXPECT_NEAR(fired->finding.observed, 0.3, 1e-6);
  EXPECT_EQ(fired->finding.tensors, std::vector<std::string>{"loss"});
  EXPECT_EQ(fired->finding.message,
            "EVAL loss 1.3 at step 7 (EVAL step 3) vs TRAIN loss 1 at step 6: "
            "(eval - train) / train = 0.3, above ratio_threshold 0.1 for 2 "
            "consecutive "
            "evaluation(s)");
}

TEST(Overfit, IgnoresStepsBeforeStartStep) {
  auto rule = Make("Overfit", {{"start_step", "10"}});
  EXPECT_FALSE(Feed(*rule, Step(0, {Loss(1.0f)}, v1::MODE_TRAIN, 0)).has_value());
  EXPECT_FALSE(Feed(*rule, Step(1, {Loss(5.0f)}, v1::MODE_EVAL, 0)).has_value());
  EXPECT_FALSE(Feed(*rule, Step(8, {Loss(0.5f)}, v1::MODE_TRAIN, 1)).has_value());
  // No train loss from step 10 on yet (step 8's 0.5 would make this 1.0).
  EXPECT_FALSE(Feed(*rule, Step(10, {Loss(1.0f)}, v1::MODE_EVAL, 1)).has_value());
  EXPECT_FALSE(Feed(*rule, Step(11, {Loss(1.0f)}, v1::MODE_TRAIN, 2)).has_value());
  EXPECT_FALSE(Feed(*rule, Step(12, {Loss(1.05f)}, v1::MODE_EVAL, 2)).has_value());
  std::optional<Finding> f = Feed(*rule, Step(13, {Loss(1.25f)}, v1::MODE_EVAL, 3));
  ASSERT_TRUE(f.has_value());
  EXPECT_NEAR(f->observed, 0.25, 1e-6);
}

TEST(Overfit, AveragesTheWorkersLossesAndTensorRegexPicksTheLoss) {
  const std::vector<StepData> steps = {
      Step(0, {Loss(1.0f, 0), Loss(3.0f, 1), Loss(100.0f, 0, "aux_loss")}, v1::MODE_TRAIN, 0),
      Step(1, {Loss(2.1f, 0), Loss(2.1f, 1), Loss(100.0f, 0, "aux_loss")}, v1::MODE_EVAL, 0),
      Step(2, {Loss(2.5f, 0), Loss(2.5f, 1), Loss(100.0f, 0, "aux_loss")}, v1::MODE_EVAL, 1),
  };
  auto rule = Make("Overfit", {{"tensor_regex", "^loss$"}});
  std::optional<Fired> fired = FirstFiring(*rule, steps);
  ASSERT_TRUE(fired.has_value());
  EXPECT_EQ(fired->index, 2u);  // (2.5 - 2) / 2; 2.1 was 5% above
  EXPECT_NEAR(fired->finding.observed, 0.25, 1e-6);
  EXPECT_THAT(fired->finding.message, HasSubstr("EVAL loss 2.5 at step 2 (EVAL step 1) vs "
                                                "TRAIN loss 2 at step 0"));
  // By default the whole losses collection counts: aux_loss swamps the gap.
  auto all = Make("Overfit");
  EXPECT_FALSE(FirstFiring(*all, steps).has_value());
}

TEST(Overfit, NeedsATrainLossAndSkipsNonFiniteLosses) {
  auto rule = Make("Overfit");
  EXPECT_FALSE(Feed(*rule, Step(0, {Loss(5.0f)}, v1::MODE_EVAL, 0)).has_value());
  EXPECT_FALSE(Feed(*rule, Step(1, {Loss(kNaN)}, v1::MODE_TRAIN, 0)).has_value());
  EXPECT_FALSE(Feed(*rule, Step(2, {Loss(5.0f)}, v1::MODE_EVAL, 1)).has_value());
  EXPECT_FALSE(Feed(*rule, Step(3, {Loss(1.0f)}, v1::MODE_TRAIN, 1)).has_value());
  EXPECT_FALSE(Feed(*rule, Step(4, {Loss(kInf)}, v1::MODE_EVAL, 2)).has_value());
  EXPECT_FALSE(Feed(*rule, Step(5, {Loss(9.0f)}, v1::MODE_GLOBAL, 5)).has_value());
  std::optional<Finding> f = Feed(*rule, Step(6, {Loss(1.5f)}, v1::MODE_EVAL, 3));
  ASSERT_TRUE(f.has_value());
  EXPECT_NEAR(f->observed, 0.5, 1e-6);
}

TEST(Overfit, RejectsBadParameters) {
  EXPECT_THAT(Create("Overfit", {{"patience", "0"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "patience=0 must be at least 1"));
  EXPECT_THAT(Create("Overfit", {{"start_step", "-1"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "start_step=-1 must be at least 0"));
  EXPECT_THAT(Create("Overfit", {{"ratio_threshold", "-0.5"}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "Overfit: ratio_threshold=-0.5 must be at least 0"));
  EXPECT_THAT(Create("Overfit", {{"tensor_regex", "("}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a valid RE2 pattern"));
}

// ===========================================================================
// Overtraining

TEST(Overtraining, FiresWhenTheTrainLossStopsImprovingByDelta) {
  auto rule = Make("Overtraining");
  // 0.95 improves on 1.0 by more than 0.01; then 5 steps improve by less.
  std::optional<Fired> fired =
      FirstFiring(*rule, LossSteps({1.0f, 0.95f, 0.945f, 0.944f, 0.943f, 0.942f, 0.941f, 0.5f}));
  ASSERT_TRUE(fired.has_value());
  EXPECT_EQ(fired->index, 6u);
  EXPECT_EQ(fired->finding.observed, 5);
  EXPECT_EQ(fired->finding.threshold, 5);
  EXPECT_EQ(fired->finding.message,
            "TRAIN loss has not improved by more than delta=0.01 for 5 saved steps "
            "(patience_train=5): best 0.95 at TRAIN step 1, now 0.941 at TRAIN step "
            "6");
}

TEST(Overtraining, AnImprovementBeyondDeltaRestartsTheCount) {
  auto rule = Make("Overtraining", {{"patience_train", "3"}, {"delta", "0.1"}});
  // 1.0; 0.95 0.92 (count 2); 0.85 improves; 0.8 0.78 0.76 (count 3).
  std::optional<Fired> fired =
      FirstFiring(*rule, LossSteps({1.0f, 0.95f, 0.92f, 0.85f, 0.8f, 0.78f, 0.76f}));
  ASSERT_TRUE(fired.has_value());
  EXPECT_EQ(fired->index, 6u);
  EXPECT_THAT(fired->finding.message, HasSubstr("best 0.85 at TRAIN step 3"));
}

TEST(Overtraining, ValidationHasItsOwnPatienceAndGlobalCountsAsTraining) {
  // EVAL flat at 0.5 while TRAIN keeps improving.
  std::vector<StepData> steps;
  for (int i = 0; i < 12; ++i) {
    steps.push_back(Step(2 * i, {Loss(2.0f - 0.1f * i)}, v1::MODE_TRAIN, i));
    steps.push_back(Step(2 * i + 1, {Loss(0.5f)}, v1::MODE_EVAL, i));
  }
  auto rule = Make("Overtraining");
  std::optional<Fired> fired = FirstFiring(*rule, steps);
  ASSERT_TRUE(fired.has_value());
  EXPECT_EQ(fired->index, 21u);  // EVAL step 10: 10 saved steps after the best
  EXPECT_THAT(fired->finding.message,
              HasSubstr("EVAL loss has not improved by more than delta=0.01 "
                        "for 10 saved steps "
                        "(patience_validation=10)"));
  auto short_patience = Make("Overtraining", {{"patience_validation", "3"}});
  fired = FirstFiring(*short_patience, steps);
  ASSERT_TRUE(fired.has_value());
  EXPECT_EQ(fired->index, 7u);  // EVAL step 3

  auto global = Make("Overtraining");
  fired = FirstFiring(*global, LossSteps({1, 1, 1, 1, 1, 1}, v1::MODE_GLOBAL));
  ASSERT_TRUE(fired.has_value());
  EXPECT_EQ(fired->index, 5u);
  EXPECT_THAT(fired->finding.message, HasSubstr("GLOBAL loss has not improved"));
  auto predict = Make("Overtraining");
  EXPECT_FALSE(
      FirstFiring(*predict, LossSteps({1, 1, 1, 1, 1, 1, 1}, v1::MODE_PREDICT)).has_value());
}

TEST(Overtraining, NonFiniteLossesNeverImprove) {
  auto rule = Make("Overtraining");
  std::optional<Fired> fired = FirstFiring(*rule, LossSteps({1.0f, kNaN, kInf, kNaN, kNaN, kNaN}));
  ASSERT_TRUE(fired.has_value());
  EXPECT_EQ(fired->index, 5u);
}

TEST(Overtraining, FiresOnceALinearModelHasConverged) {
  Net net(Linear());
  Trace run = Train(net, MakeData(256, 11, 0.3), 100, 0.1);
  auto rule = Make("Overtraining");
  std::optional<Fired> fired = FirstFiring(*rule, run.steps);
  ASSERT_TRUE(fired.has_value());
  const size_t s = fired->index;
  ASSERT_GE(s, 10u);
  EXPECT_GT(run.values[0].loss - run.values[s - 5].loss,
            0.01);  // it was learning
  EXPECT_LT(run.values[s - 5].loss - run.values[s].loss,
            0.01);  // it no longer is
  EXPECT_THAT(fired->finding.message, HasSubstr("TRAIN loss has not improved by more than "
                                                "delta=0.01 for 5 saved steps"));
}

TEST(Overtraining, QuietWhileANetworkKeepsLearning) {
  Net net(Healthy());
  Trace run = Train(net, MakeData(32, 7), 40, 0.05);
  auto rule = Make("Overtraining");
  EXPECT_FALSE(FirstFiring(*rule, run.steps).has_value());
}

TEST(Overtraining, RejectsBadParameters) {
  EXPECT_THAT(Create("Overtraining", {{"patience_train", "0"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "patience_train=0 must be at least 1"));
  EXPECT_THAT(
      Create("Overtraining", {{"patience_validation", "-3"}}),
      StatusIs(absl::StatusCode::kInvalidArgument, "patience_validation=-3 must be at least 1"));
  EXPECT_THAT(
      Create("Overtraining", {{"delta", "-0.1"}}),
      StatusIs(absl::StatusCode::kInvalidArgument, "Overtraining: delta=-0.1 must be at least 0"));
  EXPECT_THAT(Create("Overtraining", {{"patience", "5"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown parameter 'patience'"));
}

// ===========================================================================
// PoorWeightInitialization

TEST(PoorWeightInitialization, FiresWhenActivationInputVariancesAreFarApart) {
  NetConfig c = Healthy();
  c.init_scale = {1, 10, 1};
  Net net(c);
  Trace run = Train(net, MakeData(32, 7), 1, 0.05);
  const double ratio = Variance(run.values[0].pre[1]) / Variance(run.values[0].pre[0]);
  ASSERT_GT(ratio, 10);

  auto rule = Make("PoorWeightInitialization");
  std::optional<Finding> f = Feed(*rule, run.steps[0]);
  ASSERT_TRUE(f.has_value());
  EXPECT_THAT(f->tensors, ElementsAre("fc1/relu_input", "fc0/relu_input"));
  EXPECT_NEAR(f->observed, ratio, 1e-6 * ratio);
  EXPECT_EQ(f->threshold, 10);
  EXPECT_THAT(f->message, HasSubstr("activation inputs at TRAIN step 0 differ in variance by"));
  EXPECT_THAT(f->message, HasSubstr("(largest 'fc1/relu_input' "));
  EXPECT_THAT(f->message, HasSubstr("smallest 'fc0/relu_input' "));
  EXPECT_THAT(f->message, HasSubstr("above threshold 10"));
}

TEST(PoorWeightInitialization, FiresOnAGradientWithAlmostNoSpread) {
  Net net(DeepSigmoid());  // no relu_input tensors: the variance check has
                           // nothing to compare
  Trace run = Train(net, MakeData(32, 7), 1, 0.1);
  std::string expected;  // from the raw values
  double range = 0;
  for (const RawTensor& t : RawTensors(net, run.values[0])) {
    if (t.collections != std::vector<std::string>{"gradients"} || t.values.size() < 2) continue;
    auto [lo, hi] = std::minmax_element(t.values.begin(), t.values.end());
    if (static_cast<double>(*hi) - *lo < 0.001) {
      expected = t.name;
      range = static_cast<double>(*hi) - *lo;
      break;
    }
  }
  ASSERT_EQ(expected, "gradient/fc0.weight");

  auto rule = Make("PoorWeightInitialization");
  std::optional<Finding> f = Feed(*rule, run.steps[0]);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->tensors, std::vector<std::string>{expected});
  EXPECT_DOUBLE_EQ(f->observed, range);
  EXPECT_EQ(f->threshold, 0.001);
  EXPECT_THAT(f->message, HasSubstr("gradient 'gradient/fc0.weight' at TRAIN step 0 spans only"));
  EXPECT_THAT(f->message, HasSubstr("below distribution_range 0.001"));
}

TEST(PoorWeightInitialization, FiresWhenTheLossDoesNotFallInTheFirstSteps) {
  Net net(Healthy());
  Trace run = Train(net, MakeData(32, 7), 10, /*lr=*/0);  // a frozen network
  auto rule = Make("PoorWeightInitialization");
  std::optional<Fired> fired = FirstFiring(*rule, run.steps);
  ASSERT_TRUE(fired.has_value());
  EXPECT_EQ(fired->index,
            5u);  // five saved steps after the lowest loss, step 0
  EXPECT_EQ(fired->finding.observed, 5);
  EXPECT_EQ(fired->finding.threshold, 5);
  EXPECT_EQ(fired->finding.tensors, std::vector<std::string>{"MSELoss_output_0"});
  EXPECT_THAT(fired->finding.message,
              HasSubstr("loss has not decreased for 5 saved steps within the first 10 steps "
                        "(patience 5): lowest "));
}

TEST(PoorWeightInitialization, QuietOnAHeInitialisedReluNetwork) {
  Net net(Healthy());
  Trace run = Train(net, MakeData(32, 7), 15, 0.05);
  auto rule = Make("PoorWeightInitialization");
  EXPECT_FALSE(FirstFiring(*rule, run.steps).has_value());
}

TEST(PoorWeightInitialization, LooksOnlyAtTheFirstStepsOfTraining) {
  NetConfig c = Healthy();
  c.init_scale = {1, 10, 1};
  Net net(c);
  const StepValues v = net.Run(MakeData(32, 7));
  auto rule = Make("PoorWeightInitialization");
  EXPECT_FALSE(Feed(*rule, Step(0, Record(net, v), v1::MODE_EVAL, 0)).has_value());
  EXPECT_FALSE(Feed(*rule, Step(10, Record(net, v), v1::MODE_TRAIN, 10)).has_value());
  EXPECT_TRUE(Feed(*rule, Step(11, Record(net, v), v1::MODE_GLOBAL, 9)).has_value());

  // With steps=3 a frozen loss cannot outlast patience=5 inside the window.
  Net frozen(Healthy());
  Trace run = Train(frozen, MakeData(32, 7), 10, 0);
  auto short_window = Make("PoorWeightInitialization", {{"steps", "3"}});
  EXPECT_FALSE(FirstFiring(*short_window, run.steps).has_value());
  auto short_patience = Make("PoorWeightInitialization", {{"steps", "3"}, {"patience", "2"}});
  std::optional<Fired> fired = FirstFiring(*short_patience, run.steps);
  ASSERT_TRUE(fired.has_value());
  EXPECT_EQ(fired->index, 2u);
}

TEST(PoorWeightInitialization, AnEmptyActivationRegexSkipsTheVarianceCheck) {
  NetConfig c = Healthy();
  c.init_scale = {1, 10, 1};
  Net net(c);
  Trace run = Train(net, MakeData(32, 7), 1, 0.05);
  auto rule = Make("PoorWeightInitialization", {{"activation_inputs_regex", ""}});
  EXPECT_FALSE(Feed(*rule, run.steps[0]).has_value());
}

TEST(PoorWeightInitialization, RejectsBadParameters) {
  EXPECT_THAT(Create("PoorWeightInitialization", {{"threshold", "0.5"}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "PoorWeightInitialization: threshold=0.5 must be at least 1"));
  EXPECT_THAT(
      Create("PoorWeightInitialization", {{"distribution_range", "-1"}}),
      StatusIs(absl::StatusCode::kInvalidArgument, "distribution_range=-1 must be at least 0"));
  EXPECT_THAT(Create("PoorWeightInitialization", {{"steps", "0"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "steps=0 must be at least 1"));
  EXPECT_THAT(Create("PoorWeightInitialization", {{"patience", "0"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "patience=0 must be at least 1"));
  EXPECT_THAT(Create("PoorWeightInitialization", {{"activation_inputs_regex", "*relu"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a valid RE2 pattern"));
}

// ===========================================================================
// GradientFlow

TEST(GradientFlow, FiresVanishingOnADeepSigmoidNetwork) {
  Net net(DeepSigmoid());
  Trace run = Train(net, MakeData(32, 7), 1, 0.1);
  const auto& g = run.values[0].grad_w;
  const double ratio = Norm(g.front()) / Norm(g.back());

  auto rule = Make("GradientFlow");
  std::optional<Finding> f = Feed(*rule, run.steps[0]);
  ASSERT_TRUE(f.has_value());
  EXPECT_THAT(f->tensors, ElementsAre("gradient/fc0.weight", "gradient/fc12.weight"));
  EXPECT_NEAR(f->observed, ratio, 1e-6 * ratio);
  EXPECT_LT(f->observed, 1e-3);
  EXPECT_EQ(f->threshold, 1e-3);
  EXPECT_EQ(f->message,
            absl::StrFormat("vanishing gradient flow at TRAIN step 0: ||'gradient/fc0.weight'|| "
                            "%.3g / ||'gradient/fc12.weight'|| %.3g = %.3g, below "
                            "vanishing_ratio 0.001, and the first norm is below "
                            "min_first_norm 0.0001",
                            Norm(g.front()), Norm(g.back()), f->observed));
}

TEST(GradientFlow, FiresExplodingWhenTheFirstLayerStartsTooSmall) {
  NetConfig c = Healthy();
  c.init_scale = {0.001};
  Net net(c);
  Trace run = Train(net, MakeData(32, 7), 1, 0.05);
  const auto& g = run.values[0].grad_w;
  const double ratio = Norm(g.front()) / Norm(g.back());
  ASSERT_GT(ratio, 70);

  auto rule = Make("GradientFlow");
  std::optional<Finding> f = Feed(*rule, run.steps[0]);
  ASSERT_TRUE(f.has_value());
  EXPECT_THAT(f->tensors, ElementsAre("gradient/fc0.weight", "gradient/fc2.weight"));
  EXPECT_NEAR(f->observed, ratio, 1e-6 * ratio);
  EXPECT_EQ(f->threshold, 70);
  EXPECT_THAT(f->message, HasSubstr("exploding gradient flow at TRAIN step 0: "));
  EXPECT_THAT(f->message, HasSubstr(", above exploding_ratio 70"));
}

TEST(GradientFlow, QuietWhileAHeInitialisedReluNetworkTrains) {
  Net net(Healthy());
  Trace run = Train(net, MakeData(32, 7), 40, 0.05);
  auto rule = Make("GradientFlow");
  EXPECT_FALSE(FirstFiring(*rule, run.steps).has_value());
}

TEST(GradientFlow, DefaultLayersSkipBiasesAndRegexesPickOthers) {
  const std::vector<v1::TensorRecord> tensors = {
      Tensor("gradient/fc0.bias", {1000, 1000}, {"gradients"}),
      Tensor("gradient/fc0.weight", {1, 1, 1, 1}, {"gradients"}),                  // norm 2
      Tensor("gradient/fc1.weight", {0.5f, 0.5f, 0.5f, 0.5f}, {"gradients"}),      // norm 1
      Tensor("gradient/fc2.weight", {0.01f, 0.01f, 0.01f, 0.01f}, {"gradients"}),  // 0.02
      Tensor("gradient/fc2.bias", {1e-9f}, {"gradients"}),
      Tensor("fc2.weight", {1e-9f, 1e-9f}, {"weights"}),
  };
  auto rule = Make("GradientFlow");
  std::optional<Finding> f = Feed(*rule, TrainStep(0, tensors));
  ASSERT_TRUE(f.has_value());
  EXPECT_THAT(f->tensors, ElementsAre("gradient/fc0.weight", "gradient/fc2.weight"));
  EXPECT_NEAR(f->observed, 100, 1e-4);

  auto middle = Make("GradientFlow", {{"last_layer_regex", "fc1\\.weight"}});
  EXPECT_FALSE(Feed(*middle, TrainStep(0, tensors)).has_value());  // 2 / 1

  auto bias = Make("GradientFlow", {{"first_layer_regex", "fc0\\.bias"}});
  f = Feed(*bias, TrainStep(0, tensors));
  ASSERT_TRUE(f.has_value());
  EXPECT_THAT(f->tensors, ElementsAre("gradient/fc0.bias", "gradient/fc2.weight"));
}

TEST(GradientFlow, VanishingNeedsASmallFirstNormToo) {
  auto rule = Make("GradientFlow");
  // Ratio 1e-4, but the first layer still learns (norm 0.01).
  EXPECT_FALSE(Feed(*rule, TrainStep(0, {Tensor("gradient/a.weight", {0.01f}, {"gradients"}),
                                         Tensor("gradient/b.weight", {100}, {"gradients"})}))
                   .has_value());
  std::optional<Finding> f =
      Feed(*rule, TrainStep(1, {Tensor("gradient/a.weight", {1e-5f}, {"gradients"}),
                                Tensor("gradient/b.weight", {1}, {"gradients"})}));
  ASSERT_TRUE(f.has_value());
  EXPECT_THAT(f->message, HasSubstr("vanishing gradient flow at TRAIN step 1"));
  // One gradient only: no ratio.
  auto single = Make("GradientFlow");
  EXPECT_FALSE(Feed(*single, TrainStep(0, {Tensor("gradient/a.weight", {1e-9f}, {"gradients"})}))
                   .has_value());
}

TEST(GradientFlow, JudgesEachWorkerOnItsOwn) {
  auto g = [](const std::string& name, float value, int32_t worker) {
    return Tensor(name, {value}, {"gradients"}, worker);
  };
  auto rule = Make("GradientFlow");
  // Interleaved arrival; worker 0's first over worker 1's last would be 1000.
  EXPECT_FALSE(
      Feed(*rule,
           TrainStep(0, {g("gradient/fc0.weight", 1, 0), g("gradient/fc0.weight", 0.001f, 1),
                         g("gradient/fc1.weight", 1, 0), g("gradient/fc1.weight", 0.001f, 1)}))
          .has_value());
  std::optional<Finding> f = Feed(
      *rule, TrainStep(1, {g("gradient/fc0.weight", 1, 0), g("gradient/fc1.weight", 1, 0),
                           g("gradient/fc0.weight", 1, 1), g("gradient/fc1.weight", 0.001f, 1)}));
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->worker, 1);
  EXPECT_NEAR(f->observed, 1000, 1e-3);
  EXPECT_THAT(f->message, HasSubstr("(worker 1)"));
}

TEST(GradientFlow, RejectsBadParameters) {
  EXPECT_THAT(Create("GradientFlow", {{"exploding_ratio", "1e-4"}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "GradientFlow: exploding_ratio=0.0001 must be above "
                       "vanishing_ratio=0.001"));
  EXPECT_THAT(Create("GradientFlow", {{"vanishing_ratio", "0"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "vanishing_ratio must be positive"));
  EXPECT_THAT(Create("GradientFlow", {{"min_first_norm", "-1"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "min_first_norm at least 0"));
  EXPECT_THAT(Create("GradientFlow", {{"first_layer_regex", "["}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a valid RE2 pattern"));
}

// ===========================================================================
// DyingReluGradients

TEST(DyingReluGradients, FiresWhenNegativeBiasesKillMostReLUs) {
  NetConfig c = Healthy();
  c.hidden_bias = -2;
  Net net(c);
  Trace run = Train(net, MakeData(32, 7), 1, 0.05);
  size_t zeros = 0, total = 0;  // over the raw weight gradients
  for (const auto& g : run.values[0].grad_w) {
    for (float x : g) zeros += x == 0;
    total += g.size();
  }
  const double share = static_cast<double>(zeros) / total;
  ASSERT_GE(share, 0.7);

  auto rule = Make("DyingReluGradients");
  std::optional<Finding> f = Feed(*rule, run.steps[0]);
  ASSERT_TRUE(f.has_value());
  EXPECT_DOUBLE_EQ(f->observed, share);
  EXPECT_EQ(f->threshold, 0.7);
  EXPECT_THAT(f->message,
              HasSubstr(absl::StrFormat("of the weight-gradient entries at TRAIN step 0 are "
                                        "exactly zero (%d of %d), at least threshold 0.7",
                                        zeros, total)));
}

TEST(DyingReluGradients, QuietOnAHealthyNetworkAndWithAFewDeadUnits) {
  Net net(Healthy());
  Trace run = Train(net, MakeData(32, 7), 20, 0.05);
  auto rule = Make("DyingReluGradients");
  EXPECT_FALSE(FirstFiring(*rule, run.steps).has_value());

  NetConfig c = Healthy();
  c.hidden_bias = -0.5;
  Net some_dead(c);
  Trace run2 = Train(some_dead, MakeData(32, 7), 1, 0.05);
  auto rule2 = Make("DyingReluGradients");
  EXPECT_FALSE(Feed(*rule2, run2.steps[0]).has_value());
}

TEST(DyingReluGradients, BiasGradientsDoNotCount) {
  const std::vector<v1::TensorRecord> tensors = {
      Tensor("gradient/fc0.bias", std::vector<float>(100, 0), {"gradients"}),
      Tensor("gradient/fc0.weight", {1, 2, 0, 4}, {"gradients"}),
      Tensor("fc0.weight", {0, 0, 0, 0}, {"weights"}),
  };
  auto rule = Make("DyingReluGradients");
  EXPECT_FALSE(Feed(*rule, TrainStep(0, tensors)).has_value());
  auto low = Make("DyingReluGradients", {{"threshold", "0.25"}});
  std::optional<Finding> f = Feed(*low, TrainStep(0, tensors));
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->observed, 0.25);
  EXPECT_EQ(f->tensors, std::vector<std::string>{"gradient/fc0.weight"});
  EXPECT_EQ(f->message,
            "25% of the weight-gradient entries at TRAIN step 0 are exactly "
            "zero (1 of 4), at "
            "least threshold 0.25; mostly zero: 'gradient/fc0.weight'");
}

TEST(DyingReluGradients, RejectsAThresholdOutsideZeroToOne) {
  EXPECT_THAT(Create("DyingReluGradients", {{"threshold", "1.5"}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "DyingReluGradients: threshold=1.5 must be a share in (0, 1]"));
  EXPECT_THAT(Create("DyingReluGradients", {{"threshold", "0"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "(0, 1]"));
}

// ===========================================================================
// NaNOrigin

TEST(NaNOrigin, NamesTheFirstNonFiniteTensorInRecordedOrder) {
  auto rule = Make("NaNOrigin");
  EXPECT_FALSE(Feed(*rule, TrainStep(2, {Tensor("a", {1, 2})})).has_value());
  std::optional<Finding> f =
      Feed(*rule, TrainStep(3, {Tensor("a", {1, 2}), Tensor("b", {1, kNaN, 3}),
                                Tensor("c", {kInf, -kInf}, {}, 1), Tensor("d", {1}),
                                Tensor("e", {kNaN}, {}, 1)}));
  ASSERT_TRUE(f.has_value());
  EXPECT_THAT(f->tensors, ElementsAre("b", "c", "e"));
  EXPECT_EQ(f->worker, 0);
  EXPECT_EQ(f->observed, 1);
  EXPECT_EQ(f->threshold, 0);
  EXPECT_EQ(f->message,
            "first non-finite tensor at step 3 (TRAIN step 3) is 'b' (worker "
            "0), 1 NaN / 0 Inf "
            "of 3 values; later: 'c', 'e'");
}

TEST(NaNOrigin, FiresAtTheStepADivergingNetworkOverflowsFloat32) {
  Net net(Healthy());
  Trace run = Train(net, MakeData(32, 7), 10, /*lr=*/3);  // far too large
  // From the raw values: the first step and tensor with a non-finite float.
  std::optional<size_t> step;
  std::vector<std::string> names;
  for (size_t s = 0; s < run.values.size() && !step.has_value(); ++s) {
    for (const RawTensor& t : RawTensors(net, run.values[s])) {
      for (float x : t.values) {
        if (!std::isfinite(x)) {
          step = s;
          names.push_back(t.name);
          break;
        }
      }
    }
  }
  ASSERT_TRUE(step.has_value());
  ASSERT_EQ(names[0], "MSELoss_output_0");
  // The squared error overflows float32 while the double loss is still finite.
  ASSERT_TRUE(std::isfinite(run.values[*step].loss));

  auto rule = Make("NaNOrigin");
  std::optional<Fired> fired = FirstFiring(*rule, run.steps);
  ASSERT_TRUE(fired.has_value());
  EXPECT_EQ(fired->index, *step);
  EXPECT_EQ(fired->finding.tensors, names);
  EXPECT_THAT(fired->finding.message,
              HasSubstr(absl::StrCat("first non-finite tensor at step ", *step, " (TRAIN step ",
                                     *step, ") is 'MSELoss_output_0' (worker 0)")));
}

TEST(NaNOrigin, QuietOnFiniteTrainingAndTakesNoParameters) {
  Net net(Healthy());
  Trace run = Train(net, MakeData(32, 7), 20, 0.05);
  auto rule = Make("NaNOrigin");
  EXPECT_FALSE(FirstFiring(*rule, run.steps).has_value());
  EXPECT_THAT(Create("NaNOrigin", {{"only_nan", "true"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown parameter 'only_nan'"));
}

// ===========================================================================
// OscillatingLoss

const std::vector<float> kBouncing = {1.0f, 0.8f,  0.95f, 0.7f, 0.9f,
                                      0.6f, 0.85f, 0.5f,  0.8f, 0.45f};

TEST(OscillatingLoss, FiresWhenTheFourthBounceIsConfirmed) {
  auto rule = Make("OscillatingLoss");
  // Bounces 0.8->0.95, 0.7->0.9, 0.6->0.85, 0.5->0.8; each peak is known
  // once the next loss is lower: steps 3, 5, 7 and 9.
  std::optional<Fired> fired = FirstFiring(*rule, LossSteps(kBouncing));
  ASSERT_TRUE(fired.has_value());
  EXPECT_EQ(fired->index, 9u);
  EXPECT_EQ(fired->finding.observed, 0.2);
  EXPECT_EQ(fired->finding.threshold, 0.2);
  EXPECT_EQ(fired->finding.message,
            "TRAIN loss bounced back up 4 times by at least min_swing 0.03 "
            "within the last 10 "
            "saved steps (TRAIN steps 0..9; window 20): 4/20 >= max_share 0.2; "
            "largest 0.5 -> "
            "0.8 (TRAIN steps 7 -> 8)");
}

TEST(OscillatingLoss, SmallSwingsAreNotBouncesAndPlateausCountOnce) {
  std::vector<float> jitter;
  for (int i = 0; i < 40; ++i) jitter.push_back(i % 2 == 0 ? 1.0f : 0.99f);  // 1% swings
  auto rule = Make("OscillatingLoss");
  EXPECT_FALSE(FirstFiring(*rule, LossSteps(jitter)).has_value());

  // kBouncing with every trough and peak held for two steps.
  const std::vector<float> plateaus = {1.0f, 0.8f, 0.8f,  0.95f, 0.95f, 0.7f, 0.7f,
                                       0.9f, 0.6f, 0.85f, 0.5f,  0.8f,  0.45f};
  auto flat = Make("OscillatingLoss");
  std::optional<Fired> fired = FirstFiring(*flat, LossSteps(plateaus));
  ASSERT_TRUE(fired.has_value());
  EXPECT_EQ(fired->index, 12u);

  auto wide = Make("OscillatingLoss", {{"min_swing", "0.4"}});  // largest swing is 0.375
  EXPECT_FALSE(FirstFiring(*wide, LossSteps(kBouncing)).has_value());
}

TEST(OscillatingLoss, BouncesThatLeaveTheWindowNoLongerCount) {
  const std::vector<float> losses = {1.0f, 0.8f,  0.9f, 0.7f,  0.8f,  0.6f, 0.55f,
                                     0.5f, 0.45f, 0.4f, 0.45f, 0.35f, 0.4f, 0.3f};
  // Four bounces in all, never three within 6 saved steps.
  auto narrow = Make("OscillatingLoss", {{"window", "6"}, {"max_share", "0.5"}});
  EXPECT_FALSE(FirstFiring(*narrow, LossSteps(losses)).has_value());
  // A window holding them all needs ceil(0.2 * 14) = 3: the third is
  // confirmed at step 11.
  auto wide = Make("OscillatingLoss", {{"window", "14"}});
  std::optional<Fired> fired = FirstFiring(*wide, LossSteps(losses));
  ASSERT_TRUE(fired.has_value());
  EXPECT_EQ(fired->index, 11u);
}

TEST(OscillatingLoss, FiresOnTheNoisyLossOfMinibatchSgd) {
  Net net(Healthy());
  Trace run = TrainMinibatches(net, MakeData(64, 5, 0.5), 4, 40, 0.1);
  auto rule = Make("OscillatingLoss");
  std::optional<Fired> fired = FirstFiring(*rule, run.steps);
  ASSERT_TRUE(fired.has_value());
  EXPECT_LT(fired->index, 20u);
  EXPECT_GE(fired->finding.observed, 0.2);
  EXPECT_EQ(fired->finding.tensors, std::vector<std::string>{"MSELoss_output_0"});
}

TEST(OscillatingLoss, QuietOnFullBatchGradientDescent) {
  Net net(Healthy());
  Trace run = Train(net, MakeData(32, 7), 40, 0.05);
  auto rule = Make("OscillatingLoss");
  EXPECT_FALSE(FirstFiring(*rule, run.steps).has_value());
}

TEST(OscillatingLoss, ModesAreSeparateSeriesAndModeRestricts) {
  std::vector<StepData> steps;
  for (size_t i = 0; i < kBouncing.size(); ++i) {
    const int64_t s = static_cast<int64_t>(i);
    steps.push_back(Step(2 * s, {Loss(2.0f - 0.1f * s)}, v1::MODE_TRAIN, s));
    steps.push_back(Step(2 * s + 1, {Loss(kBouncing[i])}, v1::MODE_EVAL, s));
  }
  auto rule = Make("OscillatingLoss");
  std::optional<Fired> fired = FirstFiring(*rule, steps);
  ASSERT_TRUE(fired.has_value());
  EXPECT_EQ(fired->index, 19u);  // EVAL step 9
  EXPECT_THAT(fired->finding.message, HasSubstr("EVAL loss bounced back up 4 times"));
  auto train = Make("OscillatingLoss", {{"mode", "TRAIN"}});
  EXPECT_FALSE(FirstFiring(*train, steps).has_value());
  auto eval = Make("OscillatingLoss", {{"mode", "eval"}});
  EXPECT_TRUE(FirstFiring(*eval, steps).has_value());
}

TEST(OscillatingLoss, RejectsBadParameters) {
  EXPECT_THAT(Create("OscillatingLoss", {{"window", "2"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "window=2 must be at least 3"));
  EXPECT_THAT(Create("OscillatingLoss", {{"max_share", "0"}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "OscillatingLoss: max_share=0 must be in (0, 1]"));
  EXPECT_THAT(Create("OscillatingLoss", {{"min_swing", "-0.1"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "min_swing=-0.1 must be at least 0"));
  EXPECT_THAT(Create("OscillatingLoss", {{"mode", "TRAINING"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown mode 'TRAINING'"));
}

// ===========================================================================
// The catalogue

TEST(StatisticsRuleCatalog, ListsEveryRuleWithItsDocumentedDefaults) {
  using Params = std::vector<std::pair<std::string, std::string>>;
  const std::map<std::string, Params> expected = {
      {"VanishingGradient", {{"threshold", "1e-7"}}},
      {"AllZero", {{"collection_names", ""}, {"tensor_regex", ""}, {"threshold", "100"}}},
      {"TensorVariance",
       {{"collection_names", ""},
        {"tensor_regex", ""},
        {"max_threshold", ""},
        {"min_threshold", ""}}},
      {"Overfit",
       {{"tensor_regex", ""}, {"start_step", "0"}, {"patience", "1"}, {"ratio_threshold", "0.1"}}},
      {"Overtraining", {{"patience_train", "5"}, {"patience_validation", "10"}, {"delta", "0.01"}}},
      {"PoorWeightInitialization",
       {{"activation_inputs_regex", ".*relu_input"},
        {"threshold", "10.0"},
        {"distribution_range", "0.001"},
        {"patience", "5"},
        {"steps", "10"}}},
      {"GradientFlow",
       {{"first_layer_regex", ""},
        {"last_layer_regex", ""},
        {"vanishing_ratio", "1e-3"},
        {"min_first_norm", "1e-4"},
        {"exploding_ratio", "70"}}},
      {"DyingReluGradients", {{"threshold", "0.7"}}},
      {"NaNOrigin", {}},
      {"OscillatingLoss",
       {{"window", "20"}, {"min_swing", "0.03"}, {"max_share", "0.2"}, {"mode", ""}}},
  };
  std::map<std::string, RuleInfo> catalog;
  for (const RuleInfo& info : BuiltinRuleFactory()->Catalog()) {
    catalog[info.rule_type] = info;
  }
  for (const auto& [type, params] : expected) {
    SCOPED_TRACE(type);
    ASSERT_EQ(catalog.count(type), 1u);
    const RuleInfo& info = catalog[type];
    Params actual;
    for (const RuleParameterInfo& p : info.parameters) {
      actual.emplace_back(p.name, p.default_value);
      EXPECT_FALSE(p.description.empty()) << p.name;
    }
    EXPECT_EQ(actual, params);
    EXPECT_FALSE(info.description.empty());
    EXPECT_FALSE(info.suggestion.empty());
    EXPECT_EQ(info.source, "built-in");

    // Every documented default is accepted when spelled out.
    v1::RuleSpec spec;
    spec.set_rule_type(type);
    for (const auto& [name, value] : params) (*spec.mutable_parameters())[name] = value;
    if (type == "AllZero" || type == "TensorVariance") {
      (*spec.mutable_parameters())["collection_names"] = "weights";
    }
    if (type == "TensorVariance") (*spec.mutable_parameters())["max_threshold"] = "10";
    EXPECT_THAT(Factory().Create(spec), IsOk());
  }
  EXPECT_EQ(catalog["VanishingGradient"].default_collections,
            std::vector<std::string>{"gradients"});
  // Rules over every saved tensor ask for no collection: "all" would make
  // the hook save every tensor of the model.
  EXPECT_TRUE(catalog["NaNOrigin"].default_collections.empty());
  EXPECT_TRUE(catalog["ExplodingTensor"].default_collections.empty());
}

}  // namespace
}  // namespace sonde::rules
