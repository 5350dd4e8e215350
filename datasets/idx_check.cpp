// idx_check [DIR]: loads both splits of an IDX data set (Fashion-MNIST or MNIST) and prints what it
// found, or the one-line reason it cannot, with exit code 1. Without DIR: $D2L_DATA_DIR, then the
// Debian package directory.
#include <chrono>
#include <cstdio>
#include <exception>

#include "datasets/fashion_mnist.hpp"

int main(int argc, char** argv) {
  if (argc > 2) {
    std::fprintf(stderr, "usage: idx_check [DIR]\n");
    return 2;
  }
  try {
    d2l::DataDir where = d2l::resolve_data_dir(argc == 2 ? argv[1] : "");
    std::printf("data directory %s (%s)\n", where.path.c_str(), where.origin.c_str());
    for (bool train : {true, false}) {
      auto t0 = std::chrono::steady_clock::now();
      d2l::Dataset d = d2l::load_split(where.path, train);
      double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (d.n == 0)  // valid IDX files, but nothing to train on or evaluate
        throw d2l::DataError(where.path + ": the " + (train ? "training" : "test") + " split holds no examples");
      int64_t counts[10] = {};
      for (int32_t y : d.labels) ++counts[y];
      std::printf("%s: %lld images of %lldx%lld, loaded in %.3f s; per class:", train ? "train" : "test",
                  (long long)d.n, (long long)d.rows, (long long)d.cols, sec);
      for (int64_t c : counts) std::printf(" %lld", (long long)c);
      std::printf("\n");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "idx_check: %s\n", e.what());
    return 1;
  }
  return 0;
}
