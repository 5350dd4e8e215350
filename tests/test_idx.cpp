// IDX reader and Fashion-MNIST loader: tiny generated files (raw and gzip), one test case per kind of
// damage, each checking the one-line message names the file and says what is wrong.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <new>
#include <string>

#include "datasets/fashion_mnist.hpp"
#include "datasets/idx_write.hpp"

// Count the largest single allocation, to prove absurd headers are refused before allocating.
static std::atomic<size_t> g_largest_alloc{0};
void* operator new(std::size_t n) {
  size_t cur = g_largest_alloc.load();
  while (n > cur && !g_largest_alloc.compare_exchange_weak(cur, n)) {
  }
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
// noinline: inlined into std::allocator, GCC 12 would warn that free() meets operator new's pointer.
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

using d2l::DataError;
using d2l::idx_write::bytes;
using d2l::idx_write::TempDir;
using d2l::idx_write::write;
using d2l::idx_write::write_split;

// The DataError message of f(), checked to be one line holding every fragment.
template <class F>
std::string expect_error(F f, std::initializer_list<std::string> fragments) {
  std::string msg = "(no DataError thrown)";
  try {
    f();
  } catch (const DataError& e) {
    msg = e.what();
  }
  MESSAGE(msg);
  CHECK(msg.find('\n') == std::string::npos);
  for (const std::string& frag : fragments) {
    INFO("expected fragment: ", frag);
    CHECK(msg.find(frag) != std::string::npos);
  }
  return msg;
}

std::vector<uint8_t> zeros(size_t n) { return std::vector<uint8_t>(n, 0); }

}  // namespace

TEST_CASE("a valid small set loads with the right values, scaled to [0, 1]") {
  for (bool gz : {false, true}) {
    CAPTURE(gz);
    TempDir dir;
    write_split(dir.str(), "train", 7, 3, 2, gz);
    write_split(dir.str(), "t10k", 4, 3, 2, gz);
    d2l::Dataset tr = d2l::load_split(dir.str(), true);
    d2l::Dataset te = d2l::load_split(dir.str(), false);
    CHECK(tr.n == 7);
    CHECK(tr.rows == 3);
    CHECK(tr.cols == 2);
    CHECK(te.n == 4);
    REQUIRE(tr.images.size() == 7 * 3 * 2);
    REQUIRE(tr.labels.size() == 7);
    for (size_t i = 0; i < tr.images.size(); ++i) {
      CHECK(tr.images[i] == doctest::Approx(d2l::idx_write::pixel(i) / 255.0).epsilon(1e-6));
      CHECK(tr.images[i] >= 0.0f);
      CHECK(tr.images[i] <= 1.0f);
    }
    for (size_t i = 0; i < tr.labels.size(); ++i) CHECK(tr.labels[i] == d2l::idx_write::label(i));
  }
}

TEST_CASE("bad magic number") {
  TempDir dir;
  write(dir / "x", bytes(0x12345678, {1, 1, 1}, {0}), false);
  expect_error([&] { d2l::read_idx_images(dir / "x"); },
               {dir / "x", "bad magic number 0x12345678", "expected 0x00000803"});
}

TEST_CASE("unsupported data type byte") {
  TempDir dir;
  write(dir / "x", bytes(0x00000D03, {1, 1, 1}, zeros(4)), false);
  expect_error([&] { d2l::read_idx_images(dir / "x"); }, {"data type 0x0d (float32)", "unsigned bytes"});
}

TEST_CASE("wrong number of dimensions (labels file given as images)") {
  TempDir dir;
  write(dir / "x.gz", bytes(0x801, {5}, zeros(5)), true);
  expect_error([&] { d2l::read_idx_images(dir / "x.gz"); },
               {dir / "x.gz", "magic 0x00000801 means 1 dimension (a labels file); expected 0x00000803 (an images file of "
                "unsigned bytes) with 3 dimensions"});
}

TEST_CASE("header cut inside the sizes, or an image size of 0") {
  TempDir dir;
  write(dir / "x", {0, 0, 8, 3, 0, 0, 0, 5, 0, 0}, false);
  expect_error([&] { d2l::read_idx_images(dir / "x"); }, {"truncated header: 6 of the 12 bytes of dimension sizes"});
  write(dir / "z", bytes(0x803, {5, 0, 28}, {}), false);
  expect_error([&] { d2l::read_idx_images(dir / "z"); },
               {"header claims 5 images of 0x28; expected every size after the count > 0"});
}

TEST_CASE("empty file, or too short for the magic number") {
  TempDir dir;
  write(dir / "x", {0, 0}, false);
  expect_error([&] { d2l::read_idx_labels(dir / "x"); }, {"truncated: 2 bytes", "expected 0x00000801"});
  write(dir / "e.gz", {}, false);
  expect_error([&] { d2l::read_idx_labels(dir / "e.gz"); }, {dir / "e.gz", ": empty file; expected 0x00000801"});
}

TEST_CASE("truncated images") {
  for (bool gz : {false, true}) {
    CAPTURE(gz);
    TempDir dir;
    const std::string p = dir / (gz ? "train-images-idx3-ubyte.gz" : "train-images-idx3-ubyte");
    write(p, bytes(0x803, {60000, 28, 28}, zeros(1234)), gz);
    expect_error([&] { d2l::read_idx_images(p); },
                 {p + ": truncated: header claims 60000 images of 28x28 (47040000 bytes) but the file holds 1234"});
  }
}

TEST_CASE("truncated labels") {
  TempDir dir;
  write(dir / "l.gz", bytes(0x801, {100}, zeros(99)), true);
  expect_error([&] { d2l::read_idx_labels(dir / "l.gz"); },
               {"truncated: header claims 100 labels (100 bytes) but the file holds 99"});
}

TEST_CASE("trailing bytes after the data") {
  for (bool gz : {false, true}) {
    CAPTURE(gz);
    TempDir dir;
    write(dir / "l", bytes(0x801, {10}, zeros(13)), gz);
    expect_error([&] { d2l::read_idx_labels(dir / "l"); }, {"trailing data: 3 bytes after the data", "10 labels"});
  }
}

TEST_CASE("the allocation counter sees the reader's allocations") {  // control for the next two cases
  TempDir dir;
  write(dir / "big", bytes(0x801, {3u << 20}, zeros(3u << 20)), false);
  g_largest_alloc = 0;
  CHECK(d2l::read_idx_labels(dir / "big").data.size() == (3u << 20));
  CHECK(g_largest_alloc.load() >= (3u << 20));
}

namespace {
// An images file `name` (gzip when gz) of 100 zero bytes after a header claiming `count` images of
// 28x28: reading it must fail with `error`, and allocate nothing near the claim (no block of 1 MiB).
void check_claim_refused(const std::string& name, bool gz, uint32_t count, const std::string& error) {
  TempDir dir;
  write(dir / name, bytes(0x803, {count, 28, 28}, zeros(100)), gz);
  g_largest_alloc = 0;
  expect_error([&] { d2l::read_idx_images(dir / name); }, {error});
  CHECK(g_largest_alloc.load() < (1u << 20));
}
}  // namespace

TEST_CASE("absurd claimed size is refused before allocating") {
  check_claim_refused("x", false, 0xFFFFFFFFu,
                      "header claims 4294967295 images of 28x28 (3367254359280 bytes), over the 2 GiB limit");
}

TEST_CASE("a small .gz claiming far more than it holds is refused without allocating the claim") {
  check_claim_refused("x.gz", true, 1000000,  // claims 784 MB
                      "truncated: header claims 1000000 images of 28x28 (784000000 bytes) but the file holds 100");
}

TEST_CASE("non-gzip content in a .gz file") {
  TempDir dir;
  write(dir / "train-labels-idx1-ubyte.gz", bytes(0x801, {2}, {1, 2}), false);
  expect_error([&] { d2l::read_idx_labels(dir / "train-labels-idx1-ubyte.gz"); },
               {"not a gzip file (starts with bytes 00 00 08 01; expected 1f 8b)"});
}

TEST_CASE("corrupt gzip stream") {
  TempDir dir;
  write(dir / "x.gz", bytes(0x801, {1000}, zeros(1000)), true);
  // Byte 10 starts the deflate data after gzip's 10-byte header; 0xff there is block type 3, which
  // does not exist.
  std::FILE* f = std::fopen((dir / "x.gz").c_str(), "r+b");
  REQUIRE(f);
  std::fseek(f, 10, SEEK_SET);
  for (int i = 0; i < 8; ++i) std::fputc(0xff, f);
  std::fclose(f);
  expect_error([&] { d2l::read_idx_labels(dir / "x.gz"); }, {dir / "x.gz", "corrupt gzip stream (invalid block type)"});
}

TEST_CASE("gzip stream cut short") {
  TempDir dir;
  std::vector<uint8_t> data(5000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = d2l::idx_write::pixel(i * i);
  write(dir / "x.gz", bytes(0x801, {5000}, data), true);
  std::filesystem::resize_file(dir / "x.gz", std::filesystem::file_size(dir / "x.gz") / 2);
  expect_error([&] { d2l::read_idx_labels(dir / "x.gz"); }, {"corrupt gzip stream: it ends early"});
}

TEST_CASE("missing file") {
  TempDir dir;
  expect_error([&] { d2l::read_idx_images(dir / "nope"); }, {dir / "nope", "file not found"});
  write_split(dir.str(), "train", 2, 2, 2, false);  // no t10k files
  expect_error([&] { d2l::load_split(dir.str(), false); },
               {"neither t10k-images-idx3-ubyte nor t10k-images-idx3-ubyte.gz found", "expected the four IDX files"});
}

TEST_CASE("missing directory says which was tried and how to fix it") {
  const std::string fix = "install the Debian package dataset-fashion-mnist, or pass --data-dir / set D2L_DATA_DIR";
  expect_error([&] { d2l::load_split("/nonexistent/d2l", true); },
               {"data directory /nonexistent/d2l (--data-dir) does not exist; " + fix});
  const char* old = std::getenv("D2L_DATA_DIR");
  std::string saved = old ? old : "";
  setenv("D2L_DATA_DIR", "/nonexistent/env", 1);
  CHECK(d2l::resolve_data_dir("/flag").path == "/flag");  // the flag beats the variable
  expect_error([&] { d2l::load_split("", true); }, {"data directory /nonexistent/env (D2L_DATA_DIR) does not exist"});
  unsetenv("D2L_DATA_DIR");
  CHECK(d2l::resolve_data_dir("").path == d2l::kFashionMnistDebianDir);
  if (old) setenv("D2L_DATA_DIR", saved.c_str(), 1);
}

TEST_CASE("image and label counts differ") {
  TempDir dir;
  write_split(dir.str(), "train", 6, 2, 2, true);
  write(dir / "train-labels-idx1-ubyte.gz", bytes(0x801, {5}, zeros(5)), true);
  expect_error([&] { d2l::load_split(dir.str(), true); },
               {"holds 6 images but", "train-labels-idx1-ubyte.gz holds 5 labels; expected one label per image"});
}

TEST_CASE("label out of range") {
  TempDir dir;
  write(dir / "l", bytes(0x801, {4}, {1, 9, 12, 0}), false);
  expect_error([&] { d2l::read_idx_labels(dir / "l", 10); },
               {"label 12 at index 2 is out of range; expected 0..9 for 10 classes"});
  CHECK(d2l::read_idx_labels(dir / "l").data[2] == 12);  // unchecked without num_classes
}

TEST_CASE("text labels follow the book") {
  CHECK(d2l::get_fashion_mnist_labels({0, 9, 5}) == std::vector<std::string>{"t-shirt", "ankle boot", "sandal"});
  CHECK_THROWS_AS(d2l::text_label(10), std::out_of_range);
}

// Skipped (reported as such) without Debian's dataset-fashion-mnist.
TEST_CASE("real Fashion-MNIST from the Debian package" * doctest::skip(!std::filesystem::is_directory(d2l::kFashionMnistDebianDir))) {
  auto t0 = std::chrono::steady_clock::now();
  d2l::Dataset tr = d2l::load_split(d2l::kFashionMnistDebianDir, true);
  double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("loaded the training set in ", sec, " s");
  d2l::Dataset te = d2l::load_split(d2l::kFashionMnistDebianDir, false);
  CHECK(tr.n == 60000);
  CHECK(te.n == 10000);
  for (const d2l::Dataset* d : {&tr, &te}) {
    CHECK(d->rows == 28);
    CHECK(d->cols == 28);
    CHECK(d->images.size() == size_t(d->n) * 28 * 28);
    float lo = 1, hi = 0;
    for (float v : d->images) lo = std::min(lo, v), hi = std::max(hi, v);
    CHECK(lo == 0.0f);
    CHECK(hi == 1.0f);
    std::vector<int64_t> counts(10, 0);
    for (int32_t y : d->labels) ++counts.at(y);
    for (int64_t c : counts) CHECK(c == d->n / 10);  // Fashion-MNIST is balanced
  }
}
