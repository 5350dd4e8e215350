// The section's cells, in order: d2l's (Gluon edition) In [3]-[5] (`demo`) and the Gluon lab's
// In [2]-[5] (`lab`). Outside training (no autograd.record()) Gluon runs BatchNorm in inference mode,
// so the forward passes here evaluate.
#include <iostream>

#include "chapters/multi_gpu_concise/multi_gpu_concise.hpp"
#include "core/autograd.hpp"
#include "core/nn/split_and_load.hpp"
#include "core/ops.hpp"
#include "core/rng.hpp"

namespace d2l::concise {

namespace {

std::vector<Device> first_two(const std::vector<Device>& devices) {
  if (devices.size() < 2) throw ConfigError("the demonstrations need two devices (--num-gpus 2), got " + str(devices));
  return {devices[0], devices[1]};
}

// w[0] of a (C, ...) tensor: the first output channel, shape (...).
Tensor channel0(const Tensor& w) {
  Shape rest(w.shape().begin() + 1, w.shape().end());
  return reshape(slice_rows(w, 0, 1), rest);
}

}  // namespace

void demo(const std::vector<Device>& devices) {
  NoGrad no_grad;
  TrainMode predict(false);
  manual_seed(0);
  // net = resnet18(10); ctx = [mx.gpu(0), mx.gpu(1)]; net.initialize(init=init.Normal(sigma=0.01), ctx=ctx)
  auto net = resnet18(10);
  std::vector<Device> ctx = first_two(devices);
  net->initialize(Init::Normal(0.01f), ctx);
  std::cout << "# net.initialize(init=init.Normal(sigma=0.01), ctx=" << str(ctx) << ")\n";

  // x = nd.random.uniform(shape=(4, 1, 28, 28)); gpu_x = gutils.split_and_load(x, ctx)
  Tensor x = uniform({4, 1, 28, 28}, 0, 1, cpu(0));
  std::vector<Tensor> gpu_x = nn::split_and_load(x, ctx);
  std::cout << "# x = nd.random.uniform(shape=(4, 1, 28, 28)); gpu_x = gutils.split_and_load(x, ctx)\n"
            << "# net(gpu_x[0]), net(gpu_x[1])\n"
            << (*net)(gpu_x[0]) << ",\n"
            << (*net)(gpu_x[1]) << "\n\n";

  // weight = net[0].params.get('weight'); weight.data() reads the replica on cpu(0)
  auto conv = std::dynamic_pointer_cast<nn::Conv2D>((*net)[0]);
  std::cout << "# weight = net[0].params.get('weight'); weight.data()\n";
  try {
    Tensor on_host = conv->weight->data();
    std::cout << "weight.data() is the replica on cpu(0), one of the devices here (with GPUs or emulated GPUs, e.g.\n"
              << "--devices emu:0,emu:1, the host holds none: 'not initialized on cpu(0)')\n";
    (void)on_host;
  } catch (const ParameterError&) {
    std::cout << "not initialized on " << cpu(0) << "\n";
  }
  // weight.data(ctx[0])[0], weight.data(ctx[1])[0]: the same values on both devices
  std::cout << "# weight.data(ctx[0])[0], weight.data(ctx[1])[0]\n"
            << channel0(conv->weight->data(ctx[0])) << ",\n"
            << channel0(conv->weight->data(ctx[1])) << "\n";
}

void lab(const std::vector<Device>& devices, const Config& data) {
  manual_seed(0);
  // net.collect_params().initialize(ctx=ctx, force_reinit=True)
  std::vector<Device> ctx = first_two(devices);
  auto net = lab_cnn();
  net->initialize(default_init("lab-cnn"), ctx, true);
  std::cout << "# net.collect_params().initialize(ctx=" << str(ctx) << ", force_reinit=True)\n";

  // batch = the first GPU_COUNT * 2 training images; data = gluon.utils.split_and_load(batch, ctx)
  Config first4 = data;
  first4.train_subset = 4;
  ArrayDataset train = load_data(first4, true);
  Shape shape{4};
  shape.insert(shape.end(), train.feature_shape.begin(), train.feature_shape.end());
  std::vector<Tensor> X = nn::split_and_load(train.features, shape, ctx);
  std::vector<Tensor> y = nn::split_and_load(train.labels, {4}, ctx);
  {
    NoGrad no_grad;
    std::cout << "# data = gluon.utils.split_and_load(batch, ctx); print(net(data[0])); print(net(data[1]))\n"
              << (*net)(X[0]) << "\n"
              << (*net)(X[1]) << "\n\n";
  }

  // weight = net.collect_params()['cnn_conv0_weight'] (here '0.weight', PyTorch's name)
  Parameter& weight = net->collect_params()["0.weight"];
  for (Device c : ctx)
    std::cout << "=== channel 0 of the first conv on " << c << " ===\n" << channel0(weight.data(c)) << "\n";
  std::cout << "\n";

  // forward_backward(net, data, label): each device's gradient comes from its own two images
  forward_backward(*net, X, y);
  for (Device c : ctx)
    std::cout << "=== grad of channel 0 of the first conv2d on " << c << " ===\n" << channel0(weight.grad(c)) << "\n";
}

}  // namespace d2l::concise
