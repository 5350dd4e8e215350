#include "core/pipeline/schedule.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>

#include "core/device.hpp"

namespace d2l::pipeline {

Schedule parse_schedule(const std::string& name) {
  if (name == "gpipe") return Schedule::gpipe;
  if (name == "1f1b") return Schedule::one_f_one_b;
  throw ConfigError("bad pipeline schedule '" + name + "': expected gpipe or 1f1b");
}

std::string name(Schedule s) { return s == Schedule::gpipe ? "gpipe" : "1f1b"; }

double gpipe_bubble(size_t K, size_t M) {
  if (K < 1 || M < 1)
    throw ConfigError("gpipe_bubble: " + std::to_string(K) + " stages and " + std::to_string(M) +
                      " micro-batches: expected at least 1 of each");
  return static_cast<double>(K - 1) / static_cast<double>(M + K - 1);
}

static void check_sizes(size_t K, size_t M) {
  if (K < 1 || M < 1)
    throw ConfigError("pipeline: " + std::to_string(K) + " stages and " + std::to_string(M) +
                      " micro-batches: expected at least 1 of each");
}

std::vector<Step> stage_order(Schedule schedule, size_t K, size_t M, size_t s) {
  check_sizes(K, M);
  if (s >= K) throw ConfigError("pipeline: stage " + std::to_string(s) + " of " + std::to_string(K));
  std::vector<Step> out;
  auto F = [&](size_t i) { out.push_back({Step::forward, s, i}); };
  auto B = [&](size_t i) { out.push_back({Step::backward, s, i}); };
  if (schedule == Schedule::gpipe) {
    for (size_t i = 0; i < M; ++i) F(i);
    for (size_t i = 0; i < M; ++i) B(i);
    return out;
  }
  size_t warmup = std::min(K - s - 1, M);
  for (size_t i = 0; i < warmup; ++i) F(i);
  for (size_t j = 0; j < M - warmup; ++j) F(warmup + j), B(j);
  for (size_t i = M - warmup; i < M; ++i) B(i);
  return out;
}

// The simulated timeline of schedule.hpp: each stage's list (forward 1 unit, backward 2) run as early
// as its order and its inputs allow, then flattened into one host order.
static std::vector<Step> simulate(const std::vector<std::vector<Step>>& lists, size_t K) {
  using Key = std::tuple<int, size_t, size_t>;  // kind, stage, micro-batch
  std::map<Key, long> end;
  // (time, 0 for a send / 1 for a task, stage, micro-batch) -> step; sends at t go before tasks at t.
  std::vector<std::pair<std::tuple<long, int, size_t, size_t>, Step>> items;
  std::vector<size_t> next(K, 0);
  std::vector<long> free_at(K, 0);
  size_t left = 0;
  for (auto& l : lists) left += l.size();
  while (left > 0) {
    bool progress = false;
    for (size_t s = 0; s < K; ++s) {
      if (next[s] >= lists[s].size()) continue;
      const Step& st = lists[s][next[s]];
      size_t i = st.micro_batch;
      long ready = 0;  // when its input exists; -1 while the producer is not placed yet
      if (st.kind == Step::forward && s > 0) {
        auto it = end.find({Step::forward, s - 1, i});
        ready = it == end.end() ? -1 : it->second;
      } else if (st.kind == Step::backward) {
        auto it = s + 1 < K ? end.find({Step::backward, s + 1, i}) : end.find({Step::forward, s, i});
        ready = it == end.end() ? -1 : it->second;
      }
      if (ready < 0) continue;
      long start = std::max(free_at[s], ready), stop = start + (st.kind == Step::forward ? 1 : 2);
      end[{st.kind, s, i}] = stop;
      free_at[s] = stop;
      items.push_back({{start, 1, s, i}, st});
      if (st.kind == Step::forward && s + 1 < K) items.push_back({{stop, 0, s, i}, {Step::send_activation, s, i}});
      if (st.kind == Step::backward && s > 0) items.push_back({{stop, 0, s, i}, {Step::send_gradient, s, i}});
      ++next[s], --left, progress = true;
    }
    if (!progress) throw std::logic_error("pipeline: stage orders that wait on each other");
  }
  std::stable_sort(items.begin(), items.end(), [](auto& a, auto& b) { return a.first < b.first; });
  std::vector<Step> out;
  for (auto& it : items) out.push_back(it.second);
  return out;
}

std::vector<Step> enqueue_order(Schedule schedule, size_t K, size_t M) {
  check_sizes(K, M);
  std::vector<std::vector<Step>> lists;
  for (size_t s = 0; s < K; ++s) lists.push_back(stage_order(schedule, K, M, s));
  return simulate(lists, K);
}

std::vector<Step> forward_order(size_t K, size_t M) {
  check_sizes(K, M);
  std::vector<std::vector<Step>> lists(K);
  for (size_t s = 0; s < K; ++s)
    for (size_t i = 0; i < M; ++i) lists[s].push_back({Step::forward, s, i});
  return simulate(lists, K);
}

std::string str(const Step& step) {
  std::string fb = step.kind == Step::forward || step.kind == Step::send_activation ? "F" : "B";
  std::string core = fb + "(" + std::to_string(step.stage) + "," + std::to_string(step.micro_batch) + ")";
  return step.kind == Step::send_activation || step.kind == Step::send_gradient ? "send " + core : core;
}

}  // namespace d2l::pipeline
