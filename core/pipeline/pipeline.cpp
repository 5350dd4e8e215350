#include "core/pipeline/pipeline.hpp"

#include <memory>
#include <stdexcept>
#include <string>

#include "core/autograd.hpp"
#include "core/ops.hpp"
#include "core/trace.hpp"

namespace d2l::pipeline {

std::vector<std::pair<int64_t, int64_t>> micro_batches(int64_t n, int64_t split_size) {
  if (n < 1) throw ConfigError("pipeline: a batch of " + std::to_string(n) + " rows: expected at least 1");
  if (split_size < 1 || split_size > n)
    throw ConfigError("--split-size " + std::to_string(split_size) + ": expected 1.." + std::to_string(n) +
                      " (the batch has " + std::to_string(n) + " rows)");
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t b = 0; b < n; b += split_size) out.push_back({b, std::min(n, b + split_size)});
  return out;
}

Checkpoint parse_checkpoint(const std::string& name) {
  if (name == "always") return Checkpoint::always;
  if (name == "except_last") return Checkpoint::except_last;
  if (name == "never") return Checkpoint::never;
  throw ConfigError("bad checkpoint mode '" + name + "': expected always, except_last or never");
}

std::string name(Checkpoint c) {
  return c == Checkpoint::always ? "always" : c == Checkpoint::except_last ? "except_last" : "never";
}

void backward_from(const Tensor& output, const Tensor& grad) {
  if (grad.shape() != output.shape() || grad.device() != output.device())
    throw ShapeError("backward_from: gradient " + d2l::str(grad.shape()) + " on " + grad.device().str() + " for an output " +
                     d2l::str(output.shape()) + " on " + output.device().str());
  if (!grad_enabled()) throw std::logic_error("backward_from: the output was made inside a NoGrad scope");
  // A one-element stand-in for the loss: its value is never read; its backward hands `grad` to output.
  Tensor root = Tensor::empty({1}, output.device());
  record(root, "backward_from", {output}, [grad](const Tensor&) { return std::vector<Tensor>{grad}; });
  root.backward();
}

namespace {

void check_stages(const std::vector<Stage>& stages, const Tensor& x) {
  if (stages.empty()) throw ConfigError("pipeline: no stages");
  for (size_t s = 0; s < stages.size(); ++s)
    if (!stages[s].block) throw ConfigError("pipeline: stage " + std::to_string(s) + " has no block");
  if (!x.defined() || x.ndim() < 1) throw ShapeError("pipeline: the input needs a batch axis (N, ...)");
}

std::string label(size_t s, const char* what, size_t i) {
  return "stage " + std::to_string(s) + " " + what + " mb " + std::to_string(i);
}

// What one training step keeps per stage and micro-batch between the steps of its schedule.
struct Slot {
  Tensor input;   // stage s > 0: the leaf holding the received activation
  Tensor output;  // kept until the stage's backward of this micro-batch is enqueued
  Tensor grad;    // d(loss)/d(output), received from stage s+1 (s < K-1)
  Tensor replay;  // checkpointed: the input its backward runs the forward on again
  std::vector<DeferWeightGrads::Work> weight;  // zb-h1: the weight gradients its W enqueues
};

}  // namespace

Tensor forward(const std::vector<Stage>& stages, const Tensor& x, int64_t split_size) {
  check_stages(stages, x);
  const size_t K = stages.size();
  auto mbs = micro_batches(x.dim(0), split_size);
  const size_t M = mbs.size();
  Tensor x0 = x.to(stages[0].device);
  // act[s][i]: micro-batch i's input to stage s, then (s = K-1) its output.
  std::vector<std::vector<Tensor>> act(K + 1, std::vector<Tensor>(M));
  for (const Step& st : forward_order(K, M)) {
    size_t s = st.stage, i = st.micro_batch;
    if (st.kind == Step::forward) {
      trace::Label l(label(s, "fwd", i), static_cast<int64_t>(i));
      Tensor in = s == 0 ? slice_rows(x0, mbs[i].first, mbs[i].second) : act[s][i];
      act[s][i] = Tensor();
      act[s + 1][i] = stages[s].block->forward(in);
    } else {  // send_activation: the copy is differentiable, so the graph runs back across devices
      trace::Label l(label(s + 1, "recv", i), static_cast<int64_t>(i));
      act[s + 1][i] = act[s + 1][i].to(stages[s + 1].device);
    }
  }
  if (M == 1) return act[K][0];
  trace::Label l("stage " + std::to_string(K - 1) + " concat");
  return concat(act[K]);
}

Tensor forward_backward(const std::vector<Stage>& stages, const Tensor& x, const Tensor& target, int64_t split_size,
                        Schedule schedule, const LossFn& loss, Checkpoint checkpoint) {
  check_stages(stages, x);
  if (!loss) throw ConfigError("pipeline: no loss function");
  if (!grad_enabled()) throw std::logic_error("pipeline::forward_backward inside a NoGrad scope");
  if (!target.defined() || target.ndim() < 1 || target.dim(0) != x.dim(0))
    throw ShapeError("pipeline: target " + (target.defined() ? d2l::str(target.shape()) : std::string("(none)")) +
                     " for a batch of " + std::to_string(x.dim(0)) + " rows");
  const size_t K = stages.size();
  auto mbs = micro_batches(x.dim(0), split_size);
  const size_t M = mbs.size();
  const Device first = stages[0].device, last = stages[K - 1].device;
  Tensor x0 = x.to(first), t_last = target.detach().to(last);
  std::vector<std::vector<Slot>> slot(K, std::vector<Slot>(M));
  std::vector<Tensor> losses(M);
  Tensor total;

  auto checkpointed = [&](size_t i) {
    return checkpoint == Checkpoint::always || (checkpoint == Checkpoint::except_last && i + 1 < M);
  };
  auto target_of = [&](size_t i) { return slice_rows(t_last, mbs[i].first, mbs[i].second); };
  auto loss_of = [&](const Tensor& out, size_t i) {
    Tensor li = loss(out, target_of(i));
    if (li.numel() != 1) throw ShapeError("pipeline: the loss gave shape " + d2l::str(li.shape()) + ", expected one element");
    return li;
  };

  for (const Step& st : enqueue_order(schedule, K, M)) {
    const size_t s = st.stage, i = st.micro_batch;
    const auto tag = static_cast<int64_t>(i);
    Slot& me = slot[s][i];
    switch (st.kind) {
      case Step::forward: {
        trace::Label l(label(s, "fwd", i), tag);
        Tensor in = s == 0 ? slice_rows(x0, mbs[i].first, mbs[i].second) : me.input;
        if (checkpointed(i)) {  // no graph: only the input is kept, for the replay in backward
          NoGrad no_graph;
          me.replay = in;
          me.output = stages[s].block->forward(in);
          if (s + 1 == K) {
            Tensor li = loss_of(me.output, i);
            total = total.defined() ? add(total, li) : li;
          }
          break;
        }
        me.output = stages[s].block->forward(in);
        if (s + 1 == K) {
          Tensor li = loss_of(me.output, i);
          losses[i] = li;
          total = total.defined() ? add(total, li.detach()) : li.detach();
        }
        break;
      }
      case Step::send_activation: {  // a fresh leaf on the next device: its gradient is stage s's
        trace::Label l(label(s + 1, "recv", i), tag);
        Tensor a = me.output.detach().to(stages[s + 1].device);
        if (me.output.needs_grad() || me.replay.defined()) a.requires_grad(true);
        slot[s + 1][i].input = a;
        if (me.replay.defined()) me.output = Tensor();  // the replay makes it again
        break;
      }
      case Step::backward: {
        std::unique_ptr<DeferWeightGrads> defer;  // zb-h1: this is B; the weight gradients wait for W
        if (schedule == Schedule::zb_h1) {
          defer = std::make_unique<DeferWeightGrads>();
          if (me.input.defined()) defer->not_deferred(me.input);  // stage s-1 waits for this one
        }
        if (me.replay.defined()) {  // recomputation: the forward again, recording this time
          trace::Label l(label(s, "recompute", i), tag);
          Recompute again;
          me.output = stages[s].block->forward(me.replay);
          if (s + 1 == K) losses[i] = loss_of(me.output, i);
          me.replay = Tensor();
        }
        trace::Label l(label(s, "bwd", i), tag);
        if (s + 1 == K) {
          if (losses[i].defined() && losses[i].needs_grad()) losses[i].backward();
        } else if (me.output.needs_grad() && me.grad.defined()) {
          backward_from(me.output, me.grad);
        }
        if (defer) me.weight = defer->take();
        if (s + 1 == K) losses[i] = Tensor();
        me.output = Tensor();
        me.grad = Tensor();
        break;
      }
      case Step::weight: {
        trace::Label l(label(s, "wgrad", i), tag);
        DeferWeightGrads::run(me.weight);
        break;
      }
      case Step::send_gradient: {  // the input leaf's gradient goes back to stage s-1's output
        trace::Label l(label(s - 1, "recv grad", i), tag);
        Tensor g = me.input.defined() ? me.input.grad() : Tensor();
        if (g.defined()) slot[s - 1][i].grad = g.to(stages[s - 1].device);
        me.input = Tensor();
        break;
      }
    }
  }
  return total;
}

}  // namespace d2l::pipeline
