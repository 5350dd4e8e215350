// Block and ParameterDict: dotted names from registration, initialize on several devices, the
// book's errors, to(dev), forward_shards defaulting to forward per shard.
#include <doctest/doctest.h>

#include "core/nn/block.hpp"
#include "core/ops.hpp"
#include "core/rng.hpp"
#include "core/runtime.hpp"

using namespace d2l;
using namespace d2l::nn;

namespace {

// y = x @ weight^T: weight (units, in) with `in` inferred from the first input.
struct TinyDense : Block {
  ParameterPtr weight;
  ParameterPtr count;  // a state without a gradient, like BatchNorm's running statistics
  explicit TinyDense(int64_t units) {
    weight = register_parameter("weight", {units, 0}, Init::Normal(0.5f));
    count = register_parameter("count", {1}, Init::Zero(), false);
  }
  Tensor forward(const Tensor& x) override {
    weight->infer_shape({weight->shape()[0], x.dim(1)});
    return matmul(x, weight->data(x.device()), false, true);
  }
  std::string type() const override { return "TinyDense"; }
};

struct TwoDense : Block {
  std::shared_ptr<TinyDense> a, b;
  TwoDense() {
    a = register_child("first", std::make_shared<TinyDense>(3));
    b = register_child("1", std::make_shared<TinyDense>(2));
  }
  Tensor forward(const Tensor& x) override { return (*b)((*a)(x)); }
  std::string type() const override { return "TwoDense"; }
};

}  // namespace

TEST_CASE("collect_params names parameters by their dotted path, in registration order") {
  TwoDense net;
  auto params = net.collect_params();
  std::vector<std::string> names;
  for (auto& [n, p] : params) names.push_back(n);
  CHECK(names == std::vector<std::string>{"first.weight", "first.count", "1.weight", "1.count"});
  CHECK(params["1.weight"].name() == "1.weight");
  CHECK(params.trainable().size() == 2);
  CHECK_THROWS_WITH_AS(params["2.weight"], doctest::Contains("no parameter named '2.weight'"), ParameterError);
  CHECK(net.repr() == "TwoDense(\n  (first): TinyDense\n  (1): TinyDense\n)");
}

TEST_CASE("initialize on two devices: deferred shapes, identical replicas, the book's errors") {
  manual_seed(11);
  TwoDense net;
  net.initialize(Init::Normal(0.5f), {cpu(0), cpu(1)});
  auto params = net.collect_params();
  CHECK_THROWS_WITH_AS(params["first.weight"].data(cpu(0)), doctest::Contains("deferred"), ParameterError);
  Tensor x0 = Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {1, 4}, cpu(0));
  Tensor y0 = net(x0);
  CHECK(y0.shape() == Shape{1, 2});
  CHECK(params["first.weight"].shape() == Shape{3, 4});
  CHECK(params["first.weight"].data(cpu(0)).to_vector() == params["first.weight"].data(cpu(1)).to_vector());
  CHECK_THROWS_WITH_AS(params["1.weight"].data(cpu(2)),
                       "Parameter '1.weight' was not initialized on context cpu(2). It was only initialized on "
                       "[cpu(0), cpu(1)].",
                       ParameterError);
  // The same input on either device gives the same output: the replicas are used per device.
  Tensor y1 = net(x0.to(cpu(1)));
  CHECK(y1.device() == cpu(1));
  CHECK(y1.to_vector() == y0.to_vector());
  // forward_shards defaults to forward on each shard.
  auto ys = net({x0, x0.to(cpu(1))});
  REQUIRE(ys.size() == 2);
  CHECK(ys[1].device() == cpu(1));
  CHECK(ys[1].to_vector() == y0.to_vector());
  // States without a gradient get none; weights do.
  CHECK_FALSE(params["first.count"].data(cpu(0)).grad().defined());
  CHECK(params["first.weight"].grad(cpu(1)).defined());
}

TEST_CASE("to(dev) moves a block with its values; a deferred block is made there") {
  manual_seed(5);
  TwoDense net;
  net.initialize(Init::Normal(0.5f), {cpu(0)});
  Tensor x = Tensor::from_vector(std::vector<float>{1, -1}, {1, 2}, cpu(0));
  auto before = net(x).to_vector();
  auto w = net.collect_params()["first.weight"].data(cpu(0)).to_vector();
  net.to(cpu(1));
  CHECK(net.collect_params()["first.weight"].data(cpu(1)).to_vector() == w);
  CHECK_THROWS_AS(net.collect_params()["first.weight"].data(cpu(0)), ParameterError);
  CHECK(net(x.to(cpu(1))).to_vector() == before);

  TwoDense fresh;  // never initialised: to() initialises on the device, shapes still deferred
  fresh.b->to(cpu(1));
  fresh.a->to(cpu(1));
  CHECK(fresh(x.to(cpu(1))).device() == cpu(1));
  CHECK(fresh.collect_params()["1.weight"].shape() == Shape{2, 3});
}

TEST_CASE("registering a name twice is an error") {
  struct Twice : Block {
    Twice() {
      register_parameter("w", {1});
      register_parameter("w", {1});
    }
    std::string type() const override { return "Twice"; }
  };
  CHECK_THROWS_WITH_AS(Twice(), "Twice: parameter 'w' registered twice", ParameterError);
}
