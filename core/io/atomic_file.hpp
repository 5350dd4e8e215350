// Whole-file reads and atomic whole-file writes (README.md "The layer", Files: a
// checkpoint is written atomically). A write goes to a temporary file in the target's directory,
// every write() is checked, the file is fsync'ed and renamed over the target, and the directory is
// fsync'ed so the rename itself survives a crash. A failed write leaves the previous file as it was
// and removes the temporary file.
//
// Temporary files are named for their owner: `.NAME.tmp.HOST.PID.N` beside NAME (host name, process
// id, a counter). A process killed mid-write (SIGKILL, power loss) leaves one behind, the target
// itself still the old file; the next writer of the same target on the same host recognises it
// (its process is gone) and removes it, before it writes and when it first checks the place.
#pragma once
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace d2l::io {

// A file that cannot be read or written, or whose contents are malformed: one line, naming the
// path and what is wrong ("ckpt/a.safetensors: cannot write: No space left on device").
struct FileError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Replaces the contents of `path` with the pieces, one after another, or throws FileError and
// leaves `path` untouched.
void write_file_atomic(const std::string& path, const std::vector<std::string_view>& pieces);

// Proves, before any work, that `path` can be written the way write_file_atomic writes it: removes
// stale temporary files of `path`, then creates the temporary file itself in the target's directory
// and removes it again. Returns "" or why not, in a few words ("directory '/no' does not exist",
// "it is a directory", "cannot create a file in '/proc': No such file or directory"). Unlike
// access(), which root passes everywhere, this fails where the write would fail (read-only and
// virtual file systems, full inode tables).
std::string why_not_writable(const std::string& path);

// A fresh temporary name for `path` (`.NAME.tmp.HOST.PID.N` in its directory), for writers that
// produce the file some other way (a PNG drawn by gnuplot); the caller renames or removes it.
std::string temporary_name(const std::string& path);

// Removes the temporary files of `path` whose writer, on this host, no longer runs. Returns how many.
int remove_stale_temporaries(const std::string& path);

// The whole contents of a regular file, or FileError naming the path and the reason.
std::string read_file(const std::string& path);

}  // namespace d2l::io
