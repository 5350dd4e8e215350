// Autocast (core/ops.hpp, core/ops/autocast.cpp): each op of the list run under a bfloat16 and a
// float16 scope gives the type the list says; scopes nest and stay on their thread; gradients reach
// float32 leaves (master weights) in float32; a small MLP trained under autocast follows the float32
// run within the 16-bit rounding.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "check.hpp"
#include "core/ops.hpp"
#include "core/ops/op.hpp"
#include "core/parameter.hpp"
#include "core/runtime.hpp"
#include "core/tensor_parallel/conjugate_ops.hpp"
#include "one_line_error.hpp"

using namespace d2l;
using test::lcg_data;

namespace {

Tensor input(const Shape& s, uint32_t seed, Device d = cpu(0)) {
  return Tensor::from_vector(lcg_data(numel(s), seed), s, d);
}
Tensor labels(int64_t n) {
  std::vector<int32_t> l;
  for (int64_t i = 0; i < n; ++i) l.push_back(static_cast<int32_t>(i % 3));
  return Tensor::from_vector(l, {n}, cpu(0));
}

// Each op of the list, called on float32 inputs: its result's type is what the scope made the op compute in.
std::map<std::string, std::function<Tensor()>> calls() {
  return {
      {"matmul", [] { return matmul(input({4, 5}, 1), input({5, 3}, 2)); }},
      {"conv2d", [] { return conv2d(input({2, 3, 6, 6}, 3), input({4, 3, 3, 3}, 4), Tensor(), {1, 1}, {1, 1}); }},
      {"softmax_cross_entropy", [] { return softmax_cross_entropy(input({6, 3}, 5), labels(6), Reduction::none); }},
      {"mse_loss", [] { return mse_loss(input({6}, 6), input({6}, 7), Reduction::none); }},
      {"sum", [] { return sum(input({6}, 8)); }},
      {"batch_norm", [] {
         return batch_norm(input({4, 3}, 9), input({3}, 10), input({3}, 11), Tensor::zeros({3}, cpu(0)),
                           Tensor::ones({3}, cpu(0)));
       }},
      {"batch_norm_stats", [] { return batch_norm_stats(input({4, 3}, 12)); }},
      {"batch_norm_apply", [] {
         Tensor x = input({4, 3}, 13);
         return batch_norm_apply(x, batch_norm_combine_stats(batch_norm_stats(x), {4}), input({3}, 14), input({3}, 15), 1e-5f);
       }},
      {"bias_add", [] { return bias_add(input({4, 3}, 16), input({3}, 17)); }},
      {"relu", [] { return relu(input({5}, 18)); }},
      {"sigmoid", [] { return sigmoid(input({5}, 19)); }},
      {"add", [] { return add(input({5}, 20), input({5}, 21)); }},
      {"mul", [] { return mul(input({5}, 22), input({5}, 23)); }},
      {"scale", [] { return scale(input({5}, 24), 2.0f); }},
      {"max_pool2d", [] { return max_pool2d(input({1, 2, 4, 4}, 25), {2, 2}); }},
      {"avg_pool2d", [] { return avg_pool2d(input({1, 2, 4, 4}, 26), {2, 2}); }},
      {"global_avg_pool2d", [] { return global_avg_pool2d(input({1, 2, 4, 4}, 27)); }},
      {"argmax", [] { return argmax(input({4, 3}, 28)); }},
      {"count_correct", [] { return count_correct(input({4, 3}, 29), Tensor::from_vector(std::vector<int32_t>{0, 1, 2, 0}, {4}, cpu(0))); }},
      // tensor parallelism's f and g (core/tensor_parallel), over cpu(0) and cpu(1)
      {"tp_copy_to_parallel_region", [] { return tp::copy_to_parallel_region({input({5}, 30), input({5}, 31).to(cpu(1))})[0]; }},
      {"tp_reduce_from_parallel_region", [] { return tp::reduce_from_parallel_region({input({5}, 32), input({5}, 33).to(cpu(1))})[0]; }},
  };
}

}  // namespace

TEST_CASE("every op of the list computes in the type the list gives it, under bfloat16 and float16") {
  const auto ops = calls();
  CHECK(ops.size() == autocast_ops().size());  // the list holds each op once, and this test calls each
  for (const AutocastRule& rule : autocast_ops()) {
    INFO(rule.op);
    REQUIRE(ops.count(rule.op));
    // Outside a scope every op computes in float32 (argmax and count_correct give int32 counts).
    const DType plain = ops.at(rule.op)().dtype();
    for (DType t : {DType::bf16, DType::f16}) {
      INFO(dtype_name(t));
      Autocast scope(t);
      const DType got = ops.at(rule.op)().dtype();
      if (rule.policy == AutocastPolicy::lower_precision) CHECK(got == t);
      else CHECK(got == plain);
    }
  }
}

TEST_CASE("a 16-bit input: float32 ops take it cast up inside a scope, and refuse it outside one") {
  Tensor h = cast(input({5}, 30), DType::bf16);
  test::check_one_line_error([&] { sigmoid(h); }, "sigmoid: every input must be float32");
  Autocast scope(DType::bf16);
  Tensor y = sigmoid(h);
  CHECK(y.dtype() == DType::f32);
  CHECK(y.to_vector() == sigmoid(cast(h, DType::f32)).to_vector());
}

// The input-type ops run in their input's type on CPU devices (16-bit kernels there: activations stay
// 16-bit from one convolution to the next) and take float32 on emulated and GPU devices, whose
// kernels are float32; a float32 input stays float32 everywhere (the test above).
TEST_CASE("input-type ops keep a 16-bit activation 16-bit on CPU devices, and take float32 elsewhere") {
  int input_type = 0;
  for (const AutocastRule& rule : autocast_ops()) input_type += rule.policy == AutocastPolicy::input_type;
  CHECK(input_type == 5);  // bias_add, relu, add, max_pool2d, batch_norm
  for (Device d : {cpu(0), emu(0)})
    for (DType t : {DType::bf16, DType::f16}) {
      CAPTURE(d);
      INFO(dtype_name(t));
      Autocast scope(t);
      const Tensor x = conv2d(input({2, 3, 6, 6}, 60, d), input({4, 3, 3, 3}, 61, d), Tensor(), {1, 1}, {1, 1});
      REQUIRE(x.dtype() == t);
      const DType want = d.kind == DeviceKind::cpu ? t : DType::f32;
      const Tensor bn = batch_norm(x, Tensor::ones({4}, d), Tensor::zeros({4}, d), Tensor::zeros({4}, d), Tensor::ones({4}, d));
      CHECK(bn.dtype() == want);
      CHECK(relu(x).dtype() == want);
      CHECK(bias_add(x, Tensor::ones({4}, d)).dtype() == want);
      CHECK(add(x, x).dtype() == want);
      CHECK(max_pool2d(x, {2, 2}).dtype() == want);
      CHECK(add(x, cast(x, DType::f32)).dtype() == DType::f32);  // two types: float32
    }
}

TEST_CASE("scopes nest, float32 turns autocast off, and a scope belongs to its thread") {
  CHECK(autocast_type() == DType::f32);
  {
    Autocast outer(DType::bf16);
    CHECK(autocast_type() == DType::bf16);
    {
      Autocast off(DType::f32);
      CHECK(matmul(input({2, 2}, 31), input({2, 2}, 32)).dtype() == DType::f32);
      Autocast inner(DType::f16);
      CHECK(matmul(input({2, 2}, 31), input({2, 2}, 32)).dtype() == DType::f16);
    }
    CHECK(autocast_type() == DType::bf16);
    DType other = DType::i32;
    std::thread([&] { other = autocast_type(); }).join();
    CHECK(other == DType::f32);
  }
  CHECK(autocast_type() == DType::f32);
  CHECK_THROWS_AS(Autocast(DType::i32), ConfigError);
}

// ---- master weights: float32 leaves, a 16-bit forward, float32 gradients.
namespace {

struct Mlp {
  Tensor w1, b1, w2, b2;
};

Mlp make_mlp(Device d) {
  Mlp m{input({16, 8}, 40, d) * 0.5f, Tensor::zeros({16}, d), input({3, 16}, 41, d) * 0.5f, Tensor::zeros({3}, d)};
  for (Tensor* p : {&m.w1, &m.b1, &m.w2, &m.b2}) p->attach_grad();
  return m;
}

Tensor mlp_loss(const Mlp& m, const Tensor& x, const Tensor& y) {
  return softmax_cross_entropy(dense(relu(dense(x, m.w1, m.b1)), m.w2, m.b2), y, Reduction::mean);
}

// Data: 3 classes, 8 features, class c shifted along feature c.
std::pair<Tensor, Tensor> data(int64_t n, Device d) {
  std::vector<float> x = lcg_data(n * 8, 50);
  std::vector<int32_t> y;
  for (int64_t i = 0; i < n; ++i) {
    y.push_back(static_cast<int32_t>(i % 3));
    x[i * 8 + i % 3] += 1.5f;
  }
  return {Tensor::from_vector(x, {n, 8}, d), Tensor::from_vector(y, {n}, d)};
}

// Losses of `steps` SGD steps (lr 0.5) from the same start, the forward under `t` (f32: no scope).
std::vector<float> train(DType t, int steps, Device d) {
  Mlp m = make_mlp(d);
  auto [x, y] = data(48, d);
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) {
    Tensor loss;
    {
      Autocast scope(t);
      loss = mlp_loss(m, x, y);
    }
    losses.push_back(loss.item());
    loss.backward();
    for (Tensor* p : {&m.w1, &m.b1, &m.w2, &m.b2}) {
      sgd_update_(*p, p->grad(), 0.5f);
      p->zero_grad();
    }
  }
  waitall();  // the last step's work is done before the device's tensors go (and the process may exit)
  return losses;
}

}  // namespace

TEST_CASE("master weights: float32 leaves get float32 gradients close to the float32 run's") {
  auto [x, y] = data(48, cpu(0));
  Mlp ref = make_mlp(cpu(0));
  mlp_loss(ref, x, y).backward();
  for (DType t : {DType::bf16, DType::f16}) {
    INFO(dtype_name(t));
    Mlp m = make_mlp(cpu(0));
    {
      Autocast scope(t);
      mlp_loss(m, x, y).backward();
    }
    const std::vector<std::pair<Tensor, Tensor>> pairs{{m.w1, ref.w1}, {m.b1, ref.b1}, {m.w2, ref.w2}, {m.b2, ref.b2}};
    for (const auto& [p, r] : pairs) {
      REQUIRE(p.grad().defined());
      CHECK(p.dtype() == DType::f32);
      CHECK(p.grad().dtype() == DType::f32);
      const std::vector<float> g = p.grad().to_vector(), want = r.grad().to_vector();
      double scale = 0, diff = 0;
      for (size_t i = 0; i < g.size(); ++i) scale = std::max(scale, std::fabs(double(want[i]))), diff = std::max(diff, std::fabs(double(g[i]) - want[i]));
      // bfloat16 keeps 8 bits (2^-8 relative), float16 11: a few roundings deep, well inside 5% and 1%.
      CHECK(diff <= (t == DType::bf16 ? 0.05 : 0.01) * scale);
      CHECK(diff > 0);  // the 16-bit forward did round something
    }
  }
}

TEST_CASE("an MLP trained under autocast follows the float32 run within the rounding, on cpu and emu") {
  for (Device d : {cpu(0), emu(0)}) {
    CAPTURE(d.str());
    const std::vector<float> f32 = train(DType::f32, 30, d);
    CHECK(f32.back() < 0.5f * f32.front());  // it learns
    for (DType t : {DType::bf16, DType::f16}) {
      INFO(dtype_name(t));
      const std::vector<float> low = train(t, 30, d);
      for (size_t s = 0; s < f32.size(); ++s) CHECK(std::fabs(low[s] - f32[s]) <= (t == DType::bf16 ? 0.01 : 0.002) * (1 + f32[s]));
    }
  }
}

TEST_CASE("a parameter is cast once per scope: micro-batches share its copy, backward through each, a new scope a new copy") {
  Parameter p("w", {8, 4}, Init::Uniform(1.0f));
  p.initialize({cpu(0)});
  Tensor w = p.data();
  const Tensor x1 = input({3, 8}, 71), x2 = input({5, 8}, 72);
  std::vector<float> one_scope, apart;
  {
    Autocast scope(DType::bf16);
    const Tensor c1 = detail::autocast_input("matmul", w), c2 = detail::autocast_input("matmul", w);
    CHECK(c1.dtype() == DType::bf16);
    CHECK(&c1.impl() == &c2.impl());  // one copy
    CHECK(&detail::autocast_input("matmul", x1).impl() != &detail::autocast_input("matmul", x1).impl());  // not a parameter
    Tensor leaf = input({8, 4}, 73);
    leaf.attach_grad();  // a leaf, not a parameter: cast at each use
    CHECK(&detail::autocast_input("matmul", leaf).impl() != &detail::autocast_input("matmul", leaf).impl());
    // Two micro-batches, a backward each, as a pipeline runs them: both through the one copy.
    sum(matmul(x1, w)).backward();
    sum(matmul(x2, w)).backward();
    one_scope = w.grad().to_vector();
  }
  w.zero_grad();
  for (const Tensor& x : {x1, x2}) {
    Autocast scope(DType::bf16);
    sum(matmul(x, w)).backward();
  }
  apart = w.grad().to_vector();
  CHECK(one_scope == apart);  // the same gradient, whichever way the copies were shared
  // The copy goes with its scope: the next scope computes with the weight as it is now.
  Tensor before, after;
  {
    Autocast scope(DType::bf16);
    before = matmul(x1, w);
  }
  w.zero_grad();
  {
    NoGrad no_grad;
    fill_(w, 0.0f);
  }
  {
    Autocast scope(DType::bf16);
    after = matmul(x1, w);
  }
  auto largest = [](const std::vector<float>& v) {
    float m = 0;
    for (float e : v) m = std::max(m, std::fabs(e));
    return m;
  };
  CHECK(largest(before.to_vector()) > 0);
  CHECK(largest(after.to_vector()) == 0);
  waitall();
}

TEST_CASE("conv2d under autocast: 16-bit operands, float32 sums, a 16-bit result; gradients reach float32 leaves") {
  Tensor x = input({2, 3, 6, 6}, 60), w = input({4, 3, 3, 3}, 61);
  x.attach_grad(), w.attach_grad();
  const std::vector<float> want = conv2d(x, w, Tensor(), {1, 1}, {1, 1}).to_vector();
  Tensor y;
  {
    Autocast scope(DType::bf16);
    y = conv2d(x, w, Tensor(), {1, 1}, {1, 1});
  }
  CHECK(y.dtype() == DType::bf16);
  const std::vector<float> got = y.to_vector();
  // Each output sums 27 products of values rounded to 8 bits (2^-8 relative each) and is rounded once more.
  for (size_t i = 0; i < got.size(); ++i) CHECK(std::fabs(got[i] - want[i]) <= 27 * 3 * std::ldexp(1.0, -8) + std::ldexp(std::fabs(want[i]), -8));
  // The gradients against the float32 convolution's, for a loss sum(y * r): within bfloat16's rounding.
  const Tensor r = input({2, 4, 6, 6}, 62);
  sum(mul(conv2d(x, w, Tensor(), {1, 1}, {1, 1}), r)).backward();
  const std::vector<float> gx32 = x.grad().to_vector(), gw32 = w.grad().to_vector();
  x.zero_grad(), w.zero_grad();
  sum(mul(cast(y, DType::f32), r)).backward();
  CHECK(x.grad().dtype() == DType::f32);
  CHECK(w.grad().dtype() == DType::f32);
  const std::vector<float> gx = x.grad().to_vector(), gw = w.grad().to_vector();
  double worst = 0;
  for (size_t i = 0; i < gx.size(); ++i) worst = std::max(worst, std::fabs(double(gx[i]) - gx32[i]));
  for (size_t i = 0; i < gw.size(); ++i) worst = std::max(worst, std::fabs(double(gw[i]) - gw32[i]) / 10);
  MESSAGE("largest gradient difference " << worst);
  CHECK(worst <= 0.05);
  waitall();
  test::check_one_line_error([&] { conv2d(cast(x, DType::bf16), cast(w, DType::f16), Tensor()); },
                             "conv2d: x is bfloat16 and the weight float16: cast one to the other's type first");
}
