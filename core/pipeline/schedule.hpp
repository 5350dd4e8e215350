// Pipeline schedules as the order in which one host thread enqueues work (chapters/model_parallel/README.md;
// checkpoints, pipelines"). Each device runs the tasks of its compute stream in the order they were
// enqueued, so a schedule is nothing but that order; the host never waits.
//
// The work of a training step over K stages and M micro-batches:
//   F(s, i)  stage s's forward of micro-batch i on device s (the last stage also computes the loss)
//   B(s, i)  stage s's backward of micro-batch i (needs B(s+1, i); the last stage's needs F(K-1, i))
//   send     F(s, i)'s activation copied to device s+1, B(s, i)'s input gradient to device s-1
//
// Per stage, the schedules fix the order of its own F and B:
//   gpipe: F0 F1 ... F(M-1), then B0 B1 ... B(M-1): every micro-batch's activations are held at once.
//   1f1b:  w = min(K-s-1, M) warm-up forwards F0 .. F(w-1); then "one forward, one backward":
//          F(w) B0 F(w+1) B1 ...; then the remaining backwards. Between its forward and its backward,
//          stage s has at most K-s micro-batches in flight, whatever M is (see pipeline.hpp on memory).
//   zb-h1: zero-bubble H1 (Qi et al., 2024): each backward split in two, B(s, i) the input gradient
//          (what stage s-1 waits for) and W(s, i) the weight gradients (which nobody waits for).
//          1f1b's order of F and B; stage s lets its W trail its B by L = K-s-1 backwards, so the
//          last L W's fill the end of the step, where 1f1b's stage s idles waiting for gradients:
//          bubble (K-1)(T_F + T_B - T_W) against 1f1b's (K-1)(T_F + T_B + T_W), and at most L more
//          micro-batches' weight-gradient inputs held than 1f1b.
//
// The host order: the host cannot simply enqueue stage 0's list, then stage 1's, ...: B(s, i) needs the
// gradient that B(s+1, i) produces, and a cross-device copy (core/copy.cpp) orders both devices: the
// copy starts once the work enqueued before it on either device is done, and work enqueued after it
// on either device starts after it. So the host enqueues in the order of a simulated timeline:
// every task as early as its stage's order and its inputs allow, a forward taking 1 unit and a
// backward 2 (a backward does about twice a forward's work; zb-h1's B and W 1 each); tasks sorted by simulated start, each
// send placed at the simulated end of the task that produced it. For stages of equal cost the
// devices then run the simulated timeline itself (the copies' ordering costs nothing); unequal
// stages lose a little to it.
// 1f1b, K = 3 stages, M = 4 micro-batches (one column = 1 unit):
//
//   stage 0 |F0|F1|F2|  |  |  |  |B0|B0|F3|B1|B1|  |B2|B2|  |B3|B3|
//   stage 1 |  |F0|F1|  |  |B0|B0|F2|B1|B1|F3|B2|B2|  |B3|B3|  |  |
//   stage 2 |  |  |F0|B0|B0|F1|B1|B1|F2|B2|B2|F3|B3|B3|  |  |  |  |
//
//   host: F(0,0) send F(0,1) F(1,0) send send F(0,2) F(1,1) F(2,0) send send B(2,0) send B(1,0)
//         F(2,1) B(2,1) send B(0,0) F(1,2) ...
// (each stage's backward of a micro-batch may start only after the later stages' backward of it).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace d2l::pipeline {

enum class Schedule { gpipe, one_f_one_b, zb_h1 };  // "gpipe", "1f1b", "zb-h1"
// "gpipe" | "1f1b" | "zb-h1"; anything else is a ConfigError naming the choices.
Schedule parse_schedule(const std::string& name);
std::string name(Schedule s);

// GPipe's bubble: the fraction of a step's forward (or backward) phase each device idles,
// (K-1) / (M+K-1) for K stages of equal cost and M micro-batches. ConfigError for K or M < 1.
double gpipe_bubble(size_t K, size_t M);

// The idle fraction of each stage in one step, K stages of equal cost, M micro-batches, the times of
// a forward, a backward's input gradient (B) and its weight gradients (W):
//   1f1b (and gpipe):  (K-1)(T_F+T_B+T_W) / (M(T_F+T_B+T_W) + (K-1)(T_F+T_B+T_W)) = (K-1)/(M+K-1)
//   zb-h1:             (K-1)(T_F+T_B-T_W) / (M(T_F+T_B+T_W) + (K-1)(T_F+T_B-T_W))
double bubble_fraction(Schedule s, size_t K, size_t M, double t_f, double t_b, double t_w);

// One thing the host enqueues.
struct Step {
  enum Kind { forward, backward, send_activation, send_gradient, weight };  // weight: zb-h1's W
  Kind kind;
  size_t stage;        // the stage that runs it; for sends, the sending stage
  size_t micro_batch;
  bool operator==(const Step&) const = default;
};

// Stage s's own forwards and backwards, in the order its device runs them.
std::vector<Step> stage_order(Schedule schedule, size_t K, size_t M, size_t stage);
// The host's enqueue order for a training step (forwards, backwards and sends), as described above.
std::vector<Step> enqueue_order(Schedule schedule, size_t K, size_t M);
// The same for a forward pass only (forwards and activation sends): micro-batch i runs on stage s
// while micro-batch i+1 runs on stage s-1.
std::vector<Step> forward_order(size_t K, size_t M);

std::string str(const Step& step);  // "F(1,3)", "B(0,2)", "W(0,2)", "send F(1,3)", "send B(2,0)"

}  // namespace d2l::pipeline
