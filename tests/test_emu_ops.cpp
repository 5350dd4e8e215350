// Emulated CUDA kernels (kernels/cuda/*.cu compiled by g++ against kernels/emu) against their
// kernels/cpu twins: fill/copy/scale, rng, add/axpy/mul, bias_add, sum, softmax_ce,
// argmax/count_correct, on n = 1, 7, 1000, 4099 and odd (N, K) shapes; every backward against
// central finite differences of the emulated forward, and the same gradient x1.05 must fail that.
// An op whose test file runs its emulated kernels itself (tests/test_sigmoid.cpp, test_relu.cpp,
// test_mse.cpp, test_sgd.cpp, as every op's should) has no rows here.
// Tolerances (d2l::test::close: |ref - x| <= atol + rtol |ref|):
//   bitwise     elementwise ops and rng (the same float operations in the same order; g++ does not
//               contract a*b+c into an fma), argmax and count_correct (exact by nature)
//   1e-6/1e-6   reductions accumulated in double and rounded to float once (sum, bias_add backward,
//               softmax_ce): another order of the same double sum moves the float by an ulp at most
//   FD          atol 1e-3, rtol 1e-2 (fd tolerances in test_emu_ops.hpp)
// The conv2d, pool2d and batch_norm tests are in test_emu_ops_nn.cpp; the coverage check runs last.
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

void check_add(kemu::Stream s) {
  for (int64_t n : kSizes) {
    const auto a = lcg_data(n, 2), b = lcg_data(n, 3);
    std::vector<float> got(n), ref(n);
    kemu::add(s, a.data(), b.data(), got.data(), n);
    cpu::add(kSerial, a.data(), b.data(), ref.data(), n);
    CHECK(same_bits(ref, got, "add"));
    kemu::add(s, got.data(), b.data(), got.data(), n);  // in place: y is a
    cpu::add(kSerial, ref.data(), b.data(), ref.data(), n);
    CHECK(same_bits(ref, got, "add in place"));
    kemu::axpy(s, -1.5f, a.data(), got.data(), n);
    cpu::axpy(kSerial, -1.5f, a.data(), ref.data(), n);
    CHECK(same_bits(ref, got, "axpy"));
    kemu::mul(s, a.data(), b.data(), got.data(), n);
    cpu::mul(kSerial, a.data(), b.data(), ref.data(), n);
    CHECK(same_bits(ref, got, "mul"));
  }
}

// (outer, C, inner): dense (inner 1), conv-like, and channels longer than a block (inner > 256).
struct BiasShape {
  int64_t outer, C, inner;
};
const BiasShape kBiasShapes[] = {{1, 1, 1}, {7, 3, 1}, {4, 5, 13}, {2, 3, 1000}, {1000, 7, 1}, {3, 2, 4099}};

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

void check_sum(kemu::Stream s) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{4099}, int64_t{1} << 18}) {
    const auto x = lcg_data(n, 8);
    float got = NAN, ref = NAN, again = NAN;
    kemu::sum(s, x.data(), &got, n);
    cpu::sum(kSerial, x.data(), &ref, n);
    CHECK(close(&ref, &got, 1, 1e-6, 1e-6, "sum"));
    kemu::sum(s, x.data(), &again, n);
    CHECK(std::memcmp(&got, &again, sizeof got) == 0);  // a fixed order: the same bits every run
  }
}

// (N, K): classes fewer than, equal to and more than a warp's 32 lanes.
struct RowsShape {
  int64_t N, K;
};
const RowsShape kRowShapes[] = {{1, 1}, {7, 10}, {1000, 10}, {5, 32}, {3, 33}, {2, 4099}, {4099, 3}};

void check_softmax_ce(kemu::Stream s) {
  for (const RowsShape& r : kRowShapes) {
    auto logits = lcg_data(r.N * r.K, 9);
    for (float& v : logits) v *= 4.0f;
    const auto labels = labels_for(r.N, r.K, 10);
    const auto dloss = lcg_data(r.N, 11);
    std::vector<float> loss(r.N), loss_ref(r.N), dl(r.N * r.K), dl_ref(r.N * r.K);
    kemu::softmax_ce_forward(s, logits.data(), labels.data(), loss.data(), r.N, r.K);
    cpu::softmax_ce_forward(kSerial, logits.data(), labels.data(), loss_ref.data(), r.N, r.K);
    CHECK(close(loss_ref, loss, 1e-6, 1e-6, "softmax_ce_forward"));
    kemu::softmax_ce_backward(s, logits.data(), labels.data(), dloss.data(), dl.data(), r.N, r.K);
    cpu::softmax_ce_backward(kSerial, logits.data(), labels.data(), dloss.data(), dl_ref.data(), r.N, r.K);
    CHECK(close(dl_ref, dl, 1e-6, 1e-6, "softmax_ce_backward"));
  }
}

void check_argmax(kemu::Stream s) {
  for (const RowsShape& r : kRowShapes) {
    auto x = lcg_data(r.N * r.K, 12);
    for (float& v : x) v = std::round(v * 3.0f);  // few distinct values: many ties (the first one wins)
    std::vector<int32_t> idx(r.N, -7), idx_ref(r.N, -7);
    kemu::argmax(s, x.data(), idx.data(), r.N, r.K);
    cpu::argmax(kSerial, x.data(), idx_ref.data(), r.N, r.K);
    CHECK(idx == idx_ref);
    auto labels = labels_for(r.N, r.K, 13);
    for (size_t i = 0; i < labels.size(); i += 2) labels[i] = idx_ref[i];  // about half right
    float correct = NAN, correct_ref = NAN;
    kemu::count_correct(s, x.data(), labels.data(), &correct, r.N, r.K);
    cpu::count_correct(kSerial, x.data(), labels.data(), &correct_ref, r.N, r.K);
    CHECK(correct == correct_ref);
  }
  float none = NAN;
  kemu::count_correct(s, nullptr, nullptr, &none, 0, 10);
  CHECK(none == 0.0f);
}

}  // namespace

TEST_CASE("emulated fill, copy, scale are bitwise the CPU's") { check_fill_copy_scale(nullptr); }
TEST_CASE("emulated normal and uniform are bitwise the CPU's Philox numbers") { check_rng(nullptr); }
TEST_CASE("emulated add, axpy, mul are bitwise the CPU's") { check_add(nullptr); }
TEST_CASE("emulated bias_add matches the CPU") { check_bias_add(nullptr); }
TEST_CASE("emulated sum matches the CPU and is deterministic") { check_sum(nullptr); }
TEST_CASE("emulated softmax_ce matches the CPU") { check_softmax_ce(nullptr); }
TEST_CASE("emulated argmax and count_correct equal the CPU's") { check_argmax(nullptr); }

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

TEST_CASE("emulated softmax_ce_backward matches finite differences") {
  for (const RowsShape& sh : {RowsShape{7, 10}, RowsShape{3, 33}, RowsShape{1, 1}}) {
    auto logits = lcg_data(sh.N * sh.K, 28);
    for (float& v : logits) v *= 3.0f;
    const auto labels = labels_for(sh.N, sh.K, 29);
    const auto r = lcg_data(sh.N, 30);
    std::vector<float> dl(sh.N * sh.K);
    kemu::softmax_ce_backward(nullptr, logits.data(), labels.data(), r.data(), dl.data(), sh.N, sh.K);
    auto loss = [&](const std::vector<double>& xd) {
      const auto xf = to_float(xd);
      std::vector<float> l(sh.N);
      kemu::softmax_ce_forward(nullptr, xf.data(), labels.data(), l.data(), sh.N, sh.K);
      return dot(to_double(l), r);
    };
    // K = 1: the loss is constantly 0, so is the gradient: nothing for a broken one to get wrong
    CHECK(grad_check(logits, dl, loss, {1e-2}, "softmax_ce dlogits", sh.K > 1));
  }
}

// The same comparisons with the blocks spread over two OS threads (run as a separate meson test,
// also under TSan): the results may not depend on which thread ran which block.
TEST_CASE("emulated elementwise and reduction kernels on 2 device threads" * doctest::test_suite("threads")) {
  TwoThreads two;
  check_fill_copy_scale(&two.ctx);
  check_rng(&two.ctx);
  check_add(&two.ctx);
  check_bias_add(&two.ctx);
  check_sum(&two.ctx);
  check_softmax_ce(&two.ctx);
  check_argmax(&two.ctx);
  const auto x = lcg_data(4099, 31);
  float one = NAN, two_threads = NAN;
  kemu::sum(nullptr, x.data(), &one, 4099);
  kemu::sum(&two.ctx, x.data(), &two_threads, 4099);
  CHECK(std::memcmp(&one, &two_threads, sizeof one) == 0);
}
