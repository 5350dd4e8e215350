#include "core/autograd.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>


namespace d2l {

static std::mutex g_hooks_mu;
static std::map<int, GradReadyHook> g_hooks;
static int g_next_hook = 0;

int add_grad_ready_hook(GradReadyHook hook) {
  std::lock_guard<std::mutex> lock(g_hooks_mu);
  g_hooks[g_next_hook] = std::move(hook);
  return g_next_hook++;
}

void remove_grad_ready_hook(int id) {
  std::lock_guard<std::mutex> lock(g_hooks_mu);
  g_hooks.erase(id);
}

std::vector<GradReadyHook> grad_ready_hooks() {
  std::lock_guard<std::mutex> lock(g_hooks_mu);
  std::vector<GradReadyHook> out;
  for (auto& [id, h] : g_hooks) out.push_back(h);
  return out;
}

static thread_local bool g_grad_enabled = true;
static thread_local bool g_training = true;

bool grad_enabled() { return g_grad_enabled; }
NoGrad::NoGrad() : FlagScope(g_grad_enabled, false) {}

bool is_training() { return g_training; }
TrainMode::TrainMode(bool training) : FlagScope(g_training, training) {}

static thread_local bool g_recomputing = false;
bool is_recomputing() { return g_recomputing; }
Recompute::Recompute() : FlagScope(g_recomputing, true) {}

static thread_local DeferWeightGrads* g_defer = nullptr;
DeferWeightGrads::DeferWeightGrads() : prev_(g_defer) { g_defer = this; }
DeferWeightGrads::~DeferWeightGrads() { g_defer = prev_; }
std::vector<DeferWeightGrads::Work> DeferWeightGrads::take() { return std::exchange(work_, {}); }
bool DeferWeightGrads::defers(const TensorImpl* leaf) { return g_defer && g_defer->deferred_.count(leaf); }

// A deferred weight gradient is complete when W adds it: the gradient-ready hooks hear of the leaf
// then (backward() does not call them for it), so DDP's buckets never pack a gradient still to come.
bool defer_weight_grad(const Tensor& w, std::function<Tensor()> make) {
  if (!g_defer || w.impl().grad_fn || !w.impl().requires_grad) return false;
  if (std::find(g_defer->keep_.begin(), g_defer->keep_.end(), w.ptr().get()) != g_defer->keep_.end()) return false;
  g_defer->deferred_.insert(w.ptr().get());
  g_defer->work_.push_back({w.ptr(), std::move(make)});
  return true;
}

void record(const Tensor& out, const char* name, const std::vector<Tensor>& inputs,
            std::function<std::vector<Tensor>(const Tensor&)> backward) {
  if (!g_grad_enabled) return;
  bool any = std::any_of(inputs.begin(), inputs.end(), [](const Tensor& t) { return t.defined() && t.needs_grad(); });
  if (!any) return;
  auto node = std::make_shared<Node>();
  node->name = name;
  for (auto& t : inputs) {
    Edge e;
    if (t.defined()) {
      e.shape = t.shape();
      if (t.impl().grad_fn) e.fn = t.impl().grad_fn;
      else if (t.impl().requires_grad) e.leaf = t.ptr();
    }
    node->inputs.push_back(std::move(e));
  }
  node->backward = std::move(backward);
  node->output = out.ptr();
  out.impl().grad_fn = std::move(node);
}

}  // namespace d2l
