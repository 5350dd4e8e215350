#include "core/checkpoint/parameters_file.hpp"

#include <cmath>
#include <set>

#include "core/rng.hpp"
#include "core/runtime.hpp"

namespace d2l::io {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Tensors of a file that are not parameters and still belong there: PyTorch BatchNorm's batch
// counter (an I64 scalar) and a checkpoint's trainer state and other devices' replicas.
bool ignored(const std::string& name, const FileTensor& t) {
  bool counter = name == "num_batches_tracked" || ends_with(name, ".num_batches_tracked");
  if (counter && t.dtype == FileDtype::i64 && t.shape.empty()) return true;
  return name.rfind("trainer/", 0) == 0 || name.rfind("replica/", 0) == 0;
}

// "(4, 3)", or "(4, ?)" for a shape still deferred.
std::string shape_text(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + (s[i] > 0 ? std::to_string(s[i]) : "?");
  return out + (s.size() == 1 ? ",)" : ")");
}

// "'a', 'b' and 3 more"
std::string name_list(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < 4; ++i) out += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > 4) out += " and " + std::to_string(names.size() - 4) + " more";
  return out;
}

// Whether a parameter of shape `have` (0 entries unknown; () not known at all) can take `file`:
// the rule of Parameter::infer_shape, checked before anything changes.
bool fits(const Parameter& p, const Shape& file) {
  const Shape& have = p.shape();
  if (p.shape_known()) return have == file;
  if (have.empty()) return true;
  if (have.size() != file.size()) return false;
  for (size_t i = 0; i < have.size(); ++i)
    if (have[i] > 0 && have[i] != file[i]) return false;
  return true;
}

}  // namespace

void check_finite(const FileTensor& t, const std::string& name, const std::string& path) {
  std::vector<float> v = t.floats();
  size_t bad = 0, first = 0;
  for (size_t i = v.size(); i-- > 0;)
    if (!std::isfinite(v[i])) ++bad, first = i;
  if (bad == 0) return;
  throw ParameterError(path + ": tensor '" + name + "' has " + std::to_string(bad) + " of " + std::to_string(v.size()) +
                       " values that are not finite (the first, at index " + std::to_string(first) + ", is " +
                       (std::isnan(v[first]) ? "nan" : v[first] > 0 ? "inf" : "-inf") +
                       "): a diverged or damaged net; refusing to load it");
}

std::map<std::string, FileTensor> parameter_tensors(const nn::ParameterDict& params) {
  std::map<std::string, FileTensor> out;
  for (auto& [name, p] : params) {
    Tensor t = p->list_data().at(0);  // the book's error for a parameter not initialised (or deferred)
    out[name] = FileTensor::from_floats(t.shape(), t.to_vector());
  }
  return out;
}

std::vector<ParameterValues> match_parameters(const nn::ParameterDict& params, const SafetensorsFile& file,
                                              const std::string& path) {
  std::vector<ParameterValues> out;
  std::vector<std::string> missing, unexpected;
  for (auto& [name, p] : params) {
    auto it = file.tensors.find(name);
    if (it == file.tensors.end()) missing.push_back(name);
    else out.push_back({p, &it->second});
  }
  for (auto& [name, t] : file.tensors)
    if (!params.contains(name) && !ignored(name, t)) unexpected.push_back(name);
  if (!missing.empty()) {
    // PyTorch's DataParallel and DistributedDataParallel save their wrapped model under "module.".
    bool prefixed = !unexpected.empty();
    for (auto& name : unexpected) prefixed = prefixed && name.rfind("module.", 0) == 0 && params.contains(name.substr(7));
    if (prefixed)
      throw ParameterError(path + ": its names start with 'module.' (a state_dict of PyTorch's DataParallel or "
                           "DistributedDataParallel): save model.module.state_dict() instead, or strip the prefix "
                           "({k.removeprefix('module.'): v for k, v in sd.items()})");
    throw ParameterError(path + ": " + std::to_string(missing.size()) + " parameter" + (missing.size() > 1 ? "s" : "") +
                         " of the net not in the file: " + name_list(missing));
  }
  if (!unexpected.empty())
    throw ParameterError(path + ": " + std::to_string(unexpected.size()) + " tensor" + (unexpected.size() > 1 ? "s" : "") +
                         " in the file that the net does not have: " + name_list(unexpected));
  for (auto& [p, t] : out) {
    if (!is_float(t->dtype))  // BF16 and F16 are widened into the float32 parameter (exactly)
      throw ParameterError(path + ": tensor '" + p->name() + "' has dtype " + dtype_name(t->dtype) +
                           ", the parameter needs F32, BF16 or F16");
    if (!fits(*p, t->shape))
      throw ParameterError(path + ": tensor '" + p->name() + "' has shape " + str(t->shape) +
                           " but the parameter has shape " + shape_text(p->shape()));
    check_finite(*t, p->name(), path);
  }
  return out;
}

void assign_parameters(const std::vector<ParameterValues>& matched, const std::vector<Device>& devices) {
  if (devices.empty()) throw ParameterError("load_parameters: needs at least one device");
  for (auto& d : devices) runtime(d);  // a backend that is not built fails here, before any change
  RngState rng = rng_state();          // initialising below may draw numbers the file then replaces
  for (auto& [p, t] : matched) {
    if (p->initialized() || p->deferred()) p->reset_ctx(devices);
    else p->initialize(p->default_init(), devices);
    if (!p->shape_known()) p->infer_shape(t->shape);
    p->set_data(Tensor::from_vector(t->floats(), t->shape, devices[0]));
  }
  set_rng_state(rng);
}

void save_parameters(const nn::Block& block, const std::string& path) {
  SafetensorsFile file;
  file.tensors = parameter_tensors(block.collect_params());
  save_safetensors(path, file);
}

void load_parameters(nn::Block& block, const std::string& path, const std::vector<Device>& devices) {
  SafetensorsFile file = load_safetensors(path);
  assign_parameters(match_parameters(block.collect_params(), file, path), devices);
}

}  // namespace d2l::io
