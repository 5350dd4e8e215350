// conv2d_bench: speed of the CPU conv2d kernels (kernels/cpu/conv2d.cpp: forward, backward_data,
// backward_weight) on the book's LeNet shapes at batch 256 and on the conv shapes of the ResNet-18
// small-image variant (1x28x28 input) at batch 32 (batch 256 would take minutes per shape here),
// with 1 and 2 threads.
// 1. Validates every benchmarked geometry at batch 2 against direct loops in double.
// 2. Times each pass: 1 warm-up, then repeats; min and median wall time, and CPU time.
// Napkin math: a pass costs 2*N*OC*K*P flops (K = C*KH*KW, P = OH*OW; the three passes cost the
// same), printed as GFLOP/s next to a one-thread sgemm on 1024^3, the ceiling a chunk's GEMM aims at.
//   conv2d_bench [--quick]     --quick: the LeNet shapes only, 2 repeats (a smoke run)
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_util.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "kernels/cpu/kernels.hpp"

using d2l::kernels::cpu::Conv2dShape;
using d2l::kernels::cpu::Ctx;
namespace k = d2l::kernels::cpu;
namespace b = d2l::bench;

namespace {

struct Case {
  const char* name;
  Conv2dShape s;  // {N, C, H, W, OC, KH, KW, stride_h, stride_w, pad_h, pad_w}
  int count;      // how many times the network has this conv
  bool lenet;
};

const std::vector<Case> kCases = {
    {"LeNet conv1  1->20  3x3     28x28", {256, 1, 28, 28, 20, 3, 3, 1, 1, 0, 0}, 1, true},
    {"LeNet conv2 20->50  5x5     13x13", {256, 20, 13, 13, 50, 5, 5, 1, 1, 0, 0}, 1, true},
    {"R18 stem     1->64  3x3     28x28", {32, 1, 28, 28, 64, 3, 3, 1, 1, 1, 1}, 1, false},
    {"R18 s1      64->64  3x3     28x28", {32, 64, 28, 28, 64, 3, 3, 1, 1, 1, 1}, 4, false},
    {"R18 s2a     64->128 3x3 /2  28x28", {32, 64, 28, 28, 128, 3, 3, 2, 2, 1, 1}, 1, false},
    {"R18 s2sc    64->128 1x1 /2  28x28", {32, 64, 28, 28, 128, 1, 1, 2, 2, 0, 0}, 1, false},
    {"R18 s2     128->128 3x3     14x14", {32, 128, 14, 14, 128, 3, 3, 1, 1, 1, 1}, 3, false},
    {"R18 s3a    128->256 3x3 /2  14x14", {32, 128, 14, 14, 256, 3, 3, 2, 2, 1, 1}, 1, false},
    {"R18 s3sc   128->256 1x1 /2  14x14", {32, 128, 14, 14, 256, 1, 1, 2, 2, 0, 0}, 1, false},
    {"R18 s3     256->256 3x3       7x7", {32, 256, 7, 7, 256, 3, 3, 1, 1, 1, 1}, 3, false},
    {"R18 s4a    256->512 3x3 /2    7x7", {32, 256, 7, 7, 512, 3, 3, 2, 2, 1, 1}, 1, false},
    {"R18 s4sc   256->512 1x1 /2    7x7", {32, 256, 7, 7, 512, 1, 1, 2, 2, 0, 0}, 1, false},
    {"R18 s4     512->512 3x3       4x4", {32, 512, 4, 4, 512, 3, 3, 1, 1, 1, 1}, 3, false},
};

int64_t x_size(const Conv2dShape& s) { return s.N * s.C * s.H * s.W; }
int64_t w_size(const Conv2dShape& s) { return s.OC * s.C * s.KH * s.KW; }
int64_t y_size(const Conv2dShape& s) { return s.N * s.OC * s.OH() * s.OW(); }
double flops(const Conv2dShape& s) { return 2.0 * double(s.N * s.OC * s.C * s.KH * s.KW * s.OH() * s.OW()); }

// ---- 1. validation: y, dx, dw from one direct loop nest in double
struct Reference {
  std::vector<double> y, dx, dw;
};
Reference direct(const Conv2dShape& s, const std::vector<float>& x, const std::vector<float>& w,
                 const std::vector<float>& dy) {
  Reference r{std::vector<double>(y_size(s)), std::vector<double>(x_size(s)), std::vector<double>(w_size(s))};
  const int64_t OH = s.OH(), OW = s.OW();
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t oc = 0; oc < s.OC; ++oc)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          const int64_t yi = ((n * s.OC + oc) * OH + oh) * OW + ow;
          double acc = 0;
          for (int64_t ci = 0; ci < s.C; ++ci)
            for (int64_t kh = 0; kh < s.KH; ++kh)
              for (int64_t kw = 0; kw < s.KW; ++kw) {
                const int64_t ih = oh * s.stride_h - s.pad_h + kh, iw = ow * s.stride_w - s.pad_w + kw;
                if (ih < 0 || ih >= s.H || iw < 0 || iw >= s.W) continue;
                const int64_t xi = ((n * s.C + ci) * s.H + ih) * s.W + iw, wi = ((oc * s.C + ci) * s.KH + kh) * s.KW + kw;
                acc += double(x[xi]) * w[wi];
                r.dx[xi] += double(dy[yi]) * w[wi];
                r.dw[wi] += double(dy[yi]) * x[xi];
              }
          r.y[yi] = acc;
        }
  return r;
}

// |ref - got| <= atol + rtol*|ref| everywhere; prints the worst element otherwise.
bool agrees(const char* what, const std::vector<double>& ref, const std::vector<float>& got) {
  const double atol = 1e-3, rtol = 1e-3;  // float sums of up to 4608 products of values in [-1, 1)
  size_t worst = 0, bad = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double excess = std::fabs(ref[i] - got[i]) - (atol + rtol * std::fabs(ref[i]));
    if (excess > 0 || !std::isfinite(got[i])) ++bad;
    if (excess > worst_excess) worst_excess = excess, worst = i;
  }
  if (bad) std::printf("  %s: %zu of %zu outside tolerance; worst at %zu: %g vs %g\n", what, bad, ref.size(), worst, got[worst], ref[worst]);
  return bad == 0;
}

bool validate(const Case& cs) {
  Conv2dShape s = cs.s;
  s.N = 2;
  const auto x = b::random_data(x_size(s), 1), w = b::random_data(w_size(s), 2), dy = b::random_data(y_size(s), 3);
  const Reference ref = direct(s, x, w, dy);
  bool ok = true;
  for (int threads : {1, 2}) {
    k::ThreadPool pool(threads - 1);
    const Ctx c{threads, &pool};
    std::vector<float> y(y_size(s)), dx(x_size(s)), dw(w_size(s));
    k::conv2d_forward(c, s, x.data(), w.data(), y.data());
    k::conv2d_backward_data(c, s, dy.data(), w.data(), dx.data());
    k::conv2d_backward_weight(c, s, x.data(), dy.data(), dw.data());
    ok = agrees("y", ref.y, y) && agrees("dx", ref.dx, dx) && agrees("dw", ref.dw, dw) && ok;
  }
  if (!ok) std::printf("  validation FAILED: %s at batch 2\n", cs.name);
  return ok;
}

// ---- 2. timing
struct Timing {
  b::Stats fwd, data, weight;
  double total_min() const { return fwd.min + data.min + weight.min; }
  double total_median() const { return fwd.median + data.median + weight.median; }
  double cpu_median() const { return fwd.cpu_median + data.cpu_median + weight.cpu_median; }
};

Timing time_case(const Conv2dShape& s, int threads, int repeats) {
  k::ThreadPool pool(threads - 1);
  const Ctx c{threads, &pool};
  const auto x = b::random_data(x_size(s), 4), w = b::random_data(w_size(s), 5), dy = b::random_data(y_size(s), 6);
  std::vector<float> y(y_size(s)), dx(x_size(s)), dw(w_size(s));
  Timing t;
  t.fwd = b::time_it([&] { k::conv2d_forward(c, s, x.data(), w.data(), y.data()); }, 1, repeats);
  t.data = b::time_it([&] { k::conv2d_backward_data(c, s, dy.data(), w.data(), dx.data()); }, 1, repeats);
  t.weight = b::time_it([&] { k::conv2d_backward_weight(c, s, x.data(), dy.data(), dw.data()); }, 1, repeats);
  return t;
}

double sgemm_gflops() {  // one thread, 1024^3: what OpenBLAS reaches on a big, square product
  const int64_t n = 1024;
  const auto A = b::random_data(n * n, 7), B = b::random_data(n * n, 8);
  std::vector<float> C(n * n);
  auto st = b::time_it([&] { k::gemm(k::serial_ctx(), false, false, n, n, n, 1.0f, A.data(), B.data(), 0.0f, C.data()); }, 1, 5);
  return 2.0 * double(n * n * n) / st.min / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int repeats = quick ? 2 : 5;
  b::banner("conv2d_bench: kernels/cpu/conv2d.cpp, forward + backward_data + backward_weight");

  std::printf("validating every shape at batch 2 against direct loops (1 and 2 threads)...\n");
  for (const Case& cs : kCases) {
    if (quick && !cs.lenet) continue;
    if (!validate(cs)) return 1;
  }
  std::printf("  ok\n");

  const double peak = sgemm_gflops();
  std::printf("one-thread sgemm 1024^3: %.1f GFLOP/s (the per-thread ceiling for a conv's GEMMs)\n\n", peak);
  std::printf("%-34s %3s %8s %8s %8s | %9s %9s %9s %8s\n", "shape (LeNet batch 256, R18 batch 32)", "thr", "fwd", "bwd_data",
              "bwd_wt", "all min", "all med", "cpu med", "GFLOP/s");
  std::printf("%-34s %3s %8s %8s %8s | %9s %9s %9s %8s\n", "", "", "GFLOP/s", "GFLOP/s", "GFLOP/s", "ms", "ms", "ms", "all");

  for (int threads : {1, 2}) {
    double lenet_s = 0, lenet_flops = 0, r18_s = 0, r18_flops = 0;
    for (const Case& cs : kCases) {
      if (quick && !cs.lenet) continue;
      const Timing t = time_case(cs.s, threads, repeats);
      const double f = flops(cs.s);
      std::printf("%-34s %3d %8.1f %8.1f %8.1f | %9.2f %9.2f %9.2f %8.1f\n", cs.name, threads, f / t.fwd.min / 1e9,
                  f / t.data.min / 1e9, f / t.weight.min / 1e9, 1e3 * t.total_min(), 1e3 * t.total_median(),
                  1e3 * t.cpu_median(), 3 * f / t.total_min() / 1e9);
      (cs.lenet ? lenet_s : r18_s) += cs.count * t.total_min();
      (cs.lenet ? lenet_flops : r18_flops) += cs.count * 3 * f;
    }
    std::printf("  %d thread(s): LeNet convs %.1f ms per batch-256 step (%.1f GFLOP/s, %.0f%% of %d x sgemm peak)\n", threads,
                1e3 * lenet_s, lenet_flops / lenet_s / 1e9, 100 * lenet_flops / lenet_s / 1e9 / (threads * peak), threads);
    b::result("conv2d_lenet_gflops_t" + std::to_string(threads), lenet_flops / lenet_s / 1e9);
    if (!quick) {
      std::printf("  %d thread(s): all 20 ResNet-18 convs %.1f ms per batch-32 step (%.1f GFLOP/s)\n", threads, 1e3 * r18_s,
                  r18_flops / r18_s / 1e9);
      b::result("conv2d_resnet18_gflops_t" + std::to_string(threads), r18_flops / r18_s / 1e9);
    }
    std::printf("\n");
  }
  std::printf("load average at the end: %.2f (a 2-core machine is busy beyond 2)\n", b::load_average());
  return 0;
}
