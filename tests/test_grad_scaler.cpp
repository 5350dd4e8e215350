// Dynamic loss scaling (core/optim/grad_scaler.hpp, Trainer::step_scaled). A power-of-two scale is
// exact in float32: a scaled step must give the unscaled step's bits, at every ZeRO stage and with
// every kvstore of one process, for SGD with momentum and Adam, with clip_grad_norm too. An inf or a
// NaN planted in one device's gradient must skip the step on every device (weights, state and
// num_update as they were, gradients zeroed) and halve the scale; training then goes on as if that
// batch had never been. The scale follows GradScaler's rule with its own constants (2^16, halved,
// doubled after 2000 clean steps). Under Autocast(float16), a small loss's gradients underflow to
// zero without a scale and survive with one. tests/mutants runs this file against a Trainer that
// forgets to divide the scale out (an unscaled gradient): it must fail.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <map>

#include "check.hpp"
#include "one_line_error.hpp"
#include "replicas_equal.hpp"
#include "core/nn/nn.hpp"
#include "core/nn/split_and_load.hpp"
#include "core/ops.hpp"
#include "core/optim/grad_scaler.hpp"
#include "core/optim/trainer.hpp"
#include "core/rng.hpp"
#include "core/runtime.hpp"

using namespace d2l;
using namespace d2l::nn;
using namespace d2l::optim;

namespace {

constexpr int64_t kIn = 4, kHidden = 5, kOut = 3, kBatch = 7;

using Values = std::map<std::string, std::vector<float>>;

Values values_of(const ParameterDict& params) {
  Values out;
  for (auto& [name, p] : params) out[name] = p->list_data()[0].to_vector();
  return out;
}

Values state_of(const Trainer& trainer) {
  Values out;
  for (auto& [key, t] : trainer.state_dict()) out[key] = t.values;
  return out;
}

float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

std::vector<Device> cpus(int n) {
  std::vector<Device> out;
  for (int i = 0; i < n; ++i) out.push_back(cpu(i));
  return out;
}

struct Net {
  std::shared_ptr<Sequential> net = std::make_shared<Sequential>();
  std::unique_ptr<Trainer> trainer;
  Net(const std::vector<Device>& devices, const std::string& optimizer, OptimizerOptions opt, const std::string& kvstore) {
    net->add(std::make_shared<Dense>(kHidden, "relu", true, kIn), std::make_shared<Dense>(kOut, "", true, kHidden));
    manual_seed(42);
    net->initialize(Init::Xavier(), devices);
    trainer = std::make_unique<Trainer>(net->collect_params(), optimizer, opt, kvstore);
  }
};

// Batch s's losses, one a device (summed over its rows), each multiplied by the scaler's scale (none:
// not at all). bad_on >= 0: the first input of that device's shard is `bad` (an inf or a NaN), so that
// device's gradients hold infs or NaNs, as an overflow in its backward would leave them; the other
// devices' are finite.
void backward(Sequential& net, int s, const std::vector<Device>& devices, const GradScaler* scaler, int bad_on = -1,
              float bad = 0) {
  auto X = test::lcg_data(kBatch * kIn, 900 + static_cast<uint32_t>(s));
  std::vector<int32_t> y;
  for (int64_t i = 0; i < kBatch; ++i) y.push_back((X[i * kIn] > 0) + (X[i * kIn + 1] > 0));
  auto Xs = split_and_load(X, {kBatch, kIn}, devices, false);
  auto ys = split_and_load(y, {kBatch}, devices, false);
  if (bad_on >= 0) {
    Tensor& x = Xs[static_cast<size_t>(bad_on)];
    std::vector<float> host = x.to_vector();
    host[0] = bad;
    x = Tensor::from_vector(host, x.shape(), x.device());
  }
  std::vector<Tensor> losses;
  for (size_t i = 0; i < Xs.size(); ++i) {
    Tensor l = softmax_cross_entropy(net(Xs[i]), ys[i], Reduction::sum);
    losses.push_back(scaler ? scaler->scale(l) : l);
  }
  for (auto& l : losses) l.backward();
}

struct Case {
  std::string optimizer, kvstore;
  OptimizerOptions opt;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const char* kv : {"device", "ring", "local"})
    for (int stage : {0, 1, 2}) {
      if (stage > 0 && std::string(kv) == "local") continue;  // ZeRO needs 'device' or 'ring'
      OptimizerOptions sgd{.learning_rate = 0.1f, .momentum = 0.9f, .wd = 1e-3f, .zero_stage = stage};
      OptimizerOptions adam{.learning_rate = 0.01f, .wd = 1e-3f, .zero_stage = stage};
      out.push_back({"sgd", kv, sgd});
      out.push_back({"adam", kv, adam});
    }
  return out;
}

std::string describe(const Case& c) {
  return c.optimizer + ", kvstore " + c.kvstore + ", zero_stage " + std::to_string(c.opt.zero_stage) +
         (c.opt.clip_grad_norm > 0 ? ", clip_grad_norm" : "");
}

}  // namespace

TEST_CASE("a scaled step is the unscaled step, bit for bit: every kvstore, ZeRO stages 0 to 2, SGD and Adam, clipping") {
  const auto devices = cpus(2);
  auto all = cases();
  for (Case c : {cases()[0], cases()[3]}) {  // and with clip_grad_norm (small enough to clip)
    c.opt.clip_grad_norm = 0.05f;
    all.push_back(c);
  }
  for (const Case& c : all) {
    INFO(describe(c));
    Net plain(devices, c.optimizer, c.opt, c.kvstore), scaled(devices, c.optimizer, c.opt, c.kvstore);
    GradScaler scaler;
    for (int s = 0; s < 6; ++s) {
      backward(*plain.net, s, devices, nullptr);
      plain.trainer->step(kBatch);
      backward(*scaled.net, s, devices, &scaler);
      CHECK(scaler.step(*scaled.trainer, kBatch));
      scaler.update();
      if (c.opt.clip_grad_norm > 0) CHECK(scaled.trainer->last_grad_norm() == plain.trainer->last_grad_norm());
    }
    CHECK(values_of(scaled.net->collect_params()) == values_of(plain.net->collect_params()));
    CHECK(state_of(*scaled.trainer) == state_of(*plain.trainer));
    CHECK(test::replicas_equal(scaled.net->collect_params()));
    CHECK(scaler.get_scale() == 65536.0f);
    CHECK(scaler.skipped_steps() == 0);
  }
}

TEST_CASE("an inf or a NaN in one device's gradient skips the step on every device and halves the scale") {
  const auto devices = cpus(2);
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()})
    for (const Case& c : cases()) {
      INFO(describe(c), ", planted ", bad);
      // The reference never sees batch 2; the scaled run gets it with a bad value on cpu(1): it must
      // skip it, and from there on take the reference's steps at half the scale.
      Net ref(devices, c.optimizer, c.opt, c.kvstore), scaled(devices, c.optimizer, c.opt, c.kvstore);
      GradScaler scaler;
      for (int s = 0; s < 5; ++s) {
        if (s != 2) {
          backward(*ref.net, s, devices, nullptr);
          ref.trainer->step(kBatch);
        }
        if (s != 2) {
          backward(*scaled.net, s, devices, &scaler);
          CHECK(scaler.step(*scaled.trainer, kBatch));
          scaler.update();
          continue;
        }
        backward(*scaled.net, s, devices, &scaler, 1, bad);
        const Values before = values_of(scaled.net->collect_params());
        const Values state_before = state_of(*scaled.trainer);
        const int64_t updates = scaled.trainer->num_update();
        CHECK_FALSE(scaler.step(*scaled.trainer, kBatch));
        scaler.update();
        CHECK(values_of(scaled.net->collect_params()) == before);
        CHECK(state_of(*scaled.trainer) == state_before);
        CHECK(scaled.trainer->num_update() == updates);
        CHECK(test::replicas_equal(scaled.net->collect_params()));
        for (auto& [name, p] : scaled.net->collect_params())
          for (auto& g : p->list_grad())
            if (g.defined()) CHECK(max_abs(g.to_vector()) == 0.0f);  // ZeRO-2 releases them
        CHECK(scaler.get_scale() == 32768.0f);
      }
      CHECK(values_of(scaled.net->collect_params()) == values_of(ref.net->collect_params()));
      CHECK(state_of(*scaled.trainer) == state_of(*ref.trainer));
      CHECK(scaled.trainer->num_update() == 4);
      CHECK(scaler.skipped_steps() == 1);
    }
}

TEST_CASE("the scale: 2^16 at first, halved at each skip, doubled after 2000 clean steps in a row") {
  const std::vector<Device> one{cpu(0)};
  Net n(one, "sgd", {.learning_rate = 0.01f}, "device");
  GradScaler scaler;
  CHECK(scaler.get_scale() == 65536.0f);
  auto step = [&](bool bad) {
    backward(*n.net, 0, one, &scaler, bad ? 0 : -1, std::numeric_limits<float>::infinity());
    const bool stepped = scaler.step(*n.trainer, kBatch);
    scaler.update();
    return stepped;
  };
  CHECK_FALSE(step(true));
  CHECK_FALSE(step(true));
  CHECK(scaler.get_scale() == 16384.0f);
  bool all = true;
  for (int i = 0; i < 1999; ++i) all = step(false) && all;
  CHECK(all);
  CHECK(scaler.growth_tracker() == 1999);
  CHECK(scaler.get_scale() == 16384.0f);
  CHECK(step(false));
  CHECK(scaler.get_scale() == 32768.0f);
  CHECK(scaler.growth_tracker() == 0);
  CHECK(step(false));
  CHECK_FALSE(step(true));  // a skip restarts the count
  CHECK(scaler.get_scale() == 16384.0f);
  CHECK(scaler.growth_tracker() == 0);
  CHECK(scaler.skipped_steps() == 3);
  CHECK(n.trainer->num_update() == 2001);
}

TEST_CASE("under Autocast(float16) a small loss's gradients underflow to zero without loss scaling, and survive with it") {
  // A 64 -> 1 linear layer whose loss is tiny: the gradient of the weight, x^T (dL/dy), is a float16
  // GEMM's output. Its elements, about 1e-9, are below float16's smallest subnormal (6e-8).
  for (Device d : {cpu(0), emu(0)}) {
    INFO(d.str());
    manual_seed(3);
    Dense layer(1, "", false, 64);
    layer.initialize(Init::Normal(0.1f), {d});
    auto x = test::lcg_data(8 * 64, 11);
    Tensor X = Tensor::from_vector(x, {8, 64}, d);
    auto grad_with = [&](float loss_scale) {
      layer.collect_params().begin()->second->zero_grad();
      {
        Autocast mixed(DType::f16);
        scale(sum(layer(X)), 1e-9f * loss_scale).backward();
      }
      std::vector<float> g = layer.collect_params().begin()->second->grad(d).to_vector();
      for (float& v : g) v /= loss_scale;
      return g;
    };
    std::vector<float> exact;  // float32, no autocast
    {
      layer.collect_params().begin()->second->zero_grad();
      scale(sum(layer(X)), 1e-9f).backward();
      exact = layer.collect_params().begin()->second->grad(d).to_vector();
    }
    CHECK(max_abs(grad_with(1.0f)) == 0.0f);  // every gradient lost
    CHECK(max_abs(exact) > 0);
    CHECK(test::close(exact, grad_with(65536.0f), 4e-3 * max_abs(exact), 4e-3, "float16 under a 2^16 scale"));
  }
}

TEST_CASE("a disabled GradScaler is the plain loop: the loss itself, trainer.step, a scale of 1 that never changes") {
  const auto devices = cpus(2);
  Net plain(devices, "sgd", {.learning_rate = 0.1f, .momentum = 0.9f}, "device"),
      off(devices, "sgd", {.learning_rate = 0.1f, .momentum = 0.9f}, "device");
  GradScaler scaler({.enabled = false});
  for (int s = 0; s < 3; ++s) {
    backward(*plain.net, s, devices, nullptr);
    plain.trainer->step(kBatch);
    backward(*off.net, s, devices, &scaler);
    CHECK(scaler.step(*off.trainer, kBatch));
    scaler.update();
  }
  CHECK(values_of(off.net->collect_params()) == values_of(plain.net->collect_params()));
  CHECK(scaler.get_scale() == 1.0f);
  CHECK_FALSE(scaler.is_enabled());
  // An inf goes straight into the step, as without a scaler: nothing checks
  backward(*off.net, 3, devices, &scaler, 1, std::numeric_limits<float>::infinity());
  CHECK(scaler.step(*off.trainer, kBatch));
  CHECK(off.trainer->num_update() == 4);
}

TEST_CASE("loss scaling: bad settings are one-line errors") {
  test::check_one_line_error([] { GradScaler({.init_scale = 0}); }, "init_scale must be a finite number > 0");
  test::check_one_line_error([] { GradScaler({.growth_factor = 1}); }, "growth_factor must be a finite number > 1");
  test::check_one_line_error([] { GradScaler({.backoff_factor = 1}); }, "backoff_factor must be in (0, 1)");
  test::check_one_line_error([] { GradScaler({.growth_interval = 0}); }, "growth_interval must be >= 1");
  Net n({cpu(0)}, "sgd", {.learning_rate = 0.01f}, "device");
  test::check_one_line_error([&] { n.trainer->step_scaled(kBatch, 0.0f); }, "loss_scale must be a finite number > 0");
}
