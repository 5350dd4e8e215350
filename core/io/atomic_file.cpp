#include "core/io/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace d2l::io {

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what, int err) {
  throw FileError(path + ": " + what + ": " + std::strerror(err));
}

// The temporary file until it has been renamed: closed and removed on every way out but success.
struct TempFile {
  std::string name;
  int fd = -1;
  bool renamed = false;
  ~TempFile() {
    if (fd >= 0) ::close(fd);
    if (!renamed) ::unlink(name.c_str());
  }
};

// write() until every byte is out: it may write less than asked (a signal, a pipe, a nearly full
// disk) or be interrupted before writing anything.
void write_all(int fd, std::string_view bytes, const std::string& path) {
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, std::min<size_t>(left, size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(path, "cannot write", errno);
    }
    if (n == 0) fail(path, "cannot write", EIO);  // no progress and no error: treat as an I/O error
    p += n;
    left -= static_cast<size_t>(n);
  }
}

// Makes the rename durable. Some file systems cannot fsync a directory (EINVAL): nothing to do there.
void sync_directory(const std::string& dir, const std::string& path) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail(path, "written, but its directory '" + dir + "' cannot be opened to flush it", errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL) fail(path, "written, but its directory '" + dir + "' cannot be flushed", err);
}

}  // namespace

void write_file_atomic(const std::string& path, const std::vector<std::string_view>& pieces) {
  namespace fs = std::filesystem;
  fs::path target(path);
  std::string base = target.filename().string();
  if (base.empty() || base == "." || base == "..")
    throw FileError(path + ": cannot write: not a file name");
  std::string dir = target.has_parent_path() ? target.parent_path().string() : ".";

  // Unique within the process (counter) and across processes (pid); O_EXCL never reuses a name.
  static std::atomic<uint64_t> counter{0};
  TempFile tmp;
  tmp.name = dir + "/." + base + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  tmp.fd = ::open(tmp.name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);  // 0666 & ~umask
  if (tmp.fd < 0) {
    int err = errno;
    tmp.renamed = true;  // nothing was created: nothing to remove
    fail(path, "cannot create a temporary file in '" + dir + "'", err);
  }
  for (std::string_view piece : pieces) write_all(tmp.fd, piece, path);
  if (::fsync(tmp.fd) != 0) fail(path, "cannot flush to disk", errno);
  int rc = ::close(tmp.fd);
  tmp.fd = -1;
  if (rc != 0) fail(path, "cannot close", errno);
  if (::rename(tmp.name.c_str(), path.c_str()) != 0) fail(path, "cannot replace the file", errno);
  tmp.renamed = true;
  sync_directory(dir, path);
}

std::string read_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open", errno);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(path, "cannot read its size", errno);
  if (S_ISDIR(st.st_mode)) fail(path, "cannot read", EISDIR);
  // Straight into the string, sized as fstat says; a small buffer finds the end (or what a file
  // that grew meanwhile has more).
  std::string out(S_ISREG(st.st_mode) ? static_cast<size_t>(st.st_size) : 0, '\0');
  size_t got = 0;
  char more[1 << 14];
  for (;;) {
    bool inside = got < out.size();
    ssize_t n = inside ? ::read(fd, out.data() + got, out.size() - got) : ::read(fd, more, sizeof more);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(path, "cannot read", errno);
    }
    if (n == 0) break;
    if (!inside) out.append(more, static_cast<size_t>(n));
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  return out;
}

}  // namespace d2l::io
