// Autograd: every op's backward against central finite differences (and a mutated backward must
// fail the same check), the MLP chain rule by hand, accumulation, no-grad, cross-device copies and
// per-device losses.
#include <doctest/doctest.h>

#include <cmath>

#include "check.hpp"
#include "core/autograd.hpp"
#include "core/ops.hpp"
#include "core/runtime.hpp"
#include "fd_check.hpp"

using namespace d2l;
using d2l::test::GradSpec;

namespace {
using test::grad_input;
using test::OpCase;
using test::project;

// An op's row belongs in its own tests/test_<op>.cpp (test::op_case_ok), as sigmoid's is there: the
// rows here are the ops built from others (matmul, the shapes, clone) and those of the shared kernels
// (bias_add, scale).
std::vector<OpCase> op_cases(Device) {
  return {
      {"matmul", {{{3, 5}, grad_input(15, 1)}, {{5, 4}, grad_input(20, 2)}},
       [](auto& x) { return project(matmul(x[0], x[1])); }},
      {"matmul", {{{5, 3}, grad_input(15, 3)}, {{4, 5}, grad_input(20, 4)}},
       [](auto& x) { return project(matmul(x[0], x[1], true, true)); }},
      {"bias_add", {{{2, 3, 2, 2}, grad_input(24, 5)}, {{3}, grad_input(3, 6)}},
       [](auto& x) { return project(bias_add(x[0], x[1])); }},
      {"scale", {{{4}, grad_input(4, 12)}}, [](auto& x) { return project(scale(x[0], -2.5f)); }},
      {"reshape", {{{2, 6}, grad_input(12, 17)}}, [](auto& x) { return project(reshape(x[0], {3, -1})); }},
      {"concat", {{{2, 3}, grad_input(6, 18)}, {{1, 3}, grad_input(3, 19)}},
       [](auto& x) { return project(concat({x[0], x[1]})); }},
      {"slice_rows", {{{5, 2}, grad_input(10, 20)}}, [](auto& x) { return project(slice_rows(x[0], 1, 4)); }},
      {"clone", {{{4}, grad_input(4, 21)}}, [](auto& x) { return project(x[0].clone()); }},
  };
}
}  // namespace

TEST_CASE("every op's backward matches central finite differences (h 1e-2, atol 2e-3, rtol 2e-2)") {
  for (auto& c : op_cases(cpu(0))) {
    CAPTURE(c.name);
    CHECK(test::gradcheck(c.f, c.inputs, cpu(0)));
  }
}

TEST_CASE("a deliberately broken backward fails the same check") {
  for (auto& c : op_cases(cpu(0))) {
    CAPTURE(c.name);
    CHECK_FALSE(test::gradcheck_broken(c.name, c.f, c.inputs, cpu(0)));
  }
}

TEST_CASE("two-layer MLP: gradients equal the hand-derived chain rule") {
  Device d = cpu(0);
  const int N = 4, I = 3, H = 5, K = 2;
  auto xv = test::lcg_data(N * I, 1), w1v = test::lcg_data(I * H, 2), w2v = test::lcg_data(H * K, 3);
  auto tv = test::lcg_data(N * K, 4);
  Tensor X = Tensor::from_vector(xv, {N, I}, d), T = Tensor::from_vector(tv, {N, K}, d);
  Tensor W1 = Tensor::from_vector(w1v, {I, H}, d).attach_grad(), W2 = Tensor::from_vector(w2v, {H, K}, d).attach_grad();
  mse_loss(matmul(relu(matmul(X, W1)), W2), T, Reduction::sum).backward();
  // By hand in double: z = X W1, h = relu(z), y = h W2, L = sum((y - t)^2) / 2.
  std::vector<double> z(N * H), h(N * H), dy(N * K), dh(N * H), gW1(I * H, 0), gW2(H * K, 0);
  for (int n = 0; n < N; ++n)
    for (int j = 0; j < H; ++j) {
      for (int i = 0; i < I; ++i) z[n * H + j] += (double)xv[n * I + i] * w1v[i * H + j];
      h[n * H + j] = std::max(0.0, z[n * H + j]);
    }
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) {
      double y = 0;
      for (int j = 0; j < H; ++j) y += h[n * H + j] * w2v[j * K + k];
      dy[n * K + k] = y - tv[n * K + k];
    }
  for (int n = 0; n < N; ++n)
    for (int j = 0; j < H; ++j) {
      for (int k = 0; k < K; ++k) {
        gW2[j * K + k] += h[n * H + j] * dy[n * K + k];
        dh[n * H + j] += dy[n * K + k] * w2v[j * K + k];
      }
      if (z[n * H + j] <= 0) dh[n * H + j] = 0;
      for (int i = 0; i < I; ++i) gW1[i * H + j] += xv[n * I + i] * dh[n * H + j];
    }
  CHECK(test::close(gW1, W1.grad().to_vector(), 1e-5, 1e-5, "dW1"));
  CHECK(test::close(gW2, W2.grad().to_vector(), 1e-5, 1e-5, "dW2"));
}

TEST_CASE("gradients accumulate across backward calls until zeroed; NoGrad records nothing") {
  Tensor w = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3}, cpu(0)).attach_grad();
  sum(scale(w, 2.0f)).backward();
  sum(scale(w, 2.0f)).backward();
  CHECK(w.grad().to_vector() == std::vector<float>{4, 4, 4});
  w.zero_grad();
  CHECK(w.grad().to_vector() == std::vector<float>{0, 0, 0});
  {
    NoGrad no_grad;
    Tensor y = sum(w);
    CHECK_FALSE(y.needs_grad());
    CHECK_THROWS(y.backward());
  }
  CHECK_THROWS_WITH(scale(w, 1.0f).backward(), doctest::Contains("one-element"));
}

TEST_CASE("backward through a cross-device copy lands the gradient on the source device") {
  use_devices({cpu(0), cpu(1)});
  Tensor x = Tensor::from_vector(std::vector<float>{1, -2, 3}, {3}, cpu(0)).attach_grad();
  Tensor y = x.to(cpu(1));
  CHECK(y.device() == cpu(1));
  sum(mul(y, y)).backward();  // d/dx sum(x^2) = 2x
  CHECK(x.grad().device() == cpu(0));
  CHECK(x.grad().to_vector() == std::vector<float>{2, -4, 6});
}

TEST_CASE("per-device losses: each backward runs on its device and accumulates into its replica") {
  use_devices({cpu(0), cpu(1)});
  std::vector<Device> devs = {cpu(0), cpu(1)};
  std::vector<Tensor> ws, ls;
  for (auto d : devs) ws.push_back(Tensor::from_vector(std::vector<float>{1, 2}, {2}, d).attach_grad());
  uint64_t before1 = runtime(cpu(1)).kernels_run();
  for (size_t i = 0; i < devs.size(); ++i) ls.push_back(sum(scale(ws[i], static_cast<float>(i + 1))));
  for (auto& l : ls) l.backward();  // the book: for l in ls: l.backward()
  CHECK(ws[0].grad().to_vector() == std::vector<float>{1, 1});
  CHECK(ws[1].grad().to_vector() == std::vector<float>{2, 2});
  CHECK(ws[1].grad().device() == cpu(1));
  CHECK(runtime(cpu(1)).kernels_run() > before1);
}

TEST_CASE("ops refuse inputs on different devices and bad shapes with one clear line") {
  Tensor a = Tensor::zeros({2, 3}, cpu(0)), b = Tensor::zeros({3, 2}, cpu(1));
  CHECK_THROWS_WITH_AS(matmul(a, b), doctest::Contains("cpu(0) and cpu(1)"), ShapeError);
  CHECK_THROWS_WITH_AS(matmul(a, a), doctest::Contains("inner sizes differ"), ShapeError);
  CHECK_THROWS_AS(add(a, Tensor::zeros({3, 2}, cpu(0))), ShapeError);
  CHECK_THROWS_AS(reshape(a, {4, 2}), ShapeError);
  CHECK_THROWS_AS(split(a, {1, 2}), ShapeError);
}

// zb-h1 defers a weight's gradient to W (DeferWeightGrads): backward() must not report that weight
// (its gradient is still to come), W must, with the whole gradient in it. x is a received input
// (not_deferred): reported by backward as usual. y = sum(x W): dW[i][j] = sum over rows of x[r][i].
TEST_CASE("gradient-ready hooks: a weight gradient deferred to W is reported by W, complete") {
  Tensor x = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}, cpu(0));
  Tensor w = Tensor::from_vector(std::vector<float>{1, 0, 0, 1, 1, 1}, {3, 2}, cpu(0));
  x.attach_grad(), w.attach_grad();
  std::vector<std::pair<TensorImpl*, std::vector<float>>> heard;
  const int id = add_grad_ready_hook([&](TensorImpl& leaf) { heard.push_back({&leaf, Tensor(leaf.grad).to_vector()}); });
  std::vector<DeferWeightGrads::Work> work;
  {
    DeferWeightGrads defer;
    defer.not_deferred(x);
    sum(matmul(x, w)).backward();
    work = defer.take();
  }
  REQUIRE(heard.size() == 1);  // x only
  CHECK(heard[0].first == &x.impl());
  CHECK((!w.grad().defined() || w.grad().to_vector() == std::vector<float>(6, 0.0f)));  // nothing added yet
  REQUIRE(work.size() == 1);
  DeferWeightGrads::run(work);
  remove_grad_ready_hook(id);
  REQUIRE(heard.size() == 2);
  CHECK(heard[1].first == &w.impl());
  CHECK(heard[1].second == std::vector<float>{5, 5, 7, 7, 9, 9});
}

TEST_CASE("gradient-ready hooks: once per leaf per backward, when its whole gradient has been enqueued") {
  // y = sum(a * a + a * b) + sum(b): a reaches the loss through three edges, b through two, c not at
  // all. When a hook hears of a leaf, the leaf's gradient must already hold its full value (the
  // hook reads it, waiting for the device): d/da = 2a + b, d/db = a + 1.
  auto vec = [](std::vector<float> v) { return Tensor::from_vector(v, {3}, cpu(0)); };
  Tensor a = vec({1, 2, 3}), b = vec({4, 5, 6}), c = vec({7, 8, 9});
  a.attach_grad(), b.attach_grad(), c.attach_grad();
  std::vector<std::pair<TensorImpl*, std::vector<float>>> heard;
  const int id = add_grad_ready_hook([&](TensorImpl& leaf) {
    heard.push_back({&leaf, Tensor(leaf.grad).to_vector()});
  });
  Tensor y = add(sum(add(mul(a, a), mul(a, b))), sum(b));
  y.backward();
  remove_grad_ready_hook(id);
  REQUIRE(heard.size() == 2);
  for (auto& [leaf, g] : heard) {
    if (leaf == &a.impl()) CHECK(g == std::vector<float>{6, 9, 12});
    else if (leaf == &b.impl()) CHECK(g == std::vector<float>{2, 3, 4});
    else FAIL("a leaf that is not in the graph was reported");
  }
  CHECK(heard[0].first != heard[1].first);
  y = sum(mul(c, c));
  y.backward();  // the hook is gone: nothing more is heard
  CHECK(heard.size() == 2);
}
