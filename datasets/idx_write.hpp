// Writes small IDX files, raw or gzip (zlib gzopen/gzwrite): test data for the loader's tests.
#pragma once
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

namespace d2l::idx_write {

// Header (magic, big-endian sizes) followed by data; nothing is checked, so tests can lie.
inline std::vector<uint8_t> bytes(uint32_t magic, const std::vector<uint32_t>& dims,
                                  const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out;
  auto put32 = [&](uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(v >> s));
  };
  put32(magic);
  for (uint32_t d : dims) put32(d);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// gzip-compresses when gzip is true, whatever the name says.
inline void write(const std::string& path, const std::vector<uint8_t>& b, bool gzip) {
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    if (!f || (!b.empty() && gzwrite(f, b.data(), static_cast<unsigned>(b.size())) != static_cast<int>(b.size())))
      throw std::runtime_error("idx_write: cannot write " + path);
    gzclose(f);
    return;
  }
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || (!b.empty() && std::fwrite(b.data(), 1, b.size(), f) != b.size())) throw std::runtime_error("idx_write: cannot write " + path);
  std::fclose(f);
}

// Pixel value of byte i in a generated images file, and the label of example i.
inline uint8_t pixel(int64_t i) { return static_cast<uint8_t>((i * 37 + 11) % 256); }
inline uint8_t label(int64_t i) { return static_cast<uint8_t>((i * 3 + 1) % 10); }

// Writes DIR/PREFIX-images-idx3-ubyte[.gz] and DIR/PREFIX-labels-idx1-ubyte[.gz] (prefix "train"
// or "t10k") holding n images of rows x cols with the values above.
inline void write_split(const std::string& dir, const std::string& prefix, uint32_t n, uint32_t rows, uint32_t cols,
                        bool gzip) {
  std::vector<uint8_t> px(size_t{n} * rows * cols), lb(n);
  for (size_t i = 0; i < px.size(); ++i) px[i] = pixel(static_cast<int64_t>(i));
  for (size_t i = 0; i < lb.size(); ++i) lb[i] = label(static_cast<int64_t>(i));
  const std::string gz = gzip ? ".gz" : "";
  write(dir + "/" + prefix + "-images-idx3-ubyte" + gz, bytes(0x803, {n, rows, cols}, px), gzip);
  write(dir + "/" + prefix + "-labels-idx1-ubyte" + gz, bytes(0x801, {n}, lb), gzip);
}

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            ("d2l_idx_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string str() const { return path_.string(); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace d2l::idx_write
