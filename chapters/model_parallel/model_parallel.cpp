#include "chapters/model_parallel/model_parallel.hpp"

#include <cmath>
#include <cstdio>

#include "core/autograd.hpp"
#include "core/ops.hpp"
#include "core/optim/trainer.hpp"

namespace d2l::mp {

Tensor mse(const Tensor& output, const Tensor& target) {
  // d2l's mse_loss is (p - t)^2 / 2 per element: twice its mean is PyTorch's MSELoss.
  return d2l::mse_loss(output, target, Reduction::mean) * 2.0f;
}

// ---- Step 1: the toy model

ToyModel::ToyModel(Device dev0, Device dev1) : dev0(dev0), dev1(dev1) {
  // self.net1 = torch.nn.Linear(10, 10).to('cuda:0'); self.relu = torch.nn.ReLU();
  // self.net2 = torch.nn.Linear(10, 5).to('cuda:1')
  net1 = register_child("net1", std::make_shared<nn::Dense>(10, "", true, 10));
  relu = register_child("relu", std::make_shared<nn::Activation>("relu"));
  net2 = register_child("net2", std::make_shared<nn::Dense>(5, "", true, 10));
  const float bound = 1.0f / std::sqrt(10.0f);  // nn.Linear's default: U(-1/sqrt(in), 1/sqrt(in))
  for (auto& [net, dev] : {std::pair{net1, dev0}, std::pair{net2, dev1}})
    for (auto& [name, p] : net->collect_params()) p->initialize(Init::Uniform(bound), {dev});
}

Tensor ToyModel::forward(const Tensor& x) {
  Tensor h = (*relu)((*net1)(x.to(dev0)));
  return (*net2)(h.to(dev1));
}

std::pair<float, float> toy_step(Device dev0, Device dev1, bool verbose) {
  ToyModel model(dev0, dev1);
  optim::Trainer optimizer(model.collect_params(), "sgd", {.learning_rate = 0.001f});
  model.collect_params().zero_grad();                       // optimizer.zero_grad()
  Tensor inputs = normal({20, 10}, 0.0f, 1.0f, dev0);       // torch.randn(20, 10)
  Tensor outputs = model(inputs);
  Tensor labels = normal({20, 5}, 0.0f, 1.0f, dev1);        // torch.randn(20, 5).to('cuda:1')
  Tensor loss = mse(outputs, labels);
  loss.backward();                                          // loss_fn(outputs, labels).backward()
  float before = loss.item();
  optimizer.step(1);  // optimizer.step(): SGD on the mean loss, so no division by a batch size
  float after = 0;
  {
    NoGrad no_grad;
    after = mse(model(inputs), labels).item();
  }
  if (verbose) {
    std::printf("ToyModel: net1 %s on %s, net2 %s on %s\n", model.net1->describe().c_str(), dev0.str().c_str(),
                model.net2->describe().c_str(), dev1.str().c_str());
    std::printf("outputs %s on %s, labels on %s: MSELoss %.6f, after optimizer.step() %.6f\n",
                str(outputs.shape()).c_str(), outputs.device().str().c_str(), labels.device().str().c_str(), before, after);
  }
  return {before, after};
}

// ---- Step 2: ResNet-50 on two devices

ModelParallelResNet50::ModelParallelResNet50(Device dev0, Device dev1, int64_t num_classes)
    : ResNet({3, 4, 6, 3}, num_classes), dev0(dev0), dev1(dev1) {
  seq1 = std::make_shared<nn::Sequential>();
  seq1->add(conv1, bn1, relu, maxpool, layer1, layer2);
  seq1->to(dev0);
  seq2 = std::make_shared<nn::Sequential>();
  seq2->add(layer3, layer4, avgpool);
  seq2->to(dev1);
  fc->to(dev1);
}

Tensor ModelParallelResNet50::forward(const Tensor& x) {
  Tensor y = (*seq2)((*seq1)(x.to(dev0)).to(dev1));
  return (*fc)(y);  // fc flattens: self.fc(x.view(x.size(0), -1))
}

}  // namespace d2l::mp
