#include "core/pipeline/balance.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "core/pipeline/pipeline.hpp"
#include "core/runtime.hpp"

namespace d2l::pipeline {

std::vector<size_t> balance(const std::vector<double>& costs, size_t K) {
  const size_t L = costs.size();
  if (K < 1 || K > L)
    throw ConfigError("balance: " + std::to_string(K) + " stages for " + std::to_string(L) + " layers: expected 1.." +
                      std::to_string(L) + " stages");
  for (size_t j = 0; j < L; ++j)
    if (!std::isfinite(costs[j]) || costs[j] < 0)
      throw ConfigError("balance: layer " + std::to_string(j) + " costs " + std::to_string(costs[j]) +
                        ": expected a finite cost >= 0");
  std::vector<double> prefix(L + 1, 0.0);  // prefix[j] = cost of layers [0, j)
  for (size_t j = 0; j < L; ++j) prefix[j + 1] = prefix[j] + costs[j];
  auto seg = [&](size_t a, size_t b) { return prefix[b] - prefix[a]; };  // layers [a, b)

  // best[k][j]: the smallest possible largest stage cost when layers [j, L) form k stages
  // (infinity where fewer than k layers are left).
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(K + 1, std::vector<double>(L + 1, inf));
  for (size_t j = 0; j < L; ++j) best[1][j] = seg(j, L);
  for (size_t k = 2; k <= K; ++k)
    for (size_t j = 0; j + k <= L; ++j)
      for (size_t m = j + 1; m + (k - 1) <= L; ++m) best[k][j] = std::min(best[k][j], std::max(seg(j, m), best[k - 1][m]));
  const double target = best[K][0];

  // Walk from the left, ending each stage as early as the optimum still allows.
  std::vector<size_t> starts{0};
  for (size_t k = 1; k < K; ++k) {
    size_t from = starts.back(), left = K - k;  // stages still to place after this one
    size_t m = from + 1;
    while (m + left <= L && std::max(seg(from, m), best[left][m]) > target) ++m;
    starts.push_back(m);
  }
  return starts;
}

double largest_stage_cost(const std::vector<double>& costs, const std::vector<size_t>& starts) {
  double worst = 0;
  for (size_t k = 0; k < starts.size(); ++k) {
    size_t end = k + 1 < starts.size() ? starts[k + 1] : costs.size();
    double c = 0;
    for (size_t j = starts[k]; j < end && j < costs.size(); ++j) c += costs[j];
    worst = std::max(worst, c);
  }
  return worst;
}

std::vector<double> measure_layer_costs(nn::Sequential& layers, const Tensor& sample, Device d, int repeats) {
  if (repeats < 1) throw ConfigError("measure_layer_costs: repeats " + std::to_string(repeats) + ": expected >= 1");
  if (layers.size() == 0) throw ConfigError("measure_layer_costs: the Sequential has no layers");
  using Clock = std::chrono::steady_clock;
  std::vector<double> costs;
  Tensor x = sample.detach().to(d);
  for (auto& [name, child] : layers.children()) {
    std::vector<double> times;
    Tensor y;
    for (int r = 0; r <= repeats; ++r) {  // r = 0 warms up (deferred shapes, the allocator's cache)
      Tensor in = x.detach();
      in.requires_grad(true);
      waitall();
      auto t0 = Clock::now();
      y = child->forward(in);
      if (y.needs_grad()) backward_from(y, Tensor::ones(y.shape(), y.device()));
      waitall();
      if (r > 0) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
    costs.push_back(times[times.size() / 2]);
    x = y.detach();
  }
  layers.collect_params().zero_grad();
  waitall();
  return costs;
}

std::vector<std::shared_ptr<nn::Sequential>> partition(const nn::Sequential& layers, const std::vector<size_t>& starts) {
  const size_t L = layers.size();
  auto bad = [&](const std::string& why) {
    std::string list;
    for (size_t k = 0; k < starts.size(); ++k) list += (k ? ", " : "") + std::to_string(starts[k]);
    return ConfigError("partition: stage starts [" + list + "] for " + std::to_string(L) + " layers: " + why);
  };
  if (starts.empty()) throw bad("expected at least one stage");
  if (starts[0] != 0) throw bad("the first stage must start at layer 0");
  for (size_t k = 1; k < starts.size(); ++k)
    if (starts[k] <= starts[k - 1]) throw bad("expected strictly increasing starts (no empty stage)");
  if (starts.back() >= L) throw bad("the last stage would be empty");
  std::vector<std::shared_ptr<nn::Sequential>> parts;
  for (size_t k = 0; k < starts.size(); ++k) {
    auto part = std::make_shared<nn::Sequential>();
    size_t end = k + 1 < starts.size() ? starts[k + 1] : L;
    for (size_t j = starts[k]; j < end; ++j) part->add(layers.children()[j].second);
    parts.push_back(part);
  }
  return parts;
}

}  // namespace d2l::pipeline
