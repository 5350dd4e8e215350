// Gradient checking for the kernel tests: an analytic gradient (from a backward kernel, float)
// against central finite differences of a scalar loss computed in double by a reference forward:
//   numeric[i] = (loss(x + h e_i) - loss(x - h e_i)) / (2h)
// compared with d2l::test::close (|numeric - analytic| <= atol + rtol * |numeric|).
// The same at the tensor level for ops with autograd (gradcheck), and the thread settings every
// kernel test runs under. The one finite-difference helper of the tests.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <unordered_set>
#include <vector>

#include "check.hpp"
#include "core/autograd.hpp"
#include "core/ops.hpp"
#include "core/tensor.hpp"
#include "kernels/cpu/thread_pool.hpp"

namespace d2l::test {

using LossFn = std::function<double(const std::vector<double>&)>;

// Central differences of loss at up to max_points indices spread evenly over x (all of them when x
// is small). skip(i) may veto an index (e.g. near a max-pool tie).
struct FdSample {
  std::vector<int64_t> idx;
  std::vector<double> numeric;
};

inline FdSample fd_gradient(const std::vector<float>& x, const LossFn& loss, double h,
                            int64_t max_points = 400, const std::function<bool(int64_t)>& skip = {}) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<double> xd(x.begin(), x.end());
  FdSample fd;
  const int64_t step = n <= max_points ? 1 : (n + max_points - 1) / max_points;
  for (int64_t i = (step > 1 ? step / 2 : 0); i < n; i += step) {
    if (skip && skip(i)) continue;
    const double x0 = xd[i];
    xd[i] = x0 + h;
    const double up = loss(xd);
    xd[i] = x0 - h;
    const double down = loss(xd);
    xd[i] = x0;
    fd.idx.push_back(i);
    fd.numeric.push_back((up - down) / (2 * h));
  }
  return fd;
}

// Does the analytic gradient agree with the sampled numeric one? Fails if nothing was sampled.
inline bool fd_agrees(const FdSample& fd, const std::vector<float>& grad, double atol, double rtol,
                      const char* what = "fd") {
  if (fd.idx.empty()) {
    std::printf("  %s: no points checked\n", what);
    return false;
  }
  std::vector<double> analytic;
  for (int64_t i : fd.idx) analytic.push_back(grad[static_cast<size_t>(i)]);
  return close(fd.numeric, analytic, atol, rtol, what);
}

inline bool fd_check(const std::vector<float>& x, const std::vector<float>& grad, const LossFn& loss,
                     double h, double atol, double rtol, int64_t max_points = 400,
                     const std::function<bool(int64_t)>& skip = {}, const char* what = "fd") {
  return fd_agrees(fd_gradient(x, loss, h, max_points, skip), grad, atol, rtol, what);
}

// sum(y * r): the loss whose gradient with respect to y is r.
inline double dot(const std::vector<double>& y, const std::vector<float>& r) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += y[i] * r[i];
  return s;
}

inline std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Central differences that allow for relu kinks and max-pool switches: at each sampled
// index, numeric = (f(x+h) - f(x-h)) / 2h must be within atol + rtol |numeric| + bend of the analytic
// gradient, where bend = |f(x+h) - 2 f(x) + f(x-h)| / 2h. A smooth f bends by O(h^2) there; a kink
// between x-h and x+h bends it by exactly the error it causes the central difference (for piecewise
// linear f), so a kink is forgiven and a wrong gradient is not.
using KinkLoss = std::function<double(const std::vector<float>&)>;
inline bool fd_check_kinks(std::vector<float> x, const std::vector<float>& grad, const KinkLoss& f, double h, double atol,
                    double rtol, int64_t points, const char* what) {
  const int64_t n = static_cast<int64_t>(x.size()), step = std::max<int64_t>(1, (n + points - 1) / points);
  const double f0 = f(x);
  int bad = 0, checked = 0;
  for (int64_t i = step / 2; i < n; i += step, ++checked) {
    const float x0 = x[i];
    x[i] = static_cast<float>(x0 + h);
    const double up = f(x), step_up = double(x[i]) - x0;
    x[i] = static_cast<float>(x0 - h);
    const double down = f(x), step_down = x0 - double(x[i]);
    x[i] = x0;
    const double numeric = (up - down) / (step_up + step_down), bend = std::fabs(up - 2 * f0 + down) / (2 * h);
    if (!(std::fabs(numeric - grad[i]) <= atol + rtol * std::fabs(numeric) + bend) && bad++ < 5)
      std::printf("  %s mismatch at %lld: numeric %.6g analytic %.6g (bend %.3g)\n", what, (long long)i, numeric,
                  double(grad[i]), bend);
  }
  if (bad) std::printf("  %s: %d of %d points disagree\n", what, bad, checked);
  return bad == 0 && checked > 0;
}

// Tensor level: loss = f(inputs) must be a one-element tensor. The gradient autograd gives each
// input against fd_gradient of f over every element of that input (perturbed by +-h in float).
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
    const LossFn loss = [&](const std::vector<double>& xk) {
      NoGrad no_grad;
      std::vector<Tensor> ys;
      for (size_t j = 0; j < specs.size(); ++j)
        ys.push_back(j == k ? Tensor::from_vector(std::vector<float>(xk.begin(), xk.end()), specs[j].shape, d)
                            : Tensor::from_vector(specs[j].values, specs[j].shape, d));
      return static_cast<double>(f(ys).item());
    };
    const std::string what = "input " + std::to_string(k);
    const auto n = static_cast<int64_t>(specs[k].values.size());
    ok = fd_agrees(fd_gradient(specs[k].values, loss, h, n), xs[k].grad().to_vector(), atol, rtol, what.c_str()) && ok;
  }
  return ok;
}

// The negative control of a gradient check: in the graph that made `loss`, every node named `op` gets a
// backward that returns its first gradient times 1.1, so the check must then fail. Only this graph
// changes (autograd itself has no such switch); call it between the forward and backward().
inline void break_backward_of(const Tensor& loss, const std::string& op) {
  std::vector<Node*> todo;
  std::unordered_set<Node*> seen;
  if (loss.impl().grad_fn) todo.push_back(loss.impl().grad_fn.get());
  while (!todo.empty()) {
    Node* node = todo.back();
    todo.pop_back();
    if (!seen.insert(node).second) continue;
    for (const Edge& in : node->inputs)
      if (in.fn) todo.push_back(in.fn.get());
    if (node->name != op) continue;
    node->backward = [right = node->backward](const Tensor& grad_out) {
      std::vector<Tensor> gx = right(grad_out);
      if (!gx.empty() && gx[0].defined()) gx[0] = scale(gx[0], 1.1f);
      return gx;
    };
  }
}

// gradcheck of f with the backward of `op` broken as above: true means the check missed it.
inline bool gradcheck_broken(const std::string& op, const std::function<Tensor(const std::vector<Tensor>&)>& f,
                             const std::vector<GradSpec>& specs, Device d) {
  auto broken = [&](const std::vector<Tensor>& xs) {
    Tensor loss = f(xs);
    break_backward_of(loss, op);  // no graph (no change) in the finite differences, run under NoGrad
    return loss;
  };
  return gradcheck(broken, specs, d);
}

// ---- An op through autograd (the rows each tests/test_<op>.cpp gives for its op; tests/test_autograd.cpp
// for the ops without a file of their own): the backward against gradcheck on cpu(0), and the same
// check with the op's node broken (gradcheck_broken) must fail.
struct OpCase {
  const char* name;  // the Node name the mutation targets
  std::vector<GradSpec> inputs;
  std::function<Tensor(const std::vector<Tensor>&)> f;
};

// gradcheck's tolerances (h 1e-2, atol 2e-3, rtol 2e-2); true when the backward passes and the broken
// backward fails. Prints which half went wrong.
inline bool op_case_ok(const OpCase& c, Device d) {
  const bool right = gradcheck(c.f, c.inputs, d), broken_passed = gradcheck_broken(c.name, c.f, c.inputs, d);
  if (!right) std::printf("  %s: the backward disagrees with finite differences\n", c.name);
  if (broken_passed) std::printf("  %s: a deliberately broken backward passed the check\n", c.name);
  return right && !broken_passed;
}

// Inputs for OpCase: lcg_data moved 0.1 away from 0, so relu's kink is never within h of an input.
inline std::vector<float> grad_input(int64_t n, uint32_t seed) {
  auto v = lcg_data(n, seed);
  for (auto& x : v) x = x < 0 ? x - 0.1f : x + 0.1f;
  return v;
}

// sum(y * r) with a fixed random r of y's shape: a scalar loss whose gradient reaches every element.
inline Tensor project(const Tensor& y, uint32_t seed = 99) {
  return sum(mul(y, Tensor::from_vector(lcg_data(y.numel(), seed), y.shape(), y.device())));
}

// Runs body(ctx) with 1, 2 and 3 threads (the pool holds threads - 1 helpers).
inline void for_thread_counts(const std::function<void(const kernels::cpu::Ctx&)>& body) {
  for (int t : {1, 2, 3}) {
    kernels::cpu::ThreadPool pool(t - 1);
    kernels::cpu::Ctx c{t, &pool};
    body(c);
  }
}

}  // namespace d2l::test
