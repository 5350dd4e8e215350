// Whole-file reads and atomic whole-file writes (DESIGN.md "Layers, checkpoints, pipelines": a
// checkpoint is written atomically). A write goes to a temporary file in the target's directory,
// every write() is checked, the file is fsync'ed and renamed over the target, and the directory is
// fsync'ed so the rename itself survives a crash. A failed write leaves the previous file as it was
// and removes the temporary file. (A process killed mid-write can leave a `.NAME.tmp.PID.N` file
// next to the target; the target itself is still the old one.)
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

// The whole contents of a regular file, or FileError naming the path and the reason.
std::string read_file(const std::string& path);

}  // namespace d2l::io
