// The section's two networks: the small-image ResNet-18 (d2l "Concise Implementation for Multiple
// GPUs", Gluon edition, "Initialize Model Parameters on Multiple GPUs") and the Gluon lab's CNN
// ("Training on multiple GPUs with gluon").
#include "chapters/multi_gpu_concise/multi_gpu_concise.hpp"

namespace d2l::concise {

namespace {

std::shared_ptr<nn::BatchNorm> batch_norm(bool sync_bn) {
  if (sync_bn) return std::make_shared<nn::SyncBatchNorm>();
  return std::make_shared<nn::BatchNorm>();
}

// A SyncBatchNorm computing with `bn`'s own parameters (the same Parameter objects). Residual
// registers plain BatchNorms as its children bn1 and bn2 and calls them through those members, so
// putting this in a member changes how the block normalises while collect_params() (the Trainer,
// checkpoints) still finds the same parameters under the same names.
std::shared_ptr<nn::BatchNorm> synced(const std::shared_ptr<nn::BatchNorm>& bn) {
  auto s = std::make_shared<nn::SyncBatchNorm>(0, bn->momentum, bn->eps);
  s->weight = bn->weight;
  s->bias = bn->bias;
  s->running_mean = bn->running_mean;
  s->running_var = bn->running_var;
  return s;
}

}  // namespace

std::shared_ptr<nn::Sequential> resnet18(int64_t num_classes, bool sync_bn) {
  // def resnet_block(num_channels, num_residuals, first_block=False): the book defines it inside
  // resnet18; it is nn::resnet_block (core/nn/residual.hpp), line for line the same.
  auto net = std::make_shared<nn::Sequential>();
  // This model uses a smaller convolution kernel, stride, and padding and removes the maximum pooling layer.
  net->add(std::make_shared<nn::Conv2D>(64, /*kernel_size=*/3, /*strides=*/1, /*padding=*/1), batch_norm(sync_bn),
           std::make_shared<nn::Activation>("relu"));
  net->add(nn::resnet_block(64, 2, /*first_block=*/true), nn::resnet_block(128, 2), nn::resnet_block(256, 2),
           nn::resnet_block(512, 2));
  net->add(std::make_shared<nn::GlobalAvgPool2D>(), std::make_shared<nn::Dense>(num_classes));
  if (sync_bn)
    for (auto& [name, child] : net->children())  // the Residuals inside the four resnet_blocks
      if (auto stage = std::dynamic_pointer_cast<nn::Sequential>(child))
        for (auto& [i, blk] : stage->children())
          if (auto r = std::dynamic_pointer_cast<nn::Residual>(blk)) {
            r->bn1 = synced(r->bn1);
            r->bn2 = synced(r->bn2);
          }
  return net;
}

std::shared_ptr<nn::Sequential> lab_cnn() {
  auto net = std::make_shared<nn::Sequential>();  // gluon.nn.Sequential(prefix='cnn_'): names 0.weight, ...
  net->add(std::make_shared<nn::Conv2D>(nn::Conv2D::Options{.channels = 20, .kernel_size = 3, .activation = "relu"}));
  net->add(std::make_shared<nn::MaxPool2D>(/*pool_size=*/2, /*strides=*/2));
  net->add(std::make_shared<nn::Conv2D>(nn::Conv2D::Options{.channels = 50, .kernel_size = 5, .activation = "relu"}));
  net->add(std::make_shared<nn::MaxPool2D>(2, 2));
  net->add(std::make_shared<nn::Flatten>());
  net->add(std::make_shared<nn::Dense>(128, "relu"));
  net->add(std::make_shared<nn::Dense>(10));
  return net;
}

std::shared_ptr<nn::Sequential> make_net(const std::string& model, bool sync_bn) {
  if (model == "resnet18") return resnet18(10, sync_bn);
  if (model == "lab-cnn") {
    if (sync_bn) throw ConfigError("--sync-bn: the lab's CNN has no BatchNorm (use --model resnet18)");
    return lab_cnn();
  }
  throw ConfigError("bad --model '" + model + "': expected resnet18 or lab-cnn");
}

Init default_init(const std::string& model) {
  if (model == "lab-cnn") return Init::Uniform();  // collect_params().initialize(ctx=ctx): Gluon's default
  return Init::Normal(0.01f);                      // net.initialize(init=init.Normal(sigma=0.01), ctx=ctx)
}

}  // namespace d2l::concise
