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
  if (name == "zb-h1") return Schedule::zb_h1;
  throw ConfigError("bad pipeline schedule '" + name + "': expected gpipe, 1f1b or zb-h1");
}

std::string name(Schedule s) { return s == Schedule::gpipe ? "gpipe" : s == Schedule::one_f_one_b ? "1f1b" : "zb-h1"; }

double bubble_fraction(Schedule s, size_t K, size_t M, double t_f, double t_b, double t_w) {
  if (K < 1 || M < 1)
    throw ConfigError("bubble_fraction: " + std::to_string(K) + " stages and " + std::to_string(M) +
                      " micro-batches: expected at least 1 of each");
  const double work = static_cast<double>(M) * (t_f + t_b + t_w);
  const double bubble = static_cast<double>(K - 1) * (s == Schedule::zb_h1 ? t_f + t_b - t_w : t_f + t_b + t_w);
  return bubble / (work + bubble);
}

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

using EndTimes = std::map<std::tuple<int, size_t, size_t>, long>;  // (kind, stage, micro-batch) -> end time

// When stage s's step st can start: the end of the step that makes its input (a forward: the previous
// stage's forward; a backward: the next stage's backward, or on the last stage its own forward); 0 for
// the first stage's forwards and for W's (their input is their own B, run before them on the stage);
// -1 while that producer is not placed yet.
static long input_ready(const EndTimes& end, size_t K, size_t s, const Step& st) {
  if (st.kind == Step::weight || (st.kind == Step::forward && s == 0)) return 0;
  auto it = st.kind == Step::forward ? end.find({Step::forward, s - 1, st.micro_batch})
            : s + 1 < K              ? end.find({Step::backward, s + 1, st.micro_batch})
                                     : end.find({Step::forward, s, st.micro_batch});
  return it == end.end() ? -1 : it->second;
}

// The simulated timeline (schedule.hpp): each stage runs the steps of its list in order, each as
// early as its input (input_ready) and its device allow, the stage that can act earliest first; F and
// W take 1 unit, B `backward_cost`. With `place_w` the lists hold F and B only and the W's are placed
// as zb-h1 places them: a stage whose next F or B must wait for another stage runs a pending W
// instead, and runs one at once when more than K-s-1 are pending (which bounds what W's inputs hold
// in memory). Gives each stage's order as it ran (W's included) and the host's enqueue order: every
// step at its start, each send of an activation or a gradient at the end of the step that made it
// (sends before the steps that start at the same time).
struct Timeline {
  std::vector<std::vector<Step>> stages;
  std::vector<Step> host;
};
static Timeline simulate(const std::vector<std::vector<Step>>& lists, size_t K, long backward_cost, bool place_w) {
  EndTimes end;
  std::vector<size_t> next(K, 0), next_w(K, 0), done_b(K, 0);
  std::vector<long> free_at(K, 0);
  Timeline out;
  out.stages.resize(K);
  // (time, 0 for a send / 1 for a step, stage, micro-batch) -> step
  std::vector<std::pair<std::tuple<long, int, size_t, size_t>, Step>> items;
  for (;;) {
    long best_t = -1;
    size_t best = K;
    bool best_w = false;
    for (size_t s = 0; s < K; ++s) {
      const size_t pending_w = place_w ? done_b[s] - next_w[s] : 0;
      const bool left = next[s] < lists[s].size();
      if (!left && pending_w == 0) continue;
      long t;
      bool w;
      if (!left || pending_w > K - s - 1) {
        t = free_at[s], w = true;
      } else {
        const long r = input_ready(end, K, s, lists[s][next[s]]);
        if (r >= 0 && r <= free_at[s]) t = free_at[s], w = false;
        else if (pending_w > 0) t = free_at[s], w = true;  // fill the wait with a W
        else if (r >= 0) t = r, w = false;
        else continue;  // waiting on a producer not placed yet
      }
      if (best == K || t < best_t) best_t = t, best = s, best_w = w;
    }
    if (best == K) break;
    const size_t s = best;
    const Step st = best_w ? Step{Step::weight, s, next_w[s]++} : lists[s][next[s]++];
    const long stop = best_t + (st.kind == Step::backward ? backward_cost : 1);
    end[{st.kind, s, st.micro_batch}] = stop;
    free_at[s] = stop;
    if (st.kind == Step::backward) ++done_b[s];
    out.stages[s].push_back(st);
    items.push_back({{best_t, 1, s, st.micro_batch}, st});
    if (st.kind == Step::forward && s + 1 < K) items.push_back({{stop, 0, s, st.micro_batch}, {Step::send_activation, s, st.micro_batch}});
    if (st.kind == Step::backward && s > 0) items.push_back({{stop, 0, s, st.micro_batch}, {Step::send_gradient, s, st.micro_batch}});
  }
  for (size_t s = 0; s < K; ++s)
    if (next[s] != lists[s].size() || (place_w && next_w[s] != done_b[s]))
      throw std::logic_error("pipeline: stage orders that wait on each other");
  std::stable_sort(items.begin(), items.end(), [](auto& x, auto& y) { return x.first < y.first; });
  for (auto& it : items) out.host.push_back(it.second);
  return out;
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
  if (schedule == Schedule::one_f_one_b) return out;
  // zb-h1: 1f1b's F and B on every stage, W's placed on the timeline (F, B and W 1 unit each).
  std::vector<std::vector<Step>> fb;
  for (size_t t = 0; t < K; ++t) fb.push_back(stage_order(Schedule::one_f_one_b, K, M, t));
  return simulate(fb, K, 1, true).stages[s];
}

std::vector<Step> enqueue_order(Schedule schedule, size_t K, size_t M) {
  check_sizes(K, M);
  std::vector<std::vector<Step>> lists;
  for (size_t s = 0; s < K; ++s) lists.push_back(stage_order(schedule, K, M, s));
  return simulate(lists, K, schedule == Schedule::zb_h1 ? 1 : 2, false).host;
}

std::vector<Step> forward_order(size_t K, size_t M) {
  check_sizes(K, M);
  std::vector<std::vector<Step>> lists(K);
  for (size_t s = 0; s < K; ++s)
    for (size_t i = 0; i < M; ++i) lists[s].push_back({Step::forward, s, i});
  return simulate(lists, K, 2, false).host;
}

std::string str(const Step& step) {
  std::string fb = step.kind == Step::forward || step.kind == Step::send_activation ? "F"
                   : step.kind == Step::weight                                       ? "W"
                                                                                     : "B";
  std::string core = fb + "(" + std::to_string(step.stage) + "," + std::to_string(step.micro_batch) + ")";
  return step.kind == Step::send_activation || step.kind == Step::send_gradient ? "send " + core : core;
}

}  // namespace d2l::pipeline
