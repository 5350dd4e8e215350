// Tensor parallelism (core/tensor_parallel, Megatron-LM):
//   f, g       f's backward (an allreduce of the replicas' gradients) and g's (the identity, every
//              replica of the output carrying the whole gradient of the one loss) against central
//              differences of the logical loss; without f, or with a g whose backward also sums,
//              the same check fails; g's forward is the sum, with the same bits on every device
//   MLP        the Megatron MLP (column-parallel Dense -> relu -> row-parallel Dense) built from an
//              unsharded one by shard_mlp, on 2 and 4 CPU devices and on emu(0), emu(1): outputs,
//              input gradients and the gathered weight gradients equal the unsharded MLP's on cpu(0)
//              at each of 20 SGD steps, and so do the gathered weights after them (atol 1e-6, rtol
//              1e-5); without f the input gradient differs
//   errors     an empty device list, a device twice, a group not dividing the split dimension: one
//              ConfigError line each; inputs not one per device of the group
//   traffic    per step one allreduce in forward (g) and one in backward (f):
//              payload = 2 * batch * d_model * 4 bytes, counted by the ops
//   layout     parameter names, each shard's shape and device, the layers' descriptions
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "check.hpp"
#include "core/autograd.hpp"
#include "core/nn/dense.hpp"
#include "core/ops.hpp"
#include "core/optim/trainer.hpp"
#include "core/runtime.hpp"
#include "core/tensor_parallel/conjugate_ops.hpp"
#include "core/tensor_parallel/megatron_mlp.hpp"
#include "fd_check.hpp"
#include "reference_mlp.hpp"

using namespace d2l;
using namespace d2l::test::reference_mlp;
using d2l::test::close;
using d2l::test::lcg_data;

namespace {

// One tensor per device with the same values: a replicated group value.
std::vector<Tensor> replicate(const std::vector<float>& v, const Shape& s, const std::vector<Device>& devs,
                              bool grad = true) {
  std::vector<Tensor> out;
  for (Device d : devs) {
    Tensor t = Tensor::from_vector(v, s, d);
    out.push_back(grad ? t.attach_grad() : t);
  }
  return out;
}

// A smooth scalar of y: sum(sigmoid(y) * r).
Tensor smooth_loss(const Tensor& y, const std::vector<float>& r) {
  return sum(mul(sigmoid(y), Tensor::from_vector(r, y.shape(), y.device())));
}

constexpr double kH = 1e-2, kAtol = 2e-3, kRtol = 2e-2;  // test::gradcheck's tolerances

// ---- f: X replicated on 3 devices, device i computes h_i(X) = smooth_loss(X, R_i); the logical
// loss is L(X) = sum_i h_i(X), so dL/dX = sum_i dh_i/dX, which f's backward must give every replica.
struct FCase {
  std::vector<Device> devs{cpu(0), cpu(1), cpu(2)};
  Shape shape{2, 3};
  std::vector<float> x = lcg_data(6, 1);
  std::vector<float> r(size_t i) const { return lcg_data(6, 10 + uint32_t(i)); }
  double logical_loss(const std::vector<double>& xv) const {
    NoGrad no_grad;
    double l = 0;
    for (size_t i = 0; i < devs.size(); ++i)
      l += smooth_loss(Tensor::from_vector(std::vector<float>(xv.begin(), xv.end()), shape, devs[i]), r(i)).item();
    return l;
  }
  // The replicas' gradients after one backward per device loss; with_f = false feeds X_i straight in.
  std::vector<std::vector<float>> grads(bool with_f) const {
    auto xs = replicate(x, shape, devs);
    auto ys = with_f ? tp::copy_to_parallel_region(xs) : xs;
    for (size_t i = 0; i < devs.size(); ++i) smooth_loss(ys[i], r(i)).backward();
    std::vector<std::vector<float>> g;
    for (auto& t : xs) g.push_back(t.grad().to_vector());
    return g;
  }
};

// ---- g: partial Z_j (different on each device) summed into Y, replicated; every device computes the
// same loss of its replica, L(Y) = smooth_loss(Y, R). dL/dZ_j = dL/dY: the identity, per replica.
struct GCase {
  std::vector<Device> devs{cpu(0), cpu(1), cpu(2)};
  Shape shape{2, 3};
  std::vector<float> r = lcg_data(6, 20);
  std::vector<float> z(size_t j) const { return lcg_data(6, 30 + uint32_t(j)); }
  double logical_loss(size_t j, const std::vector<double>& zj) const {
    NoGrad no_grad;
    std::vector<float> y(6, 0.0f);
    for (size_t k = 0; k < devs.size(); ++k) {
      const std::vector<float> v = k == j ? std::vector<float>(zj.begin(), zj.end()) : z(k);
      for (size_t e = 0; e < y.size(); ++e) y[e] += v[e];
    }
    return smooth_loss(Tensor::from_vector(y, shape, cpu(0)), r).item();
  }
};

// ---- The MLP: the unsharded reference on cpu(0) (tests/reference_mlp.hpp, weights from the RNG) and
// the same weights sharded over a group.
struct Reference : test::reference_mlp::ReferenceMlp {
  Reference() : ReferenceMlp(Init::Uniform(0.5f), 3, 4) {}
};

// The sharded parameters put back together as the unsharded layout, on the host.
struct Gathered {
  std::vector<float> w1, b1, w2;
  std::vector<std::vector<float>> b2;  // one per replica
};
Gathered gather(const tp::MegatronMLP& mlp, bool grads) {
  auto values = [&](const nn::ParameterPtr& p, Device d) { return (grads ? p->grad(d) : p->data(d)).to_vector(); };
  const auto& devs = mlp.fc1->devices();
  Gathered g;
  std::vector<std::vector<float>> w2_shards;
  for (size_t i = 0; i < devs.size(); ++i) {
    const auto& s1 = mlp.fc1->shards()[i];
    auto w = values(s1->weight, devs[i]), b = values(s1->bias, devs[i]);
    g.w1.insert(g.w1.end(), w.begin(), w.end());  // shard i: rows [i h, (i+1) h) of (hidden, in)
    g.b1.insert(g.b1.end(), b.begin(), b.end());
    w2_shards.push_back(values(mlp.fc2->shards()[i]->weight, devs[i]));  // (out, h)
    g.b2.push_back(values(mlp.fc2->bias, devs[i]));
  }
  const int64_t h = kHidden / int64_t(devs.size());
  for (int64_t row = 0; row < kModel; ++row)  // shard i: columns [i h, (i+1) h) of (out, hidden)
    for (auto& s : w2_shards) g.w2.insert(g.w2.end(), s.begin() + row * h, s.begin() + (row + 1) * h);
  return g;
}

bool same_as_reference(const Reference& ref, const Gathered& g, bool grads, const std::string& when) {
  auto v = [&](const nn::ParameterPtr& p) { return (grads ? p->grad(cpu(0)) : p->data(cpu(0))).to_vector(); };
  const std::string what = when + (grads ? " gradient of " : " ");
  bool ok = close(v(ref.fc1.weight), g.w1, kMlpAtol, kMlpRtol, (what + "fc1.weight").c_str());
  ok = close(v(ref.fc1.bias), g.b1, kMlpAtol, kMlpRtol, (what + "fc1.bias").c_str()) && ok;
  ok = close(v(ref.fc2.weight), g.w2, kMlpAtol, kMlpRtol, (what + "fc2.weight").c_str()) && ok;
  for (auto& b : g.b2) ok = close(v(ref.fc2.bias), b, kMlpAtol, kMlpRtol, (what + "fc2.bias").c_str()) && ok;
  return ok;
}

// Plain SGD on every tensor, each replica by its own gradient, then the gradients reset. (A Trainer's
// kvstore would sum the row layer's bias replicas, each of which already holds the whole gradient.)
void sgd_step(const nn::ParameterDict& params) {
  for (auto& p : params.trainable()) {
    auto ws = p->list_data(), gs = p->list_grad();
    for (size_t k = 0; k < ws.size(); ++k) sgd_update_(ws[k], gs[k], kLr);
    p->zero_grad();
  }
}

// 20 steps of the sharded MLP beside the unsharded one: each step the outputs (every replica, with
// the same bits on every device), the input gradients and the weight gradients must agree; then
// the weights after the last step.
// optimizer "sgd": plain SGD on every tensor (sgd_step); "adam": Trainers with Adam, the unsharded
// MLP's with the 'device' kvstore on its one device, the sharded MLP's with kvstore 'none' (each
// replica of the row layer's bias updated from its own, whole, gradient).
void check_mlp_against_unsharded(const std::vector<Device>& devs, const std::string& optimizer = "sgd") {
  use_devices(devs);
  Reference ref;
  auto mlp = tp::shard_mlp(ref.fc1, ref.fc2, devs);
  const optim::OptimizerOptions adam{.learning_rate = 0.01f};
  std::vector<std::unique_ptr<optim::Trainer>> trainers;
  if (optimizer == "adam") {
    trainers.push_back(std::make_unique<optim::Trainer>(ref.fc1.collect_params(), "adam", adam, "device"));
    trainers.push_back(std::make_unique<optim::Trainer>(ref.fc2.collect_params(), "adam", adam, "device"));
    trainers.push_back(std::make_unique<optim::Trainer>(mlp->collect_params(), "adam", adam, "none"));
  }
  REQUIRE(same_as_reference(ref, gather(*mlp, false), false, "initial"));
  for (uint32_t step = 0; step < 20; ++step) {
    CAPTURE(step);
    const auto b = ref.forward_backward(100 + step, 200 + step);

    auto xs = replicate(b.X, {kBatch, kModel}, devs);
    auto ys = (*mlp)(xs);
    REQUIRE(ys.size() == devs.size());
    for (size_t i = 0; i < devs.size(); ++i) mse_loss(ys[i], Tensor::from_vector(b.T, {kBatch, kModel}, devs[i])).backward();

    for (size_t i = 0; i < devs.size(); ++i) {
      CHECK(ys[i].device() == devs[i]);
      CHECK(close(b.y.to_vector(), ys[i].to_vector(), kMlpAtol, kMlpRtol, "output"));
      CHECK(ys[i].to_vector() == ys[0].to_vector());
      CHECK(close(b.x.grad().to_vector(), xs[i].grad().to_vector(), kMlpAtol, kMlpRtol, "input gradient"));
    }
    CHECK(same_as_reference(ref, gather(*mlp, true), true, "step " + std::to_string(step)));
    if (optimizer == "adam") {
      for (auto& t : trainers) t->step(1);
    } else {
      sgd_step(ref.fc1.collect_params());
      sgd_step(ref.fc2.collect_params());
      sgd_step(mlp->collect_params());
    }
  }
  CHECK(same_as_reference(ref, gather(*mlp, false), false, "after 20 steps"));
}

}  // namespace

TEST_CASE("f: forward the identity, backward the sum of the replicas' gradients (finite differences)") {
  FCase c;
  use_devices(c.devs);
  const auto g = c.grads(true);
  const test::LossFn L = [&](const std::vector<double>& xv) { return c.logical_loss(xv); };
  for (size_t i = 0; i < c.devs.size(); ++i) {
    CAPTURE(i);
    CHECK(test::fd_check(c.x, g[i], L, kH, kAtol, kRtol, 400, {}, "dX"));
    CHECK(g[i] == g[0]);  // one allreduce: the same bits on every device
  }
  // Without f each replica gets only its own device's part of dL/dX: the same check fails.
  const auto no_f = c.grads(false);
  CHECK_FALSE(test::fd_check(c.x, no_f[0], L, kH, kAtol, kRtol, 400, {}, "dX without f (expected to differ)"));
}

TEST_CASE("f: X's gradient exists once every device's loss has been backpropagated") {
  FCase c;
  use_devices(c.devs);
  auto xs = replicate(c.x, c.shape, c.devs);
  auto ys = tp::copy_to_parallel_region(xs);
  CHECK(ys[1].to_vector() == c.x);
  tp::reset_traffic();
  for (size_t i = 0; i + 1 < c.devs.size(); ++i) smooth_loss(ys[i], c.r(i)).backward();
  for (auto& x : xs) CHECK(x.grad().to_vector() == std::vector<float>(6, 0.0f));  // still zero
  CHECK(tp::traffic().allreduces == 0);
  smooth_loss(ys.back(), c.r(c.devs.size() - 1)).backward();
  CHECK(tp::traffic().allreduces == 1);
  CHECK(xs[0].grad().to_vector() != std::vector<float>(6, 0.0f));
}

TEST_CASE("g: forward the sum with the same bits on every device, backward the identity (finite differences)") {
  GCase c;
  use_devices(c.devs);
  // The sum.
  std::vector<Tensor> zs;
  for (size_t j = 0; j < c.devs.size(); ++j) zs.push_back(Tensor::from_vector(c.z(j), c.shape, c.devs[j]).attach_grad());
  auto ys = tp::reduce_from_parallel_region(zs);
  std::vector<double> want(6, 0.0);
  for (size_t j = 0; j < c.devs.size(); ++j)
    for (size_t e = 0; e < 6; ++e) want[e] += c.z(j)[e];
  for (size_t i = 0; i < c.devs.size(); ++i) {
    CHECK(ys[i].device() == c.devs[i]);
    CHECK(close(want, ys[i].to_vector(), 1e-6, 1e-6, "sum"));
    CHECK(ys[i].to_vector() == ys[0].to_vector());
  }
  // The gradient: one backward per device's replica of the loss.
  for (auto& y : ys) smooth_loss(y, c.r).backward();
  for (size_t j = 0; j < c.devs.size(); ++j) {
    CAPTURE(j);
    const test::LossFn L = [&](const std::vector<double>& zj) { return c.logical_loss(j, zj); };
    CHECK(test::fd_check(c.z(j), zs[j].grad().to_vector(), L, kH, kAtol, kRtol, 400, {}, "dZ"));
  }
  // A sum whose backward also sums (plain copies added on each device) gives every Z_j P times the
  // gradient under one backward per replica: the same check fails.
  std::vector<Tensor> zs2;
  for (size_t j = 0; j < c.devs.size(); ++j) zs2.push_back(Tensor::from_vector(c.z(j), c.shape, c.devs[j]).attach_grad());
  for (Device d : c.devs) {
    Tensor y = zs2[0].to(d);
    for (size_t j = 1; j < zs2.size(); ++j) y = add(y, zs2[j].to(d));
    smooth_loss(y, c.r).backward();
  }
  const test::LossFn L0 = [&](const std::vector<double>& z0) { return c.logical_loss(0, z0); };
  CHECK_FALSE(test::fd_check(c.z(0), zs2[0].grad().to_vector(), L0, kH, kAtol, kRtol, 400, {},
                             "dZ of a summing backward (expected to differ)"));
}

TEST_CASE("the Megatron MLP on 2 and 4 CPU devices equals the unsharded MLP over 20 SGD steps") {
  SUBCASE("2 devices") { check_mlp_against_unsharded({cpu(0), cpu(1)}); }
  SUBCASE("4 devices") { check_mlp_against_unsharded({cpu(0), cpu(1), cpu(2), cpu(3)}); }
}

TEST_CASE("the Megatron MLP on emulated GPUs [emu(0), emu(1)] equals the unsharded MLP over 20 SGD steps") {
  check_mlp_against_unsharded({emu(0), emu(1)});
}

TEST_CASE("the Megatron MLP with Adam Trainers (kvstore 'none') equals the unsharded MLP over 20 steps") {
  SUBCASE("2 devices") { check_mlp_against_unsharded({cpu(0), cpu(1)}, "adam"); }
  SUBCASE("4 devices") { check_mlp_against_unsharded({cpu(0), cpu(1), cpu(2), cpu(3)}, "adam"); }
}

TEST_CASE("kvstore 'none' sums nothing: each replica is updated from its own gradient") {
  // The row layer's bias holds the whole gradient on every replica: 'device' would count it twice.
  for (const std::string kv : {"none", "device"}) {
    CAPTURE(kv);
    auto p = std::make_shared<Parameter>("bias", Shape{3}, Init::Zero());
    p->initialize({cpu(0), cpu(1)});
    nn::ParameterDict dict;
    dict.add("bias", p);
    optim::Trainer t(dict, "sgd", {.learning_rate = 1.0f}, kv);
    for (auto& w : p->list_data()) sum(mul(w, Tensor::from_vector(std::vector<float>{1, 2, 3}, {3}, w.device()))).backward();
    t.step(1);
    const std::vector<float> want = kv == "none" ? std::vector<float>{-1, -2, -3} : std::vector<float>{-2, -4, -6};
    for (auto& w : p->list_data()) CHECK(w.to_vector() == want);
  }
}

TEST_CASE("the Megatron MLP without f: the input gradient is only one shard's part") {
  const std::vector<Device> devs{cpu(0), cpu(1)};
  use_devices(devs);
  Reference ref;
  auto mlp = tp::shard_mlp(ref.fc1, ref.fc2, devs);
  const auto b = ref.forward_backward(7, 8);
  // fc1's shards called directly: the column-parallel layer without its f.
  auto xs = replicate(b.X, {kBatch, kModel}, devs);
  std::vector<Tensor> hs;
  for (size_t i = 0; i < devs.size(); ++i) hs.push_back(mlp->fc1->shards()[i]->forward(xs[i]));
  auto ys = mlp->fc2->forward_shards(hs);
  for (size_t i = 0; i < devs.size(); ++i) mse_loss(ys[i], Tensor::from_vector(b.T, {kBatch, kModel}, devs[i])).backward();
  CHECK(close(b.y.to_vector(), ys[0].to_vector(), kMlpAtol, kMlpRtol, "output (f moves nothing forward)"));
  CHECK_FALSE(close(b.x.grad().to_vector(), xs[0].grad().to_vector(), kMlpAtol, kMlpRtol, "dX without f (expected to differ)"));
}

TEST_CASE("tensor-parallel layers: bad groups and inputs are one clear error") {
  use_devices({cpu(0), cpu(1), cpu(2), cpu(3)});
  const std::vector<Device> four{cpu(0), cpu(1), cpu(2), cpu(3)};
  CHECK_THROWS_WITH_AS(tp::ColumnParallelDense(6, four),
                       "ColumnParallelDense: units 6 cannot be split evenly over 4 devices [cpu(0), cpu(1), cpu(2), "
                       "cpu(3)] (needs a positive multiple of 4)",
                       ConfigError);
  CHECK_THROWS_WITH_AS(tp::RowParallelDense(8, 10, four),
                       "RowParallelDense: in_units 10 cannot be split evenly over 4 devices [cpu(0), cpu(1), cpu(2), "
                       "cpu(3)] (needs a positive multiple of 4)",
                       ConfigError);
  CHECK_THROWS_WITH_AS(tp::ColumnParallelDense(8, {}), "ColumnParallelDense: needs at least one device", ConfigError);
  CHECK_THROWS_WITH_AS(tp::RowParallelDense(8, 8, {}), "RowParallelDense: needs at least one device", ConfigError);
  CHECK_THROWS_WITH_AS(tp::ColumnParallelDense(8, {cpu(0), cpu(1), cpu(0)}),
                       "ColumnParallelDense: device cpu(0) is listed twice in [cpu(0), cpu(1), cpu(0)]", ConfigError);
  CHECK_THROWS_WITH_AS(tp::RowParallelDense(8, 8, {cpu(1), cpu(1)}),
                       "RowParallelDense: device cpu(1) is listed twice in [cpu(1), cpu(1)]", ConfigError);
  // shard_mlp checks the group against the hidden width.
  Reference ref;
  CHECK_THROWS_AS(tp::shard_mlp(ref.fc1, ref.fc2, {cpu(0), cpu(1), cpu(2)}), ConfigError);
  CHECK_THROWS_AS(tp::shard_mlp(ref.fc1, ref.fc2, {}), ConfigError);
  // Inputs: one per device of the group, in its order.
  tp::ColumnParallelDense col(8, {cpu(0), cpu(1)});
  const Tensor a = Tensor::ones({2, 4}, cpu(0)), b = Tensor::ones({2, 4}, cpu(1));
  CHECK_THROWS_WITH_AS(col.forward_shards({b, a}),
                       "ColumnParallelDense: takes one input per device of its group [cpu(0), cpu(1)], in that order, "
                       "got [cpu(1), cpu(0)]",
                       ShapeError);
  CHECK_THROWS_AS(col.forward(a), ShapeError);
  CHECK_THROWS_AS(tp::copy_to_parallel_region({a, a}), ShapeError);
  CHECK_THROWS_AS(tp::reduce_from_parallel_region({a, Tensor::ones({2, 3}, cpu(1))}), ShapeError);
  CHECK_THROWS_AS(tp::reduce_from_parallel_region({}), ShapeError);
}

TEST_CASE("communication per step: one allreduce forward (g), one backward (f), 2 * batch * d_model * 4 bytes") {
  for (const std::vector<Device>& devs : {std::vector<Device>{cpu(0), cpu(1)}, std::vector<Device>{cpu(0), cpu(1), cpu(2), cpu(3)}}) {
    CAPTURE(devs.size());
    use_devices(devs);
    Reference ref;
    auto mlp = tp::shard_mlp(ref.fc1, ref.fc2, devs);
    const int64_t per_allreduce = kBatch * kModel * 4;  // a (batch, d_model) float32 activation
    tp::reset_traffic();
    auto xs = replicate(lcg_data(kBatch * kModel, 5), {kBatch, kModel}, devs);
    auto ys = (*mlp)(xs);
    CHECK(tp::traffic().allreduces == 1);  // g
    CHECK(tp::traffic().payload_bytes == per_allreduce);
    for (size_t i = 0; i < devs.size(); ++i) sum(ys[i]).backward();
    CHECK(tp::traffic().allreduces == 2);  // f
    CHECK(tp::traffic().payload_bytes == 2 * kBatch * kModel * 4);
    // An input that needs no gradient (the first layer's data): f has nothing to send back.
    tp::reset_traffic();
    ys = (*mlp)(replicate(lcg_data(kBatch * kModel, 6), {kBatch, kModel}, devs, false));
    for (size_t i = 0; i < devs.size(); ++i) sum(ys[i]).backward();
    CHECK(tp::traffic().allreduces == 1);
    CHECK(tp::traffic().payload_bytes == per_allreduce);
  }
  // In and out widths differ: f sums the (batch, in) input gradient, g the (batch, out) output.
  const std::vector<Device> two{cpu(0), cpu(1)};
  use_devices(two);
  tp::MegatronMLP mlp(12, 5, two, "relu", 3);
  tp::reset_traffic();
  auto ys = mlp(replicate(lcg_data(4 * 3, 9), {4, 3}, two));
  for (auto& y : ys) sum(y).backward();
  CHECK(tp::traffic().allreduces == 2);
  CHECK(tp::traffic().payload_bytes == 4 * 5 * 4 + 4 * 3 * 4);
}

TEST_CASE("tensor-parallel layers: parameter names, shard shapes and placement, descriptions") {
  const std::vector<Device> two{cpu(0), cpu(1)};
  use_devices(two);
  Reference ref;
  auto mlp = tp::shard_mlp(ref.fc1, ref.fc2, two);
  std::vector<std::string> names;
  for (auto& [name, p] : mlp->collect_params()) names.push_back(name);
  // A block's own parameters come before its children's (Block::collect_params).
  CHECK(names == std::vector<std::string>{"fc1.0.weight", "fc1.0.bias", "fc1.1.weight", "fc1.1.bias", "fc2.bias",
                                          "fc2.0.weight", "fc2.1.weight"});
  auto params = mlp->collect_params();
  CHECK(params["fc1.1.weight"].shape() == Shape{kHidden / 2, kModel});
  CHECK(params["fc1.1.weight"].list_ctx() == std::vector<Device>{cpu(1)});
  CHECK(params["fc2.0.weight"].shape() == Shape{kModel, kHidden / 2});
  CHECK(params["fc2.0.weight"].list_ctx() == std::vector<Device>{cpu(0)});
  CHECK(params["fc2.bias"].list_ctx() == two);
  CHECK(mlp->fc1->describe() == "ColumnParallelDense(8 -> 16 over [cpu(0), cpu(1)], Activation(relu))");
  CHECK(mlp->fc2->describe() == "RowParallelDense(16 -> 8 over [cpu(0), cpu(1)])");
}
