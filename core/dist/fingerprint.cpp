#include "core/dist/fingerprint.hpp"

#include <cstdint>
#include <cstring>

#include "core/dist/collectives.hpp"
#include "core/dist/process_group.hpp"

namespace d2l::dist {

namespace {

// "name=value" lines; a newline in a value is kept as "\n" so the lines stay lines.
std::string serialize(const Fingerprint& f) {
  std::string s;
  for (auto& [k, v] : f) {
    s += k + "=";
    for (char c : v) s += c == '\n' ? std::string("\\n") : std::string(1, c);
    s += "\n";
  }
  return s;
}

Fingerprint parse(const std::string& s) {
  Fingerprint f;
  size_t at = 0;
  while (at < s.size()) {
    size_t end = s.find('\n', at), eq = s.find('=', at);
    f.emplace_back(s.substr(at, eq - at), s.substr(eq + 1, end - eq - 1));
    at = end + 1;
  }
  return f;
}

// "" when equal, else the first difference as seen from rank r.
std::string first_difference(const Fingerprint& root, const Fingerprint& other, int r) {
  const std::string R = "rank " + std::to_string(r);
  for (size_t i = 0; i < std::max(root.size(), other.size()); ++i) {
    if (i >= other.size()) return R + " has no '" + root[i].first + "', rank 0 has " + root[i].first + " " + root[i].second;
    if (i >= root.size()) return R + " has " + other[i].first + " " + other[i].second + ", rank 0 has no '" + other[i].first + "'";
    if (root[i].first != other[i].first)
      return R + " has '" + other[i].first + "' where rank 0 has '" + root[i].first + "'";
    if (root[i].second != other[i].second)
      return R + " has " + root[i].first + " " + other[i].second + ", rank 0 has " + root[i].second;
  }
  return "";
}

}  // namespace

std::string shape_text(const Shape& s) { return str(s); }

void check_same_config(const Fingerprint& mine) {
  if (world_size() == 1) return;
  std::vector<std::string> all = gather_strings(serialize(mine));
  Fingerprint root = parse(all[0]);
  for (int r = 1; r < world_size(); ++r) {
    std::string diff = first_difference(root, parse(all[static_cast<size_t>(r)]), r);
    if (!diff.empty()) throw CollectiveError("the ranks' configurations differ: " + diff);
  }
}

void check_same_bits(const std::vector<Tensor>& tensors, const std::string& what) {
  if (world_size() == 1) return;
  uint64_t h = 1469598103934665603ull;  // FNV-1a over every float's bits
  for (auto& t : tensors)
    for (float v : t.to_vector()) {
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      for (int b = 0; b < 4; ++b) h = (h ^ ((bits >> (8 * b)) & 0xff)) * 1099511628211ull;
    }
  std::vector<std::string> all = gather_strings(std::to_string(h));
  for (int r = 1; r < world_size(); ++r)
    if (all[static_cast<size_t>(r)] != all[0])
      throw CollectiveError("rank " + std::to_string(r) + "'s " + what + " differ from rank 0's");
}

}  // namespace d2l::dist
