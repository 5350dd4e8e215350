// The 16-bit activations of autocast's input-type ops on CPU devices (relu, add, max_pool2d,
// batch_norm: kernels/cpu's *16 kernels, core/ops). Their contract: each output is what the float32
// op computes on the widened inputs, rounded once into the input's type; backward the same with the
// 16-bit gradient, BatchNorm's parameter gradients float32. So the reference is the float32 op (its
// kernels are checked against double loops and finite differences in their own tests) between
// casts, and the test asserts equality bit for bit, forward and every gradient, on both formats.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "check.hpp"
#include "core/autograd.hpp"
#include "core/ops.hpp"
#include "core/runtime.hpp"
#include "one_line_error.hpp"

using namespace d2l;

namespace {

Tensor input(const Shape& s, uint32_t seed, float scale = 3.0f) {
  std::vector<float> v = test::lcg_data(numel(s), seed);
  for (float& x : v) x *= scale;
  return Tensor::from_vector(v, s, cpu(0));
}

std::vector<uint32_t> bits(const Tensor& t) {
  std::vector<uint32_t> b;
  for (float v : t.to_vector()) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    b.push_back(u);
  }
  return b;
}

// op on n inputs: with 16-bit x16[i] as they are (the 16-bit kernels), and the float32 op on the
// widened values with its result rounded into t (the reference). Then the loss sum(y * w) backward
// through both: the results' bits and every leaf's gradient (float32 leaves, cast to t on the way in)
// must be the same.
void check_op(const char* what, DType t, const std::vector<Shape>& shapes,
              const std::function<Tensor(const std::vector<Tensor>&)>& op) {
  INFO(what);
  INFO(dtype_name(t));
  std::vector<Tensor> leaves16, leaves_ref, in16, in_ref;
  for (size_t i = 0; i < shapes.size(); ++i) {
    Tensor base = cast(input(shapes[i], static_cast<uint32_t>(7 + i)), t);  // 16-bit values
    leaves16.push_back(cast(base, DType::f32).requires_grad());
    leaves_ref.push_back(cast(base, DType::f32).requires_grad());
    in16.push_back(cast(leaves16.back(), t));
    in_ref.push_back(cast(cast(leaves_ref.back(), t), DType::f32));
  }
  const Tensor y16 = op(in16);
  const Tensor y_ref = cast(op(in_ref), t);
  CHECK(y16.dtype() == t);
  CHECK(bits(y16) == bits(y_ref));
  const Tensor w = input(y16.shape(), 99, 1.0f);
  sum(mul(cast(y16, DType::f32), w)).backward();
  sum(mul(cast(y_ref, DType::f32), w)).backward();
  for (size_t i = 0; i < shapes.size(); ++i) {
    INFO("the gradient of input " << i);
    CHECK(bits(leaves16[i].grad()) == bits(leaves_ref[i].grad()));
  }
}

}  // namespace

TEST_CASE("bias_add, relu, add and max_pool2d on 16-bit activations: the float32 op's results rounded once, forward and backward") {
  for (DType t : {DType::bf16, DType::f16}) {
    check_op("relu", t, {{1000}}, [](const std::vector<Tensor>& x) { return relu(x[0]); });
    const Tensor bias = input({5}, 30, 1.0f);
    check_op("bias_add", t, {{3, 5, 4, 7}}, [&](const std::vector<Tensor>& x) { return bias_add(x[0], bias); });
    check_op("add", t, {{3, 333}, {3, 333}}, [](const std::vector<Tensor>& x) { return add(x[0], x[1]); });
    // ResNet's stem pooling: 3x3 windows, stride 2, padding 1 (overlapping: backward sums in a plane)
    check_op("max_pool2d 3x3/2", t, {{2, 3, 9, 11}},
             [](const std::vector<Tensor>& x) { return max_pool2d(x[0], {3, 3}, {2, 2}, {1, 1}); });
    check_op("max_pool2d 2x2", t, {{2, 3, 8, 8}}, [](const std::vector<Tensor>& x) { return max_pool2d(x[0], {2, 2}); });
  }
}

TEST_CASE("batch_norm on 16-bit activations: statistics and parameters float32, x, y and dx rounded once") {
  for (DType t : {DType::bf16, DType::f16}) {
    for (const Shape& s : {Shape{4, 5, 3, 3}, Shape{16, 7}}) {
      const int64_t C = s[1];
      Tensor gamma = input({C}, 40, 1.0f), beta = input({C}, 41, 1.0f);
      std::vector<Tensor> rm(2), rv(2);  // the running statistics each path updates
      int path = 0;
      check_op("batch_norm, training", t, {s}, [&](const std::vector<Tensor>& x) {
        Tensor& m = rm[static_cast<size_t>(path)];
        Tensor& v = rv[static_cast<size_t>(path++)];
        m = Tensor::zeros({C}, cpu(0)), v = Tensor::ones({C}, cpu(0));
        return batch_norm(x[0], gamma, beta, m, v);
      });
      CHECK(bits(rm[0]) == bits(rm[1]));
      CHECK(bits(rv[0]) == bits(rv[1]));
      // gamma and beta as leaves: their gradients are float32 and the same both ways
      Tensor g16 = gamma.clone().attach_grad(), b16 = beta.clone().attach_grad();
      Tensor g32 = gamma.clone().attach_grad(), b32 = beta.clone().attach_grad();
      Tensor x16 = cast(input(s, 42), t);
      Tensor m1 = Tensor::zeros({C}, cpu(0)), v1 = Tensor::ones({C}, cpu(0)), m2 = m1.clone(), v2 = v1.clone();
      const Tensor w = input(s, 43, 1.0f);
      sum(mul(cast(batch_norm(x16, g16, b16, m1, v1), DType::f32), w)).backward();
      sum(mul(cast(cast(batch_norm(cast(x16, DType::f32), g32, b32, m2, v2), t), DType::f32), w)).backward();
      CHECK(g16.grad().dtype() == DType::f32);
      CHECK(bits(g16.grad()) == bits(g32.grad()));
      CHECK(bits(b16.grad()) == bits(b32.grad()));
      // evaluation: the running statistics normalise
      TrainMode eval(false);
      Tensor y16 = batch_norm(x16, gamma, beta, rm[0], rv[0]);
      CHECK(y16.dtype() == t);
      CHECK(bits(y16) == bits(cast(batch_norm(cast(x16, DType::f32), gamma, beta, rm[0], rv[0]), t)));
    }
  }
}

TEST_CASE("16-bit activations run on CPU devices; elsewhere the ops refuse them in one line") {
  const Tensor h = cast(input({4}, 50), DType::bf16).to(emu(0));
  test::check_one_line_error([&] { relu(h); }, "relu: a bfloat16 input runs on CPU devices only");
  test::check_one_line_error([&] { add(h, h); }, "add: a bfloat16 input runs on CPU devices only");
  // two float types: both in float32, as PyTorch promotes
  const Tensor a = cast(input({4}, 51), DType::bf16), b = input({4}, 52);
  const Tensor y = add(a, b);
  CHECK(y.dtype() == DType::f32);
  CHECK(y.to_vector() == add(cast(a, DType::f32), b).to_vector());
}
