// conv2d, pooling and batch norm through autograd: backward against central finite differences,
// a mutated backward must fail the same check, and the tensor-level ops agree with the kernels' shapes.
#include <doctest/doctest.h>

#include <cmath>

#include "check.hpp"
#include "core/autograd.hpp"
#include "core/ops.hpp"
#include "fd_check.hpp"

using namespace d2l;
using d2l::test::GradSpec;

namespace {
Tensor project(const Tensor& y, uint32_t seed = 77) {
  return sum(mul(y, Tensor::from_vector(test::lcg_data(y.numel(), seed), y.shape(), y.device())));
}
// Distinct, well-separated values so that max pooling has no near-ties within h.
std::vector<float> spread(int64_t n, uint32_t seed) {
  auto v = test::lcg_data(n, seed);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(((i * 37 + seed) % n)) * 0.1f + 0.01f * v[i];
  return v;
}
struct OpCase {
  const char* name;
  std::vector<GradSpec> inputs;
  std::function<Tensor(const std::vector<Tensor>&)> f;
};
std::vector<OpCase> cases() {
  return {
      {"conv2d", {{{2, 3, 7, 5}, test::lcg_data(210, 1)}, {{4, 3, 3, 3}, test::lcg_data(108, 2)}},
       [](auto& x) { return project(conv2d(x[0], x[1], Tensor(), {2, 1}, {1, 1})); }},
      {"conv2d", {{{1, 1, 6, 6}, test::lcg_data(36, 3)}, {{2, 1, 5, 5}, test::lcg_data(50, 4)}},
       [](auto& x) { return project(conv2d(x[0], x[1], Tensor())); }},
      {"max_pool2d", {{{2, 2, 5, 5}, spread(100, 5)}}, [](auto& x) { return project(max_pool2d(x[0], {3, 3}, {2, 2}, {1, 1})); }},
      {"avg_pool2d", {{{1, 2, 5, 4}, test::lcg_data(40, 6)}}, [](auto& x) { return project(avg_pool2d(x[0], {2, 2})); }},
      {"global_avg_pool2d", {{{2, 3, 3, 2}, test::lcg_data(36, 7)}}, [](auto& x) { return project(global_avg_pool2d(x[0])); }},
      {"batch_norm",
       {{{4, 3, 2, 2}, test::lcg_data(48, 8)}, {{3}, {0.5f, 1.5f, -1.0f}}, {{3}, {0.1f, -0.2f, 0.3f}}},
       [](auto& x) {
         Device d = x[0].device();
         return project(batch_norm(x[0], x[1], x[2], Tensor::zeros({3}, d), Tensor::ones({3}, d)));
       }},
  };
}
}  // namespace

TEST_CASE("conv/pool/batch-norm backward matches central finite differences (h 1e-2, atol 2e-3, rtol 2e-2)") {
  for (auto& c : cases()) {
    CAPTURE(c.name);
    CHECK(test::gradcheck(c.f, c.inputs, cpu(0)));
  }
}

TEST_CASE("a deliberately broken conv/pool/batch-norm backward fails the same check") {
  for (auto& c : cases()) {
    CAPTURE(c.name);
    CHECK_FALSE(test::gradcheck_broken(c.name, c.f, c.inputs, cpu(0)));
  }
}

TEST_CASE("conv2d with bias, output shapes, and clear shape errors") {
  Device d = cpu(0);
  Tensor x = Tensor::ones({2, 3, 8, 8}, d), w = Tensor::ones({5, 3, 3, 3}, d), b = Tensor::full({5}, 0.5f, d);
  Tensor y = conv2d(x, w, b, {2, 2}, {1, 1});
  CHECK(y.shape() == Shape{2, 5, 4, 4});
  CHECK(y.to_vector()[5] == doctest::Approx(27.5f));  // an interior position: 3*3*3 ones + bias
  CHECK(max_pool2d(Tensor::ones({1, 1, 28, 28}, d), {3, 3}, {2, 2}, {1, 1}).shape() == Shape{1, 1, 14, 14});
  CHECK(avg_pool2d(Tensor::ones({1, 1, 7, 7}, d), {2, 2}).shape() == Shape{1, 1, 3, 3});
  CHECK_THROWS_WITH_AS(conv2d(x, Tensor::ones({5, 2, 3, 3}, d), Tensor()), doctest::Contains("input channels"), ShapeError);
  CHECK_THROWS_AS(conv2d(Tensor::ones({2, 3, 8}, d), w, Tensor()), ShapeError);
  CHECK_THROWS_AS(max_pool2d(x, {9, 9}), ShapeError);
}

TEST_CASE("batch norm: evaluation mode uses the running statistics the training steps left") {
  Device d = cpu(0);
  Tensor rm = Tensor::zeros({2}, d), rv = Tensor::ones({2}, d), g = Tensor::ones({2}, d), b = Tensor::zeros({2}, d);
  Tensor x = Tensor::from_vector(std::vector<float>{1, 10, 3, 20, 5, 30}, {3, 2}, d);  // channel 0: 1,3,5; 1: 10,20,30
  batch_norm(x, g, b, rm, rv, 0.5f);
  // mean (3, 20), unbiased var (4, 100): running = 0.5 * old + 0.5 * batch.
  CHECK(test::close(std::vector<double>{1.5, 10}, rm.to_vector(), 1e-6, 1e-6, "running mean"));
  CHECK(test::close(std::vector<double>{2.5, 50.5}, rv.to_vector(), 1e-5, 1e-6, "running var"));
  TrainMode eval(false);
  auto y = batch_norm(x, g, b, rm, rv, 0.5f).to_vector();
  CHECK(y[0] == doctest::Approx((1 - 1.5) / std::sqrt(2.5 + 1e-5)));
  CHECK(rm.to_vector()[0] == 1.5f);  // evaluation leaves the statistics alone
}
