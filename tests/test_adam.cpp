// adam_update on every backend: the CPU kernel (kernels/cpu/adam.cpp) for four steps against Adam's
// textbook formula in double (m_hat, v_hat), with and without weight decay, with zero and tiny
// gradients (where epsilon matters); the emulated CUDA kernel (kernels/cuda/adam.cu) bitwise against
// the CPU's; the op (core/ops/adam.cpp) against the kernel, and its shape checks. multi_adam_update (a
// list of tensors in one launch) bitwise against adam_update tensor by tensor, on the CPU and emulated,
// for lists of odd sizes and longer than one launch's table; one launch per table; its op. The Trainer's
// "adam" against PyTorch's torch.optim.Adam is in tests/test_trainer.cpp.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>

#include "core/ops/op.hpp"
#include "emu_check.hpp"
#include "kernel_check.hpp"

// One step of PyTorch's Adam on w, m, v in place: gi = grad_scale * g + wd * w; m = beta1 * m +
// (1 - beta1) * gi; v = beta2 * v + (1 - beta2) * gi^2; w -= step_size * (m / (sqrt(v) / bc2_sqrt + eps)).
D2L_DECLARE_KERNEL(adam_update, float* w, float* m, float* v, const float* g, int64_t n, float grad_scale, float wd,
                   float beta1, float beta2, float eps, float step_size, float bc2_sqrt);
// The same for each of count tensors t (n[t] elements): the bits adam_update gives tensor t.
D2L_DECLARE_KERNEL(multi_adam_update, float* const* w, float* const* m, float* const* v, const float* const* g,
                   const int64_t* n, int64_t count, float grad_scale, float wd, float beta1, float beta2, float eps,
                   float step_size, float bc2_sqrt);

using namespace d2l::test;

namespace {

struct Hyper {
  double lr, beta1, beta2, eps, wd, grad_scale;
};
const Hyper kNoDecay{0.01, 0.9, 0.999, 1e-8, 0.0, 0.25};
const Hyper kDecay{0.05, 0.8, 0.99, 1e-6, 0.1, 1.0};

// Step t's gradient: lcg_data, with every 7th element 0 and every 5th tiny (1e-6 of its value), so
// that sqrt(v_hat) is near epsilon there.
Vec gradient(int64_t n, int t) {
  Vec g = lcg_data(n, 40 + static_cast<uint32_t>(t));
  for (int64_t i = 0; i < n; ++i) {
    if (i % 7 == 3) g[i] = 0.0f;
    if (i % 5 == 1) g[i] *= 1e-6f;
  }
  return g;
}

// The float constants the kernel takes for step t (the Trainer's optim::adam_constants computes the same).
float step_size(const Hyper& h, int t) { return static_cast<float>(h.lr / (1.0 - std::pow(float(h.beta1), t))); }
float bc2_sqrt(const Hyper& h, int t) { return static_cast<float>(std::sqrt(1.0 - std::pow(float(h.beta2), t))); }

void kernel_step(const cpu::Ctx& c, Vec& w, Vec& m, Vec& v, const Vec& g, const Hyper& h, int t) {
  cpu::adam_update(c, w.data(), m.data(), v.data(), g.data(), static_cast<int64_t>(w.size()), float(h.grad_scale),
                   float(h.wd), float(h.beta1), float(h.beta2), float(h.eps), step_size(h, t), bc2_sqrt(h, t));
}

// Adam as its paper and torch.optim.Adam's documentation write it, in double, from the float inputs.
// m_abs, v_abs: m's and v's recursions over the size of gi's terms, |grad_scale * g| + |wd * w|:
// the scale of their rounding errors (gi, and m, may cancel to near 0).
struct RefAdam {
  std::vector<double> w, m, v, m_abs, v_abs;
  void step(const Vec& g, const Hyper& h, int t) {
    const double b1 = float(h.beta1), b2 = float(h.beta2), eps = float(h.eps), wd = float(h.wd), lr = float(h.lr);
    for (size_t i = 0; i < w.size(); ++i) {
      const double gi = double(float(h.grad_scale)) * g[i] + wd * w[i];
      m[i] = b1 * m[i] + (1 - b1) * gi;
      const double size = std::fabs(double(float(h.grad_scale)) * g[i]) + std::fabs(wd * w[i]);
      m_abs[i] = b1 * m_abs[i] + (1 - b1) * size;
      v_abs[i] = b2 * v_abs[i] + (1 - b2) * size * size;
      v[i] = b2 * v[i] + (1 - b2) * gi * gi;
      const double m_hat = m[i] / (1 - std::pow(b1, t)), v_hat = v[i] / (1 - std::pow(b2, t));
      w[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
};

// |got - ref| <= rtol * scale for every element (scale: what the value is made of; NaN fails).
bool close_to_scale(const std::vector<double>& ref, const Vec& got, const std::vector<double>& scale, double rtol,
                    const char* what) {
  int bad = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    if (!(std::fabs(got[i] - ref[i]) <= rtol * scale[i]) && bad++ < 5)
      std::printf("  %s mismatch at %zu: ref %.9g got %.9g (scale %.3g)\n", what, i, ref[i], double(got[i]), scale[i]);
  return bad == 0;
}

}  // namespace

// Float against double over four steps: each step rounds m, v and w to float, a few ulp of what they
// are made of: m and v are checked against the size of their terms (m_abs, v_abs: the gradient and the
// decay may cancel, and m's terms change sign), w relatively; the tiny gradients (1e-6) as tightly as
// the others.
TEST_CASE("adam_update: four steps against Adam in double, with and without weight decay") {
  for (const Hyper& h : {kNoDecay, kDecay}) {
    CAPTURE(h.wd);
    for_contexts_and_sizes([&](const cpu::Ctx& c, int64_t n) {
      Vec w = lcg_data(n, 31), m(n, 0.0f), v(n, 0.0f);
      const std::vector<double> zeros(n, 0.0);
      RefAdam ref{{w.begin(), w.end()}, zeros, zeros, zeros, zeros};
      for (int t = 1; t <= 4; ++t) {
        CAPTURE(t);
        const Vec g = gradient(n, t);
        kernel_step(c, w, m, v, g, h, t);
        ref.step(g, h, t);
        CHECK(close_to_scale(ref.m, m, ref.m_abs, 1e-6, "m"));
        CHECK(close_to_scale(ref.v, v, ref.v_abs, 1e-6, "v"));
        CHECK(close(ref.w, w, 1e-7, 1e-6, "w"));
      }
    });
  }
}

TEST_CASE("adam_update: a zero gradient without decay leaves w, m and v as they are") {
  const int64_t n = 9;
  Vec w = lcg_data(n, 5), m(n, 0.0f), v(n, 0.0f), g(n, 0.0f);
  const Vec w0 = w;
  kernel_step(cpu::serial_ctx(), w, m, v, g, kNoDecay, 1);
  CHECK(w == w0);
  CHECK(m == Vec(n, 0.0f));
  CHECK(v == Vec(n, 0.0f));
}

// ---- the emulated CUDA kernel: bitwise the CPU's (the same float operations in the same order),
// three steps, n = 1, 7, 1000, 4099 (grid-stride tails).
namespace {
void check_emulated(kemu::Stream s) {
  for_grid_sizes([&](int64_t n) {
    for (const Hyper& h : {kNoDecay, kDecay}) {
      Vec w = lcg_data(n, 2), m(n, 0.0f), v(n, 0.0f);
      Vec rw = w, rm = m, rv = v;
      for (int t = 1; t <= 3; ++t) {
        const Vec g = gradient(n, t);
        kemu::adam_update(s, w.data(), m.data(), v.data(), g.data(), n, float(h.grad_scale), float(h.wd),
                          float(h.beta1), float(h.beta2), float(h.eps), step_size(h, t), bc2_sqrt(h, t));
        kernel_step(cpu::serial_ctx(), rw, rm, rv, g, h, t);
      }
      CHECK(same_bits(rw, w, "adam_update w"));
      CHECK(same_bits(rm, m, "adam_update m"));
      CHECK(same_bits(rv, v, "adam_update v"));
    }
  });
}
}  // namespace

D2L_EMULATED_CASES("emulated adam_update is bitwise the CPU's", "emulated adam_update on 2 device threads",
                   check_emulated)

// ---- the op: the kernel on the tensors' device, and its checks.
TEST_CASE("adam_update_ runs the kernel on cpu(0) and emu(0); mismatched tensors are ShapeErrors") {
  using d2l::Tensor;
  const int64_t n = 33;
  const Hyper& h = kDecay;
  d2l::AdamStep s{float(h.beta1), float(h.beta2), float(h.eps), float(h.wd), float(h.grad_scale), step_size(h, 1),
                  bc2_sqrt(h, 1)};
  Vec w = lcg_data(n, 7), m(n, 0.0f), v(n, 0.0f);
  const Vec g = gradient(n, 1), w0 = w;
  kernel_step(cpu::serial_ctx(), w, m, v, g, h, 1);
  for (d2l::Device d : {d2l::cpu(0), d2l::emu(0)}) {
    CAPTURE(d.str());
    Tensor tw = Tensor::from_vector(w0, {n}, d), tm = Tensor::zeros({n}, d), tv = Tensor::zeros({n}, d);
    d2l::adam_update_(tw, tm, tv, Tensor::from_vector(g, {n}, d), s);
    CHECK(tw.to_vector() == w);
    CHECK(tm.to_vector() == m);
    CHECK(tv.to_vector() == v);
  }
  Tensor a = Tensor::zeros({n}, d2l::cpu(0)), b = Tensor::zeros({n}, d2l::cpu(0)), c = Tensor::zeros({n}, d2l::cpu(0));
  CHECK_THROWS_AS(d2l::adam_update_(a, b, c, Tensor::zeros({n + 1}, d2l::cpu(0)), s), d2l::ShapeError);
  CHECK_THROWS_AS(d2l::adam_update_(a, b, c, Tensor::zeros({n}, d2l::cpu(1)), s), d2l::ShapeError);
  CHECK_THROWS_AS(d2l::adam_update_(a, b, b, c, s), d2l::ShapeError);
}

// ---- multi_adam_update against adam_update tensor by tensor, on one backend: three steps of both on
// the same lists, then every w, m and v compared bit for bit.
namespace {

// A backend's adam_update and multi_adam_update, called with the constants of step t.
template <class One, class Multi>
void check_multi_adam(const std::vector<int64_t>& sizes, One one, Multi multi) {
  for (const Hyper& h : {kNoDecay, kDecay}) {
    CAPTURE(h.wd);
    auto w = lists_of(sizes, 10), m = lists_of(sizes, 0), v = lists_of(sizes, 0);
    for (auto& x : m) x.assign(x.size(), 0.0f);
    for (auto& x : v) x.assign(x.size(), 0.0f);
    auto rw = w, rm = m, rv = v;
    for (int t = 1; t <= 3; ++t) {
      std::vector<Vec> g;
      for (int64_t n : sizes) g.push_back(gradient(n, t));
      for (size_t i = 0; i < sizes.size(); ++i) one(rw[i].data(), rm[i].data(), rv[i].data(), g[i].data(), sizes[i], h, t);
      std::vector<const float*> gp;
      for (auto& x : g) gp.push_back(x.data());
      multi(pointers(w).data(), pointers(m).data(), pointers(v).data(), gp.data(), sizes.data(),
            static_cast<int64_t>(sizes.size()), h, t);
    }
    bool same = true;
    for (size_t i = 0; i < sizes.size(); ++i) {
      CAPTURE(i);
      same = same_bits(rw[i], w[i], "multi_adam_update w") && same;
      same = same_bits(rm[i], m[i], "multi_adam_update m") && same;
      same = same_bits(rv[i], v[i], "multi_adam_update v") && same;
    }
    CHECK(same);
  }
}

// kernel(stream or ctx, w, m, v, g, n, the constants): the launchers' common tail of arguments.
#define D2L_ADAM_ARGS(h, t) float(h.grad_scale), float(h.wd), float(h.beta1), float(h.beta2), float(h.eps), \
                            step_size(h, t), bc2_sqrt(h, t)

void check_multi_emulated(kemu::Stream s) {
  for_list_sizes([&](const std::vector<int64_t>& sizes) {
    check_multi_adam(
        sizes,
        [&](float* w, float* m, float* v, const float* g, int64_t n, const Hyper& h, int t) {
          kemu::adam_update(s, w, m, v, g, n, D2L_ADAM_ARGS(h, t));
        },
        [&](float* const* w, float* const* m, float* const* v, const float* const* g, const int64_t* n, int64_t count,
            const Hyper& h, int t) { kemu::multi_adam_update(s, w, m, v, g, n, count, D2L_ADAM_ARGS(h, t)); });
  });
}

}  // namespace

TEST_CASE("multi_adam_update on the CPU is adam_update tensor by tensor, bit for bit") {
  for_list_sizes([&](const std::vector<int64_t>& sizes) {
    for_thread_counts([&](const cpu::Ctx& c) {
      check_multi_adam(
          sizes,
          [&](float* w, float* m, float* v, const float* g, int64_t n, const Hyper& h, int t) {
            cpu::adam_update(c, w, m, v, g, n, D2L_ADAM_ARGS(h, t));
          },
          [&](float* const* w, float* const* m, float* const* v, const float* const* g, const int64_t* n,
              int64_t count, const Hyper& h, int t) { cpu::multi_adam_update(c, w, m, v, g, n, count, D2L_ADAM_ARGS(h, t)); });
    });
  });
}

D2L_EMULATED_CASES("emulated multi_adam_update is adam_update tensor by tensor, bit for bit",
                   "emulated multi_adam_update on 2 device threads", check_multi_emulated)

TEST_CASE("multi_adam_update launches once per table of tensors") {
  for_list_sizes([&](const std::vector<int64_t>& sizes) {
    auto w = lists_of(sizes, 1), m = lists_of(sizes, 2), v = lists_of(sizes, 3), g = lists_of(sizes, 4);
    for (auto& x : v) for (float& y : x) y = y * y;  // a second moment is >= 0
    const int64_t count = static_cast<int64_t>(sizes.size());
    const int64_t before = launches("multi_adam_update_kernel");
    kemu::multi_adam_update(nullptr, pointers(w).data(), pointers(m).data(), pointers(v).data(), pointers(g).data(),
                            sizes.data(), count, D2L_ADAM_ARGS(kDecay, 2));
    CHECK(launches("multi_adam_update_kernel") - before ==
          (count + kemu::kMaxTensorsPerLaunch - 1) / kemu::kMaxTensorsPerLaunch);
  });
}

// ---- the op: one launch on emu(0) for the whole list, adam_update_'s bits on cpu(0) and emu(0).
TEST_CASE("multi_adam_update_ is adam_update_ per tensor, in one launch; bad lists are ShapeErrors") {
  using d2l::Tensor;
  const Hyper& h = kDecay;
  const d2l::AdamStep s{float(h.beta1), float(h.beta2), float(h.eps), float(h.wd), float(h.grad_scale),
                        step_size(h, 1), bc2_sqrt(h, 1)};
  for (d2l::Device d : {d2l::cpu(0), d2l::emu(0)}) {
    CAPTURE(d.str());
    std::vector<Tensor> w, m, v, g, rw, rm, rv;
    for (size_t t = 0; t < kListSizes.size(); ++t) {
      const int64_t n = kListSizes[t];
      for (auto* list : {&w, &rw}) list->push_back(Tensor::from_vector(lcg_data(n, static_cast<uint32_t>(t)), {n}, d));
      for (auto* list : {&m, &rm, &v, &rv}) list->push_back(Tensor::zeros({n}, d));
      g.push_back(Tensor::from_vector(gradient(n, 1), {n}, d));
    }
    const int64_t before = launches("multi_adam_update_kernel");
    d2l::multi_adam_update_(w, m, v, g, s);
    for (size_t t = 0; t < w.size(); ++t) d2l::adam_update_(rw[t], rm[t], rv[t], g[t], s);
    d2l::waitall();
    CHECK(launches("multi_adam_update_kernel") - before == (d.kind == d2l::DeviceKind::emu ? 1 : 0));
    for (size_t t = 0; t < w.size(); ++t) {
      CHECK(same_bits(rw[t].to_vector(), w[t].to_vector(), "w"));
      CHECK(same_bits(rm[t].to_vector(), m[t].to_vector(), "m"));
      CHECK(same_bits(rv[t].to_vector(), v[t].to_vector(), "v"));
    }
  }
  auto z = [](int64_t n) { return Tensor::zeros({n}, d2l::cpu(0)); };
  CHECK_THROWS_AS(d2l::multi_adam_update_({z(3)}, {z(3)}, {z(3)}, {}, s), d2l::ShapeError);
  CHECK_THROWS_AS(d2l::multi_adam_update_({z(3)}, {z(3)}, {z(2)}, {z(3)}, s), d2l::ShapeError);
  const Tensor a = z(3);
  CHECK_THROWS_AS(d2l::multi_adam_update_({a}, {z(3)}, {a}, {z(3)}, s), d2l::ShapeError);
}
