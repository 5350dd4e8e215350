// d2l "Multi-GPU Training" from scratch (13.5), section by section.
#include "chapters/multi_gpu_scratch/multi_gpu_scratch.hpp"

#include "core/autograd.hpp"
#include "core/cli.hpp"
#include "core/comm.hpp"
#include "core/dist/collectives.hpp"
#include "core/nn/activation.hpp"
#include "core/ops.hpp"
#include "core/optim/kvstore.hpp"
#include "core/rng.hpp"
#include "core/trace.hpp"

namespace d2l::scratch {

// ---- "A Toy Network": initialize model parameters (scale = 0.01).
std::vector<Tensor> init_params(Device d) {
  const float scale = 0.01f;
  return {normal({20, 1, 3, 3}, 0, scale, d),  Tensor::zeros({20}, d),
          normal({50, 20, 5, 5}, 0, scale, d), Tensor::zeros({50}, d),
          normal({800, 128}, 0, scale, d),     Tensor::zeros({128}, d),
          normal({128, 10}, 0, scale, d),      Tensor::zeros({10}, d)};
}

// ---- Define the model.
Tensor lenet(const Tensor& X, const std::vector<Tensor>& params, Activation activation) {
  Tensor h1_conv = conv2d(X, params[0], params[1]);
  Tensor h1_activation = activation(h1_conv);
  Tensor h1 = avg_pool2d(h1_activation, {2, 2}, {2, 2});
  Tensor h2_conv = conv2d(h1, params[2], params[3]);
  Tensor h2_activation = activation(h2_conv);
  Tensor h2 = avg_pool2d(h2_activation, {2, 2}, {2, 2});
  h2 = flatten(h2);  // h2.reshape(h2.shape[0], -1)
  Tensor h3_linear = bias_add(matmul(h2, params[4]), params[5]);
  Tensor h3 = activation(h3_linear);
  return bias_add(matmul(h3, params[6]), params[7]);
}

Activation activation_by_name(const std::string& name) {
  if (name.empty()) throw ConfigError("--activation: a name is needed (supported: " + nn::activation_names() + ")");
  return nn::activation_op("--activation", name);
}

// ---- Cross-entropy loss (reduction='none', as the PyTorch version).
Tensor loss(const Tensor& y_hat, const Tensor& y) { return softmax_cross_entropy(y_hat, y, Reduction::none); }

// ---- Data synchronization: "distribute the parameters to multiple devices and attach gradients".
std::vector<Tensor> get_params(const std::vector<Tensor>& params, Device device) {
  std::vector<Tensor> new_params;
  for (auto& p : params) {
    Tensor q = Tensor::empty(p.shape(), device);
    p.copyto(q);  // always a copy, also on p's own device
    q.attach_grad();
    new_params.push_back(q);
  }
  return new_params;
}

// "Sum all vectors and broadcast the result back to all devices": data[0] += data[i] (copied to
// data[0]'s device), then the sum is copied INTO every data[i] (in place, so the replicas really
// change; a rebinding like data[i] = ... would leave them unsynchronised).
void allreduce(const std::vector<Tensor>& data) {
  NoGrad no_grad;
  for (size_t i = 1; i < data.size(); ++i) add_(data[0], data[i].to(data[0].device()));
  for (size_t i = 1; i < data.size(); ++i) data[0].copyto(data[i]);
}

// ---- Data distribution.
static std::vector<int64_t> shard_sizes(int64_t n, size_t k) {
  std::vector<int64_t> s(k);
  for (size_t i = 0; i < k; ++i) s[i] = n / static_cast<int64_t>(k) + (static_cast<int64_t>(i) < n % static_cast<int64_t>(k));
  return s;
}

std::vector<Tensor> split_and_load(const std::vector<float>& data, int64_t rows, int64_t cols,
                                   const std::vector<Device>& devices) {
  std::vector<Tensor> out;
  int64_t at = 0;
  for (size_t i = 0; i < devices.size(); ++i) {
    int64_t n = shard_sizes(rows, devices.size())[i];
    std::vector<float> part(data.begin() + at * cols, data.begin() + (at + n) * cols);
    out.push_back(Tensor::from_vector(part, {n, cols}, devices[i]));
    at += n;
  }
  return out;
}

std::pair<std::vector<Tensor>, std::vector<Tensor>> split_batch(const Batch& batch, const std::vector<Device>& devices) {
  const int64_t row = batch.n ? static_cast<int64_t>(batch.X.size()) / batch.n : 0;
  std::vector<Tensor> Xs, ys;
  int64_t at = 0;
  auto sizes = shard_sizes(batch.n, devices.size());
  for (size_t i = 0; i < devices.size(); ++i) {
    Shape shape = batch.shape;
    shape[0] = sizes[i];
    std::vector<float> x(batch.X.begin() + at * row, batch.X.begin() + (at + sizes[i]) * row);
    std::vector<int32_t> y(batch.y.begin() + at, batch.y.begin() + at + sizes[i]);
    Xs.push_back(Tensor::from_vector(x, shape, devices[i]));
    ys.push_back(Tensor::from_vector(y, {sizes[i]}, devices[i]));
    at += sizes[i];
  }
  return {Xs, ys};
}

// ---- Training.
void sgd(const std::vector<Tensor>& params, float lr, int64_t batch_size) {
  NoGrad no_grad;
  for (auto& p : params) {
    sgd_update_(p, p.grad(), lr / static_cast<float>(batch_size));
    p.zero_grad();
  }
}

std::vector<Tensor> train_batch(const Batch& batch, std::vector<std::vector<Tensor>>& device_params,
                                const std::vector<Device>& devices, float lr, const std::string& allreduce_algorithm,
                                const std::string& dist_allreduce, dist::Buckets* buckets, Activation activation,
                                DType autocast, optim::GradScaler* scaler, bool* stepped) {
  auto [X_shards, y_shards] = split_batch(batch, devices);
  // Loss calculation on each device; a device with an empty shard adds a zero gradient.
  std::vector<Tensor> ls;
  {
    Autocast mixed(autocast);  // --precision bf16 / fp16 (f32: off)
    for (size_t i = 0; i < devices.size(); ++i)
      if (X_shards[i].dim(0) > 0) ls.push_back(sum(loss(lenet(X_shards[i], device_params[i], activation), y_shards[i])));
    for (auto& l : ls) (scaler ? scaler->scale(l) : l).backward();  // back propagation on each device, in parallel
  }
  // Sum all gradients from each device and broadcast them to all devices.
  if (buckets) {
    buckets->finish();  // --dist with buckets: most allreduces already ran during backward
  } else {
    trace::Label region("allreduce");  // names this work in a --trace timeline
    for (size_t i = 0; i < device_params[0].size(); ++i) {
      std::vector<Tensor> grads;
      for (size_t c = 0; c < devices.size(); ++c) grads.push_back(device_params[c][i].grad());
      if (!dist_allreduce.empty()) dist::allreduce(grads, allreduce_algorithm, dist_allreduce);  // --dist
      else if (allreduce_algorithm == "naive") allreduce(grads);
      else d2l::allreduce(grads, allreduce_algorithm);  // ring (exercise 3)
    }
  }
  // The model parameters are updated separately on each device, with the full minibatch size
  // (over every process with --dist). fp16: the gradients are S times the loss's; every device holds
  // the same sums, so device 0's squares tell whether any overflowed, here and on every rank.
  float rate = lr;
  bool step = true;
  if (scaler && scaler->is_enabled()) {
    double squares = 0;
    for (auto& p : device_params[0]) squares += optim::sum_of_squares(p.grad());
    rate = lr / scaler->get_scale();
    step = scaler->unscale(squares);
    scaler->update();
  }
  for (auto& param : device_params) {
    if (step) {
      sgd(param, rate, batch.size());
    } else {
      for (auto& p : param) p.zero_grad();  // a skipped step: nothing updated
    }
  }
  if (stepped) *stepped = step;
  std::vector<Tensor> out;
  for (auto& l : ls) out.push_back(l.detach());
  return out;
}

double evaluate_accuracy(const DataIter& test_iter, const std::vector<std::vector<Tensor>>& device_params,
                         const std::vector<Device>& devices, bool all_devices, Activation activation) {
  NoGrad no_grad;
  TrainMode eval(false);
  trace::Label region("evaluate");  // names this work in a --trace timeline
  std::vector<Device> used = all_devices ? devices : std::vector<Device>{devices[0]};
  std::vector<Tensor> counts;
  for (const Batch& b : test_iter.epoch(0)) {
    check_interrupt();
    auto [Xs, ys] = split_batch(b, used);
    for (size_t i = 0; i < used.size(); ++i)
      if (Xs[i].dim(0) > 0) counts.push_back(count_correct(lenet(Xs[i], device_params[i], activation), ys[i]));
  }
  double correct = 0;
  for (auto& c : counts) correct += c.item();
  return correct / static_cast<double>(test_iter.size());
}

}  // namespace d2l::scratch
