// Parameters as replica sets: identical replicas, the book's errors, deferred initialisation.
#include <doctest/doctest.h>

#include <cmath>

#include "core/parameter.hpp"
#include "core/rng.hpp"
#include "core/runtime.hpp"

using namespace d2l;

TEST_CASE("initialize on two devices gives bitwise identical replicas") {
  manual_seed(7);
  Parameter w("conv0_weight", {20, 1, 3, 3});
  w.initialize(Init::Normal(0.01f), {cpu(0), cpu(1)});
  auto a = w.data(cpu(0)).to_vector(), b = w.data(cpu(1)).to_vector();
  CHECK(a == b);
  CHECK(w.list_data().size() == 2);
  CHECK(w.list_data()[1].device() == cpu(1));
  CHECK(w.grad(cpu(1)).to_vector() == std::vector<float>(180, 0.0f));
  double sq = 0;
  for (float x : a) sq += x * x;
  CHECK(std::sqrt(sq / a.size()) == doctest::Approx(0.01).epsilon(0.25));  // N(0, 0.01)
}

TEST_CASE("using a parameter on a device it is not on is the book's clear error") {
  Parameter w("dense0_weight", {2, 3});
  CHECK_THROWS_WITH_AS(w.data(cpu(0)), doctest::Contains("has not been initialized"), ParameterError);
  w.initialize(Init::Uniform(), {cpu(1)});
  CHECK_THROWS_WITH_AS(w.data(), "Parameter 'dense0_weight' was not initialized on context cpu(0). It was only "
                                 "initialized on [cpu(1)].",
                       ParameterError);
  CHECK_NOTHROW(w.data(cpu(1)));
}

TEST_CASE("deferred initialisation: shape inferred at the first forward; reading before is an error") {
  manual_seed(3);
  Parameter w("dense1_weight", {10, 0});  // in_units unknown
  w.initialize(Init::Xavier(), {cpu(0), cpu(1)});
  CHECK_THROWS_WITH_AS(w.data(cpu(0)), doctest::Contains("deferred"), ParameterError);
  CHECK_THROWS_AS(w.infer_shape({11, 4}), ParameterError);  // known dim disagrees
  w.infer_shape({10, 4});
  CHECK(w.shape() == Shape{10, 4});
  auto a = w.data(cpu(0)).to_vector();
  CHECK(a == w.data(cpu(1)).to_vector());
  float bound = std::sqrt(6.0f / 14.0f);
  for (float x : a) CHECK(std::fabs(x) <= bound);
}

TEST_CASE("re-initialising is skipped unless forced; set_data reaches every replica") {
  manual_seed(1);
  Parameter b("bias", {3}, Init::Zero());
  b.initialize({cpu(0), cpu(1)});
  b.initialize(Init::One(), {cpu(0)});  // skipped, as Gluon does
  CHECK(b.list_ctx().size() == 2);
  b.initialize(Init::One(), {cpu(0)}, true);
  CHECK(b.data(cpu(0)).to_vector() == std::vector<float>{1, 1, 1});
  b.initialize({cpu(0), cpu(1)}, true);
  b.set_data(Tensor::from_vector(std::vector<float>{4, 5, 6}, {3}, cpu(0)));
  CHECK(b.data(cpu(1)).to_vector() == std::vector<float>{4, 5, 6});
  CHECK_THROWS_AS(b.set_data(Tensor::zeros({2}, cpu(0))), ParameterError);
}
