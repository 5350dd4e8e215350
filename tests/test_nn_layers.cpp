// The layers of core/nn: every block's forward against direct loops or the op-level functions with
// the same parameters, every backward (input and parameter gradients) against central finite
// differences of the block's own forward, deferred shapes and their errors, BatchNorm's per-device
// running statistics, Sequential/Residual over shards, and the same blocks on emulated GPUs
// [emu(0), emu(1)] against cpu(0).
//   FD: h 1e-3, |numeric - analytic| <= 2e-3 + 2e-2 |numeric| (gradcheck's tolerances, fd_check.hpp) + the bend
//   of a relu kink (fd_check_kinks), at most 40 points a tensor.
//   emu vs cpu: |cpu - emu| <= 1e-4 + 1e-4 |cpu|.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <stdexcept>

#include "check.hpp"
#include "core/autograd.hpp"
#include "core/nn/nn.hpp"
#include "core/ops.hpp"
#include "core/rng.hpp"
#include "fd_check.hpp"

using namespace d2l;
using namespace d2l::nn;
using d2l::test::close;
using d2l::test::lcg_data;

namespace {

Tensor tensor(const std::vector<float>& v, const Shape& s, Device d = cpu(0)) { return Tensor::from_vector(v, s, d); }
Tensor random_tensor(const Shape& s, uint32_t seed, Device d = cpu(0)) { return tensor(lcg_data(numel(s), seed), s, d); }

// Distinct, well-separated values so that max pooling has no near-ties within h.
std::vector<float> spread(int64_t n, uint32_t seed) {
  auto v = lcg_data(n, seed);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 37 + seed) % n) * 0.1f + 0.01f * v[i];
  return v;
}

// Initialises `net` with Normal(0.5) weights on `devices`, runs x once so deferred shapes are known,
// then gives every trainable parameter (biases, BatchNorm's gamma and beta too) values in [-1, 1) so
// that each of them matters to the output. Replicas stay identical.
void setup(Block& net, const Tensor& x, const std::vector<Device>& devices = {cpu(0)}, uint32_t seed = 7) {
  manual_seed(seed);
  net.initialize(Init::Normal(0.5f), devices);
  net(x.to(devices[0]));
  for (auto& p : net.collect_params().trainable())
    p->set_data(tensor(lcg_data(numel(p->shape()), seed++), p->shape(), devices[0]));
}

using Loss = d2l::test::KinkLoss;
using d2l::test::fd_check_kinks;  // central differences that forgive relu kinks (fd_check.hpp)

// d(sum(net(x) * r))/d(x and every trainable parameter's replica on x's device) against central
// differences of the block's forward (run under NoGrad, in the current training mode).
// broken_op: break that op's backward in the graph (test::break_backward_of); the check must then fail.
bool block_gradcheck(Block& net, const Tensor& x0, const char* broken_op = nullptr, double h = 1e-3, double atol = 2e-3,
                     double rtol = 2e-2, int64_t points = 40) {
  Device d = x0.device();
  const Shape xs = x0.shape();
  const std::vector<float> xv = x0.to_vector();
  auto params = net.collect_params().trainable();
  for (auto& p : params) p->zero_grad();
  Tensor x = tensor(xv, xs, d).attach_grad();
  Tensor y = net(x);
  const std::vector<float> r = lcg_data(y.numel(), 99);
  Tensor loss_r = sum(mul(y, tensor(r, y.shape(), d)));
  if (broken_op) test::break_backward_of(loss_r, broken_op);
  loss_r.backward();
  auto loss = [&](const Tensor& input) {
    NoGrad no_grad;
    return test::dot(test::to_double(net(input).to_vector()), r);
  };
  bool ok = fd_check_kinks(
      xv, x.grad().to_vector(), [&](const std::vector<float>& v) { return loss(tensor(v, xs, d)); }, h, atol, rtol,
      points, "input");
  Tensor x_plain = tensor(xv, xs, d);
  for (auto& p : params) {
    Tensor w = p->data(d);
    const std::vector<float> wv = w.to_vector();
    auto at = [&](const std::vector<float>& v) {
      tensor(v, w.shape(), d).copyto(w);
      return loss(x_plain);
    };
    ok = fd_check_kinks(wv, w.grad().to_vector(), at, h, atol, rtol, points, p->name().c_str()) && ok;
    tensor(wv, w.shape(), d).copyto(w);  // restore
  }
  return ok;
}

// The block (initialised by setup() on cpu(0) and on `others`) gives the same output, input
// gradient and parameter gradients on each device of `others` as on cpu(0).
void check_same_on(Block& net, const Tensor& x_cpu, const std::vector<Device>& others) {
  auto params = net.collect_params().trainable();
  for (auto& p : params) p->zero_grad();
  auto run = [&](Device d) {
    Tensor x = x_cpu.to(d).detach();
    x.attach_grad();
    Tensor y = net(x);
    sum(mul(y, random_tensor(y.shape(), 99, d))).backward();
    return std::pair{y, x};
  };
  auto [y0, x0] = run(cpu(0));
  for (Device d : others) {
    CAPTURE(d.str());
    auto [y, x] = run(d);
    CHECK(y.device() == d);
    CHECK(y.shape() == y0.shape());
    CHECK(close(y0.to_vector(), y.to_vector(), 1e-4, 1e-4, "output"));
    CHECK(close(x0.grad().to_vector(), x.grad().to_vector(), 1e-4, 1e-4, "input grad"));
    for (auto& p : params) {
      CAPTURE(p->name());
      CHECK(close(p->grad(cpu(0)).to_vector(), p->grad(d).to_vector(), 1e-4, 1e-4, p->name().c_str()));
    }
  }
}

// A BatchNorm that records how forward_shards reaches it (what a SyncBatchNorm relies on).
struct SpyBatchNorm : BatchNorm {
  int calls = 0;
  size_t shards = 0;
  std::vector<Tensor> forward_shards(const std::vector<Tensor>& xs) override {
    ++calls;
    shards = xs.size();
    for (auto& x : xs) infer_channels(x);
    return BatchNorm::forward_shards(xs);
  }
  std::string type() const override { return "SpyBatchNorm"; }
};

}  // namespace

TEST_CASE("Dense: flattens, matches a double loop with and without bias, relu and sigmoid; FD backward") {
  Tensor x = random_tensor({3, 2, 2, 2}, 1);  // flattened to (3, 8)
  for (auto [act, use_bias] :
       {std::pair{"", true}, std::pair{"relu", true}, std::pair{"sigmoid", true}, std::pair{"", false}}) {
    CAPTURE(act);
    CAPTURE(use_bias);
    Dense fc(5, act, use_bias);
    setup(fc, x);
    CHECK(fc.weight->shape() == Shape{5, 8});
    CHECK(fc.collect_params().size() == (use_bias ? 2u : 1u));
    auto xv = x.to_vector(), w = fc.weight->data().to_vector();
    auto b = use_bias ? fc.bias->data().to_vector() : std::vector<float>(5, 0.0f);
    std::vector<double> ref(15);
    for (int n = 0; n < 3; ++n)
      for (int u = 0; u < 5; ++u) {
        double s = b[u];
        for (int k = 0; k < 8; ++k) s += double(xv[n * 8 + k]) * w[u * 8 + k];
        const std::string a = act;
        ref[n * 5 + u] = a == "relu" ? std::max(s, 0.0) : a == "sigmoid" ? 1.0 / (1.0 + std::exp(-s)) : s;
      }
    Tensor y = fc(x);
    CHECK(y.shape() == Shape{3, 5});
    CHECK(close(ref, y.to_vector(), 1e-5, 1e-5, "dense"));
    CHECK(fc.describe() == std::string("Dense(8 -> 5, ") + (*act ? "Activation(" + std::string(act) + ")" : "linear") + ")");
    CHECK(block_gradcheck(fc, x));
  }
}

TEST_CASE("Conv2D: the conv2d op with the same weights (pairs, strides, padding, relu); FD backward") {
  Tensor x = random_tensor({2, 3, 6, 5}, 2);
  Conv2D conv(4, Pair{3, 2}, Pair{2, 1}, Pair{1, 0}, true, 0, "relu");
  setup(conv, x);
  CHECK(conv.weight->shape() == Shape{4, 3, 3, 2});
  Tensor ref = relu(conv2d(x, conv.weight->data(), conv.bias->data(), {2, 1}, {1, 0}));
  Tensor y = conv(x);
  CHECK(y.shape() == Shape{2, 4, 3, 4});
  CHECK(close(ref.to_vector(), y.to_vector(), 1e-6, 1e-6, "conv"));
  CHECK(block_gradcheck(conv, x));

  Conv2D plain(Conv2D::Options{.channels = 2, .kernel_size = 1, .use_bias = false, .in_channels = 3});
  CHECK(plain.weight->shape() == Shape{2, 3, 1, 1});  // known at once: in_channels given
  setup(plain, x);
  CHECK(close(conv2d(x, plain.weight->data(), Tensor()).to_vector(), plain(x).to_vector(), 1e-6, 1e-6, "1x1"));
  CHECK(block_gradcheck(plain, x));

  Conv2D squashed(Conv2D::Options{.channels = 2, .kernel_size = 3, .activation = "sigmoid"});
  setup(squashed, x);
  CHECK(squashed.describe() == "Conv2D(3 -> 2, kernel_size=(3, 3), stride=(1, 1), Activation(sigmoid))");
  Tensor squashed_ref = sigmoid(conv2d(x, squashed.weight->data(), squashed.bias->data()));
  CHECK(close(squashed_ref.to_vector(), squashed(x).to_vector(), 0, 0, "conv sigmoid"));
  CHECK(block_gradcheck(squashed, x));
}

TEST_CASE("a deliberately broken backward fails the block's gradient check (the kink allowance hides none)") {
  Tensor x = random_tensor({2, 2, 4, 4}, 3);
  Conv2D conv(2, 3, 1, 1);
  Residual blk(3, true, 2);
  MaxPool2D pool(2);
  Dense fc(3, "relu");
  setup(conv, x);
  setup(blk, x);
  setup(fc, x);
  Tensor xs = tensor(spread(x.numel(), 3), x.shape());
  for (auto [op, block, input] : {std::tuple<const char*, Block*, Tensor>{"conv2d", &conv, x}, {"batch_norm", &blk, x},
                                  {"relu", &blk, x}, {"max_pool2d", &pool, xs}, {"matmul", &fc, x}}) {
    CAPTURE(op);
    CHECK(block_gradcheck(*block, input));
    CHECK_FALSE(block_gradcheck(*block, input, op));
  }
}

TEST_CASE("pools, Activation and Flatten: the op-level functions; FD backward") {
  Tensor x = tensor(spread(2 * 3 * 5 * 6, 5), {2, 3, 5, 6});
  MaxPool2D max3(3, 2, 1);
  AvgPool2D avg2(2);  // strides default to the window
  GlobalAvgPool2D gap;
  Activation act("relu");
  Flatten flat;
  CHECK(close(max_pool2d(x, {3, 3}, {2, 2}, {1, 1}).to_vector(), max3(x).to_vector(), 0, 0, "max"));
  CHECK(avg2(x).shape() == Shape{2, 3, 2, 3});
  CHECK(close(avg_pool2d(x, {2, 2}, {2, 2}).to_vector(), avg2(x).to_vector(), 0, 0, "avg"));
  CHECK(close(global_avg_pool2d(x).to_vector(), gap(x).to_vector(), 0, 0, "gap"));
  Tensor xr = random_tensor({2, 3, 2, 2}, 6);
  CHECK(close(relu(xr).to_vector(), act(xr).to_vector(), 0, 0, "relu"));
  Activation squash("sigmoid");
  CHECK(squash.describe() == "Activation(sigmoid)");
  CHECK(close(sigmoid(xr).to_vector(), squash(xr).to_vector(), 0, 0, "sigmoid"));
  CHECK(block_gradcheck(squash, random_tensor({2, 3, 2, 2}, 9)));
  CHECK(flat(x).shape() == Shape{2, 90});
  CHECK(flat(x).to_vector() == x.to_vector());
  for (Block* b : std::initializer_list<Block*>{&max3, &avg2, &gap, &flat}) {
    CAPTURE(b->describe());
    CHECK(block_gradcheck(*b, x));
  }
  CHECK(block_gradcheck(act, random_tensor({2, 3, 2, 2}, 8)));
  CHECK(max3.describe() == "MaxPool2D(size=(3, 3), stride=(2, 2), padding=(1, 1))");
  CHECK(avg2.describe() == "AvgPool2D(size=(2, 2), stride=(2, 2), padding=(0, 0))");
  CHECK_THROWS_WITH_AS(gap(random_tensor({2, 3}, 1)), "GlobalAvgPool2D: input must be (N, C, H, W), got (2, 3)",
                       ShapeError);
}

TEST_CASE("BatchNorm: the batch_norm op on (N, C) and (N, C, H, W), running statistics, eval mode; FD backward") {
  for (Shape s : {Shape{6, 3}, Shape{2, 3, 3, 2}}) {
    CAPTURE(str(s));
    Tensor x = random_tensor(s, 9);
    BatchNorm bn(0, 0.3f);
    setup(bn, x);  // one training forward already: the running statistics moved
    Tensor rm = bn.running_mean->data().clone(), rv = bn.running_var->data().clone();
    Tensor rm_ref = rm.clone(), rv_ref = rv.clone();
    Tensor ref = batch_norm(x, bn.weight->data(), bn.bias->data(), rm_ref, rv_ref, 0.3f, 1e-5f);
    CHECK(close(ref.to_vector(), bn(x).to_vector(), 1e-6, 1e-6, "train"));
    CHECK(close(rm_ref.to_vector(), bn.running_mean->data().to_vector(), 0, 0, "running_mean"));
    CHECK(close(rv_ref.to_vector(), bn.running_var->data().to_vector(), 0, 0, "running_var"));
    CHECK(block_gradcheck(bn, x));
    TrainMode eval(false);
    Tensor before = bn.running_mean->data().clone();
    Tensor ref_eval = batch_norm(x, bn.weight->data(), bn.bias->data(), bn.running_mean->data(), bn.running_var->data());
    CHECK(close(ref_eval.to_vector(), bn(x).to_vector(), 1e-6, 1e-6, "eval"));
    CHECK(before.to_vector() == bn.running_mean->data().to_vector());  // evaluation leaves them alone
  }
  BatchNorm bn;
  std::vector<std::string> names;
  for (auto& [n, p] : bn.collect_params()) names.push_back(n + (p->differentiable() ? "" : " (no grad)"));
  CHECK(names == std::vector<std::string>{"weight", "bias", "running_mean (no grad)", "running_var (no grad)"});
  CHECK(bn.describe() == "BatchNorm(axis=1, eps=1e-05, momentum=0.1, in_channels=None)");
  CHECK_THROWS_WITH_AS(bn(random_tensor({4}, 1)),
                       "BatchNorm(axis=1, eps=1e-05, momentum=0.1, in_channels=None): input must be (N, C) or "
                       "(N, C, H, W), got (4,)",
                       ShapeError);
}

TEST_CASE("BatchNorm on 2 devices keeps running statistics per device (Gluon's behaviour)") {
  const float m = 0.1f;
  const int64_t N = 3, C = 2, HW = 4;
  BatchNorm bn;
  bn.initialize(Init::Normal(0.5f), {cpu(0), cpu(1)});
  std::vector<Tensor> shards{random_tensor({N, C, 2, 2}, 21, cpu(0)), random_tensor({N, C, 2, 2}, 22, cpu(1))};
  bn(shards);  // one training forward of shard i on device i
  std::vector<std::vector<double>> mean(2, std::vector<double>(C)), var(2, std::vector<double>(C));
  for (int i = 0; i < 2; ++i) {
    CAPTURE(i);
    auto v = shards[i].to_vector();
    std::vector<double> want_m(C), want_v(C);
    for (int64_t c = 0; c < C; ++c) {
      double s = 0, ss = 0;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < HW; ++k) s += v[(n * C + c) * HW + k];
      mean[i][c] = s / (N * HW);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < HW; ++k) ss += std::pow(v[(n * C + c) * HW + k] - mean[i][c], 2);
      var[i][c] = ss / (N * HW - 1);  // unbiased, as PyTorch's running_var
      want_m[c] = (1 - m) * 0.0 + m * mean[i][c];
      want_v[c] = (1 - m) * 1.0 + m * var[i][c];
    }
    CHECK(close(want_m, bn.running_mean->data(cpu(i)).to_vector(), 1e-6, 1e-5, "running_mean"));
    CHECK(close(want_v, bn.running_var->data(cpu(i)).to_vector(), 1e-6, 1e-5, "running_var"));
  }
  auto rm0 = bn.running_mean->data(cpu(0)).to_vector(), rm1 = bn.running_mean->data(cpu(1)).to_vector();
  CHECK(rm0 != rm1);
  // Evaluation: each device normalises with its own running statistics (gamma 1, beta 0).
  TrainMode eval(false);
  for (int i = 0; i < 2; ++i) {
    auto rm = bn.running_mean->data(cpu(i)).to_vector(), rv = bn.running_var->data(cpu(i)).to_vector();
    auto v = shards[i].to_vector();
    std::vector<double> want(v.size());
    for (size_t k = 0; k < v.size(); ++k) {
      size_t c = (k / HW) % C;
      want[k] = (v[k] - rm[c]) / std::sqrt(double(rv[c]) + 1e-5);
    }
    CHECK(close(want, bn(shards[i]).to_vector(), 1e-5, 1e-5, "eval"));
  }
}

TEST_CASE("deferred shapes: known after the first forward, the book's error before, a clear error after") {
  Conv2D conv(4, 3);
  conv.initialize(Init::Normal(0.5f), {cpu(0)});
  CHECK(conv.weight->shape() == Shape{4, 0, 3, 3});
  CHECK_THROWS_WITH_AS(conv.weight->data(cpu(0)), doctest::Contains("initialization was deferred"), ParameterError);
  CHECK(conv.describe() == "Conv2D(None -> 4, kernel_size=(3, 3), stride=(1, 1))");
  conv(random_tensor({1, 2, 5, 5}, 1));
  CHECK(conv.weight->shape() == Shape{4, 2, 3, 3});
  CHECK(conv.weight->data(cpu(0)).shape() == Shape{4, 2, 3, 3});
  CHECK(conv.describe() == "Conv2D(2 -> 4, kernel_size=(3, 3), stride=(1, 1))");
  CHECK_THROWS_WITH_AS(conv(random_tensor({1, 3, 5, 5}, 1)),
                       "Conv2D(2 -> 4, kernel_size=(3, 3), stride=(1, 1)): input (1, 3, 5, 5) needs weight "
                       "(4, 3, 3, 3), but weight is (4, 2, 3, 3)",
                       ShapeError);
  CHECK_THROWS_WITH_AS(conv(random_tensor({2, 5, 5}, 1)),
                       doctest::Contains("input must be (N, C, H, W), got (2, 5, 5)"), ShapeError);

  Sequential net;
  net.add(std::make_shared<Dense>(3), std::make_shared<BatchNorm>());
  net.initialize(Init::Normal(0.5f), {cpu(0)});
  net(random_tensor({4, 6}, 2));
  CHECK(net.collect_params()["0.weight"].shape() == Shape{3, 6});
  CHECK(net.collect_params()["1.running_var"].shape() == Shape{3});
  CHECK_THROWS_WITH_AS(net(random_tensor({4, 5}, 2)),
                       "Dense(6 -> 3, linear): input (4, 5) needs 0.weight (3, 5), but 0.weight is (3, 6)", ShapeError);
  BatchNorm bn;
  bn.initialize(Init::Normal(), {cpu(0)});
  bn(random_tensor({4, 3}, 3));
  CHECK_THROWS_WITH_AS(bn(random_tensor({4, 2}, 3)), doctest::Contains("input (4, 2) needs weight (2,), but weight is (3,)"),
                       ShapeError);
}

TEST_CASE("Sequential: children in order, the same as composing the ops by hand; indexing and its errors") {
  Tensor x = random_tensor({2, 1, 6, 6}, 4);
  Sequential net;
  net.add(std::make_shared<Conv2D>(3, 3, 1, 1, true, 0, "relu"), std::make_shared<MaxPool2D>(2));
  net.add(std::make_shared<Flatten>()).add(std::make_shared<Dense>(4));
  setup(net, x);
  CHECK(net.size() == 4);
  auto conv = std::dynamic_pointer_cast<Conv2D>(net[0]);
  auto fc = std::dynamic_pointer_cast<Dense>(net.at(-1));
  REQUIRE(conv);
  REQUIRE(fc);
  Tensor by_hand = relu(conv2d(x, conv->weight->data(), conv->bias->data(), {1, 1}, {1, 1}));
  by_hand = dense(flatten(max_pool2d(by_hand, {2, 2})), fc->weight->data(), fc->bias->data());
  CHECK(close(by_hand.to_vector(), net(x).to_vector(), 1e-6, 1e-6, "sequential"));
  CHECK(block_gradcheck(net, x));
  std::vector<std::string> names;
  for (auto& [n, p] : net.collect_params()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"0.weight", "0.bias", "3.weight", "3.bias"});

  CHECK_THROWS_WITH_AS(net[4], "Sequential: index 4 is out of range for 4 blocks", std::out_of_range);
  CHECK_THROWS_WITH_AS(net.at(-5), "Sequential: index -5 is out of range for 4 blocks", std::out_of_range);
  CHECK_THROWS_WITH_AS(Sequential().at(0), "Sequential: index 0 is out of range for 0 blocks", std::out_of_range);
}

TEST_CASE("Residual: the book's formula with the op-level functions, with and without 1x1 conv and stride 2") {
  struct Case {
    int64_t channels;
    bool use_1x1conv;
    int64_t strides;
  };
  for (Case c : {Case{2, false, 1}, Case{3, true, 1}, Case{3, true, 2}}) {
    CAPTURE(c.use_1x1conv);
    CAPTURE(c.strides);
    Tensor X = random_tensor({2, 2, 5, 5}, 10);
    Residual blk(c.channels, c.use_1x1conv, c.strides);
    CHECK(bool(blk.conv3) == c.use_1x1conv);
    setup(blk, X);
    auto conv = [](const Conv2D& k, const Tensor& t, int64_t s, int64_t p) {
      return conv2d(t, k.weight->data(), k.bias->data(), {s, s}, {p, p});
    };
    auto bn = [](const BatchNorm& b, const Tensor& t) {  // fresh statistics: training output does not use them
      int64_t C = t.dim(1);
      return batch_norm(t, b.weight->data(), b.bias->data(), Tensor::zeros({C}, cpu(0)), Tensor::ones({C}, cpu(0)));
    };
    Tensor Y = relu(bn(*blk.bn1, conv(*blk.conv1, X, c.strides, 1)));
    Y = bn(*blk.bn2, conv(*blk.conv2, Y, 1, 1));
    Tensor shortcut = c.use_1x1conv ? conv(*blk.conv3, X, c.strides, 0) : X;
    Tensor ref = relu(Y + shortcut);
    Tensor out = blk(X);
    int64_t side = c.strides == 2 ? 3 : 5;
    CHECK(out.shape() == Shape{2, c.channels, side, side});
    CHECK(close(ref.to_vector(), out.to_vector(), 1e-5, 1e-5, "residual"));
    CHECK(block_gradcheck(blk, X));
  }
}

TEST_CASE("Sequential and Residual pass all shards to each layer; outputs equal forward per shard") {
  Sequential net;
  net.add(resnet_block(2, 1, true), resnet_block(3, 1));
  std::vector<Tensor> xs{random_tensor({2, 2, 4, 4}, 30, cpu(0)), random_tensor({2, 2, 4, 4}, 31, cpu(1))};
  setup(net, xs[0], {cpu(0), cpu(1)});
  auto first = std::dynamic_pointer_cast<Residual>(std::dynamic_pointer_cast<Sequential>(net[1])->at(0));
  REQUIRE(first);
  auto spy = std::make_shared<SpyBatchNorm>();
  spy->initialize(Init::One(), {cpu(0), cpu(1)});
  first->bn2 = spy;  // the Residual now calls the spy (a stand-in for a SyncBatchNorm)
  auto ys = net(xs);
  CHECK(spy->calls == 1);
  CHECK(spy->shards == 2);
  REQUIRE(ys.size() == 2);
  for (int i = 0; i < 2; ++i) {
    CHECK(ys[i].device() == cpu(i));
    CHECK(ys[i].shape() == Shape{2, 3, 2, 2});
    CHECK(ys[i].to_vector() == net(xs[i]).to_vector());
  }
}

TEST_CASE("resnet_block as the book writes it; names, repr") {
  auto stage = resnet_block(4, 2);
  REQUIRE(stage->size() == 2);
  auto r0 = std::dynamic_pointer_cast<Residual>((*stage)[0]), r1 = std::dynamic_pointer_cast<Residual>((*stage)[1]);
  CHECK(r0->conv3);  // halves height and width, so the shortcut needs the 1x1 conv
  CHECK_FALSE(r1->conv3);
  CHECK_FALSE(std::dynamic_pointer_cast<Residual>((*resnet_block(4, 2, true))[0])->conv3);
  std::vector<std::string> names;
  for (auto& [n, p] : stage->collect_params())
    if (n.rfind("0.", 0) == 0) names.push_back(n);
  CHECK(names == std::vector<std::string>{
                     "0.conv1.weight", "0.conv1.bias", "0.conv2.weight", "0.conv2.bias", "0.conv3.weight",
                     "0.conv3.bias", "0.bn1.weight", "0.bn1.bias", "0.bn1.running_mean", "0.bn1.running_var",
                     "0.bn2.weight", "0.bn2.bias", "0.bn2.running_mean", "0.bn2.running_var"});
  stage->initialize(Init::Normal(), {cpu(0)});
  CHECK((*stage)(random_tensor({1, 2, 6, 6}, 1)).shape() == Shape{1, 4, 3, 3});
  CHECK(r1->repr() ==
        "Residual(\n"
        "  (conv1): Conv2D(4 -> 4, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))\n"
        "  (conv2): Conv2D(4 -> 4, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))\n"
        "  (bn1): BatchNorm(axis=1, eps=1e-05, momentum=0.1, in_channels=4)\n"
        "  (bn2): BatchNorm(axis=1, eps=1e-05, momentum=0.1, in_channels=4)\n"
        ")");
}

TEST_CASE("repr of the lab CNN prints like Gluon's print(net)") {
  Sequential net;
  net.add(std::make_shared<Conv2D>(Conv2D::Options{.channels = 20, .kernel_size = 3, .activation = "relu"}),
          std::make_shared<MaxPool2D>(Pair{2, 2}, Pair{2, 2}),
          std::make_shared<Conv2D>(Conv2D::Options{.channels = 50, .kernel_size = 5, .activation = "relu"}),
          std::make_shared<MaxPool2D>(Pair{2, 2}, Pair{2, 2}), std::make_shared<Flatten>(),
          std::make_shared<Dense>(128, "relu"), std::make_shared<Dense>(10));
  CHECK(net[0]->describe() == "Conv2D(None -> 20, kernel_size=(3, 3), stride=(1, 1), Activation(relu))");
  net.initialize(Init::Normal(), {cpu(0)});
  CHECK(net(random_tensor({1, 1, 28, 28}, 1)).shape() == Shape{1, 10});
  CHECK(net.repr() ==
        "Sequential(\n"
        "  (0): Conv2D(1 -> 20, kernel_size=(3, 3), stride=(1, 1), Activation(relu))\n"
        "  (1): MaxPool2D(size=(2, 2), stride=(2, 2), padding=(0, 0))\n"
        "  (2): Conv2D(20 -> 50, kernel_size=(5, 5), stride=(1, 1), Activation(relu))\n"
        "  (3): MaxPool2D(size=(2, 2), stride=(2, 2), padding=(0, 0))\n"
        "  (4): Flatten\n"
        "  (5): Dense(800 -> 128, Activation(relu))\n"
        "  (6): Dense(128 -> 10, linear)\n"
        ")");
  CHECK(Conv2D(8, 1, 2, 0, false).describe() == "Conv2D(None -> 8, kernel_size=(1, 1), stride=(2, 2), bias=False)");
}

TEST_CASE("bad layer arguments are one clear ConfigError") {
  CHECK_THROWS_WITH_AS(Activation("tanh"), "Activation: unknown activation 'tanh' (supported: relu, sigmoid)", ConfigError);
  CHECK_THROWS_WITH_AS(Activation(""), "Activation: an activation name is needed (supported: relu, sigmoid)", ConfigError);
  CHECK_THROWS_WITH_AS(Dense(4, "tanh"), "Dense: unknown activation 'tanh' (supported: relu, sigmoid)", ConfigError);
  CHECK_THROWS_WITH_AS(Conv2D(Conv2D::Options{.channels = 4, .kernel_size = 3, .activation = "Relu"}),
                       "Conv2D: unknown activation 'Relu' (supported: relu, sigmoid)", ConfigError);
  CHECK_THROWS_WITH_AS(Dense(0), "Dense: units must be >= 1, got 0", ConfigError);
  CHECK_THROWS_WITH_AS(Conv2D(Conv2D::Options{.channels = 4}), doctest::Contains("kernel_size (0, 0)"), ConfigError);
  CHECK_THROWS_AS(MaxPool2D(2, 2, -1), ConfigError);
  CHECK_THROWS_AS(BatchNorm(0, 1.5f), ConfigError);
}

TEST_CASE("the blocks on [emu(0), emu(1)] give cpu(0)'s outputs and gradients (within 1e-4)") {
  const std::vector<Device> emus{emu(0), emu(1)}, all{cpu(0), emu(0), emu(1)};
  SUBCASE("Dense") {
    Dense fc(3, "relu");
    Tensor x = random_tensor({2, 2, 2}, 40);
    setup(fc, x, all);
    check_same_on(fc, x, emus);
  }
  SUBCASE("Conv2D") {
    Conv2D conv(2, 3, 2, 1);
    Tensor x = random_tensor({1, 2, 5, 4}, 41);
    setup(conv, x, all);
    check_same_on(conv, x, emus);
  }
  SUBCASE("BatchNorm, also its running statistics") {
    BatchNorm bn;
    Tensor x = random_tensor({3, 2, 2, 2}, 42);
    setup(bn, x, all);
    bn.running_mean->set_data(Tensor::zeros({2}, cpu(0)));  // every device: one update, in check_same_on
    bn.running_var->set_data(Tensor::ones({2}, cpu(0)));
    check_same_on(bn, x, emus);
    for (Device d : emus) {
      CHECK(close(bn.running_mean->data(cpu(0)).to_vector(), bn.running_mean->data(d).to_vector(), 1e-4, 1e-4, "rm"));
      CHECK(close(bn.running_var->data(cpu(0)).to_vector(), bn.running_var->data(d).to_vector(), 1e-4, 1e-4, "rv"));
    }
  }
  SUBCASE("pools") {
    Tensor x = tensor(spread(2 * 2 * 4 * 5, 43), {2, 2, 4, 5});
    MaxPool2D max3(3, 2, 1);
    AvgPool2D avg2(2, 1);
    GlobalAvgPool2D gap;
    for (Block* b : std::initializer_list<Block*>{&max3, &avg2, &gap}) {
      CAPTURE(b->describe());
      check_same_on(*b, x, emus);
    }
  }
  SUBCASE("Residual with 1x1 conv and stride 2") {
    Residual blk(3, true, 2);
    Tensor x = random_tensor({2, 2, 4, 4}, 44);
    setup(blk, x, all);
    check_same_on(blk, x, emus);
  }
}
