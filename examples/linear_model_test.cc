#include "examples/linear_model.h"

#include <cmath>

#include "gtest/gtest.h"

namespace sonde::examples {
namespace {

TEST(LinearModel, GoodHyperparametersReduceTheLoss) {
  LinearModel model(0.1f, 1.0f, 256, 42);
  const float first = model.Step().loss;
  float last = first;
  for (int i = 0; i < 59; ++i) last = model.Step().loss;
  EXPECT_GT(first, 50.0f);  // w starts at [10, 10], 9 away from [1, 1]
  EXPECT_LT(last, first / 4);
}

TEST(LinearModel, BlogsBadHyperparametersGiveNaNAtStepTwo) {
  LinearModel model(100.0f, 1e11f, 10, 42);
  StepOutput s0 = model.Step();
  StepOutput s1 = model.Step();
  StepOutput s2 = model.Step();
  EXPECT_TRUE(std::isfinite(s0.loss));
  EXPECT_GT(s0.loss, 1e23f);  // the blog's 7.9e23
  EXPECT_TRUE(std::isfinite(s1.loss));
  EXPECT_TRUE(std::isnan(s2.loss));
  EXPECT_TRUE(std::isnan(s2.weight[0]));
}

}  // namespace
}  // namespace sonde::examples
