#include "core/io/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "kernels/cpu/float16.hpp"

namespace d2l::io {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian and is copied to and from memory as is");

using json = nlohmann::json;

const char* dtype_name(FileDtype t) {
  switch (t) {
    case FileDtype::f32: return "F32";
    case FileDtype::i32: return "I32";
    case FileDtype::i64: return "I64";
    case FileDtype::bf16: return "BF16";
    case FileDtype::f16: return "F16";
  }
  return "?";
}

size_t dtype_size(FileDtype t) { return t == FileDtype::i64 ? 8 : t == FileDtype::bf16 || t == FileDtype::f16 ? 2 : 4; }

bool is_float(FileDtype t) { return t == FileDtype::f32 || t == FileDtype::bf16 || t == FileDtype::f16; }

FileTensor FileTensor::from_floats(Shape shape, const std::vector<float>& values) {
  if (static_cast<int64_t>(values.size()) != numel(shape))
    throw ShapeError("FileTensor: " + std::to_string(values.size()) + " values do not fill shape " + str(shape));
  FileTensor t{FileDtype::f32, std::move(shape), std::vector<unsigned char>(values.size() * 4)};
  if (!values.empty()) std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

FileTensor FileTensor::from_ints(FileDtype dtype, Shape shape, const std::vector<int64_t>& values) {
  if (is_float(dtype)) throw ShapeError("FileTensor::from_ints: dtype must be I32 or I64");
  if (static_cast<int64_t>(values.size()) != numel(shape))
    throw ShapeError("FileTensor: " + std::to_string(values.size()) + " values do not fill shape " + str(shape));
  FileTensor t{dtype, std::move(shape), std::vector<unsigned char>(values.size() * dtype_size(dtype))};
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == FileDtype::i64) std::memcpy(t.bytes.data() + 8 * i, &values[i], 8);
    else {
      auto v = static_cast<int32_t>(values[i]);
      std::memcpy(t.bytes.data() + 4 * i, &v, 4);
    }
  }
  return t;
}

FileTensor FileTensor::from_bits16(FileDtype dtype, Shape shape, const std::vector<uint16_t>& bits) {
  if (dtype != FileDtype::bf16 && dtype != FileDtype::f16) throw ShapeError("FileTensor::from_bits16: dtype must be BF16 or F16");
  if (static_cast<int64_t>(bits.size()) != numel(shape))
    throw ShapeError("FileTensor: " + std::to_string(bits.size()) + " values do not fill shape " + str(shape));
  FileTensor t{dtype, std::move(shape), std::vector<unsigned char>(bits.size() * 2)};
  if (!bits.empty()) std::memcpy(t.bytes.data(), bits.data(), t.bytes.size());
  return t;
}

std::vector<uint16_t> FileTensor::bits16() const {
  if (dtype != FileDtype::bf16 && dtype != FileDtype::f16)
    throw FileError(std::string("tensor has dtype ") + dtype_name(dtype) + ", expected BF16 or F16");
  std::vector<uint16_t> v(bytes.size() / 2);
  if (!v.empty()) std::memcpy(v.data(), bytes.data(), v.size() * 2);
  return v;
}

std::vector<float> FileTensor::floats() const {
  if (dtype == FileDtype::bf16 || dtype == FileDtype::f16) {
    const auto f = dtype == FileDtype::bf16 ? kernels::cpu::Float16::bf16 : kernels::cpu::Float16::f16;
    std::vector<float> v;
    for (uint16_t h : bits16()) v.push_back(kernels::cpu::widen(f, h));
    return v;
  }
  if (dtype != FileDtype::f32)
    throw FileError(std::string("tensor has dtype ") + dtype_name(dtype) + ", expected F32, BF16 or F16");
  std::vector<float> v(bytes.size() / 4);
  if (!v.empty()) std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

std::vector<int64_t> FileTensor::ints() const {
  if (is_float(dtype)) throw FileError(std::string("tensor has dtype ") + dtype_name(dtype) + ", expected I32 or I64");
  size_t size = dtype_size(dtype);
  std::vector<int64_t> v(bytes.size() / size);
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == FileDtype::i64) std::memcpy(&v[i], bytes.data() + 8 * i, 8);
    else {
      int32_t x;
      std::memcpy(&x, bytes.data() + 4 * i, 4);
      v[i] = x;
    }
  }
  return v;
}

namespace {

[[noreturn]] void fail(const std::string& source, const std::string& what) { throw FileError(source + ": " + what); }

// A name for an error message: quoted, with control and non-ASCII bytes escaped so it stays one line.
std::string show_name(std::string_view s) {
  std::string out = "'";
  for (unsigned char c : s) {
    if (c < 0x20 || c >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "'";
}

// A name as a JSON string ("0.weight", escapes included); FileError when it is not UTF-8.
std::string json_string(const std::string& s, const std::string& source) {
  try {
    return json(s).dump();
  } catch (const json::exception&) {
    fail(source, "the name " + show_name(s) + " is not valid UTF-8");
  }
}

// The reference writer's order: later dtypes of its enum first (... F16 < BF16 < I32 < U32 < F32 < F64 <
// I64 ...), then by name.
int dtype_rank(FileDtype t) {
  switch (t) {
    case FileDtype::i64: return 0;
    case FileDtype::f32: return 1;
    case FileDtype::i32: return 2;
    case FileDtype::bf16: return 3;
    case FileDtype::f16: return 4;
  }
  return 5;
}

using Entry = std::pair<const std::string, FileTensor>;

std::vector<const Entry*> write_order(const SafetensorsFile& file) {
  std::vector<const Entry*> order;
  for (auto& e : file.tensors) order.push_back(&e);
  std::stable_sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return dtype_rank(a->second.dtype) < dtype_rank(b->second.dtype);  // stable: names stay sorted
  });
  return order;
}

std::string header(const SafetensorsFile& file, const std::string& source) {
  std::string h = "{";
  if (!file.metadata.empty()) {
    h += "\"__metadata__\":{";
    bool first = true;
    for (auto& [k, v] : file.metadata) {
      h += (first ? "" : ",") + json_string(k, source) + ":" + json_string(v, source);
      first = false;
    }
    h += "}";
  }
  uint64_t offset = 0;
  for (const Entry* e : write_order(file)) {
    const auto& [name, t] = *e;
    if (name == "__metadata__") fail(source, "a tensor cannot be named '__metadata__'");
    for (int64_t d : t.shape)
      if (d < 0) fail(source, "tensor " + show_name(name) + " has a negative dimension in shape " + str(t.shape));
    uint64_t n = static_cast<uint64_t>(numel(t.shape)) * dtype_size(t.dtype);
    if (t.bytes.size() != n)
      fail(source, "tensor " + show_name(name) + " holds " + std::to_string(t.bytes.size()) + " bytes but shape " +
                       str(t.shape) + " of " + dtype_name(t.dtype) + " needs " + std::to_string(n));
    h += (h.size() > 1 ? "," : "") + json_string(name, source) + ":{\"dtype\":\"" + dtype_name(t.dtype) +
         "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) h += (i ? "," : "") + std::to_string(t.shape[i]);
    h += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + n) + "]}";
    offset += n;
  }
  h += "}";
  h.append((8 - h.size() % 8) % 8, ' ');  // the data then starts 8-byte aligned
  std::string out(8, '\0');
  uint64_t len = h.size();
  std::memcpy(out.data(), &len, 8);
  return out + h;
}

}  // namespace

std::string safetensors_header(const SafetensorsFile& file) { return header(file, "safetensors"); }

std::string safetensors_bytes(const SafetensorsFile& file) {
  std::string out = header(file, "safetensors");
  for (const Entry* e : write_order(file)) out.append(e->second.bytes.begin(), e->second.bytes.end());
  return out;
}

void save_safetensors(const std::string& path, const SafetensorsFile& file) {
  std::string h = header(file, path);
  std::vector<std::string_view> pieces{h};
  for (const Entry* e : write_order(file))
    pieces.emplace_back(reinterpret_cast<const char*>(e->second.bytes.data()), e->second.bytes.size());
  write_file_atomic(path, pieces);
}

// ---- reader ----

namespace {

constexpr uint64_t kMaxHeader = 100'000'000;  // the reference reader's limit on N

// Control and non-ASCII bytes escaped, long text cut: an error message stays one readable line.
std::string one_line(std::string_view s, size_t max = 80) {
  std::string q = show_name(s.substr(0, max));
  q = q.substr(1, q.size() - 2);
  return s.size() > max ? q + "..." : q;
}

// nlohmann keeps the last of two equal keys without a word; its parse callback sees every key, so
// repeated names (at any depth) are caught here.
json parse_header(std::string_view text, const std::string& source) {
  std::vector<std::set<std::string>> seen;
  std::string repeated;
  json::parser_callback_t cb = [&](int, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) seen.emplace_back();
    else if (ev == json::parse_event_t::object_end) seen.pop_back();
    else if (ev == json::parse_event_t::key && repeated.empty() && !seen.back().insert(parsed.get<std::string>()).second)
      repeated = parsed.get<std::string>();
    return true;
  };
  json h;
  try {
    h = json::parse(text.begin(), text.end(), cb);
  } catch (const json::exception& e) {
    std::string m = e.what();  // "[json.exception.parse_error.101] parse error at line 1, column 2: ..."
    if (m.rfind("[json.exception", 0) == 0 && m.find("] ") != std::string::npos) m = m.substr(m.find("] ") + 2);
    fail(source, "header is not valid JSON: " + one_line(m, 200));
  }
  if (!repeated.empty()) fail(source, "header names " + show_name(repeated) + " twice");
  return h;
}

// A JSON value that must be a whole number >= 0.
uint64_t whole(const json& v, const std::string& what, const std::string& source) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) fail(source, what + " is negative (" + v.dump() + ")");
  if (v.is_number_float()) fail(source, what + " is not a whole number (" + one_line(v.dump()) + ")");
  fail(source, what + " is not a number (" + one_line(v.dump()) + ")");
}

struct Info {
  std::string name;
  FileDtype dtype;
  Shape shape;
  uint64_t begin, end;
};

std::string range(uint64_t b, uint64_t e) { return "[" + std::to_string(b) + ", " + std::to_string(e) + "]"; }

Info parse_entry(const std::string& name, const json& v, uint64_t data_size, const std::string& source) {
  const std::string t = "tensor " + show_name(name);
  if (!v.is_object()) fail(source, t + " is not an object with dtype, shape and data_offsets");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!v.contains(key)) fail(source, t + " has no \"" + key + "\"");
  Info info{name, FileDtype::f32, {}, 0, 0};

  const json& dt = v["dtype"];
  if (!dt.is_string()) fail(source, t + ": dtype is not a string (" + one_line(dt.dump()) + ")");
  std::string d = dt.get<std::string>();
  if (d == "F32") info.dtype = FileDtype::f32;
  else if (d == "I32") info.dtype = FileDtype::i32;
  else if (d == "I64") info.dtype = FileDtype::i64;
  else if (d == "BF16") info.dtype = FileDtype::bf16;
  else if (d == "F16") info.dtype = FileDtype::f16;
  else if (std::set<std::string>{"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "U32", "F64", "U64"}.count(d))
    fail(source, t + " has dtype " + d + ", which this reader does not take (F32, BF16, F16, I32 or I64)");
  else fail(source, t + " has an unknown dtype " + show_name(d));

  const json& sh = v["shape"];
  if (!sh.is_array()) fail(source, t + ": shape is not a list (" + one_line(sh.dump()) + ")");
  uint64_t count = 1;
  bool overflow = false;
  for (size_t i = 0; i < sh.size(); ++i) {
    uint64_t dim = whole(sh[i], t + ": shape " + one_line(sh.dump()) + " entry " + std::to_string(i), source);
    if (dim > static_cast<uint64_t>(INT64_MAX)) overflow = true;
    overflow |= __builtin_mul_overflow(count, dim, &count);
    info.shape.push_back(static_cast<int64_t>(dim));
  }
  uint64_t need = 0;
  overflow |= __builtin_mul_overflow(count, dtype_size(info.dtype), &need);
  if (overflow) fail(source, t + ": shape " + one_line(sh.dump()) + " is too large to be stored");

  const json& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2)
    fail(source, t + ": data_offsets is not a pair [begin, end] (" + one_line(off.dump()) + ")");
  info.begin = whole(off[0], t + ": data_offsets begin", source);
  info.end = whole(off[1], t + ": data_offsets end", source);
  if (info.begin > info.end) fail(source, t + ": data_offsets " + range(info.begin, info.end) + " run backwards");
  if (info.end - info.begin != need)
    fail(source, t + ": data_offsets " + range(info.begin, info.end) + " hold " + std::to_string(info.end - info.begin) +
                     " bytes, but shape " + str(info.shape) + " of " + d + " needs " + std::to_string(need));
  if (info.end > data_size)
    fail(source, t + ": data_offsets " + range(info.begin, info.end) + " go beyond the " + std::to_string(data_size) +
                     " bytes of data");
  return info;
}

}  // namespace

SafetensorsFile parse_safetensors(std::string_view bytes, const std::string& source) {
  if (bytes.size() < 8)
    fail(source, "file is " + std::to_string(bytes.size()) +
                     " bytes, too short for a safetensors file (it starts with an 8-byte header length)");
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  if (n > kMaxHeader)
    fail(source, "header length " + std::to_string(n) + " is absurd (safetensors allows at most " +
                     std::to_string(kMaxHeader) + " bytes)");
  if (n > bytes.size() - 8)
    fail(source, "header length " + std::to_string(n) + " goes beyond the end of the file (8 + " + std::to_string(n) +
                     " > " + std::to_string(bytes.size()) + " bytes)");
  json h = parse_header(bytes.substr(8, n), source);
  if (!h.is_object()) fail(source, std::string("header is a JSON ") + h.type_name() + ", expected an object");
  std::string_view data = bytes.substr(8 + n);

  SafetensorsFile out;
  std::vector<Info> infos;
  for (auto& [name, v] : h.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) fail(source, "__metadata__ is not an object of strings (" + one_line(v.dump()) + ")");
      for (auto& [k, s] : v.items()) {
        if (!s.is_string()) fail(source, "__metadata__ value of " + show_name(k) + " is not a string (" + one_line(s.dump()) + ")");
        out.metadata[k] = s.get<std::string>();
      }
      continue;
    }
    infos.push_back(parse_entry(name, v, data.size(), source));
  }

  // The tensors must tile the data section: sorted by offset, each begins where the previous ended.
  std::sort(infos.begin(), infos.end(), [](const Info& a, const Info& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  uint64_t pos = 0;
  const Info* prev = nullptr;
  for (const Info& i : infos) {
    if (i.begin < pos)
      fail(source, "tensor " + show_name(i.name) + " (bytes " + range(i.begin, i.end) + ") overlaps tensor " +
                       show_name(prev->name) + " (bytes " + range(prev->begin, prev->end) + ")");
    if (i.begin > pos)
      fail(source, std::to_string(i.begin - pos) + " bytes of gap before tensor " + show_name(i.name) + " (it begins at " +
                       std::to_string(i.begin) + ", the data before it ends at " + std::to_string(pos) + ")");
    pos = i.end;
    prev = &i;
  }
  if (pos != data.size())
    fail(source, std::to_string(data.size() - pos) + " trailing bytes after the last tensor (the tensors cover " +
                     std::to_string(pos) + " of " + std::to_string(data.size()) + " data bytes)");

  for (const Info& i : infos) {
    FileTensor& t = out.tensors[i.name];
    t = FileTensor{i.dtype, i.shape, std::vector<unsigned char>(i.end - i.begin)};
    if (!t.bytes.empty()) std::memcpy(t.bytes.data(), data.data() + i.begin, t.bytes.size());
  }
  return out;
}

SafetensorsFile load_safetensors(const std::string& path) { return parse_safetensors(read_file(path), path); }

}  // namespace d2l::io
