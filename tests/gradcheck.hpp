// Central finite differences against autograd (STYLE.md 4), at the tensor level.
// loss = f(inputs) must be a one-element tensor. Each input element is perturbed by +-h in float;
// numeric = (f(x+h) - f(x-h)) / 2h. Accepted when |numeric - analytic| <= atol + rtol * |numeric|.
#pragma once
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include "core/autograd.hpp"
#include "core/tensor.hpp"

namespace d2l::test {

struct GradSpec {
  Shape shape;
  std::vector<float> values;
};

inline bool gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f, const std::vector<GradSpec>& specs,
                      Device d, double h = 1e-2, double atol = 2e-3, double rtol = 2e-2) {
  std::vector<Tensor> xs;
  for (auto& s : specs) xs.push_back(Tensor::from_vector(s.values, s.shape, d).attach_grad());
  f(xs).backward();
  bool ok = true;
  for (size_t k = 0; k < specs.size(); ++k) {
    std::vector<float> analytic = xs[k].grad().to_vector();
    int bad = 0;
    for (size_t i = 0; i < specs[k].values.size(); ++i) {
      auto at = [&](double delta) {
        NoGrad no_grad;
        std::vector<Tensor> ys;
        for (size_t j = 0; j < specs.size(); ++j) {
          std::vector<float> v = specs[j].values;
          if (j == k) v[i] = static_cast<float>(v[i] + delta);
          ys.push_back(Tensor::from_vector(v, specs[j].shape, d));
        }
        return static_cast<double>(f(ys).item());
      };
      double numeric = (at(h) - at(-h)) / (2 * h);
      if (!(std::fabs(numeric - analytic[i]) <= atol + rtol * std::fabs(numeric))) {
        if (bad++ < 5)
          std::printf("  input %zu element %zu: numeric %.6g analytic %.6g\n", k, i, numeric, (double)analytic[i]);
        ok = false;
      }
    }
  }
  return ok;
}

}  // namespace d2l::test
