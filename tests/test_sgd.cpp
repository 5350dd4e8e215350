// sgd_update on every backend: the CPU kernel (kernels/cpu/sgd.cpp) against a direct loop, the emulated
// CUDA kernel (kernels/cuda/sgd.cu) bitwise against the CPU's. multi_sgd_mom_update, the Trainer's SGD on a
// list of tensors in one launch: bitwise the per-tensor step (scale, then three axpy) on the CPU and
// emulated, with and without momentum and weight decay, for lists of odd sizes and longer than one
// launch's table; one launch per table; the op multi_sgd_mom_update_ and its checks.
#include <doctest/doctest.h>

#include "core/ops/op.hpp"
#include "emu_check.hpp"
#include "kernel_check.hpp"

// w -= lr * g (the book's sgd: param[:] = param - lr * grad / batch_size, lr pre-divided).
D2L_DECLARE_KERNEL(sgd_update, float* w, const float* g, int64_t n, float lr);
// For each of count tensors t (n[t] elements): mom = momentum * mom + decay * w + grad_scale * g; w += mom,
// rounded as scale then three axpy round it.
D2L_DECLARE_KERNEL(multi_sgd_mom_update, float* const* w, float* const* mom, const float* const* g, const int64_t* n,
                   int64_t count, float momentum, float decay, float grad_scale);

using namespace d2l::test;

TEST_CASE("sgd_update") {
  for_contexts_and_sizes([](const cpu::Ctx& c, int64_t n) {
    Vec w = lcg_data(n, 51), g = lcg_data(n, 52);
    std::vector<double> ref(n);
    for (int64_t i = 0; i < n; ++i) ref[i] = double(w[i]) - double(0.03f) * g[i];
    cpu::sgd_update(c, w.data(), g.data(), n, 0.03f);
    CHECK(close(ref, w, 1e-7, 2.4e-7, "sgd"));
  });
}

// ---- the emulated CUDA kernel: bitwise the CPU's (the same float operations in the same order),
// n = 1, 7, 1000, 4099 (grid-stride tails).
namespace {
void check_emulated(kemu::Stream s) {
  for_grid_sizes([&](int64_t n) {
    const auto a = lcg_data(n, 2), b = lcg_data(n, 3);
    Vec got = a, ref = a;
    kemu::sgd_update(s, got.data(), b.data(), n, 0.03f);
    cpu::sgd_update(cpu::serial_ctx(), ref.data(), b.data(), n, 0.03f);
    CHECK(same_bits(ref, got, "sgd_update"));
  });
}
}  // namespace

D2L_EMULATED_CASES("emulated sgd_update is bitwise the CPU's",
                   "emulated sgd_update on 2 device threads", check_emulated)

// ---- multi_sgd_mom_update against the per-tensor step, on one backend: three steps (the momentum
// carries over) of both on the same lists, then every w and mom compared bit for bit.
namespace {

struct SgdCase {
  const char* name;
  float momentum, decay, grad_scale;  // decay = -lr * wd, grad_scale = -lr / batch_size
};
const SgdCase kSgdCases[] = {{"plain", 0.0f, 0.0f, -0.1f / 32},
                             {"momentum", 0.9f, 0.0f, -0.1f / 32},
                             {"momentum and weight decay", 0.9f, -0.1f * 5e-4f, -0.1f / 32},
                             {"weight decay only", 0.0f, -0.05f * 1e-2f, -0.05f / 7}};

// A backend's kernels: scale(x, y, n, alpha), axpy(alpha, x, y, n) and the multi-tensor launcher.
template <class Scale, class Axpy, class Multi>
void check_multi_sgd(const std::vector<int64_t>& sizes, Scale scale, Axpy axpy, Multi multi) {
  for (const SgdCase& k : kSgdCases) {
    CAPTURE(k.name);
    auto w = lists_of(sizes, 10), mom = lists_of(sizes, 100), rw = w, rmom = mom;
    for (int step = 0; step < 3; ++step) {
      const auto g = lists_of(sizes, 1000 + 50 * static_cast<uint32_t>(step));
      for (size_t t = 0; t < sizes.size(); ++t) {  // the per-tensor step: optim::sgd_step's four kernels
        const int64_t n = sizes[t];
        scale(rmom[t].data(), rmom[t].data(), n, k.momentum);
        axpy(k.decay, rw[t].data(), rmom[t].data(), n);
        axpy(k.grad_scale, g[t].data(), rmom[t].data(), n);
        axpy(1.0f, rmom[t].data(), rw[t].data(), n);
      }
      std::vector<const float*> gp;
      for (auto& x : g) gp.push_back(x.data());
      multi(pointers(w).data(), pointers(mom).data(), gp.data(), sizes.data(), static_cast<int64_t>(sizes.size()),
            k.momentum, k.decay, k.grad_scale);
    }
    bool same = true;
    for (size_t t = 0; t < sizes.size(); ++t) {
      CAPTURE(t);
      same = same_bits(rw[t], w[t], "multi_sgd_mom_update w") && same;
      same = same_bits(rmom[t], mom[t], "multi_sgd_mom_update mom") && same;
    }
    CHECK(same);
  }
}

void check_multi_emulated(kemu::Stream s) {
  for_list_sizes([&](const std::vector<int64_t>& sizes) {
    check_multi_sgd(
        sizes, [&](const float* x, float* y, int64_t n, float a) { kemu::scale(s, x, y, n, a); },
        [&](float a, const float* x, float* y, int64_t n) { kemu::axpy(s, a, x, y, n); },
        [&](auto... args) { kemu::multi_sgd_mom_update(s, args...); });
  });
}

}  // namespace

TEST_CASE("multi_sgd_mom_update on the CPU is the per-tensor step, bit for bit") {
  for_list_sizes([&](const std::vector<int64_t>& sizes) {
    for_thread_counts([&](const cpu::Ctx& c) {
      check_multi_sgd(
          sizes, [&](const float* x, float* y, int64_t n, float a) { cpu::scale(c, x, y, n, a); },
          [&](float a, const float* x, float* y, int64_t n) { cpu::axpy(c, a, x, y, n); },
          [&](auto... args) { cpu::multi_sgd_mom_update(c, args...); });
    });
  });
}

D2L_EMULATED_CASES("emulated multi_sgd_mom_update is the per-tensor step, bit for bit",
                   "emulated multi_sgd_mom_update on 2 device threads", check_multi_emulated)

TEST_CASE("multi_sgd_mom_update launches once per table of tensors") {
  for (const auto& sizes : {kListSizes, many_sizes(), std::vector<int64_t>{0, 0}, std::vector<int64_t>{}}) {
    CAPTURE(sizes.size());
    auto w = lists_of(sizes, 1), mom = lists_of(sizes, 2), g = lists_of(sizes, 3);
    const int64_t count = static_cast<int64_t>(sizes.size());
    const int64_t before = launches("multi_sgd_mom_update_kernel");
    kemu::multi_sgd_mom_update(nullptr, pointers(w).data(), pointers(mom).data(), pointers(g).data(), sizes.data(),
                               count, 0.9f, -1e-4f, -0.01f);
    int64_t tables = (count + kemu::kMaxTensorsPerLaunch - 1) / kemu::kMaxTensorsPerLaunch;
    if (count == 2) tables = 0;  // only empty tensors: nothing to launch
    CHECK(launches("multi_sgd_mom_update_kernel") - before == tables);
  }
  CHECK(many_sizes().size() > 2 * kemu::kMaxTensorsPerLaunch);  // three tables
}

// ---- the op: one launch on emu(0) for the whole list, the per-tensor ops' bits on cpu(0) and emu(0).
TEST_CASE("multi_sgd_mom_update_ is scale_ and three add_ per tensor, in one launch; bad lists are ShapeErrors") {
  using d2l::Tensor;
  const float momentum = 0.9f, decay = -0.1f * 1e-3f, grad_scale = -0.1f / 16;
  for (d2l::Device d : {d2l::cpu(0), d2l::emu(0)}) {
    CAPTURE(d.str());
    std::vector<Tensor> w, mom, g, rw, rmom;
    for (size_t t = 0; t < kListSizes.size(); ++t) {
      const int64_t n = kListSizes[t];
      const uint32_t seed = static_cast<uint32_t>(3 * t);
      for (auto* list : {&w, &rw}) list->push_back(Tensor::from_vector(lcg_data(n, seed), {n}, d));
      for (auto* list : {&mom, &rmom}) list->push_back(Tensor::from_vector(lcg_data(n, seed + 1), {n}, d));
      g.push_back(Tensor::from_vector(lcg_data(n, seed + 2), {n}, d));
    }
    const int64_t before = launches("multi_sgd_mom_update_kernel");
    d2l::multi_sgd_mom_update_(w, mom, g, momentum, decay, grad_scale);
    for (size_t t = 0; t < w.size(); ++t) {
      d2l::scale_(rmom[t], momentum);
      d2l::add_(rmom[t], rw[t], decay);
      d2l::add_(rmom[t], g[t], grad_scale);
      d2l::add_(rw[t], rmom[t], 1.0f);
    }
    d2l::waitall();
    CHECK(launches("multi_sgd_mom_update_kernel") - before == (d.kind == d2l::DeviceKind::emu ? 1 : 0));
    for (size_t t = 0; t < w.size(); ++t) {
      CHECK(same_bits(rw[t].to_vector(), w[t].to_vector(), "w"));
      CHECK(same_bits(rmom[t].to_vector(), mom[t].to_vector(), "mom"));
    }
  }
  auto z = [](int64_t n, int dev) { return Tensor::zeros({n}, d2l::cpu(dev)); };
  CHECK_THROWS_AS(d2l::multi_sgd_mom_update_({z(3, 0)}, {z(3, 0)}, {}, 0.9f, 0.0f, -0.1f), d2l::ShapeError);
  CHECK_THROWS_AS(d2l::multi_sgd_mom_update_({z(3, 0)}, {z(3, 0)}, {z(4, 0)}, 0.9f, 0.0f, -0.1f), d2l::ShapeError);
  CHECK_THROWS_AS(d2l::multi_sgd_mom_update_({z(3, 0), z(3, 1)}, {z(3, 0), z(3, 1)}, {z(3, 0), z(3, 1)}, 0.9f, 0.0f, -0.1f),
                  d2l::ShapeError);
  const Tensor a = z(3, 0);
  CHECK_THROWS_AS(d2l::multi_sgd_mom_update_({a}, {a}, {z(3, 0)}, 0.9f, 0.0f, -0.1f), d2l::ShapeError);
}
