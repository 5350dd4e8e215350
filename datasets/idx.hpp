// IDX reader (the file format of MNIST and Fashion-MNIST), raw or gzip-compressed.
// Layout: magic (4 bytes big-endian: 0x00 0x00, data type, number of dimensions), one 4-byte
// big-endian size per dimension, then the data in row-major order. Only unsigned bytes (type 0x08)
// are read: images are magic 0x00000803 (n, rows, cols), labels 0x00000801 (n).
// Every problem throws DataError with one line: the file, what is wrong, what was expected.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace d2l {

// A data file (or data directory) is missing or malformed.
struct DataError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct IdxArray {
  std::vector<int64_t> dims;   // (n, rows, cols) for images, (n) for labels
  std::vector<uint8_t> data;   // prod(dims) bytes, row-major
};

// Largest data block we agree to allocate: 2 GiB. A header claiming more is corrupt
// (Fashion-MNIST's biggest file holds 47 MB).
inline constexpr int64_t kIdxMaxBytes = int64_t{1} << 31;

// Reads an unsigned-byte IDX file with `ndims` dimensions. A name ending in ".gz" must be gzip;
// other names may be either (zlib detects the gzip magic 1f 8b).
IdxArray read_idx(const std::string& path, int ndims);

// read_idx(path, 3): magic 0x00000803, rows and cols > 0.
IdxArray read_idx_images(const std::string& path);

// read_idx(path, 1): magic 0x00000801. With num_classes > 0, every label must be < num_classes.
IdxArray read_idx_labels(const std::string& path, int num_classes = 0);

}  // namespace d2l
