// Emulated CUDA kernels (kernels/cuda/*.cu compiled by g++ against kernels/emu) against their
// kernels/cpu twins, for the kernels several ops or the runtime share: fill/copy/scale, rng, bias_add,
// on n = 1, 7, 1000, 4099 and odd shapes; every backward against central finite differences of the
// emulated forward, and the same gradient x1.05 must fail that. An op's own kernels are run by its
// test file (tests/test_<op>.cpp: relu, sigmoid, add, mse, sgd, sum, softmax_ce, argmax, pool2d,
// batch_norm), and have no rows here.
// Tolerances (d2l::test::close: |ref - x| <= atol + rtol |ref|):
//   bitwise     elementwise kernels and rng (the same float operations in the same order; g++ does not
//               contract a*b+c into an fma)
//   1e-6/1e-6   reductions accumulated in double and rounded to float once (bias_add backward):
//               another order of the same double sum moves the float by an ulp at most
//   FD          atol 1e-3, rtol 1e-2 (FdTol, tests/emu_check.hpp)
// The conv2d tests are in test_emu_ops_nn.cpp, SyncBatchNorm's pieces in test_emu_ops_sync_bn.cpp; the
// coverage check runs last.
#include "test_emu_ops.hpp"

#include <cstdint>
#include <limits>
#include <vector>

using namespace emu_ops;

namespace {

const int64_t kSizes[] = {1, 7, 1000, 4099};

void check_fill_copy_scale(kemu::Stream s) {
  for (int64_t n : kSizes) {
    const auto x = lcg_data(n, 1);
    std::vector<float> got(n, NAN), ref(n, NAN);
    kemu::fill(s, got.data(), n, 2.5f);
    cpu::fill(kSerial, ref.data(), n, 2.5f);
    CHECK(same_bits(ref, got, "fill"));
    kemu::copy(s, x.data(), got.data(), n);
    CHECK(same_bits(x, got, "copy"));
    kemu::scale(s, x.data(), got.data(), n, -0.3f);
    cpu::scale(kSerial, x.data(), ref.data(), n, -0.3f);
    CHECK(same_bits(ref, got, "scale"));
    kemu::scale(s, got.data(), got.data(), n, 3.0f);  // in place
    cpu::scale(kSerial, ref.data(), ref.data(), n, 3.0f);
    CHECK(same_bits(ref, got, "scale in place"));
  }
  // copy moves int32 labels as bytes: every pattern survives, NaN-looking ones too.
  const std::vector<int32_t> ints = {0, -1, 7, 0x7fc00001, 0x7f800001, std::numeric_limits<int32_t>::min()};
  std::vector<int32_t> out(ints.size(), 0);
  kemu::copy(s, reinterpret_cast<const float*>(ints.data()), reinterpret_cast<float*>(out.data()),
             static_cast<int64_t>(ints.size()));
  CHECK(out == ints);
}

void check_rng(kemu::Stream s) {
  struct Case {
    uint64_t seed, offset;
  };
  // offsets near 2^32: the counter's carry into its second word
  const Case cases[] = {{0, 0}, {42, 0}, {42, 1000}, {0xDEADBEEFCAFEull, 0xFFFFFF00ull}, {7, 1ull << 40}};
  for (int64_t n : kSizes)
    for (const Case& c : cases) {
      std::vector<float> got(n), ref(n);
      kemu::normal(s, got.data(), n, c.seed, c.offset, 0.5f, 2.0f);
      cpu::normal(kSerial, ref.data(), n, c.seed, c.offset, 0.5f, 2.0f);
      CHECK(same_bits(ref, got, "normal"));
      kemu::uniform(s, got.data(), n, c.seed, c.offset, -0.25f, 0.75f);
      cpu::uniform(kSerial, ref.data(), n, c.seed, c.offset, -0.25f, 0.75f);
      CHECK(same_bits(ref, got, "uniform"));
      kemu::uniform(s, got.data(), n, c.seed, c.offset, 1.0f, 1.0000001f);  // a range of one float step
      cpu::uniform(kSerial, ref.data(), n, c.seed, c.offset, 1.0f, 1.0000001f);
      CHECK(same_bits(ref, got, "uniform narrow"));
    }
  // Element i depends on (seed, offset + i) only, not on the launch: a shifted, longer draw agrees.
  std::vector<float> a(4099), b(4099 + 13);
  kemu::normal(s, a.data(), 4099, 9, 13, 0.0f, 1.0f);
  kemu::normal(s, b.data(), 4099 + 13, 9, 0, 0.0f, 1.0f);
  CHECK(same_bits(a, std::vector<float>(b.begin() + 13, b.end()), "normal shifted"));
}

// (outer, C, inner): dense (inner 1), conv-like, and channels longer than a block (inner > 256). The
// backward sums a channel in chunks of 2048 loads under the emulation (kernels/cuda/channel_chunks.cuh:
// float4 loads where inner % 4 == 0): several chunks with scalar loads ({3, 2, 4099}: 7, {5000, 3, 1}:
// 3) and with float4 loads ({3, 2, 4100}: 2, the last one of 2 loads).
struct BiasShape {
  int64_t outer, C, inner;
};
const BiasShape kBiasShapes[] = {{1, 1, 1},    {7, 3, 1},    {4, 5, 13},   {2, 3, 1000},
                                 {1000, 7, 1}, {3, 2, 4099}, {5000, 3, 1}, {3, 2, 4100}};

void check_bias_add(kemu::Stream s) {
  for (const BiasShape& b : kBiasShapes) {
    const int64_t n = b.outer * b.C * b.inner;
    const auto x = lcg_data(n, 5), bias = lcg_data(b.C, 6), dy = lcg_data(n, 7);
    std::vector<float> got(n), ref(n), db(b.C), db_ref(b.C);
    kemu::bias_add_forward(s, x.data(), bias.data(), got.data(), b.outer, b.C, b.inner);
    cpu::bias_add_forward(kSerial, x.data(), bias.data(), ref.data(), b.outer, b.C, b.inner);
    CHECK(same_bits(ref, got, "bias_add_forward"));
    kemu::bias_add_backward(s, dy.data(), db.data(), b.outer, b.C, b.inner);
    cpu::bias_add_backward(kSerial, dy.data(), db_ref.data(), b.outer, b.C, b.inner);
    CHECK(close(db_ref, db, 1e-6, 1e-6, "bias_add_backward"));
  }
}

}  // namespace

TEST_CASE("emulated fill, copy, scale are bitwise the CPU's") { check_fill_copy_scale(nullptr); }
TEST_CASE("emulated normal and uniform are bitwise the CPU's Philox numbers") { check_rng(nullptr); }
TEST_CASE("emulated bias_add matches the CPU") { check_bias_add(nullptr); }

TEST_CASE("n = 0 launches nothing and touches nothing") {
  float v = 1.0f;
  kemu::fill(nullptr, &v, 0, 2.0f);
  kemu::normal(nullptr, &v, 0, 1, 0, 0.0f, 1.0f);
  CHECK(v == 1.0f);
}

// ---- backward passes against central differences of the emulated forward
TEST_CASE("emulated bias_add_backward matches finite differences") {
  for (const BiasShape& b : {BiasShape{7, 3, 1}, BiasShape{4, 5, 13}, BiasShape{2, 3, 300}}) {
    const int64_t n = b.outer * b.C * b.inner;
    const auto x = lcg_data(n, 25), bias = lcg_data(b.C, 26), r = lcg_data(n, 27);
    std::vector<float> db(b.C);
    kemu::bias_add_backward(nullptr, r.data(), db.data(), b.outer, b.C, b.inner);
    auto loss = [&](const std::vector<double>& bd) {
      const auto bf = to_float(bd);
      std::vector<float> y(n);
      kemu::bias_add_forward(nullptr, x.data(), bf.data(), y.data(), b.outer, b.C, b.inner);
      return dot(to_double(y), r);
    };
    CHECK(grad_check(bias, db, loss, {5e-2}, "bias_add db"));  // linear in b: a wide step is exact
  }
}

// The same comparisons with the blocks spread over two OS threads (run as a separate meson test,
// also under TSan): the results may not depend on which thread ran which block.
TEST_CASE("emulated fill, copy, scale, rng, bias_add on 2 device threads" * doctest::test_suite("threads")) {
  TwoThreads two;
  check_fill_copy_scale(&two.ctx);
  check_rng(&two.ctx);
  check_bias_add(&two.ctx);
}
