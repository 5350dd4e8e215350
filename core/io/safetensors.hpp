// The safetensors file format (the format of Hugging Face's `safetensors`, read by PyTorch through
// safetensors.torch.load_file):
//
//   bytes [0, 8)        N, the header length, unsigned 64-bit little-endian
//   bytes [8, 8 + N)    a JSON object, UTF-8:
//                         {"__metadata__": {"key": "value", ...},            (optional, strings only)
//                          "0.weight": {"dtype": "F32", "shape": [4, 3], "data_offsets": [0, 48]}, ...}
//   bytes [8 + N, end)  the tensors' raw bytes, little-endian, C order; data_offsets count from 8 + N
//
// Writer: what the reference writer (safetensors' Rust `serialize`) writes, byte for byte: compact
// JSON, "__metadata__" first, tensors ordered by dtype (the reference's order, I64, F32, I32, BF16,
// F16: larger first) then by name, the data in
// that same order with no gaps, the header padded with spaces to a multiple of 8 bytes so every
// tensor starts 8-byte aligned. The file is written atomically (core/io/atomic_file.hpp).
//
// Reader: F32, BF16, F16, I32 and I64 tensors. It checks everything and throws FileError with one line naming
// the file and the problem: too short, header length absurd (> 100 MB, as the reference) or beyond
// the file, header not UTF-8 JSON or not an object, repeated names, an entry missing or mistyping
// dtype / shape / data_offsets, a dtype it does not read, negative or fractional dimensions, byte
// counts that overflow, data_offsets that do not match shape x dtype size, run backwards or past the
// data, and tensors that overlap, leave a gap, or leave bytes after the last one. As in the
// reference, the tensors must cover the data section exactly: trailing bytes are an error. Unknown
// fields inside an entry are ignored (as the reference does).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/io/atomic_file.hpp"
#include "core/shape.hpp"

namespace d2l::io {

enum class FileDtype { f32, i32, i64, bf16, f16 };
const char* dtype_name(FileDtype t);  // "F32", "I32", "I64", "BF16", "F16": the names in the file
size_t dtype_size(FileDtype t);       // bytes per element
bool is_float(FileDtype t);           // F32, BF16 or F16

// One tensor of a file: its dtype, shape (() for a scalar) and raw little-endian bytes.
struct FileTensor {
  FileDtype dtype = FileDtype::f32;
  Shape shape;
  std::vector<unsigned char> bytes;  // numel(shape) * dtype_size(dtype)

  static FileTensor from_floats(Shape shape, const std::vector<float>& values);
  static FileTensor from_ints(FileDtype dtype, Shape shape, const std::vector<int64_t>& values);  // i32 or i64
  static FileTensor from_bits16(FileDtype dtype, Shape shape, const std::vector<uint16_t>& bits);  // bf16 or f16
  std::vector<float> floats() const;   // F32, or BF16 and F16 widened (exactly); FileError otherwise
  std::vector<uint16_t> bits16() const;  // BF16 or F16: the values' bits (FileError otherwise)
  std::vector<int64_t> ints() const;   // I32 or I64, widened (FileError otherwise)
};

struct SafetensorsFile {
  std::map<std::string, FileTensor> tensors;    // by name
  std::map<std::string, std::string> metadata;  // "__metadata__"; not written when empty
};

// The 8 length bytes and the padded JSON header the writer puts before the data.
std::string safetensors_header(const SafetensorsFile& file);
// The whole file as bytes (header, then the data in header order).
std::string safetensors_bytes(const SafetensorsFile& file);
// Writes the file atomically; FileError when it cannot.
void save_safetensors(const std::string& path, const SafetensorsFile& file);

// Parses and checks a whole file's bytes; `source` (the path) starts every error message.
SafetensorsFile parse_safetensors(std::string_view bytes, const std::string& source);
SafetensorsFile load_safetensors(const std::string& path);

}  // namespace d2l::io
