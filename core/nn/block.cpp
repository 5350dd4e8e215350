#include "core/nn/block.hpp"

#include <algorithm>
#include <set>

namespace d2l::nn {

void ParameterDict::add(std::string name, ParameterPtr p) {
  if (contains(name)) throw ParameterError("collect_params: two parameters named '" + name + "'");
  items_.emplace_back(std::move(name), std::move(p));
}

bool ParameterDict::contains(const std::string& name) const {
  return std::any_of(items_.begin(), items_.end(), [&](const Item& it) { return it.first == name; });
}

Parameter& ParameterDict::operator[](const std::string& name) const {
  for (auto& [n, p] : items_)
    if (n == name) return *p;
  std::string some;
  for (size_t i = 0; i < items_.size() && i < 4; ++i) some += (i ? ", " : "") + items_[i].first;
  if (items_.size() > 4) some += ", ...";
  throw ParameterError("no parameter named '" + name + "' (there are " + std::to_string(items_.size()) +
                       (items_.empty() ? "" : ": " + some) + ")");
}

std::vector<ParameterPtr> ParameterDict::trainable() const {
  std::vector<ParameterPtr> out;
  for (auto& [n, p] : items_)
    if (p->differentiable()) out.push_back(p);
  return out;
}

void ParameterDict::initialize(const Init& init, const std::vector<Device>& devices, bool force_reinit) const {
  // Running statistics and biases keep the defaults their blocks gave them (Gluon: an explicit
  // init applies to weights; zeros/ones stay for bias, gamma, beta and the running statistics).
  for (auto& [n, p] : items_) {
    bool weight = n.size() >= 6 && n.compare(n.size() - 6, 6, "weight") == 0 && p->differentiable() &&
                  p->shape().size() >= 2;
    p->initialize(weight ? init : p->default_init(), devices, force_reinit);
  }
}

void ParameterDict::reset_ctx(const std::vector<Device>& devices) const {
  for (auto& [n, p] : items_) p->reset_ctx(devices);
}

void ParameterDict::zero_grad() const {
  for (auto& [n, p] : items_)
    if (p->differentiable()) p->zero_grad();
}

Tensor Block::forward(const Tensor& x) { return forward_shards({x}).at(0); }

std::vector<Tensor> Block::forward_shards(const std::vector<Tensor>& xs) {
  std::vector<Tensor> out;
  out.reserve(xs.size());
  for (auto& x : xs) out.push_back(forward(x));
  return out;
}

void Block::collect(const std::string& prefix, ParameterDict& out) const {
  for (auto& [n, p] : params_) {
    p->set_name(prefix + n);
    out.add(prefix + n, p);
  }
  for (auto& [n, c] : children_) c->collect(prefix + n + ".", out);
}

ParameterDict Block::collect_params() const {
  ParameterDict out;
  collect("", out);
  return out;
}

void Block::initialize(const Init& init, const std::vector<Device>& devices, bool force_reinit) {
  collect_params().initialize(init, devices, force_reinit);
}

Block& Block::to(Device d) {
  for (auto& [n, p] : collect_params()) {
    if (p->initialized() || p->deferred()) p->reset_ctx({d});
    else p->initialize({d});  // never initialised: made on d with its default initialiser
  }
  return *this;
}

std::string Block::describe() const { return type(); }

std::string Block::repr(int indent) const {
  std::string pad(static_cast<size_t>(indent), ' ');
  if (children_.empty()) return describe();
  std::string s = type() + "(\n";
  for (auto& [n, c] : children_) s += pad + "  (" + n + "): " + c->repr(indent + 2) + "\n";
  return s + pad + ")";
}

ParameterPtr Block::register_parameter(const std::string& name, Shape shape, Init default_init, bool differentiable) {
  for (auto& [n, p] : params_)
    if (n == name) throw ParameterError(type() + ": parameter '" + name + "' registered twice");
  auto p = std::make_shared<Parameter>(name, std::move(shape), default_init, differentiable);
  params_.emplace_back(name, p);
  return p;
}

void Block::add_child(const std::string& name, std::shared_ptr<Block> child) {
  if (!child) throw ParameterError(type() + ": child '" + name + "' is null");
  for (auto& [n, c] : children_)
    if (n == name) throw ParameterError(type() + ": child '" + name + "' registered twice");
  children_.emplace_back(name, std::move(child));
}

}  // namespace d2l::nn
