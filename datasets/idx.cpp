// IDX reader: raw and gzip files through one zlib reader, every claim in the header checked
// against the bytes actually there before anything large is allocated.
#include "datasets/idx.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace d2l {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw DataError(path + ": " + what);
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08X", v);
  return buf;
}

std::string hex_bytes(const uint8_t* p, int64_t n) {
  std::string s = "bytes";
  char buf[8];
  for (int64_t i = 0; i < n; ++i) std::snprintf(buf, sizeof buf, " %02x", p[i]), s += buf;
  return s;
}

const char* type_name(uint8_t t) {
  switch (t) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "int16";
    case 0x0C: return "int32";
    case 0x0D: return "float32";
    case 0x0E: return "float64";
    default: return "unknown";
  }
}

const char* kind_name(int ndims) {
  return ndims == 3 ? "an images file" : ndims == 1 ? "a labels file" : "this IDX file";
}

// "60000 images of 28x28", "60000 labels", or "dims 2x3x4x5".
std::string describe(const std::vector<int64_t>& d) {
  if (d.size() == 3)
    return std::to_string(d[0]) + " images of " + std::to_string(d[1]) + "x" + std::to_string(d[2]);
  if (d.size() == 1) return std::to_string(d[0]) + " labels";
  std::string s = "dims ";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? "x" : "") + std::to_string(d[i]);
  return s;
}

bool has_gz_name(const std::string& p) { return p.size() >= 3 && p.compare(p.size() - 3, 3, ".gz") == 0; }

// Reads raw and gzip files alike: gzread passes a file without the gzip magic through unchanged.
class Reader {
 public:
  explicit Reader(const std::string& path) : path_(path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    auto st = fs::status(path, ec);
    if (!fs::exists(st)) fail(path, "file not found");
    if (fs::is_directory(st)) fail(path, "is a directory; expected an IDX file");
    file_bytes_ = static_cast<int64_t>(fs::file_size(path, ec));
    if (ec) fail(path, "cannot read its size: " + ec.message());
    f_ = gzopen(path.c_str(), "rb");
    if (!f_) fail(path, std::string("cannot open: ") + std::strerror(errno));
    gzbuffer(f_, 1 << 17);  // 128 KiB instead of 8 KiB: fewer read calls on the 26 MB training file
  }
  ~Reader() { gzclose(f_); }
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  bool gzip() { return gzdirect(f_) == 0; }  // meaningful after the first read
  int64_t file_bytes() const { return file_bytes_; }

  // Reads up to n bytes; fewer only where the data ends. A damaged gzip stream throws.
  int64_t read(uint8_t* buf, int64_t n) {
    int64_t got = 0;
    while (got < n) {
      unsigned chunk = static_cast<unsigned>(std::min<int64_t>(n - got, int64_t{1} << 30));
      int r = gzread(f_, buf + got, chunk);
      check();
      if (r <= 0) break;
      got += r;
    }
    return got;
  }

 private:
  void check() {
    int err = Z_OK;
    const char* msg = gzerror(f_, &err);
    if (err == Z_OK) return;
    if (err == Z_BUF_ERROR)
      fail(path_, "corrupt gzip stream: it ends early (unexpected end of file); expected a complete .gz file");
    if (err == Z_ERRNO) fail(path_, std::string("read error: ") + std::strerror(errno));
    std::string m = msg;  // zlib prefixes its message with the path
    if (m.rfind(path_ + ": ", 0) == 0) m.erase(0, path_.size() + 2);
    fail(path_, "corrupt gzip stream (" + m + "); expected a valid .gz file");
  }

  std::string path_;
  gzFile f_ = nullptr;
  int64_t file_bytes_ = 0;
};

}  // namespace

IdxArray read_idx(const std::string& path, int ndims) {
  Reader in(path);
  const uint32_t want = 0x800u | static_cast<uint32_t>(ndims);
  const std::string expect = "expected " + hex32(want) + " (" + kind_name(ndims) + " of unsigned bytes)";

  if (in.file_bytes() == 0) fail(path, "empty file; " + expect);
  uint8_t head[4] = {0, 0, 0, 0};
  int64_t got = in.read(head, 4);
  const bool gz = in.gzip();
  if (has_gz_name(path) && !gz)
    fail(path, "not a gzip file (starts with " + hex_bytes(head, got) + "; expected 1f 8b) although the name ends in .gz");
  if (got < 4) fail(path, "truncated: " + std::to_string(got) + " bytes, too short for the 4-byte magic number; " + expect);
  const uint32_t magic = uint32_t{head[0]} << 24 | uint32_t{head[1]} << 16 | uint32_t{head[2]} << 8 | head[3];
  if (head[0] != 0 || head[1] != 0) fail(path, "bad magic number " + hex32(magic) + ", not an IDX file; " + expect);
  if (head[2] != 0x08)
    fail(path, "magic " + hex32(magic) + " says data type 0x" + hex_bytes(&head[2], 1).substr(6) + " (" +
                   type_name(head[2]) + "); " + expect);
  if (head[3] != ndims)
    fail(path, "magic " + hex32(magic) + " means " + std::to_string(head[3]) + " dimension" +
                   (head[3] == 1 ? "" : "s") + " (" + kind_name(head[3]) + "); " + expect + " with " +
                   std::to_string(ndims) + " dimension" + (ndims == 1 ? "" : "s"));

  // One 4-byte big-endian size per dimension.
  std::vector<uint8_t> sizes(4 * static_cast<size_t>(ndims));
  got = in.read(sizes.data(), static_cast<int64_t>(sizes.size()));
  if (got < static_cast<int64_t>(sizes.size()))
    fail(path, "truncated header: " + std::to_string(got) + " of the " + std::to_string(sizes.size()) +
                   " bytes of dimension sizes");
  IdxArray out;
  double claimed = 1;  // a double cannot overflow here: at most 3 sizes below 2^32
  for (int i = 0; i < ndims; ++i) {
    const uint8_t* p = &sizes[4 * i];
    int64_t d = int64_t{p[0]} << 24 | int64_t{p[1]} << 16 | int64_t{p[2]} << 8 | p[3];
    out.dims.push_back(d);
    claimed *= static_cast<double>(d);
  }
  for (int i = 1; i < ndims; ++i)
    if (out.dims[i] == 0) fail(path, "header claims " + describe(out.dims) + "; expected every size after the count > 0");
  char cbuf[48];
  std::snprintf(cbuf, sizeof cbuf, "%.0f", claimed);
  const std::string claim = "header claims " + describe(out.dims) + " (" + cbuf + " bytes)";

  // Refuse impossible sizes before allocating anything.
  if (claimed > static_cast<double>(kIdxMaxBytes))
    fail(path, claim + ", over the 2 GiB limit; the header is corrupt");
  const int64_t bytes = static_cast<int64_t>(claimed);
  const int64_t header = 4 + 4 * int64_t{ndims};
  if (!gz) {
    const int64_t avail = in.file_bytes() - header;
    if (bytes > avail) fail(path, "truncated: " + claim + " but the file holds " + std::to_string(avail));
    if (bytes < avail)
      fail(path, "trailing data: " + std::to_string(avail - bytes) + " bytes after the data; " + claim);
  }

  // Allocate no more than the file can hold: exactly the claim for a raw file (checked above); for
  // gzip at most ~1032x the compressed size (deflate's largest expansion), growing only as data
  // actually arrives.
  const double most = gz ? 1032.0 * static_cast<double>(in.file_bytes()) + 1024 : static_cast<double>(bytes);
  out.data.resize(static_cast<size_t>(std::min(static_cast<double>(bytes), most)));
  got = in.read(out.data.data(), static_cast<int64_t>(out.data.size()));
  while (got == static_cast<int64_t>(out.data.size()) && got < bytes) {
    out.data.resize(static_cast<size_t>(std::min(bytes, 2 * got)));
    got += in.read(out.data.data() + got, static_cast<int64_t>(out.data.size()) - got);
  }
  if (got < bytes) fail(path, "truncated: " + claim + " but the file holds " + std::to_string(got));
  int64_t extra = 0;
  uint8_t buf[4096];
  for (int64_t r; (r = in.read(buf, sizeof buf)) > 0;) extra += r;
  if (extra > 0) fail(path, "trailing data: " + std::to_string(extra) + " bytes after the data; " + claim);
  return out;
}

IdxArray read_idx_images(const std::string& path) { return read_idx(path, 3); }

IdxArray read_idx_labels(const std::string& path, int num_classes) {
  IdxArray a = read_idx(path, 1);
  if (num_classes > 0)
    for (size_t i = 0; i < a.data.size(); ++i)
      if (a.data[i] >= num_classes)
        fail(path, "label " + std::to_string(a.data[i]) + " at index " + std::to_string(i) +
                       " is out of range; expected 0.." + std::to_string(num_classes - 1) + " for " +
                       std::to_string(num_classes) + " classes");
  return a;
}

}  // namespace d2l
