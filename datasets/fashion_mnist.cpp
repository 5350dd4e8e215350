// Fashion-MNIST loader: finds the IDX files, checks images and labels agree, scales to [0, 1].
#include "datasets/fashion_mnist.hpp"

#include <cstdlib>
#include <filesystem>
#include <stdexcept>

namespace d2l {
namespace {

namespace fs = std::filesystem;

const char* const kHowToFix =
    "install the Debian package dataset-fashion-mnist, or pass --data-dir / set D2L_DATA_DIR";

// dir/stem, or dir/stem.gz; the uncompressed file wins when both exist (it reads faster).
std::string find_file(const std::string& dir, const std::string& stem) {
  std::error_code ec;
  for (const std::string& name : {stem, stem + ".gz"}) {
    fs::path p = fs::path(dir) / name;
    if (fs::is_regular_file(p, ec)) return p.string();
  }
  throw DataError(dir + ": neither " + stem + " nor " + stem +
                  ".gz found; expected the four IDX files (train-images-idx3-ubyte, train-labels-idx1-ubyte, "
                  "t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, each optionally .gz)");
}

}  // namespace

DataDir resolve_data_dir(const std::string& dir) {
  if (!dir.empty()) return {dir, "--data-dir"};
  if (const char* env = std::getenv("D2L_DATA_DIR"); env && *env) return {env, "D2L_DATA_DIR"};
  return {kFashionMnistDebianDir, "the default"};
}

Dataset load_idx_pair(const std::string& images_path, const std::string& labels_path, int num_classes) {
  IdxArray im = read_idx_images(images_path);
  IdxArray lb = read_idx_labels(labels_path, num_classes);
  if (im.dims[0] != lb.dims[0])
    throw DataError(images_path + " holds " + std::to_string(im.dims[0]) + " images but " + labels_path +
                    " holds " + std::to_string(lb.dims[0]) + " labels; expected one label per image");
  Dataset d;
  d.n = im.dims[0], d.rows = im.dims[1], d.cols = im.dims[2];
  d.images.resize(im.data.size());
  for (size_t i = 0; i < im.data.size(); ++i) d.images[i] = static_cast<float>(im.data[i]) / 255.0f;
  d.labels.assign(lb.data.begin(), lb.data.end());
  return d;
}

Dataset load_split(const std::string& dir, bool train, int num_classes) {
  DataDir where = resolve_data_dir(dir);
  std::error_code ec;
  if (!fs::is_directory(where.path, ec)) {
    const char* what = fs::exists(where.path, ec) ? "is not a directory" : "does not exist";
    throw DataError("data directory " + where.path + " (" + where.origin + ") " + what + "; " + kHowToFix);
  }
  const std::string prefix = train ? "train" : "t10k";
  std::string images = find_file(where.path, prefix + "-images-idx3-ubyte");
  std::string labels = find_file(where.path, prefix + "-labels-idx1-ubyte");
  return load_idx_pair(images, labels, num_classes);
}

std::string text_label(int32_t k) {
  static const char* const names[10] = {"t-shirt", "trouser", "pullover", "dress", "coat",
                                        "sandal",  "shirt",   "sneaker",  "bag",   "ankle boot"};
  if (k < 0 || k > 9)
    throw std::out_of_range("text_label: label " + std::to_string(k) + " out of range; expected 0..9");
  return names[k];
}

std::vector<std::string> get_fashion_mnist_labels(const std::vector<int32_t>& labels) {
  std::vector<std::string> out;
  out.reserve(labels.size());
  for (int32_t k : labels) out.push_back(text_label(k));
  return out;
}

}  // namespace d2l
