// Fashion-MNIST (and MNIST digits, same file names and format) loaded into host memory.
// Mirrors the book's load_data_fashion_mnist / get_fashion_mnist_labels (d2l.ai, "Image
// Classification Dataset"); the iterators over it are in datasets/data_iter.hpp.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "datasets/idx.hpp"

namespace d2l {

// Where Debian's dataset-fashion-mnist package puts the four .gz files.
inline constexpr const char* kFashionMnistDebianDir = "/usr/share/datasets/fashion-mnist";

struct Dataset {
  int64_t n = 0, rows = 0, cols = 0;
  std::vector<float> images;    // (n, 1, rows, cols), pixel / 255 in [0, 1]
  std::vector<int32_t> labels;  // (n)
};

// The directory to read and where that choice came from ("--data-dir", "D2L_DATA_DIR", or the
// Debian package default), so an error can say which one was tried.
struct DataDir {
  std::string path;
  std::string origin;
};

// Lookup order: dir when not empty (the --data-dir flag) > $D2L_DATA_DIR > kFashionMnistDebianDir.
DataDir resolve_data_dir(const std::string& dir);

// Loads one split from a directory holding train-images-idx3-ubyte[.gz],
// train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz].
// dir "" means resolve_data_dir's order. Labels must be < num_classes (0: not checked).
Dataset load_split(const std::string& dir, bool train, int num_classes = 10);

// Pairs an images file with a labels file; counts must match.
Dataset load_idx_pair(const std::string& images_path, const std::string& labels_path, int num_classes = 10);

// The book's get_fashion_mnist_labels: 0 -> "t-shirt", ..., 9 -> "ankle boot".
std::string text_label(int32_t k);  // k outside 0..9 throws std::out_of_range
std::vector<std::string> get_fashion_mnist_labels(const std::vector<int32_t>& labels);

}  // namespace d2l
