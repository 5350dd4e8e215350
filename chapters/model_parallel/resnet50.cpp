#include "chapters/model_parallel/resnet50.hpp"

#include <cmath>

#include "core/ops.hpp"

namespace d2l::mp {

namespace {
// torchvision's conv1x1 / conv3x3 / the 7x7 stem: no bias, weights N(0, sqrt(2 / fan_out)) with
// fan_out = out_channels * kh * kw (kaiming_normal_, mode="fan_out", nonlinearity="relu").
std::shared_ptr<nn::Conv2D> conv(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t padding) {
  auto c = std::make_shared<nn::Conv2D>(out, k, stride, padding, /*use_bias=*/false, in);
  c->weight->initialize(Init::Normal(std::sqrt(2.0f / static_cast<float>(out * k * k))), {cpu(0)});
  return c;
}

// BatchNorm2d(C): weight 1, bias 0, running mean 0, running variance 1 (the blocks' defaults).
std::shared_ptr<nn::BatchNorm> bn(int64_t C) {
  auto b = std::make_shared<nn::BatchNorm>(C);
  b->initialize(Init::Uniform(), {cpu(0)});  // only weights of rank >= 2 take the init: none here
  return b;
}
}  // namespace

Bottleneck::Bottleneck(int64_t inplanes, int64_t planes, int64_t stride, std::shared_ptr<nn::Sequential> ds) {
  conv1 = register_child("conv1", conv(inplanes, planes, 1, 1, 0));
  bn1 = register_child("bn1", bn(planes));
  conv2 = register_child("conv2", conv(planes, planes, 3, stride, 1));
  bn2 = register_child("bn2", bn(planes));
  conv3 = register_child("conv3", conv(planes, planes * expansion, 1, 1, 0));
  bn3 = register_child("bn3", bn(planes * expansion));
  relu = register_child("relu", std::make_shared<nn::Activation>("relu"));
  if (ds) downsample = register_child("downsample", ds);
}

Tensor Bottleneck::forward(const Tensor& x) {
  Tensor identity = x;
  Tensor out = (*relu)((*bn1)((*conv1)(x)));
  out = (*relu)((*bn2)((*conv2)(out)));
  out = (*bn3)((*conv3)(out));
  if (downsample) identity = (*downsample)(x);
  return (*relu)(out + identity);
}

ResNet::ResNet(const std::vector<int>& layers, int64_t num_classes) : num_classes(num_classes) {
  if (layers.size() != 4) throw ConfigError("ResNet: expected 4 stage sizes, got " + std::to_string(layers.size()));
  if (num_classes < 1) throw ConfigError("ResNet: num_classes must be >= 1, got " + std::to_string(num_classes));
  conv1 = register_child("conv1", conv(3, 64, 7, 2, 3));
  bn1 = register_child("bn1", bn(64));
  relu = register_child("relu", std::make_shared<nn::Activation>("relu"));
  maxpool = register_child("maxpool", std::make_shared<nn::MaxPool2D>(3, 2, 1));
  layer1 = register_child("layer1", make_layer(64, layers[0], 1));
  layer2 = register_child("layer2", make_layer(128, layers[1], 2));
  layer3 = register_child("layer3", make_layer(256, layers[2], 2));
  layer4 = register_child("layer4", make_layer(512, layers[3], 2));
  avgpool = register_child("avgpool", std::make_shared<nn::GlobalAvgPool2D>());
  // nn.Linear(2048, num_classes): weight and bias U(-1/sqrt(in), 1/sqrt(in)).
  const int64_t in = 512 * Bottleneck::expansion;
  fc = register_child("fc", std::make_shared<nn::Dense>(num_classes, "", true, in));
  const float bound = 1.0f / std::sqrt(static_cast<float>(in));
  fc->weight->initialize(Init::Uniform(bound), {cpu(0)});
  fc->bias->initialize(Init::Uniform(bound), {cpu(0)});
}

std::shared_ptr<nn::Sequential> ResNet::make_layer(int64_t planes, int blocks, int64_t stride) {
  std::shared_ptr<nn::Sequential> ds;
  if (stride != 1 || inplanes_ != planes * Bottleneck::expansion) {
    ds = std::make_shared<nn::Sequential>();
    ds->add(conv(inplanes_, planes * Bottleneck::expansion, 1, stride, 0), bn(planes * Bottleneck::expansion));
  }
  auto layer = std::make_shared<nn::Sequential>();
  layer->add(std::make_shared<Bottleneck>(inplanes_, planes, stride, ds));
  inplanes_ = planes * Bottleneck::expansion;
  for (int i = 1; i < blocks; ++i) layer->add(std::make_shared<Bottleneck>(inplanes_, planes));
  return layer;
}

Tensor ResNet::forward(const Tensor& x) {
  Tensor y = (*maxpool)((*relu)((*bn1)((*conv1)(x))));
  y = (*layer4)((*layer3)((*layer2)((*layer1)(y))));
  return (*fc)((*avgpool)(y));  // fc flattens (N, 2048, 1, 1) to (N, 2048): torch.flatten(x, 1)
}

std::shared_ptr<nn::Sequential> ResNet::layer_list() const {
  auto list = std::make_shared<nn::Sequential>();
  list->add(conv1, bn1, relu, maxpool);
  for (auto* layer : {&layer1, &layer2, &layer3, &layer4})
    for (auto& [name, block] : (*layer)->children()) list->add(block);
  list->add(avgpool, fc);
  return list;
}

std::vector<std::string> ResNet::layer_names() const {
  std::vector<std::string> names{"conv1", "bn1", "relu", "maxpool"};
  int i = 1;
  for (auto* layer : {&layer1, &layer2, &layer3, &layer4}) {
    for (auto& [name, block] : (*layer)->children()) names.push_back("layer" + std::to_string(i) + "." + name);
    ++i;
  }
  names.push_back("avgpool");
  names.push_back("fc");
  return names;
}

std::shared_ptr<ResNet> resnet50(int64_t num_classes) {
  return std::make_shared<ResNet>(std::vector<int>{3, 4, 6, 3}, num_classes);
}

}  // namespace d2l::mp
