// Trainer and kvstores: the SGD step against a hand computation in double, a small CNN (conv, relu,
// pool, dense) trained on 1, 2 and 3 devices with uneven shards through every kvstore (equal to the
// one-device run, replicas bitwise equal after every step), emulated GPUs, state_dict round trips,
// the device kvstore spreading its reductions, and the configuration errors. Adam: adam_step against
// PyTorch's torch.optim.Adam (tests/adam_torch.py, when Debian's python3 has PyTorch), a Trainer with
// "adam" against a hand-written Adam in double over the same gradients on every kvstore, the CNN
// on 2 devices, and its state_dict.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "check.hpp"
#include "replicas_equal.hpp"
#include "core/copy.hpp"
#include "core/nn/nn.hpp"
#include "core/nn/split_and_load.hpp"
#include "core/ops.hpp"
#include "core/optim/kvstore.hpp"
#include "core/optim/trainer.hpp"
#include "core/rng.hpp"
#include "core/runtime.hpp"
#include "emu_check.hpp"

using namespace d2l;
using namespace d2l::nn;
using namespace d2l::optim;

namespace {

const std::vector<std::string> kKVStores{"device", "local", "ring"};

// conv(3x3, pad 1) + relu -> max pool 2 -> dense: (N, 1, S, S) -> (N, 3). No BatchNorm, so shards
// of a batch compute exactly what the whole batch does.
std::shared_ptr<Sequential> small_cnn(int64_t channels) {
  auto net = std::make_shared<Sequential>();
  net->add(std::make_shared<Conv2D>(channels, 3, 1, 1, true, 0, "relu"), std::make_shared<MaxPool2D>(2),
           std::make_shared<Dense>(3));
  return net;
}

struct Config {
  int64_t batch = 11, size = 6, channels = 4;
  int steps = 20;
  SGDOptions opt{0.1f, 0.9f, 1e-4f};
  std::string optimizer = "sgd";
};

// Device-0 values of every trainable parameter, by name.
using Values = std::map<std::string, std::vector<float>>;

Values values_of(const ParameterDict& params) {
  Values out;
  for (auto& [name, p] : params)
    if (p->differentiable()) out[name] = p->data(p->list_ctx()[0]).to_vector();
  return out;
}

using test::replicas_equal;

// Step s's batch: features from an LCG, labels from the features' signs (learnable).
std::pair<std::vector<float>, std::vector<int32_t>> batch_data(const Config& c, int s) {
  auto X = test::lcg_data(c.batch * c.size * c.size, 1000 + s);
  std::vector<int32_t> y;
  for (int64_t i = 0; i < c.batch; ++i) y.push_back((X[i * c.size * c.size] > 0) + (X[i * c.size * c.size + 1] > 0));
  return {X, y};
}

// The small CNN from seed `seed`, initialised (Xavier) on `devices`.
std::shared_ptr<Sequential> seeded_cnn(const Config& c, uint64_t seed, const std::vector<Device>& devices) {
  manual_seed(seed);
  auto net = small_cnn(c.channels);
  net->initialize(Init::Xavier(), devices);
  return net;
}

// One training step, the book's way: shards, one loss per device, backward per loss, step.
void train_step(Sequential& net, Trainer& trainer, const Config& c, int s, const std::vector<Device>& devices) {
  auto [X, y] = batch_data(c, s);
  auto Xs = split_and_load(X, {c.batch, 1, c.size, c.size}, devices, false);
  auto ys = split_and_load(y, {c.batch}, devices, false);
  std::vector<Tensor> losses;
  for (size_t i = 0; i < Xs.size(); ++i) losses.push_back(softmax_cross_entropy(net(Xs[i]), ys[i], Reduction::sum));
  for (auto& l : losses) l.backward();
  trainer.step(c.batch);
}

// Trains a fresh net (same seed, so the same initial values everywhere); checks the replicas after
// every step; returns the final parameters.
Values train(const Config& c, const std::vector<Device>& devices, const std::string& kvstore) {
  auto net = seeded_cnn(c, 42, devices);
  Trainer trainer(net->collect_params(), c.optimizer, c.opt, kvstore);  // before the shapes are known (deferred)
  bool equal = true;
  for (int s = 0; s < c.steps; ++s) {
    train_step(*net, trainer, c, s, devices);
    equal = equal && replicas_equal(net->collect_params());
  }
  CHECK_MESSAGE(equal, "replicas differ after a step, kvstore ", kvstore, " on ", str(devices));
  CHECK(trainer.num_update() == c.steps);
  return values_of(net->collect_params());
}

bool close_values(const Values& ref, const Values& got, double rtol, double atol) {
  bool ok = ref.size() == got.size();
  for (auto& [name, v] : ref) ok = test::close(v, got.at(name), atol, rtol, name.c_str()) && ok;
  return ok;
}

}  // namespace

TEST_CASE("one step matches a hand-computed SGD update with momentum and weight decay") {
  const float lr = 0.5f, mom = 0.9f, wd = 0.01f;
  const std::vector<float> w0{1.0f, -2.0f, 0.5f}, g0{0.3f, 0.1f, -0.2f}, g1{0.1f, -0.5f, 0.4f};
  for (const std::vector<Device>& devices : {std::vector<Device>{cpu(0), cpu(1)}, std::vector<Device>{cpu(0), emu(0)}})
    for (auto& kv : kKVStores) {
      CAPTURE(kv);
      CAPTURE(str(devices));
      auto p = std::make_shared<Parameter>("w", Shape{3});
      p->initialize(devices);
      p->set_data(Tensor::from_vector(w0, {3}, cpu(0)));
      ParameterDict dict;
      dict.add("w", p);
      Trainer trainer(dict, "sgd", {lr, mom, wd}, kv);
      CHECK(trainer.kvstore_type() == kv);
      // Reference in double: mom = m*mom - lr*wd*w - (lr/batch)*(g0+g1); w += mom.
      std::vector<double> w(w0.begin(), w0.end()), m(3, 0.0);
      auto ref_step = [&](double rate, const std::vector<float>& a, const std::vector<float>& b, int batch) {
        for (int i = 0; i < 3; ++i) {
          m[i] = mom * m[i] - rate * wd * w[i] - rate / batch * (double(a[i]) + b[i]);
          w[i] += m[i];
        }
      };
      Tensor::from_vector(g0, {3}, devices[0]).copyto(p->grad(devices[0]));
      Tensor::from_vector(g1, {3}, devices[1]).copyto(p->grad(devices[1]));
      trainer.step(4);
      ref_step(lr, g0, g1, 4);
      CHECK(test::close(w, p->data(devices[1]).to_vector(), 1e-6, 1e-6, "step 1"));
      CHECK(p->grad(devices[0]).to_vector() == std::vector<float>(3, 0.0f));  // reset after the step
      CHECK(p->grad(devices[1]).to_vector() == std::vector<float>(3, 0.0f));
      // A new learning rate scales only the new terms (MXNet's formula), and a step with no gradient
      // (the parameter unused) still applies momentum and weight decay.
      trainer.set_learning_rate(0.25f);
      trainer.step(4);
      ref_step(0.25, {0, 0, 0}, {0, 0, 0}, 4);
      CHECK(test::close(w, p->data(devices[0]).to_vector(), 1e-6, 1e-6, "step 2"));
      CHECK(p->data(devices[0]).to_vector() == p->data(devices[1]).to_vector());
      auto state = trainer.state_dict();
      CHECK(test::close(m, state.at("momentum/w").values, 1e-6, 1e-6, "momentum"));
      CHECK(state.at("num_update").values == std::vector<float>{2});
      CHECK(state.at("learning_rate").values == std::vector<float>{0.25f});
    }
}

TEST_CASE("momentum follows a parameter moved by reset_ctx, also between host and devices") {
  const float lr = 0.5f, mom = 0.9f;
  const std::vector<std::vector<Device>> moves{{cpu(0), cpu(1)}, {cpu(1), cpu(2)}, {cpu(2)}, {cpu(0), cpu(1)}};
  for (auto& kv : kKVStores) {
    CAPTURE(kv);
    auto p = std::make_shared<Parameter>("w", Shape{2});
    p->initialize(moves[0]);
    p->set_data(Tensor::from_vector(std::vector<float>{1, -1}, {2}, cpu(0)));
    ParameterDict dict;
    dict.add("w", p);
    Trainer trainer(dict, "sgd", {lr, mom, 0.0f}, kv);
    std::vector<double> w{1, -1}, m{0, 0};
    for (size_t s = 0; s < moves.size(); ++s) {
      p->reset_ctx(moves[s]);
      for (auto& d : moves[s]) Tensor::from_vector(std::vector<float>{1, 2}, {2}, d).copyto(p->grad(d));
      trainer.step(1);
      const double n = static_cast<double>(moves[s].size());
      for (int i = 0; i < 2; ++i) m[i] = mom * m[i] - lr * n * (i + 1), w[i] += m[i];
      CHECK(test::close(w, p->data(moves[s].back()).to_vector(), 1e-6, 1e-6));
    }
  }
}

TEST_CASE("momentum 0 is plain SGD with weight decay: w -= lr * (g / batch + wd * w)") {
  auto p = std::make_shared<Parameter>("w", Shape{2});
  p->initialize({cpu(0)});
  p->set_data(Tensor::from_vector(std::vector<float>{2, -4}, {2}, cpu(0)));
  ParameterDict dict;
  dict.add("w", p);
  Trainer trainer(dict, "sgd", {0.1f, 0.0f, 0.5f});
  Tensor::from_vector(std::vector<float>{6, 6}, {2}, cpu(0)).copyto(p->grad(cpu(0)));
  trainer.step(3);
  CHECK(test::close(std::vector<double>{2 - 0.1 * (2 + 0.5 * 2), -4 - 0.1 * (2 - 0.5 * 4)},
                    p->data(cpu(0)).to_vector(), 1e-6, 1e-6));
}

TEST_CASE("clip_grad_norm: one SGD step is w - lr * g * min(1, max_norm / (||g|| + 1e-6)), g = sum / batch") {
  // Two parameters: the norm is over both. Device 1 (when there) adds its own gradient into the sum.
  const float lr = 0.5f;
  const std::vector<float> a0{1, -2}, b0{0.5f, 3, -1}, ga{3, -1}, gb{0.5f, 2, -1}, ha{1, 1}, hb{-2, 0.25f, 4};
  for (float max_norm : {0.3f, 1e3f})
    for (const std::vector<Device>& devices : {std::vector<Device>{cpu(0)}, std::vector<Device>{cpu(0), cpu(1)}})
      for (auto& kv : kKVStores) {
        CAPTURE(max_norm);
        CAPTURE(str(devices));
        CAPTURE(kv);
        ParameterDict dict;
        auto a = std::make_shared<Parameter>("a", Shape{2}), b = std::make_shared<Parameter>("b", Shape{3});
        for (auto& [p, w] : {std::pair{a, a0}, std::pair{b, b0}}) {
          p->initialize(devices);
          p->set_data(Tensor::from_vector(w, p->shape(), cpu(0)));
          dict.add(p->name(), p);
        }
        Trainer trainer(dict, "sgd", {.learning_rate = lr, .clip_grad_norm = max_norm}, kv);
        CHECK(std::isnan(trainer.last_grad_norm()));
        const int batch = 4;
        Tensor::from_vector(ga, {2}, devices[0]).copyto(a->grad(devices[0]));
        Tensor::from_vector(gb, {3}, devices[0]).copyto(b->grad(devices[0]));
        if (devices.size() == 2) {
          Tensor::from_vector(ha, {2}, devices[1]).copyto(a->grad(devices[1]));
          Tensor::from_vector(hb, {3}, devices[1]).copyto(b->grad(devices[1]));
        }
        trainer.step(batch);
        // In double: g = sum over the devices / batch, one norm over a and b.
        auto g = [&](const std::vector<float>& x, const std::vector<float>& y) {
          std::vector<double> out;
          for (size_t i = 0; i < x.size(); ++i) out.push_back((x[i] + (devices.size() == 2 ? y[i] : 0.0)) / batch);
          return out;
        };
        const std::vector<double> g_a = g(ga, ha), g_b = g(gb, hb);
        double squares = 0;
        for (double v : g_a) squares += v * v;
        for (double v : g_b) squares += v * v;
        const double norm = std::sqrt(squares), coef = std::min(1.0, max_norm / (norm + 1e-6));
        CHECK(trainer.last_grad_norm() == doctest::Approx(norm).epsilon(1e-6));
        CHECK((max_norm < norm) == (coef < 1));  // 0.3 clips, 1e3 does not
        std::vector<double> want_a, want_b;
        for (size_t i = 0; i < a0.size(); ++i) want_a.push_back(a0[i] - lr * g_a[i] * coef);
        for (size_t i = 0; i < b0.size(); ++i) want_b.push_back(b0[i] - lr * g_b[i] * coef);
        for (auto& d : devices) {
          CHECK(test::close(want_a, a->data(d).to_vector(), 1e-6, 1e-6, "a"));
          CHECK(test::close(want_b, b->data(d).to_vector(), 1e-6, 1e-6, "b"));
        }
      }
  // The option's errors.
  auto p = std::make_shared<Parameter>("w", Shape{2});
  ParameterDict dict;
  dict.add("w", p);
  for (float bad : {-1.0f, std::nanf(""), INFINITY})
    CHECK_THROWS_WITH_AS(Trainer(dict, "adam", {.clip_grad_norm = bad}),
                         doctest::Contains("Trainer: clip_grad_norm must be a finite number >= 0 (0: off)"), ConfigError);
}

TEST_CASE("a CNN trained on 2 and 3 devices with uneven shards equals the 1-device run, for every kvstore") {
  Config c;  // batch 11: shards 6/5 and 4/4/3
  const Values ref = train(c, {cpu(0)}, "device");
  for (auto& kv : kKVStores) {
    CAPTURE(kv);
    CHECK(train(c, {cpu(0)}, kv) == ref);  // one device: the kvstores do nothing, bit for bit
  }
  std::map<std::string, Values> by_kv;
  for (const std::vector<Device>& devices : {std::vector<Device>{cpu(0), cpu(1)}, std::vector<Device>{cpu(0), cpu(1), cpu(2)}}) {
    for (auto& kv : kKVStores) {
      CAPTURE(kv);
      CAPTURE(str(devices));
      by_kv[kv] = train(c, devices, kv);
      CHECK(close_values(ref, by_kv[kv], 1e-5, 1e-7));
    }
    // device and local add the replicas in the same order: the same bits; ring reassociates.
    CHECK(by_kv["device"] == by_kv["local"]);
    CHECK(close_values(by_kv["device"], by_kv["ring"], 1e-5, 1e-7));
  }
  // The run did learn something: parameters moved away from their initial values.
  manual_seed(42);
  auto fresh = small_cnn(c.channels);
  fresh->initialize(Init::Xavier(), {cpu(0)});
  fresh->forward(Tensor::zeros({1, 1, c.size, c.size}, cpu(0)));  // completes the deferred shapes
  const Values start = values_of(fresh->collect_params());
  double moved = 0;
  for (auto& [name, v] : ref)
    for (size_t j = 0; j < v.size(); ++j) moved = std::max(moved, double(std::fabs(v[j] - start.at(name)[j])));
  CHECK(moved > 0.05);
}

TEST_CASE("on two emulated GPUs the replicas stay equal and follow the CPU run") {
  Config c;
  c.batch = 5, c.size = 4, c.channels = 2, c.steps = 3;
  const Values ref = train(c, {cpu(0)}, "device");
  for (const std::string kv : {"device", "ring"}) {
    CAPTURE(kv);
    CHECK(close_values(ref, train(c, {emu(0), emu(1)}, kv), 1e-4, 1e-6));
  }
}

// Trainer.step updates every parameter of a device in one launch (KVStore::update_all: the multi-tensor
// kernels): a net trained by a Trainer against the same net stepped key by key through the kvstore's
// update(), one parameter a device a call (the per-tensor kernels), the same gradients: the same bits
// after every step, for SGD with and without momentum and weight decay and for Adam, on two emulated GPUs,
// two CPUs and one emulated GPU. On emulated GPUs a step launches the multi-tensor kernel once per device
// and none of the per-tensor ones.
TEST_CASE("Trainer.step updates each device's parameters in one launch, with the bits of the per-parameter step") {
  const Config c;
  struct Case {
    std::string optimizer;
    OptimizerOptions opt;
    const char* multi_kernel;
    const char* per_tensor_kernel;
  };
  OptimizerOptions adam_opt;
  adam_opt.learning_rate = 0.01f, adam_opt.wd = 1e-3f;
  const std::vector<Case> cases{{"sgd", {0.1f, 0.9f, 1e-4f}, "multi_sgd_mom_update_kernel", "scale_kernel"},
                                {"sgd", {0.1f, 0.0f, 0.0f}, "multi_sgd_mom_update_kernel", "scale_kernel"},
                                {"adam", adam_opt, "multi_adam_update_kernel", "adam_update_kernel"}};
  for (const Case& k : cases)
    for (const std::vector<Device>& devices :
         {std::vector<Device>{emu(0), emu(1)}, std::vector<Device>{cpu(0), cpu(1)}, std::vector<Device>{emu(0)}}) {
      CAPTURE(k.optimizer);
      CAPTURE(k.opt.momentum);
      CAPTURE(str(devices));
      std::shared_ptr<Sequential> nets[2];
      for (auto& net : nets) {  // the same values in both: each drawn from seed 42 at its first forward
        manual_seed(42);
        net = small_cnn(c.channels);
        net->initialize(Init::Xavier(), devices);
        (*net)(Tensor::zeros({1, 1, c.size, c.size}, devices[0]));
      }
      Trainer trainer(nets[0]->collect_params(), k.optimizer, k.opt, "device");
      auto kv = create_kvstore("device");
      std::vector<std::vector<std::vector<Tensor>>> state;  // the reference's: per key, slot, replica
      std::vector<std::vector<std::vector<float>>> host_state;
      const bool emulated = devices[0].kind == DeviceKind::emu;
      bool same = true;
      for (int s = 0; s < 3; ++s) {
        for (auto& net : nets) {  // the same batch through both nets: the same gradients
          auto [X, y] = batch_data(c, s);
          auto Xs = split_and_load(X, {c.batch, 1, c.size, c.size}, devices, false);
          auto ys = split_and_load(y, {c.batch}, devices, false);
          for (size_t i = 0; i < Xs.size(); ++i) softmax_cross_entropy((*net)(Xs[i]), ys[i], Reduction::sum).backward();
        }
        waitall();
        const int64_t multi_before = test::launches(k.multi_kernel), plain_before = test::launches(k.per_tensor_kernel);
        trainer.step(c.batch);
        waitall();
        CHECK(test::launches(k.multi_kernel) - multi_before == (emulated ? static_cast<int64_t>(devices.size()) : 0));
        CHECK(test::launches(k.per_tensor_kernel) == plain_before);
        // The reference: the Trainer's step constants, then kv->update key by key.
        const float lr = k.opt.learning_rate;
        Step step = SGDStep{k.opt.momentum, -lr * k.opt.wd, -lr / static_cast<float>(c.batch)};
        if (k.optimizer == "adam")
          step = adam_constants(AdamStep{k.opt.beta1, k.opt.beta2, k.opt.epsilon, k.opt.wd, 1.0f / c.batch}, lr, s + 1);
        int64_t key = 0;
        for (auto& [name, p] : nets[1]->collect_params()) {
          if (!p->differentiable()) continue;
          const std::vector<Tensor> w = p->list_data();
          std::vector<Tensor> g;
          for (auto& x : w) g.push_back(x.grad());
          if (static_cast<size_t>(key) == state.size()) {
            state.emplace_back(state_slots(step));
            host_state.emplace_back();
            for (auto& slot : state.back())
              for (auto& x : w) slot.push_back(Tensor::zeros(x.shape(), x.device()));
          }
          kv->update(key, w, g, state[key], host_state[key], step);
          p->zero_grad();
          ++key;
        }
        // Every replica of every parameter: the same bits in both nets.
        auto a = nets[0]->collect_params(), b = nets[1]->collect_params();
        for (auto& [name, p] : a)
          for (size_t i = 0; i < devices.size(); ++i)
            same = same && p->list_data()[i].to_vector() == b[name].list_data()[i].to_vector();
      }
      CHECK(same);
    }
}

TEST_CASE("a trainer restored from state_dict continues bit for bit like the original") {
  Config c;
  c.steps = 3;
  const std::vector<Device> devices{cpu(0), cpu(1)};
  for (auto& kv : kKVStores) {
    CAPTURE(kv);
    auto a = seeded_cnn(c, 3, devices);
    Trainer ta(a->collect_params(), "sgd", c.opt, kv);
    for (int s = 0; s < c.steps; ++s) train_step(*a, ta, c, s, devices);
    ta.set_learning_rate(0.05f);
    auto state = ta.state_dict();
    CHECK(state.size() == 4 + 2);
    CHECK(state.at("momentum/0.weight").shape == Shape{4, 1, 3, 3});
    CHECK(state.at("momentum/2.bias").shape == Shape{3});

    auto b = seeded_cnn(c, 99, devices);  // other initial values, replaced below
    b->forward(Tensor::zeros({1, 1, c.size, c.size}, cpu(0)));  // complete the deferred shapes
    auto pa = a->collect_params(), pb = b->collect_params();
    for (auto& [name, p] : pa) pb[name].set_data(p->data(cpu(0)));
    Trainer tb(pb, "sgd", {0.3f, c.opt.momentum, c.opt.wd}, kv);
    tb.load_state_dict(state);
    CHECK(tb.learning_rate() == 0.05f);
    CHECK(tb.num_update() == 3);
    for (int s = c.steps; s < c.steps + 3; ++s) {
      train_step(*a, ta, c, s, devices);
      train_step(*b, tb, c, s, devices);
    }
    CHECK(values_of(pa) == values_of(pb));
    auto sa = ta.state_dict(), sb = tb.state_dict();
    for (auto& [key, t] : sa) CHECK(t.values == sb.at(key).values);

    // What is wrong is named.
    auto missing = state;
    missing.erase("momentum/0.bias");
    CHECK_THROWS_WITH_AS(tb.load_state_dict(missing), doctest::Contains("no 'momentum/0.bias'"), ParameterError);
    auto bad_shape = state;
    bad_shape["momentum/2.bias"] = HostTensor{{4}, {0, 0, 0, 0}};
    CHECK_THROWS_WITH_AS(tb.load_state_dict(bad_shape), doctest::Contains("'momentum/2.bias' has shape (4,), parameter '2.bias' has shape (3,)"), ShapeError);
    auto extra = state;
    extra["momentum/9.weight"] = HostTensor{{1}, {0}};
    CHECK_THROWS_WITH_AS(tb.load_state_dict(extra), doctest::Contains("unexpected 'momentum/9.weight'"), ParameterError);
    CHECK(values_of(pa) == values_of(pb));  // a rejected state changes nothing
  }
}

TEST_CASE("kvstores sum in place, bitwise equal on every device; device and local agree bit for bit") {
  const std::vector<Device> devices{cpu(0), cpu(1), cpu(2)};
  const int64_t n = 1001;
  std::vector<std::vector<float>> parts;
  std::vector<double> ref(n, 0.0);
  for (int i = 0; i < 3; ++i) {
    parts.push_back(test::lcg_data(n, 10 + i));
    for (int64_t j = 0; j < n; ++j) ref[j] += parts[i][j];
  }
  std::map<std::string, std::vector<float>> sums;
  for (auto& kv : kKVStores) {
    CAPTURE(kv);
    auto store = create_kvstore(kv);
    std::vector<Tensor> values;
    for (int i = 0; i < 3; ++i) values.push_back(Tensor::from_vector(parts[i], {n}, devices[i]));
    store->pushpull(0, values);
    sums[kv] = values[0].to_vector();
    for (auto& v : values) CHECK(v.to_vector() == sums[kv]);
    CHECK(test::close(ref, sums[kv], 1e-6, 1e-6, kv.c_str()));
  }
  CHECK(sums["device"] == sums["local"]);
  // Closed form: device i holds i + 1; every device must hold exactly 6.
  for (auto& kv : kKVStores) {
    std::vector<Tensor> values;
    for (int i = 0; i < 3; ++i) values.push_back(Tensor::full({7}, float(i + 1), devices[i]));
    create_kvstore(kv)->pushpull(5, values);
    for (auto& v : values) CHECK(v.to_vector() == std::vector<float>(7, 6.0f));
  }
}

TEST_CASE("the device kvstore spreads its keys over the devices") {
  const std::vector<Device> devices{cpu(0), cpu(1)};
  auto store = create_kvstore("device");
  reset_copy_counters();
  for (int64_t key = 0; key < 4; ++key) {
    std::vector<Tensor> values{Tensor::full({256}, 1.0f, cpu(0)), Tensor::full({256}, 2.0f, cpu(1))};
    store->pushpull(key, values);
    CHECK(values[1].to_vector() == std::vector<float>(256, 3.0f));
  }
  auto where = store->placement();
  REQUIRE(where.size() == 4);
  int on0 = 0, on1 = 0;
  for (auto& [key, d] : where) (d == cpu(0) ? on0 : on1)++;
  CHECK(on0 == 2);
  CHECK(on1 == 2);
  // Both devices received gradients to reduce and sums to copy back: 4 keys, 1 KiB each way per key.
  CHECK(copy_counters(cpu(0)).bytes_in == 4 * 1024);
  CHECK(copy_counters(cpu(1)).bytes_in == 4 * 1024);
  // A large key goes to the less loaded device: cpu(0) and cpu(1) hold 512 elements each, so the
  // next (4096) goes to cpu(0) and the one after to cpu(1).
  std::vector<Tensor> big{Tensor::zeros({4096}, cpu(0)), Tensor::zeros({4096}, cpu(1))};
  store->pushpull(4, big);
  std::vector<Tensor> small{Tensor::zeros({8}, cpu(0)), Tensor::zeros({8}, cpu(1))};
  store->pushpull(5, small);
  CHECK(store->placement().at(4) == cpu(0));
  CHECK(store->placement().at(5) == cpu(1));
  CHECK(create_kvstore("local")->placement().empty());
}

TEST_CASE("bad optimizer, kvstore and option values are configuration errors") {
  auto p = std::make_shared<Parameter>("w", Shape{2});
  p->initialize({cpu(0)});
  ParameterDict dict;
  dict.add("w", p);
  CHECK_THROWS_WITH_AS(Trainer(dict, "adagrad", {}), "Trainer: unknown optimizer 'adagrad': expected sgd or adam",
                       ConfigError);
  CHECK_THROWS_WITH_AS(Trainer(dict, "Adam", {}), "Trainer: unknown optimizer 'Adam': expected sgd or adam", ConfigError);
  CHECK_THROWS_WITH_AS(Trainer(dict, "", {}), "Trainer: unknown optimizer '': expected sgd or adam", ConfigError);
  CHECK(Trainer(dict, "adam", {}).optimizer() == "adam");
  CHECK(Trainer(dict, "adam", {}, "dist_sync").kvstore_type() == "dist_sync");
  // Each optimizer's own hyperparameters, in range; the other's left at their defaults.
  CHECK_THROWS_WITH_AS(Trainer(dict, "adam", {.learning_rate = 1e-3f, .momentum = 0.9f}),
                       doctest::Contains("momentum is SGD's; optimizer 'adam' takes learning_rate, wd, beta1, beta2 and epsilon"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(Trainer(dict, "sgd", {.learning_rate = 0.1f, .beta1 = 0.5f}),
                       "Trainer: beta1, beta2 and epsilon are Adam's; optimizer 'sgd' takes learning_rate, momentum and wd",
                       ConfigError);
  CHECK_THROWS_WITH_AS(Trainer(dict, "adam", {.beta1 = 1.0f}), "Trainer: beta1 must be in [0, 1), got 1", ConfigError);
  CHECK_THROWS_AS(Trainer(dict, "adam", {.beta2 = -0.1f}), ConfigError);
  CHECK_THROWS_AS(Trainer(dict, "adam", {.epsilon = -1e-8f}), ConfigError);
  CHECK_THROWS_AS(Trainer(dict, "adam", {.wd = NAN}), ConfigError);
  CHECK_THROWS_AS(Trainer(dict, "adam", {-1e-3f}), ConfigError);
  CHECK_THROWS_WITH_AS(Trainer(dict, "sgd", {}, "nccl"), doctest::Contains("kvstore 'nccl' needs GPUs and a build with NCCL"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(Trainer(dict, "sgd", {}, "dist_async"),
                       "unknown kvstore 'dist_async': expected device, local, ring, dist_sync, dist_sync_ring, nccl or none",
                       ConfigError);
  CHECK(Trainer(dict, "sgd", {}, "dist_sync").kvstore_type() == "dist_sync");  // a world of one: 'device'
  CHECK(Trainer(dict, "sgd", {}, "dist_sync_ring").kvstore_type() == "dist_sync_ring");
  CHECK_THROWS_AS(Trainer(dict, "sgd", {-0.1f, 0, 0}), ConfigError);
  CHECK_THROWS_AS(Trainer(dict, "sgd", {0.1f, 1.5f, 0}), ConfigError);
  CHECK_THROWS_AS(Trainer(dict, "sgd", {0.1f, 0, NAN}), ConfigError);
  Trainer t(dict, "sgd", {0.1f, 0.9f, 0});
  CHECK_THROWS_AS(t.step(0), ConfigError);
  CHECK_THROWS_AS(t.set_learning_rate(INFINITY), ConfigError);
  CHECK(t.learning_rate() == 0.1f);
  // An uninitialised parameter: the book's error, and nothing updated.
  auto q = std::make_shared<Parameter>("q", Shape{2});
  dict.add("q", q);
  Trainer t2(dict, "sgd", {});
  CHECK_THROWS_AS(t2.step(1), ParameterError);
  CHECK(t2.num_update() == 0);
}

// ---- Adam

namespace {

// tests/adam_torch.py, found from this file's name as the compiler saw it (relative to the build
// directory, whose tests/ folder holds this executable).
std::string adam_script() {
  namespace fs = std::filesystem;
  fs::path here = fs::path(__FILE__).parent_path() / "adam_torch.py";
  if (here.is_absolute() || fs::exists(here)) return here.string();
  std::error_code ec;
  fs::path build_root = fs::read_symlink("/proc/self/exe", ec).parent_path().parent_path();
  return (build_root / here).lexically_normal().string();
}

struct AdamCase {
  float lr, beta1, beta2, eps, wd, grad_scale;
  std::vector<float> w0;
  std::vector<std::vector<float>> grads;  // one per step
};

// Fixed numbers: 12 weights, 5 steps of gradients in [-1, 1) with one exact zero and two tiny ones
// (1e-6: sqrt(v_hat) near epsilon); grad_scale 0.25, as a Trainer's 1 / batch_size.
AdamCase adam_case(float lr, float beta1, float beta2, float eps, float wd) {
  AdamCase c{lr, beta1, beta2, eps, wd, 0.25f, test::lcg_data(12, 61), {}};
  for (int t = 0; t < 5; ++t) {
    auto g = test::lcg_data(12, 70 + t);
    g[3] = 0.0f, g[5] *= 1e-6f, g[8] *= 1e-6f;
    c.grads.push_back(g);
  }
  return c;
}

// After each step of each case: w, m, v as torch.optim.Adam computed them.
using TorchSteps = std::vector<std::vector<std::array<std::vector<float>, 3>>>;

TorchSteps run_torch_adam(const std::vector<AdamCase>& cases) {
  namespace fs = std::filesystem;
  const std::string script = adam_script();
  REQUIRE_MESSAGE(fs::exists(script), "no " << script);
  std::string dir = (fs::temp_directory_path() / "d2l_adam_XXXXXX").string();
  REQUIRE(mkdtemp(dir.data()) != nullptr);
  {
    std::ofstream in(dir + "/adam_in.txt");
    in.precision(9);
    in << cases.size() << "\n";
    for (auto& c : cases) {
      in << c.lr << " " << c.beta1 << " " << c.beta2 << " " << c.eps << " " << c.wd << " " << c.grad_scale << " "
         << c.grads.size() << " " << c.w0.size() << "\n";
      for (float x : c.w0) in << x << " ";
      in << "\n";
      for (auto& g : c.grads) {
        for (float x : g) in << x << " ";
        in << "\n";
      }
    }
  }
  std::fflush(nullptr);
  int rc = std::system(("'" + test::python() + "' '" + script + "' '" + dir + "'").c_str());
  REQUIRE(WIFEXITED(rc));
  REQUIRE(WEXITSTATUS(rc) == 0);
  std::ifstream out(dir + "/adam_out.txt");
  TorchSteps steps(cases.size());
  for (size_t k = 0; k < cases.size(); ++k)
    for (size_t t = 0; t < cases[k].grads.size(); ++t) {
      std::array<std::vector<float>, 3> wmv;
      for (auto& v : wmv) {
        v.resize(cases[k].w0.size());
        for (auto& x : v) out >> x;
      }
      steps[k].push_back(wmv);
    }
  REQUIRE(out.good());
  fs::remove_all(dir);
  return steps;
}

}  // namespace

// adam_step on host arrays and, through the op adam_update_, on cpu(0) and emu(0), five steps after
// each of which w, m and v are those of torch.optim.Adam on the same numbers: PyTorch's defaults
// without weight decay, and other betas, epsilon and weight decay (added to the gradient, not AdamW).
// The host loop and the cpu(0) kernel give the same bits ('local' and 'device' agree).
TEST_CASE("adam_step follows torch.optim.Adam step by step, with and without weight decay" *
          doctest::skip(!test::python_can_import("torch"))) {
  const std::vector<AdamCase> cases{adam_case(0.01f, 0.9f, 0.999f, 1e-8f, 0.0f),
                                    adam_case(0.05f, 0.8f, 0.99f, 1e-6f, 0.1f)};
  const TorchSteps torch = run_torch_adam(cases);
  for (size_t k = 0; k < cases.size(); ++k) {
    const AdamCase& c = cases[k];
    CAPTURE(c.wd);
    const int64_t n = static_cast<int64_t>(c.w0.size());
    const AdamStep base{c.beta1, c.beta2, c.eps, c.wd, c.grad_scale};
    std::vector<float> w = c.w0, m(n, 0.0f), v(n, 0.0f);
    std::vector<std::array<Tensor, 3>> on;  // w, m, v on cpu(0) and emu(0)
    for (Device d : {cpu(0), emu(0)})
      on.push_back({Tensor::from_vector(c.w0, {n}, d), Tensor::zeros({n}, d), Tensor::zeros({n}, d)});
    for (size_t t = 0; t < c.grads.size(); ++t) {
      CAPTURE(t + 1);
      const AdamStep s = adam_constants(base, c.lr, static_cast<int64_t>(t) + 1);
      adam_step(w.data(), m.data(), v.data(), c.grads[t].data(), n, s);
      const auto& [tw, tm, tv] = torch[k][t];
      CHECK(test::close(tw, w, 1e-7, 1e-6, "w"));
      CHECK(test::close(tm, m, 1e-8, 1e-5, "m"));
      CHECK(test::close(tv, v, 1e-15, 1e-5, "v"));
      for (auto& [dw, dm, dv] : on) {
        CAPTURE(dw.device().str());
        adam_step(dw, dm, dv, Tensor::from_vector(c.grads[t], {n}, dw.device()), s);
        CHECK(test::close(tw, dw.to_vector(), 1e-7, 1e-6, "w"));
        CHECK(test::close(tm, dm.to_vector(), 1e-8, 1e-5, "m"));
        CHECK(test::close(tv, dv.to_vector(), 1e-15, 1e-5, "v"));
      }
      CHECK(on[0][0].to_vector() == w);  // cpu(0)'s kernel: the host loop's bits
      CHECK(on[0][1].to_vector() == m);
      CHECK(on[0][2].to_vector() == v);
    }
  }
}

TEST_CASE("adam_constants: step t's bias corrections") {
  const AdamStep s = adam_constants(AdamStep{}, 0.01f, 1);
  CHECK(s.step_size == doctest::Approx(0.01 / (1 - 0.9)).epsilon(1e-6));
  CHECK(s.bias_correction2_sqrt == doctest::Approx(std::sqrt(1 - 0.999)).epsilon(1e-6));
  const AdamStep s3 = adam_constants(AdamStep{}, 0.01f, 3);
  CHECK(s3.step_size == doctest::Approx(0.01 / (1 - std::pow(0.9, 3))).epsilon(1e-6));
  CHECK(s3.bias_correction2_sqrt == doctest::Approx(std::sqrt(1 - std::pow(0.999, 3))).epsilon(1e-6));
  CHECK(s3.beta1 == 0.9f);
  CHECK(s3.epsilon == 1e-8f);
}

namespace {

// Dense(4, relu) -> Dense(3): (N, 5) -> (N, 3), shapes deferred.
std::shared_ptr<Sequential> tiny_mlp() {
  auto net = std::make_shared<Sequential>();
  net->add(std::make_shared<Dense>(4, "relu"), std::make_shared<Dense>(3));
  return net;
}

}  // namespace

// A Trainer with "adam" trains a tiny MLP for 4 steps (the learning rate halved before the last two);
// before each step the test reads every replica's gradient, and a separate Adam in double, written
// here from the formula (g = sum / batch + wd * w; m, v; m_hat, v_hat; w -= lr * m_hat / (sqrt(v_hat) +
// eps)), takes the same step. The Trainer's weights and its state_dict's exp_avg / exp_avg_sq follow it
// after every step, on one device, two CPUs and a CPU with an emulated GPU, through every kvstore; the
// replicas stay bitwise equal, and state() holds m and v beside each replica.
TEST_CASE("a Trainer with adam follows a hand-written double-precision Adam over the same gradients") {
  const float lr = 0.02f, wd = 0.01f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
  const int64_t batch = 7, features = 5;
  const std::vector<std::vector<Device>> device_sets{{cpu(0)}, {cpu(0), cpu(1)}, {cpu(0), emu(0)}};
  for (auto& devices : device_sets)
    for (const std::string kv : {"device", "local", "ring", "dist_sync"}) {
      CAPTURE(kv);
      CAPTURE(str(devices));
      manual_seed(5);
      auto net = tiny_mlp();
      net->initialize(Init::Xavier(), devices);
      Trainer trainer(net->collect_params(), "adam", {.learning_rate = lr, .wd = wd}, kv);
      CHECK(trainer.state_names() == std::vector<std::string>{"exp_avg", "exp_avg_sq"});
      std::map<std::string, std::vector<double>> w, m, v;  // the reference, by parameter name
      double rate = lr;
      bool followed = true, equal = true;
      for (int t = 1; t <= 4; ++t) {
        if (t == 3) trainer.set_learning_rate(lr / 2), rate = lr / 2;
        auto X = test::lcg_data(batch * features, 300 + t);
        std::vector<int32_t> y;
        for (int64_t i = 0; i < batch; ++i) y.push_back(X[i * features] > 0 ? 2 : (X[i * features + 1] > 0));
        auto Xs = split_and_load(X, {batch, features}, devices, false);
        auto ys = split_and_load(y, {batch}, devices, false);
        for (size_t i = 0; i < Xs.size(); ++i) softmax_cross_entropy((*net)(Xs[i]), ys[i], Reduction::sum).backward();
        for (auto& [name, p] : net->collect_params()) {
          if (t == 1) {
            auto w0 = p->data(devices[0]).to_vector();
            w[name].assign(w0.begin(), w0.end());
            m[name].assign(w0.size(), 0.0), v[name].assign(w0.size(), 0.0);
          }
          std::vector<double> g(w[name].size(), 0.0);
          for (auto& d : devices) {
            auto gd = p->grad(d).to_vector();
            for (size_t j = 0; j < g.size(); ++j) g[j] += gd[j];
          }
          for (size_t j = 0; j < g.size(); ++j) {
            const double gj = g[j] / batch + double(wd) * w[name][j];
            m[name][j] = double(b1) * m[name][j] + (1 - double(b1)) * gj;
            v[name][j] = double(b2) * v[name][j] + (1 - double(b2)) * gj * gj;
            const double m_hat = m[name][j] / (1 - std::pow(double(b1), t));
            const double v_hat = v[name][j] / (1 - std::pow(double(b2), t));
            w[name][j] -= rate * m_hat / (std::sqrt(v_hat) + double(eps));
          }
        }
        trainer.step(batch);
        const auto state = trainer.state_dict();
        for (auto& [name, p] : net->collect_params()) {
          CAPTURE(name);
          CAPTURE(t);
          followed = test::close(w[name], p->data(devices.back()).to_vector(), 1e-6, 1e-5, "w") && followed;
          followed = test::close(m[name], state.at("exp_avg/" + name).values, 1e-7, 1e-4, "m") && followed;
          followed = test::close(v[name], state.at("exp_avg_sq/" + name).values, 1e-10, 1e-4, "v") && followed;
        }
        equal = equal && replicas_equal(net->collect_params());
      }
      CHECK(followed);
      CHECK(equal);
      CHECK(trainer.num_update() == 4);
      // The state beside each replica, on its device (in host memory for 'local' with 2 replicas).
      const auto& exp_avg = trainer.state("0.weight", "exp_avg");
      if (kv == "local" && devices.size() > 1) {
        CHECK(exp_avg.empty());
      } else {
        REQUIRE(exp_avg.size() == devices.size());
        for (size_t i = 0; i < devices.size(); ++i) CHECK(exp_avg[i].device() == devices[i]);
        CHECK(test::close(m["0.weight"], exp_avg.back().to_vector(), 1e-7, 1e-4, "state()"));
      }
      // The weights moved: a few steps of about the learning rate each.
      auto now = net->collect_params()["1.bias"].data(devices[0]).to_vector();
      double moved = 0;
      for (float x : now) moved = std::max(moved, double(std::fabs(x)));
      CHECK(moved > lr);
    }
  auto net = tiny_mlp();
  net->initialize(Init::Xavier(), {cpu(0)});
  Trainer trainer(net->collect_params(), "adam", {});
  CHECK_THROWS_AS(trainer.state("0.weight", "momentum"), ParameterError);
  CHECK_THROWS_AS(trainer.state("9.weight", "exp_avg"), ParameterError);
}

TEST_CASE("Adam: a CNN on 2 devices equals the 1-device run for every kvstore; device and local the same bits") {
  Config c;
  c.steps = 6;
  c.optimizer = "adam";
  c.opt = {.learning_rate = 0.01f, .wd = 1e-4f};
  const Values ref = train(c, {cpu(0)}, "device");
  std::map<std::string, Values> by_kv;
  for (auto& kv : kKVStores) {
    CAPTURE(kv);
    by_kv[kv] = train(c, {cpu(0), cpu(1)}, kv);
    CHECK(close_values(ref, by_kv[kv], 1e-4, 1e-6));
  }
  CHECK(by_kv["device"] == by_kv["local"]);
}

TEST_CASE("an adam trainer restored from state_dict continues bit for bit like the original") {
  Config c;
  c.steps = 3;
  c.optimizer = "adam";
  c.opt = {.learning_rate = 0.01f, .wd = 1e-3f, .beta1 = 0.8f};
  const std::vector<Device> devices{cpu(0), cpu(1)};
  for (const std::string kv : {"device", "local"}) {
    CAPTURE(kv);
    auto a = seeded_cnn(c, 3, devices);
    Trainer ta(a->collect_params(), "adam", c.opt, kv);
    for (int s = 0; s < c.steps; ++s) train_step(*a, ta, c, s, devices);
    auto state = ta.state_dict();
    CHECK(state.size() == 2 * 4 + 2);
    CHECK(state.at("exp_avg/0.weight").shape == Shape{4, 1, 3, 3});
    CHECK(state.at("exp_avg_sq/2.bias").shape == Shape{3});
    CHECK(state.count("momentum/0.weight") == 0);

    auto b = seeded_cnn(c, 99, devices);
    b->forward(Tensor::zeros({1, 1, c.size, c.size}, cpu(0)));
    auto pa = a->collect_params(), pb = b->collect_params();
    for (auto& [name, p] : pa) pb[name].set_data(p->data(cpu(0)));
    Trainer tb(pb, "adam", c.opt, kv);
    tb.load_state_dict(state);
    CHECK(tb.num_update() == 3);  // the next step is t = 4: the bias corrections continue
    for (int s = c.steps; s < c.steps + 3; ++s) {
      train_step(*a, ta, c, s, devices);
      train_step(*b, tb, c, s, devices);
    }
    CHECK(values_of(pa) == values_of(pb));

    // An SGD trainer's state is not an Adam trainer's, and the reverse.
    Trainer sgd(pb, "sgd", {0.1f}, kv);
    CHECK_THROWS_WITH_AS(sgd.load_state_dict(state), doctest::Contains("no 'momentum/0.weight'"), ParameterError);
    CHECK_THROWS_WITH_AS(tb.load_state_dict(sgd.state_dict()), doctest::Contains("optimizer adam"), ParameterError);
  }
}
