// Part 2, tensor parallelism (Megatron-LM, Shoeybi et al. 2019, section 3). A small classifier
//
//   X (784) -> Dense(d_model, relu) -> [ Dense(hidden, relu) -> Dense(d_model) ] -> relu -> Dense(10)
//
// whose bracketed MLP is, in the second run, split over P devices: tp::shard_mlp cuts the first
// weight by its output features (column-parallel, f before it) and the second by its input
// features (row-parallel, g after it). The layers outside the bracket are replicated, and every
// device of the group sees the whole minibatch: the batch is not split, the weights are. Each device
// computes the one logical loss from its replica of the output and runs its own backward, so every
// replica already holds the whole gradient of its tensor: each tensor is updated by its own
// gradient (sgd_update_), and nothing is summed over replicas as a data-parallel Trainer would.
// With --clip-grad-norm the step is clipped by the norm of the one logical model's gradient
// (torch.nn.utils.clip_grad_norm_, optim::GradClip): each tensor counted once, from its first
// replica, which is a slice for the split MLP's shards (each its own tensor on one device) and the
// whole gradient for a replicated one: the slices' squares add up to the unsplit MLP's.
#include <cmath>
#include <memory>

#include "chapters/sharding/sharding.hpp"
#include "core/autograd.hpp"
#include "core/cli.hpp"
#include "core/nn/dense.hpp"
#include "core/nn/sequential.hpp"
#include "core/ops.hpp"
#include "core/optim/grad_scaler.hpp"
#include "core/optim/kvstore.hpp"
#include "core/rng.hpp"
#include "core/runtime.hpp"
#include "core/tensor_parallel/conjugate_ops.hpp"
#include "core/tensor_parallel/megatron_mlp.hpp"

namespace d2l::sharding {

namespace {

// The classifier over a group of devices: `mlp` is the plain fc1 -> fc2 on a group of one device,
// or the Megatron MLP over P devices; `embed` and `out` have a replica on every device of the group.
struct Classifier {
  std::vector<Device> group;
  std::shared_ptr<nn::Dense> embed, out;
  std::shared_ptr<nn::Block> mlp;

  // xs[i] on group[i], all the same minibatch: one replica of the logits per device.
  std::vector<Tensor> operator()(const std::vector<Tensor>& xs) {
    std::vector<Tensor> hs = (*mlp)((*embed)(xs));  // replicated -> (f ... g) -> replicated
    for (auto& h : hs) h = relu(h);
    return (*out)(hs);
  }
  std::vector<const nn::Block*> blocks() const { return {embed.get(), mlp.get(), out.get()}; }
  std::vector<nn::ParameterPtr> params() const {
    std::vector<nn::ParameterPtr> ps;
    for (const nn::Block* b : blocks())
      for (auto& p : b->collect_params().trainable()) ps.push_back(p);
    return ps;
  }
};

// The minibatch copied whole to every device of the group.
std::pair<std::vector<Tensor>, std::vector<Tensor>> load_everywhere(const Batch& b, int64_t features,
                                                                    const std::vector<Device>& group) {
  std::vector<Tensor> Xs, ys;
  for (Device d : group) {
    Xs.push_back(Tensor::from_vector(b.X, {b.n, features}, d));
    ys.push_back(Tensor::from_vector(b.y, {b.n}, d));
  }
  return {Xs, ys};
}

// A replicated Dense on `group` with the values of `from` (on one device).
std::shared_ptr<nn::Dense> replicate(const nn::Dense& from, int64_t units, const std::string& activation, int64_t in_units,
                                     const std::vector<Device>& group) {
  auto d = std::make_shared<nn::Dense>(units, activation, true, in_units);
  d->collect_params().initialize(Init::Zero(), group);
  d->weight->set_data(from.weight->list_data()[0]);
  d->bias->set_data(from.bias->list_data()[0]);
  return d;
}

double accuracy(Classifier& net, const DataIter& iter, int64_t features) {
  NoGrad no_grad;
  double correct = 0;
  for (const Batch& b : iter.epoch(0)) {
    auto [Xs, ys] = load_everywhere(b, features, net.group);
    correct += count_correct(net(Xs)[0], ys[0]).item();
  }
  return correct / static_cast<double>(iter.size());
}

// The book's training loop over one group: forward on every device, one backward per device, then
// every tensor updated by its own gradient. `counted` gets tp::traffic() over the first step.
std::vector<EpochRow> train(Classifier& net, const Config& cfg, const DataIter& train_iter, const DataIter& test_iter,
                            int64_t features, std::vector<double>& step_losses, std::vector<double>& norms,
                            tp::Traffic* counted, int64_t* counted_batch) {
  std::vector<EpochRow> rows;
  int64_t step = 0;
  optim::GradScaler scaler({.enabled = cfg.autocast == DType::f16});  // --precision fp16
  for (int epoch = 0; epoch < cfg.num_epochs; ++epoch) {
    double loss_sum = 0, correct = 0;
    for (const Batch& b : train_iter.epoch(epoch)) {
      check_interrupt();
      if (step == 0) tp::reset_traffic();
      auto [Xs, ys] = load_everywhere(b, features, net.group);
      std::vector<Tensor> outputs, ls;
      {
        Autocast mixed(cfg.autocast);  // --precision bf16 / fp16 (f32: off)
        outputs = net(Xs);
        for (size_t i = 0; i < outputs.size(); ++i) ls.push_back(softmax_cross_entropy(outputs[i], ys[i], Reduction::sum));
        for (auto& l : ls) scaler.scale(l).backward();  // each the gradient of the one loss; f sums the shards' input gradients
      }
      bool stepped = true;
      {
        NoGrad no_grad;
        // The logical model's gradient, each tensor once (above): its squares for the clipping and
        // for fp16's check for an inf
        double squares = 0;
        if (cfg.clip_grad_norm > 0 || scaler.is_enabled())
          for (auto& p : net.params()) squares += optim::sum_of_squares(p->list_grad()[0]);
        const float S = scaler.get_scale();  // 1 unless fp16
        stepped = scaler.unscale(squares);
        float rate = cfg.lr / static_cast<float>(b.n);
        if (stepped && cfg.clip_grad_norm > 0) {
          optim::GradClip clip{.max_norm = cfg.clip_grad_norm, .batch_size = b.n, .loss_scale = S};
          rate = -std::get<optim::SGDStep>(clip.apply(optim::SGDStep{0, 0, -rate}, squares)).grad_scale;
          norms.push_back(clip.total_norm);
        }
        rate /= S;
        for (auto& p : net.params()) {
          auto ws = p->list_data(), gs = p->list_grad();
          for (size_t k = 0; stepped && k < ws.size(); ++k) sgd_update_(ws[k], gs[k], rate);
          p->zero_grad();
        }
        scaler.update();
      }
      const double loss = ls[0].item();  // every replica of the loss is the same logical loss
      ++step;
      check_loss(loss, stepped, epoch + 1, step);
      loss_sum += loss;
      step_losses.push_back(loss / static_cast<double>(b.n));
      correct += count_correct(outputs[0].detach(), ys[0]).item();
      if (step == 1 && counted) *counted = tp::traffic(), *counted_batch = b.n;
    }
    const auto n = static_cast<double>(train_iter.size());
    rows.push_back({loss_sum / n, correct / n, accuracy(net, test_iter, features)});
    if (cfg.verbose)
      std::printf("  %-9s epoch %d, loss %.4f, train acc %.3f, test acc %.3f\n", counted ? "sharded" : "unsharded",
                  epoch + 1, rows.back().loss, rows.back().train_acc, rows.back().test_acc);
    std::fflush(stdout);
  }
  return rows;
}

}  // namespace

TensorParallelResult tensor_parallel(const Config& cfg) {
  DataIter train_iter(*cfg.train_data, cfg.batch_size, true, cfg.seed);
  DataIter test_iter(*cfg.test_data, cfg.batch_size, false);
  int64_t features = 1;
  for (int64_t s : train_iter.data().feature_shape) features *= s;
  const std::vector<Device> one{cfg.devices[0]};
  const std::vector<Device> group(cfg.devices.begin(), cfg.devices.begin() + cfg.tp_size);

  // The unsharded classifier on one device.
  manual_seed(cfg.seed);
  Classifier unsharded{one, std::make_shared<nn::Dense>(cfg.d_model, "relu", true, features),
                       std::make_shared<nn::Dense>(10, "", true, cfg.d_model), nullptr};
  auto fc1 = std::make_shared<nn::Dense>(cfg.hidden, "relu", true, cfg.d_model);
  auto fc2 = std::make_shared<nn::Dense>(cfg.d_model, "", true, cfg.hidden);
  auto plain_mlp = std::make_shared<nn::Sequential>();
  plain_mlp->add(fc1, fc2);
  unsharded.mlp = plain_mlp;
  for (const nn::Block* b : unsharded.blocks()) b->collect_params().initialize(Init::Xavier(), one);

  // The same weights, the MLP split over P devices (before either run changes them).
  Classifier sharded{group, replicate(*unsharded.embed, cfg.d_model, "relu", features, group),
                     replicate(*unsharded.out, 10, "", cfg.d_model, group), tp::shard_mlp(*fc1, *fc2, group)};

  TensorParallelResult r;
  if (cfg.verbose) std::printf("  unsharded on %s:\n", str(one).c_str());
  r.unsharded = train(unsharded, cfg, train_iter, test_iter, features, r.unsharded_steps, r.unsharded_norms, nullptr, nullptr);
  if (cfg.verbose) std::printf("  the MLP split over %s:\n", str(group).c_str());
  tp::Traffic t;
  r.sharded = train(sharded, cfg, train_iter, test_iter, features, r.sharded_steps, r.sharded_norms, &t, &r.step_batch);
  r.allreduces_per_step = t.allreduces;
  r.bytes_per_step = t.payload_bytes;
  // g's forward sums the (batch, d_model) output; f's backward the (batch, d_model) input gradient.
  r.formula_bytes_per_step = 2 * r.step_batch * cfg.d_model * 4;

  // The two trained classifiers on the test set: their logits side by side.
  NoGrad no_grad;
  for (const Batch& b : test_iter.epoch(0)) {
    auto a = unsharded(load_everywhere(b, features, one).first)[0].to_vector();
    auto s = sharded(load_everywhere(b, features, group).first)[0].to_vector();
    for (size_t e = 0; e < a.size(); ++e) r.max_output_diff = std::max(r.max_output_diff, std::fabs(double(a[e]) - double(s[e])));
  }
  return r;
}

}  // namespace d2l::sharding
