// Pipeline parallelism over K stages on K devices (PyTorch's model-parallel tutorial, "Step 4: use pipeline
// technology"; chapters/model_parallel/README.md). A pipeline is streams and events, not threads of its
// own: stage s's work for micro-batch i is enqueued on device s's compute stream, its activation is
// copied on the next device's copy stream after an event, and the host thread only enqueues, in the
// order of the schedule (schedule.hpp), so device s works on micro-batch i+1 while device s+1 works
// on micro-batch i. Nothing here reads a value, so nothing here waits.
//
//   std::vector<pipeline::Stage> stages{{seq1, cpu(0)}, {seq2, cpu(1)}};    // seq1->to(cpu(0)), ...
//   Tensor y = pipeline::forward(stages, X, 20);                            // 120 rows, 6 micro-batches
//   Tensor l = pipeline::forward_backward(stages, X, Y, 20, Schedule::one_f_one_b,
//       [](const Tensor& out, const Tensor& t) { return mse_loss(out, t, Reduction::sum); });
//
// Trace labels (core/trace.hpp; tag = micro-batch): "stage s fwd mb i", "stage s bwd mb i" (zb-h1: the
// input gradient B), "stage s wgrad mb i" (zb-h1's W), "stage s recompute mb i" on device
// s's streams, "stage s recv mb i" / "stage s recv grad mb i" on the copy stream of the device that
// receives an activation / a gradient.
//
// forward_backward cuts autograd's graph at the stage boundaries: stage s+1's input is a fresh leaf
// holding the copied activation; stage s+1's backward leaves that leaf's gradient, which is copied to
// device s and handed to stage s's output (backward_from). So each stage's backward of each
// micro-batch is its own piece of work the schedule can place (and carries its own trace label).
//
// Memory: the host drops a micro-batch's activations when it enqueues their backward, and the
// caching allocator reuses memory in stream order (core/allocator.hpp): a block the host lets go is
// handed at once to the device's later work. So each schedule holds what its order holds: GPipe
// every micro-batch's activations before the first backward, 1f1b at most K-s micro-batches' on
// stage s, zb-h1 a little more (the inputs of the weight gradients W still to run).
//
// Recomputation (GPipe's re-materialization; torchgpipe's `checkpoint`): a checkpointed micro-batch's
// forward runs without recording a graph, so a stage keeps only its input (the stage-boundary
// activation); its backward first runs that forward again, recording, then backward through it.
// always: every micro-batch; except_last: all but the last (whose backward follows its forward
// closely in GPipe; torchgpipe's default); never. Costs one more forward per checkpointed micro-batch.
// BatchNorm's running statistics are updated by the first forward only (core/autograd.hpp, Recompute).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/nn/block.hpp"
#include "core/pipeline/balance.hpp"
#include "core/pipeline/schedule.hpp"

namespace d2l::pipeline {

struct Stage {
  nn::BlockPtr block;  // its parameters live on `device` (Block::to)
  Device device;
};

enum class Checkpoint { always, except_last, never };
// "always" | "except_last" | "never"; anything else is a ConfigError naming the choices.
Checkpoint parse_checkpoint(const std::string& name);
std::string name(Checkpoint c);

// Per-micro-batch loss: the last stage's output and the target rows of that micro-batch -> a
// one-element tensor.
using LossFn = std::function<Tensor(const Tensor& output, const Tensor& target)>;

// Micro-batch row ranges [begin, end) of an n-row batch for split_size (the last one may be smaller):
// (120, 50) -> [0, 50), [50, 100), [100, 120). ConfigError for n < 1 and for split_size outside
// 1..n ("--split-size 0: expected 1..120 (the batch has 120 rows)").
std::vector<std::pair<int64_t, int64_t>> micro_batches(int64_t n, int64_t split_size);

// Forward only (the tutorial's PipelineParallelResNet50.forward): x (N, ...) on stage 0's device (or
// any device: moved there) is cut into micro-batches; stage s runs on its device; activations are
// copied to the next stage's device; the outputs are concatenated on the last stage's device:
// (N, ...) there. Differentiable like any op (a loss of the result can backward through it).
Tensor forward(const std::vector<Stage>& stages, const Tensor& x, int64_t split_size);

// A training step's forward and backward, pipelined in the schedule's order (no parameter update):
// gradients accumulate into every stage's parameters (and into x's gradient when x needs one);
// returns the sum of the micro-batch losses (a (1) tensor on the loss's device, without history).
// target (N, ...) anywhere; its rows [begin, end) go to the loss with micro-batch [begin, end).
Tensor forward_backward(const std::vector<Stage>& stages, const Tensor& x, const Tensor& target, int64_t split_size,
                        Schedule schedule, const LossFn& loss, Checkpoint checkpoint = Checkpoint::never);

// Autograd from a non-scalar output whose gradient d(loss)/d(output) is known (grad: output's shape
// and device): accumulates into every leaf the output depends on, as loss.backward() would.
void backward_from(const Tensor& output, const Tensor& grad);

}  // namespace d2l::pipeline
