// ResNet-50 in torchvision's layout (torchvision.models.resnet: ResNet(Bottleneck, [3, 4, 6, 3])),
// the model the section (PyTorch's model-parallel tutorial, "Step 2") splits over two devices. The children carry
// torchvision's names, so the parameter names are its state_dict keys and a torchvision state_dict
// saved as safetensors loads with io::load_parameters:
//
//   conv1.weight (64, 3, 7, 7)          bn1.{weight, bias, running_mean, running_var} (64)
//   layer1.0.conv1.weight (64, 64, 1, 1) ... layer1.0.bn3.*, layer1.0.downsample.0.weight (256, 64, 1, 1),
//   layer1.0.downsample.1.* ... layer4.2.bn3.*                    fc.weight (1000, 2048), fc.bias (1000)
//
// Convolutions have no bias (torchvision: bias=False, the BatchNorm after each one has its own).
// Initialisation is torchvision's: conv weights N(0, sqrt(2 / fan_out)) (kaiming_normal_, mode
// fan_out, relu), BatchNorm weight 1 and bias 0, fc weight and bias U(-1/sqrt(2048), 1/sqrt(2048))
// (nn.Linear's default). As torchvision builds the model on the CPU, the constructor makes the
// parameters on cpu(0); move them with to(device).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/nn/nn.hpp"

namespace d2l::mp {

// torchvision's Bottleneck (ResNet v1.5: the stride sits on the 3x3 conv):
//   out = relu(bn1(conv1(x)))       conv1: 1x1, inplanes -> planes
//   out = relu(bn2(conv2(out)))     conv2: 3x3, stride, padding 1, planes -> planes
//   out = bn3(conv3(out))           conv3: 1x1, planes -> planes * expansion
//   return relu(out + (downsample ? downsample(x) : x))
// downsample (a 1x1 conv with the stride, then BatchNorm) matches x to out's channels and size.
class Bottleneck : public nn::Block {
 public:
  static constexpr int64_t expansion = 4;
  Bottleneck(int64_t inplanes, int64_t planes, int64_t stride = 1, std::shared_ptr<nn::Sequential> downsample = nullptr);

  // x (N, inplanes, H, W) -> (N, planes * 4, ceil(H / stride), ceil(W / stride))
  Tensor forward(const Tensor& x) override;
  std::string type() const override { return "Bottleneck"; }

  std::shared_ptr<nn::Conv2D> conv1, conv2, conv3;
  std::shared_ptr<nn::BatchNorm> bn1, bn2, bn3;
  std::shared_ptr<nn::Activation> relu;
  std::shared_ptr<nn::Sequential> downsample;  // null when x already has out's shape
};

// torchvision's ResNet with Bottleneck blocks:
//   conv1 7x7/2 (pad 3) -> bn1 -> relu -> maxpool 3x3/2 (pad 1) -> layer1 .. layer4 -> avgpool -> fc
// layer i is `layers[i]` Bottlenecks of width 64, 128, 256, 512 (stride 1, 2, 2, 2 in the first
// block, which also gets the downsample); avgpool is global (torchvision's AdaptiveAvgPool2d((1, 1))).
class ResNet : public nn::Block {
 public:
  ResNet(const std::vector<int>& layers, int64_t num_classes = 1000);

  Tensor forward(const Tensor& x) override;  // x (N, 3, H, W) -> (N, num_classes); H, W >= 32
  std::string type() const override { return "ResNet"; }

  // The model as one flat list of the blocks in forward order, what a pipeline cuts into stages:
  // conv1, bn1, relu, maxpool, every Bottleneck of layer1 .. layer4, avgpool, fc (22 blocks for
  // ResNet-50; fc flattens its input). The blocks are shared with this model, not copies.
  std::shared_ptr<nn::Sequential> layer_list() const;
  // The names of layer_list()'s blocks: "conv1", ..., "layer1.0", ..., "fc".
  std::vector<std::string> layer_names() const;

  std::shared_ptr<nn::Conv2D> conv1;
  std::shared_ptr<nn::BatchNorm> bn1;
  std::shared_ptr<nn::Activation> relu;
  std::shared_ptr<nn::MaxPool2D> maxpool;
  std::shared_ptr<nn::Sequential> layer1, layer2, layer3, layer4;
  std::shared_ptr<nn::GlobalAvgPool2D> avgpool;
  std::shared_ptr<nn::Dense> fc;
  int64_t num_classes;

 private:
  // torchvision's _make_layer: `blocks` Bottlenecks of width `planes`, the first with `stride`.
  std::shared_ptr<nn::Sequential> make_layer(int64_t planes, int blocks, int64_t stride);
  int64_t inplanes_ = 64;
};

// torchvision.models.resnet50(num_classes=...): ResNet([3, 4, 6, 3], num_classes), on cpu(0).
std::shared_ptr<ResNet> resnet50(int64_t num_classes = 1000);

}  // namespace d2l::mp
