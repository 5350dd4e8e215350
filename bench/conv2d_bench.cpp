// conv2d_bench: speed of the CPU conv2d members (kernels/cpu/conv2d.cpp: kernel2 im2col, kernel3
// winograd F(4x4, 3x3) and winograd2 F(2x2, 3x3), kernel4 blocked, and automatic, the per-shape choice; forward,
// backward_data, backward_weight) on the book's LeNet shapes at batch 256, on the conv shapes of the
// ResNet-18 small-image variant (1x28x28 input) at batch 32 (batch 256 would take minutes per shape
// here), and on ResNet-50's 3x3 stride-1 convs (224x224 input) at batch 4, with 1 and 2 threads.
// kernel1 (direct loops) is too slow to time here; it is the tests' reference.
// 1. Validates every member on every benchmarked geometry at batch 2 against direct loops in double.
// 2. Times each pass of each member: 1 warm-up, then repeats; min and median wall time, CPU time.
// Napkin math: a pass costs 2*N*OC*K*P flops (K = C*KH*KW, P = OH*OW; the three passes cost the
// same), printed as nominal GFLOP/s (Winograd does fewer multiplications than that: it can pass
// the sgemm ceiling) next to a one-thread sgemm on 1024^3, the ceiling a chunk's GEMM aims at.
//   conv2d_bench [--quick] [--threads T] [--only TEXT]
//     --quick: the LeNet shapes only, 2 repeats (a smoke run); --threads: only T threads (default 1
//     and 2); --only: only the shapes whose name contains TEXT (e.g. R50).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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
    {"R50 c2      64->64  3x3     56x56", {4, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1}, 3, false},
    {"R50 c3     128->128 3x3     28x28", {4, 128, 28, 28, 128, 3, 3, 1, 1, 1, 1}, 4, false},
    {"R50 c4     256->256 3x3     14x14", {4, 256, 14, 14, 256, 3, 3, 1, 1, 1, 1}, 6, false},
    {"R50 c5     512->512 3x3       7x7", {4, 512, 7, 7, 512, 3, 3, 1, 1, 1, 1}, 3, false},
};
bool resnet50(const Case& cs) { return cs.name[1] == '5'; }

using d2l::kernels::cpu::Conv2dKernel;
const Conv2dKernel kMembers[] = {Conv2dKernel::im2col, Conv2dKernel::winograd, Conv2dKernel::winograd2,
                                 Conv2dKernel::blocked, Conv2dKernel::automatic};
const char* name(Conv2dKernel m) {
  switch (m) {
    case Conv2dKernel::direct: return "direct";
    case Conv2dKernel::im2col: return "im2col";
    case Conv2dKernel::winograd: return "winograd";
    case Conv2dKernel::winograd2: return "winograd2";
    case Conv2dKernel::blocked: return "blocked";
    case Conv2dKernel::implicit: return "implicit";
    default: return "auto";
  }
}

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

// The worst |ref - got| as a fraction of the reference's root mean square, at most 2e-4: the bound
// tests/test_conv2d.cpp holds F(4x4, 3x3) to (im2col's errors are ~1e-6 of it).
bool agrees(const char* what, const std::vector<double>& ref, const std::vector<float>& got) {
  double sq = 0, worst = 0;
  size_t at = 0;
  for (double r : ref) sq += r * r;
  const double rms = std::sqrt(sq / double(std::max<size_t>(ref.size(), 1)));
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = std::fabs(ref[i] - got[i]);
    if (!(e <= worst)) worst = e, at = i;  // NaN too
  }
  const bool ok = worst <= 2e-4 * rms;
  if (!ok) std::printf("  %s: worst error %g of rms %g at %zu: %g vs %g\n", what, worst, rms, at, got[at], ref[at]);
  return ok;
}

bool validate(const Case& cs) {
  Conv2dShape s = cs.s;
  s.N = 2;
  const auto x = b::random_data(x_size(s), 1), w = b::random_data(w_size(s), 2), dy = b::random_data(y_size(s), 3);
  const Reference ref = direct(s, x, w, dy);
  bool ok = true;
  for (Conv2dKernel m : kMembers) {
    k::set_conv2d_kernel(m);
    for (int threads : {1, 2}) {
      k::ThreadPool pool(threads - 1);
      const Ctx c{threads, &pool};
      std::vector<float> y(y_size(s)), dx(x_size(s)), dw(w_size(s));
      k::conv2d_forward(c, s, x.data(), w.data(), y.data());
      k::conv2d_backward_data(c, s, dy.data(), w.data(), dx.data());
      k::conv2d_backward_weight(c, s, x.data(), dy.data(), dw.data());
      const bool good = agrees("y", ref.y, y) & agrees("dx", ref.dx, dx) & agrees("dw", ref.dw, dw);
      if (!good) std::printf("  validation FAILED: %s, %s, %d thread(s), batch 2\n", cs.name, name(m), threads);
      ok = ok && good;
    }
  }
  k::set_conv2d_kernel(Conv2dKernel::im2col);
  return ok;
}

// ---- 2. timing
struct Timing {
  b::Stats fwd, data, weight;
  double total_min() const { return fwd.min + data.min + weight.min; }
  double total_median() const { return fwd.median + data.median + weight.median; }
  double cpu_median() const { return fwd.cpu_median + data.cpu_median + weight.cpu_median; }
};

Timing time_case(const Conv2dShape& s, Conv2dKernel m, int threads, int repeats) {
  k::set_conv2d_kernel(m);
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
  bool quick = false;
  int only_threads = 0;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    else if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) only_threads = std::atoi(argv[++i]);
    else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = argv[++i];
    else {
      std::printf("usage: conv2d_bench [--quick] [--threads T] [--only TEXT]\n");
      return 2;
    }
  }
  const auto wanted = [&](const Case& cs) {
    return (!quick || cs.lenet) && (only.empty() || std::string(cs.name).find(only) != std::string::npos);
  };
  const int repeats = quick ? 2 : 5;
  b::banner("conv2d_bench: kernels/cpu/conv2d.cpp, forward + backward_data + backward_weight, per member");

  std::printf("validating every member on every shape at batch 2 against direct loops (1 and 2 threads)...\n");
  for (const Case& cs : kCases)
    if (wanted(cs) && !validate(cs)) return 1;
  std::printf("  ok\n");

  const double peak = sgemm_gflops();
  std::printf("kernel4 blocked runs its %s build\n", k::vector_isa_name(k::conv2d_blocked_isa()));
  std::printf("one-thread sgemm 1024^3: %.1f GFLOP/s (the per-thread ceiling for a conv's GEMMs)\n", peak);
  std::printf("nominal GFLOP/s = 2*N*OC*OH*OW*C*KH*KW / time; auto = the member automatic picks (conv2d_auto_kernel)\n\n");
  std::printf("%-34s %-9s %3s %8s %8s %8s | %9s %9s %8s %6s\n", "shape (LeNet b256, R18 b32, R50 b4)", "member", "thr",
              "fwd", "bwd_data", "bwd_wt", "all min", "cpu med", "GFLOP/s", "x sgemm");
  std::printf("%-34s %-9s %3s %8s %8s %8s | %9s %9s %8s %6s\n", "", "", "", "GFLOP/s", "GFLOP/s", "GFLOP/s", "ms", "ms", "all",
              "peak");

  for (int threads : {1, 2}) {
    if (only_threads && threads != only_threads) continue;
    // per member: seconds and flops of a LeNet, a ResNet-18 and a ResNet-50 step's convs
    struct Sum {
      double s = 0, flops = 0;
    };
    Sum sums[3][std::size(kMembers)];
    for (const Case& cs : kCases) {
      if (!wanted(cs)) continue;
      const double f = flops(cs.s);
      for (size_t mi = 0; mi < std::size(kMembers); ++mi) {
        const Conv2dKernel m = kMembers[mi];
        const Timing t = time_case(cs.s, m, threads, repeats);
        char label[32];
        std::snprintf(label, sizeof label, "%s%s", name(m),
                      m == Conv2dKernel::automatic ? (std::string("=") + name(k::conv2d_auto_kernel(cs.s))).c_str() : "");
        std::printf("%-34s %-9s %3d %8.1f %8.1f %8.1f | %9.2f %9.2f %8.1f %6.2f\n", mi == 0 ? cs.name : "", label, threads,
                    f / t.fwd.min / 1e9, f / t.data.min / 1e9, f / t.weight.min / 1e9, 1e3 * t.total_min(),
                    1e3 * t.cpu_median(), 3 * f / t.total_min() / 1e9, 3 * f / t.total_min() / 1e9 / (threads * peak));
        Sum& sum = sums[cs.lenet ? 0 : resnet50(cs) ? 2 : 1][mi];
        sum.s += cs.count * t.total_min();
        sum.flops += cs.count * 3 * f;
      }
    }
    const char* nets[3] = {"LeNet convs, batch 256", "ResNet-18 convs (20), batch 32", "ResNet-50 3x3 stride-1 convs (16), batch 4"};
    const char* keys[3] = {"lenet", "resnet18", "resnet50_3x3"};
    for (int net = 0; net < 3; ++net) {
      if (sums[net][0].s == 0) continue;
      std::printf("  %d thread(s): %s, ms per step:", threads, nets[net]);
      for (size_t mi = 0; mi < std::size(kMembers); ++mi) std::printf(" %s %.1f", name(kMembers[mi]), 1e3 * sums[net][mi].s);
      std::printf("\n");
      // the default member (im2col) under the keys compare.sh has always read; automatic beside it
      b::result(std::string("conv2d_") + keys[net] + "_gflops_t" + std::to_string(threads), sums[net][0].flops / sums[net][0].s / 1e9);
      const Sum& a = sums[net][std::size(kMembers) - 1];
      b::result(std::string("conv2d_") + keys[net] + "_auto_gflops_t" + std::to_string(threads), a.flops / a.s / 1e9);
    }
    std::printf("\n");
  }
  std::printf("load average at the end: %.2f (a 2-core machine is busy beyond 2)\n", b::load_average());
  return 0;
}
