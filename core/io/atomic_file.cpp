#include "core/io/atomic_file.hpp"

#include "core/cancel.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
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

// The target's directory ("." for a bare name) and its file name; FileError for "", "." or "dir/".
struct Place {
  std::string dir, base;
};
Place place_of(const std::string& path) {
  std::filesystem::path target(path);
  std::string base = target.filename().string();
  if (base.empty() || base == "." || base == "..") throw FileError(path + ": cannot write: not a file name");
  return {target.has_parent_path() ? target.parent_path().string() : ".", base};
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  std::string h(buf);
  for (char& c : h)
    if (c == '/') c = '_';
  return h;
}

std::string temp_prefix(const Place& p) { return "." + p.base + ".tmp."; }

std::string next_temp_name(const Place& p) {
  // Unique within the process (counter) and across processes (host, pid); O_EXCL never reuses a name.
  static std::atomic<uint64_t> counter{0};
  return p.dir + "/" + temp_prefix(p) + host_name() + "." + std::to_string(::getpid()) + "." + std::to_string(counter++);
}

// "HOST.PID.N" (or "PID.N", the older names without a host) -> host and pid; false if not of that form.
bool parse_owner(const std::string& rest, std::string& host, long& pid) {
  size_t last = rest.rfind('.');
  if (last == std::string::npos || last + 1 == rest.size()) return false;
  for (size_t i = last + 1; i < rest.size(); ++i)
    if (rest[i] < '0' || rest[i] > '9') return false;
  size_t before = last == 0 ? std::string::npos : rest.rfind('.', last - 1);
  std::string pid_text = rest.substr(before == std::string::npos ? 0 : before + 1, last - (before == std::string::npos ? 0 : before + 1));
  if (pid_text.empty() || pid_text.size() > 9) return false;
  for (char c : pid_text)
    if (c < '0' || c > '9') return false;
  pid = std::stol(pid_text);
  host = before == std::string::npos ? "" : rest.substr(0, before);
  return pid > 0;
}

}  // namespace

std::string temporary_name(const std::string& path) { return next_temp_name(place_of(path)); }

int remove_stale_temporaries(const std::string& path) {
  Place p = place_of(path);
  const std::string prefix = temp_prefix(p), me = host_name();
  int removed = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(p.dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    std::string host;
    long pid = 0;
    if (!parse_owner(name.substr(prefix.size()), host, pid)) continue;
    if (!host.empty() && host != me) continue;  // another machine's writer (a shared file system): not ours to judge
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // its writer still runs
    if (::unlink((p.dir + "/" + name).c_str()) == 0) ++removed;
  }
  return removed;
}

std::string why_not_writable(const std::string& path) {
  if (path.empty()) return "the file name is empty";
  Place p;
  try {
    p = place_of(path);
  } catch (const FileError&) {
    return "not a file name";
  }
  struct stat st {};
  if (::stat(p.dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return "directory '" + p.dir + "' does not exist";
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return "it is a directory";
  remove_stale_temporaries(path);
  std::string probe = next_temp_name(p);
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) return "cannot create a file in '" + p.dir + "': " + std::strerror(errno);
  ::close(fd);
  ::unlink(probe.c_str());
  return "";
}

void write_file_atomic(const std::string& path, const std::vector<std::string_view>& pieces) {
  const Place p = place_of(path);
  const std::string& dir = p.dir;
  // After Ctrl-C the queued work is skipped (core/cancel.hpp), so what would be written may be stale.
  if (work_cancelled()) throw FileError(path + ": not written: the run was interrupted");
  remove_stale_temporaries(path);  // a killed writer's leftovers
  TempFile tmp;
  tmp.name = next_temp_name(p);
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
