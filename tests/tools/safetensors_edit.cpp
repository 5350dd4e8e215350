// safetensors_edit IN OUT EDIT...: writes a copy of the safetensors file IN to OUT with the edits
// applied in order, for the bad-input tables (tests/cli/bad_input.sh) that need files which are
// well formed but say something wrong:
//   set NAME I VALUE     value I of the F32 tensor NAME becomes VALUE (nan, inf, -inf or a number)
//   meta KEY VALUE       the __metadata__ entry KEY becomes VALUE
//   copy FROM TO         tensor TO becomes a copy of tensor FROM
//   drop NAME            tensor NAME is removed
//   prefix P             every tensor name gets P in front (PyTorch's DataParallel: "module.")
// Exit 2 with one line on stderr for a bad edit or an unreadable file.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "core/io/safetensors.hpp"

using namespace d2l::io;

namespace {

float number(const std::string& s) {
  if (s == "nan") return NAN;
  if (s == "inf") return INFINITY;
  if (s == "-inf") return -INFINITY;
  size_t used = 0;
  float v = std::stof(s, &used);
  if (used != s.size()) throw std::invalid_argument("not a number: " + s);
  return v;
}

FileTensor& tensor(SafetensorsFile& f, const std::string& name) {
  auto it = f.tensors.find(name);
  if (it == f.tensors.end()) throw std::invalid_argument("no tensor '" + name + "'");
  return it->second;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> a(argv + 1, argv + argc);
  try {
    if (a.size() < 2) throw std::invalid_argument("usage: safetensors_edit IN OUT [set NAME I VALUE | meta KEY VALUE | copy FROM TO | drop NAME | prefix P]...");
    SafetensorsFile f = load_safetensors(a[0]);
    size_t i = 2;
    auto arg = [&](size_t k) -> const std::string& {
      if (i + k >= a.size()) throw std::invalid_argument("'" + a[i] + "' needs more arguments");
      return a[i + k];
    };
    while (i < a.size()) {
      const std::string& op = a[i];
      if (op == "set") {
        FileTensor& t = tensor(f, arg(1));
        std::vector<float> v = t.floats();
        v.at(std::stoul(arg(2))) = number(arg(3));
        t = FileTensor::from_floats(t.shape, v);
        i += 4;
      } else if (op == "meta") {
        f.metadata[arg(1)] = arg(2);
        i += 3;
      } else if (op == "copy") {
        FileTensor t = tensor(f, arg(1));
        f.tensors[arg(2)] = t;
        i += 3;
      } else if (op == "drop") {
        tensor(f, arg(1));
        f.tensors.erase(arg(1));
        i += 2;
      } else if (op == "prefix") {
        std::map<std::string, FileTensor> renamed;
        for (auto& [name, t] : f.tensors) renamed[arg(1) + name] = t;
        f.tensors = renamed;
        i += 2;
      } else {
        throw std::invalid_argument("unknown edit '" + op + "'");
      }
    }
    save_safetensors(a[1], f);
  } catch (const std::exception& e) {
    std::cerr << "safetensors_edit: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
