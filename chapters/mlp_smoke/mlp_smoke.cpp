#include "chapters/mlp_smoke/mlp_smoke.hpp"

#include <chrono>
#include <cstdio>

#include "core/autograd.hpp"
#include "core/cli.hpp"
#include "core/comm.hpp"
#include "core/ops.hpp"
#include "core/parameter.hpp"
#include "core/rng.hpp"
#include "core/runtime.hpp"
#include "datasets/synthetic.hpp"

namespace d2l::smoke {

namespace {
struct Mlp {
  Parameter w1, b1, w2, b2;
  Mlp(int64_t in, int64_t hidden, int64_t out)
      : w1("dense0_weight", {hidden, in}, Init::Xavier()), b1("dense0_bias", {hidden}, Init::Zero()),
        w2("dense1_weight", {out, hidden}, Init::Xavier()), b2("dense1_bias", {out}, Init::Zero()) {}
  std::vector<Parameter*> params() { return {&w1, &b1, &w2, &b2}; }
  // A forward pass uses the replicas on the input's device.
  Tensor operator()(const Tensor& X) {
    Device d = X.device();
    return dense(relu(dense(X, w1.data(d), b1.data(d))), w2.data(d), b2.data(d));
  }
};

// Shard sizes as even as possible: sizes differ by at most one.
std::vector<int64_t> shard_sizes(int64_t n, size_t k) {
  std::vector<int64_t> s(k);
  for (size_t i = 0; i < k; ++i) s[i] = n / k + (static_cast<int64_t>(i) < n % static_cast<int64_t>(k));
  return s;
}
}  // namespace

Result run(const Config& cfg) {
  const auto& devs = cfg.devices;
  if (devs.empty()) throw ConfigError("smoke: no devices");
  if (cfg.batch_size < static_cast<int64_t>(devs.size()))
    throw ConfigError("--batch-size " + std::to_string(cfg.batch_size) + " is smaller than the " +
                      std::to_string(devs.size()) + " devices: every device needs at least one example");
  manual_seed(cfg.seed);
  SyntheticSpec spec;
  spec.seed = cfg.seed;
  spec.n = cfg.n_train;
  spec.sample_seed = 1;
  DataIter train_iter(make_classification(spec), cfg.batch_size, true, cfg.seed);
  spec.n = cfg.n_test;
  spec.sample_seed = 2;
  DataIter test_iter(make_classification(spec), cfg.batch_size, false);
  if (train_iter.size() == 0 || test_iter.size() == 0)
    throw ConfigError(std::string("smoke: the ") + (train_iter.size() == 0 ? "training" : "test") + " set has no examples");
  const int64_t features = train_iter.data().feature_shape[0];

  Mlp net(features, cfg.hidden, 10);
  for (auto* p : net.params()) p->initialize(devs);
  std::vector<uint64_t> kernels_before;
  for (auto d : devs) kernels_before.push_back(runtime(d).kernels_run());

  Result r;
  auto start = std::chrono::steady_clock::now();
  for (int epoch = 0; epoch < cfg.num_epochs; ++epoch) {
    double loss_sum = 0;
    int64_t step = 0;
    for (const Batch& b : train_iter.epoch(epoch)) {
      check_interrupt();  // Ctrl-C: stop between minibatches
      auto sizes = shard_sizes(b.n, devs.size());
      std::vector<Tensor> losses;
      int64_t at = 0;
      for (size_t i = 0; i < devs.size(); ++i) {
        if (sizes[i] == 0) continue;  // a short last batch: this device adds a zero gradient
        std::vector<float> x(b.X.begin() + at * features, b.X.begin() + (at + sizes[i]) * features);
        std::vector<int32_t> y(b.y.begin() + at, b.y.begin() + at + sizes[i]);
        at += sizes[i];
        Tensor X = Tensor::from_vector(x, {sizes[i], features}, devs[i]);
        Tensor Y = Tensor::from_vector(y, {sizes[i]}, devs[i]);
        losses.push_back(softmax_cross_entropy(net(X), Y, Reduction::sum));
      }
      for (auto& l : losses) l.backward();  // each on its own device, in parallel
      NoGrad no_grad;
      for (auto* p : net.params()) {
        allreduce_naive(p->list_grad());
        for (auto& w : p->list_data()) {
          sgd_update_(w, w.grad(), cfg.lr / static_cast<float>(b.n));  // the step uses the full minibatch size
          w.zero_grad();
        }
      }
      double step_loss = 0;
      for (auto& l : losses) step_loss += l.item();
      check_loss(step_loss, epoch + 1, ++step);  // NaN or infinite: stop, naming the epoch and step
      loss_sum += step_loss;
    }
    r.epoch_loss.push_back(loss_sum / static_cast<double>(train_iter.size()));
    if (cfg.verbose) std::printf("epoch %d, loss %.4f\n", epoch + 1, r.epoch_loss.back());
  }
  waitall();
  r.sec_per_epoch = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
                    std::max(1, cfg.num_epochs);
  for (size_t i = 0; i < devs.size(); ++i) r.kernels_per_device.push_back(runtime(devs[i]).kernels_run() - kernels_before[i]);

  // Test accuracy on device 0.
  NoGrad no_grad;
  double correct = 0;
  for (const Batch& b : test_iter.epoch(0)) {
    Tensor X = Tensor::from_vector(b.X, {b.n, features}, devs[0]);
    Tensor Y = Tensor::from_vector(b.y, {b.n}, devs[0]);
    correct += count_correct(net(X), Y).item();
  }
  r.test_acc = correct / static_cast<double>(test_iter.size());
  return r;
}

}  // namespace d2l::smoke
