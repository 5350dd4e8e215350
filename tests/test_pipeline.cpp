// core/pipeline: micro-batch ranges and their errors; schedules as stage orders and host enqueue
// orders (checked against the data dependencies written out independently); balance() against a
// brute-force search over every partition; partition() shares the children; measure_layer_costs()
// sees layers of known cost and leaves zero gradients; forward and forward_backward equal the
// single-device model (outputs, loss, parameter and input gradients) for both schedules, K = 2 and 3
// stages, split sizes 1, 3 and n, and the gradient agrees with central finite differences; the
// recorded trace shows the overlap, GPipe's bubble and each device's 1F1B order (stages that sleep a
// known time); a short run on [emu(0), emu(1)].
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <thread>

#include "check.hpp"
#include "core/autograd.hpp"
#include "core/nn/nn.hpp"
#include "core/ops.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/rng.hpp"
#include "core/runtime.hpp"
#include "core/trace.hpp"

using namespace d2l;
using namespace d2l::pipeline;

namespace {

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

Tensor mse_sum(const Tensor& out, const Tensor& t) { return mse_loss(out, t, Reduction::sum); }

// A small conv/dense Sequential: (N, 2, 5, 5) -> (N, 3).
std::shared_ptr<nn::Sequential> small_net() {
  auto net = std::make_shared<nn::Sequential>();
  net->add(std::make_shared<nn::Conv2D>(3, 3, 1, 1, true, 0, "relu"), std::make_shared<nn::Conv2D>(4, 3, 1, 1),
           std::make_shared<nn::Activation>("relu"), std::make_shared<nn::Flatten>(),
           std::make_shared<nn::Dense>(6, "relu"), std::make_shared<nn::Dense>(3));
  return net;
}

// Two dense layers, `hidden` units with relu and then `out`, from seed `seed`: Uniform(0.5) on `device`.
std::shared_ptr<nn::Sequential> two_layer_mlp(uint64_t seed, int64_t hidden, int64_t out, Device device) {
  manual_seed(seed);
  auto net = std::make_shared<nn::Sequential>();
  net->add(std::make_shared<nn::Dense>(hidden, "relu"), std::make_shared<nn::Dense>(out));
  net->initialize(Init::Uniform(0.5f), {device});
  return net;
}

// The net cut at `starts`, stage k moved to devices[k].
std::vector<Stage> place(const nn::Sequential& net, const std::vector<size_t>& starts, const std::vector<Device>& devices) {
  std::vector<Stage> stages;
  auto parts = partition(net, starts);
  for (size_t k = 0; k < parts.size(); ++k) {
    parts[k]->to(devices[k]);
    stages.push_back({parts[k], devices[k]});
  }
  return stages;
}

std::map<std::string, std::vector<float>> grads_of(const nn::Block& net) {
  std::map<std::string, std::vector<float>> out;
  for (auto& [name, p] : net.collect_params()) out[name] = p->grad(p->list_ctx().at(0)).to_vector();
  return out;
}

// A stage of known cost: forward sleeps `fwd` then copies x; its backward sleeps `bwd` then copies
// the gradient (the identity, so the pipeline's gradients can still be checked).
// A copy of x that first sleeps `ms` on x's device: a task of known length.
Tensor sleep_copy(const Tensor& x, std::chrono::milliseconds ms, const char* op) {
  Tensor y = Tensor::empty(x.shape(), x.device());
  float *src = x.data(), *dst = y.data();
  size_t bytes = static_cast<size_t>(x.numel()) * sizeof(float);
  launch(x.device(), op, {x.storage(), y.storage()}, [=](const LaunchCtx&) {
    std::this_thread::sleep_for(ms);
    std::memcpy(dst, src, bytes);
  });
  return y;
}

class Sleep : public nn::Block {
 public:
  Sleep(std::chrono::milliseconds fwd, std::chrono::milliseconds bwd) : fwd_(fwd), bwd_(bwd) {}
  Tensor forward(const Tensor& x) override {
    Tensor y = sleep_copy(x, fwd_, "sleep fwd");
    auto bwd = bwd_;
    record(y, "sleep", {x}, [bwd](const Tensor& gy) { return std::vector<Tensor>{sleep_copy(gy, bwd, "sleep bwd")}; });
    return y;
  }
  std::string type() const override { return "Sleep"; }

 private:
  std::chrono::milliseconds fwd_, bwd_;
};

// The identity with a weight: its backward is B, x's gradient ("sleep bwd"), and W, the weight's
// ("sleep wgrad", zero), each a sleep; zb-h1 runs W later (core/autograd.hpp's DeferWeightGrads).
class SleepW : public nn::Block {
 public:
  SleepW(std::chrono::milliseconds f, std::chrono::milliseconds b, std::chrono::milliseconds w, Device d)
      : f_(f), b_(b), w_(w), weight_(Tensor::zeros({1}, d)) {
    weight_.requires_grad(true);
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = sleep_copy(x, f_, "sleep fwd");
    record(y, "sleep", {x, weight_}, [b = b_, w = w_, weight = weight_](const Tensor& gy) {
      Tensor gx = sleep_copy(gy, b, "sleep bwd");
      auto weight_grad = [w, weight] { return sleep_copy(Tensor::zeros({1}, weight.device()), w, "sleep wgrad"); };
      if (defer_weight_grad(weight, weight_grad)) return std::vector<Tensor>{gx, Tensor()};
      return std::vector<Tensor>{gx, weight_grad()};
    });
    return y;
  }
  std::string type() const override { return "SleepW"; }
  Tensor weight() const { return weight_; }

 private:
  std::chrono::milliseconds f_, b_, w_;
  Tensor weight_;
};

}  // namespace

TEST_CASE("micro_batches cuts the rows; bad split sizes are one-line errors") {
  using R = std::vector<std::pair<int64_t, int64_t>>;
  CHECK(micro_batches(120, 50) == R{{0, 50}, {50, 100}, {100, 120}});
  CHECK(micro_batches(7, 3) == R{{0, 3}, {3, 6}, {6, 7}});
  CHECK(micro_batches(7, 7) == R{{0, 7}});
  CHECK(micro_batches(3, 1) == R{{0, 1}, {1, 2}, {2, 3}});
  CHECK_THROWS_AS(micro_batches(120, 0), ConfigError);
  CHECK(error_of([] { micro_batches(120, 0); }) == "--split-size 0: expected 1..120 (the batch has 120 rows)");
  CHECK(error_of([] { micro_batches(120, 121); }).find("--split-size 121: expected 1..120") == 0);
  CHECK_THROWS_AS(micro_batches(0, 1), ConfigError);
}

TEST_CASE("schedule names, GPipe's bubble, stage orders") {
  CHECK(parse_schedule("gpipe") == Schedule::gpipe);
  CHECK(parse_schedule("1f1b") == Schedule::one_f_one_b);
  CHECK(name(Schedule::one_f_one_b) == "1f1b");
  CHECK(parse_schedule("zb-h1") == Schedule::zb_h1);
  CHECK(name(Schedule::zb_h1) == "zb-h1");
  CHECK(error_of([] { parse_schedule("zigzag"); }) == "bad pipeline schedule 'zigzag': expected gpipe, 1f1b or zb-h1");
  CHECK(parse_checkpoint("except_last") == Checkpoint::except_last);
  CHECK(name(Checkpoint::always) == "always");
  CHECK(error_of([] { parse_checkpoint("sometimes"); }) == "bad checkpoint mode 'sometimes': expected always, except_last or never");
  // The formulas at hand-worked points (1F1B's measured from a trace: "zb-h1 runs W in 1f1b's bubble",
  // suite timing): K = 2, M = 4, F = B = W = 1: 1 idle slot of 3 time units per stage against 12 of
  // work, 3/15; K = 3, M = 5, F = 1, B = W = 2: 2 x 5 idle against 25, 10/35; zb-h1's W's fill
  // F + B - W of each bubble slot's F + B + W: 1/13 and 2/27.
  CHECK(bubble_fraction(Schedule::one_f_one_b, 2, 4, 1, 1, 1) == doctest::Approx(0.2));
  CHECK(bubble_fraction(Schedule::one_f_one_b, 3, 5, 1, 2, 2) == doctest::Approx(10.0 / 35));
  CHECK(bubble_fraction(Schedule::gpipe, 3, 5, 1, 2, 2) == doctest::Approx(10.0 / 35));
  CHECK(bubble_fraction(Schedule::zb_h1, 2, 4, 1, 1, 1) == doctest::Approx(1.0 / 13));
  CHECK(bubble_fraction(Schedule::zb_h1, 3, 5, 1, 2, 2) == doctest::Approx(2.0 / 27));
  CHECK(gpipe_bubble(2, 4) == doctest::Approx(0.2));
  CHECK(gpipe_bubble(1, 5) == 0.0);
  CHECK_THROWS_AS(gpipe_bubble(2, 0), ConfigError);

  auto str_of = [](const std::vector<Step>& steps) {
    std::string s;
    for (auto& st : steps) s += (s.empty() ? "" : " ") + str(st);
    return s;
  };
  CHECK(str_of(stage_order(Schedule::gpipe, 2, 3, 1)) == "F(1,0) F(1,1) F(1,2) B(1,0) B(1,1) B(1,2)");
  // 1F1B, K = 3: stage 0 warms up with 2 forwards, stage 1 with 1, the last stage with none.
  CHECK(str_of(stage_order(Schedule::one_f_one_b, 3, 4, 0)) == "F(0,0) F(0,1) F(0,2) B(0,0) F(0,3) B(0,1) B(0,2) B(0,3)");
  CHECK(str_of(stage_order(Schedule::one_f_one_b, 3, 4, 1)) == "F(1,0) F(1,1) B(1,0) F(1,2) B(1,1) F(1,3) B(1,2) B(1,3)");
  CHECK(str_of(stage_order(Schedule::one_f_one_b, 3, 4, 2)) == "F(2,0) B(2,0) F(2,1) B(2,1) F(2,2) B(2,2) F(2,3) B(2,3)");
  CHECK(str_of(stage_order(Schedule::one_f_one_b, 3, 1, 0)) == "F(0,0) B(0,0)");  // fewer micro-batches than stages
  // zb-h1, K = 2: the last stage runs each W right after its B; stage 0 runs W's while it waits for
  // stage 1's gradient, and holds at most K-s-1 = 1 pending W beyond that.
  CHECK(str_of(stage_order(Schedule::zb_h1, 2, 4, 1)) == "F(1,0) B(1,0) W(1,0) F(1,1) B(1,1) W(1,1) F(1,2) B(1,2) W(1,2) F(1,3) B(1,3) W(1,3)");
  CHECK(str_of(stage_order(Schedule::zb_h1, 2, 4, 0)) == "F(0,0) F(0,1) B(0,0) F(0,2) W(0,0) B(0,1) F(0,3) W(0,1) B(0,2) W(0,2) B(0,3) W(0,3)");
  for (size_t K = 1; K <= 4; ++K)
    for (size_t M = 1; M <= 7; ++M)
      for (size_t s = 0; s < K; ++s) {
        auto zb = stage_order(Schedule::zb_h1, K, M, s);
        std::vector<Step> fb;
        std::map<size_t, size_t> b_at;
        size_t pending = 0;
        for (size_t p = 0; p < zb.size(); ++p) {
          if (zb[p].kind == Step::weight) {
            CHECK(b_at.count(zb[p].micro_batch) == 1);  // W(i) after B(i)
            --pending;
          } else {
            fb.push_back(zb[p]);
          }
          if (zb[p].kind == Step::backward) b_at[zb[p].micro_batch] = p, ++pending;
          if (zb[p].kind == Step::forward) CHECK(pending + 1 <= K - s);  // W's do not pile up
        }
        CHECK(fb == stage_order(Schedule::one_f_one_b, K, M, s));  // 1f1b's F and B
        CHECK(zb.size() == 3 * M);
      }
}

TEST_CASE("the host's enqueue order keeps each stage's order and every data dependency") {
  for (Schedule sched : {Schedule::gpipe, Schedule::one_f_one_b, Schedule::zb_h1})
    for (size_t K = 1; K <= 4; ++K)
      for (size_t M = 1; M <= 7; ++M) {
        auto order = enqueue_order(sched, K, M);
        std::map<std::string, size_t> at;  // str(step) -> position
        for (size_t p = 0; p < order.size(); ++p) {
          CHECK_MESSAGE(at.count(str(order[p])) == 0, str(order[p]) << " twice");
          at[str(order[p])] = p;
        }
        // F and B (and zb-h1's W) per stage, a send per boundary each way
        CHECK(order.size() == (sched == Schedule::zb_h1 ? 3 : 2) * K * M + 2 * (K - 1) * M);
        auto F = [](size_t s, size_t i) { return "F(" + std::to_string(s) + "," + std::to_string(i) + ")"; };
        auto B = [](size_t s, size_t i) { return "B(" + std::to_string(s) + "," + std::to_string(i) + ")"; };
        for (size_t s = 0; s < K; ++s) {
          std::vector<Step> mine;
          for (auto& st : order)
            if (st.stage == s && (st.kind == Step::forward || st.kind == Step::backward || st.kind == Step::weight))
              mine.push_back(st);
          CHECK(mine == stage_order(sched, K, M, s));
          for (size_t i = 0; i < M; ++i) {
            if (s > 0) CHECK(at.at(F(s - 1, i)) < at.at("send " + F(s - 1, i)));
            if (s > 0) CHECK(at.at("send " + F(s - 1, i)) < at.at(F(s, i)));
            if (s + 1 < K) CHECK(at.at(B(s + 1, i)) < at.at("send " + B(s + 1, i)));
            if (s + 1 < K) CHECK(at.at("send " + B(s + 1, i)) < at.at(B(s, i)));
            if (s + 1 == K) CHECK(at.at(F(s, i)) < at.at(B(s, i)));
          }
        }
      }
  auto fwd = forward_order(3, 4);
  CHECK(fwd.size() == 3 * 4 + 2 * 4);
  CHECK(str(fwd[0]) == "F(0,0)");
}

TEST_CASE("balance() gives the optimal partition (brute force), earliest boundaries on ties") {
  CHECK(balance({1, 2, 3, 4, 5, 6, 7, 8, 9}, 3) == std::vector<size_t>{0, 5, 7});  // 15 | 13 | 17
  CHECK(balance({4, 1, 1, 1, 1, 4}, 3) == std::vector<size_t>{0, 1, 5});           // 4 | 4 | 4
  CHECK(balance({4, 1, 1, 1, 1, 4}, 2) == std::vector<size_t>{0, 3});              // 6 | 6
  CHECK(balance({5, 1, 1, 5}, 2) == std::vector<size_t>{0, 2});                    // 6 | 6
  CHECK(balance({1, 2, 1}, 2) == std::vector<size_t>{0, 1});                       // 1 | 3, tie with 3 | 1
  CHECK(balance({3, 3}, 1) == std::vector<size_t>{0});
  CHECK(balance({1, 1, 1}, 3) == std::vector<size_t>{0, 1, 2});
  CHECK(error_of([] { balance({1, 2, 3}, 4); }) == "balance: 4 stages for 3 layers: expected 1..3 stages");
  CHECK_THROWS_AS(balance({1, 2, 3}, 0), ConfigError);
  CHECK_THROWS_AS(balance({1, -2, 3}, 2), ConfigError);

  // Every composition of L layers into K stages, enumerated with a bit mask of the cuts.
  auto brute = [](const std::vector<double>& c, size_t K) {
    size_t L = c.size();
    std::vector<size_t> best;
    double best_cost = 1e300;
    for (uint32_t mask = 0; mask < (1u << (L - 1)); ++mask) {
      if (static_cast<size_t>(__builtin_popcount(mask)) != K - 1) continue;
      std::vector<size_t> starts{0};
      for (size_t j = 1; j < L; ++j)
        if (mask >> (j - 1) & 1u) starts.push_back(j);
      double cost = largest_stage_cost(c, starts);
      if (cost < best_cost || (cost == best_cost && starts < best)) best_cost = cost, best = starts;
    }
    return best;
  };
  auto data = test::lcg_data(400, 7);
  size_t at = 0;
  for (size_t L = 1; L <= 9; ++L)
    for (size_t K = 1; K <= L; ++K) {
      std::vector<double> c;
      for (size_t j = 0; j < L; ++j) c.push_back(std::round((data[at++ % data.size()] + 1.0) * 5));  // 0..10, ties
      CHECK_MESSAGE(balance(c, K) == brute(c, K), "L=" << L << " K=" << K);
    }
}

TEST_CASE("partition() shares the children; bad boundaries are errors") {
  auto net = small_net();
  auto parts = partition(*net, {0, 2, 5});
  REQUIRE(parts.size() == 3);
  CHECK(parts[0]->size() == 2);
  CHECK(parts[1]->size() == 3);
  CHECK(parts[2]->size() == 1);
  CHECK(parts[1]->at(0) == net->at(2));
  CHECK(parts[2]->at(0) == net->at(5));
  CHECK_THROWS_AS(partition(*net, {1, 3}), ConfigError);
  CHECK_THROWS_AS(partition(*net, {0, 3, 3}), ConfigError);
  CHECK(error_of([&] { partition(*net, {0, 6}); }) == "partition: stage starts [0, 6] for 6 layers: the last stage would be empty");
}

TEST_CASE("measure_layer_costs times each child's forward and backward; gradients are left zero") {
  using namespace std::chrono_literals;
  use_devices({cpu(0), cpu(1)});
  auto net = std::make_shared<nn::Sequential>();
  net->add(std::make_shared<Sleep>(1ms, 1ms), std::make_shared<nn::Dense>(3), std::make_shared<Sleep>(6ms, 12ms));
  net->initialize(Init::Uniform(), {cpu(1)});
  Tensor sample = Tensor::from_vector(test::lcg_data(4 * 5, 3), {4, 5}, cpu(0));  // moved to cpu(1)
  auto costs = measure_layer_costs(*net, sample, cpu(1), 2);
  REQUIRE(costs.size() == 3);
  CHECK(costs[0] >= 2e-3);  // a sleep lasts at least its time: lower bounds only
  CHECK(costs[2] >= 18e-3);
  CHECK(costs[2] > costs[0]);
  CHECK(balance(costs, 2) == std::vector<size_t>{0, 2});
  for (auto& [name, g] : grads_of(*net)) CHECK(g == std::vector<float>(g.size(), 0.0f));
  CHECK_THROWS_AS(measure_layer_costs(*net, sample, cpu(1), 0), ConfigError);
}

TEST_CASE("forward and forward_backward equal the single-device model") {
  use_devices({cpu(0), cpu(1), cpu(2)});
  manual_seed(3);
  const int64_t n = 7;
  auto net = small_net();
  net->initialize(Init::Uniform(0.3f), {cpu(0)});
  Tensor X = Tensor::from_vector(test::lcg_data(n * 2 * 5 * 5, 1), {n, 2, 5, 5}, cpu(0));
  Tensor T = Tensor::from_vector(test::lcg_data(n * 3, 2), {n, 3}, cpu(0));
  // The reference: the whole batch at once on cpu(0).
  Tensor Xr = X.clone().detach();
  Xr.attach_grad();
  Tensor out_ref = net->forward(Xr);
  Tensor loss_ref = mse_sum(out_ref, T);
  loss_ref.backward();
  auto y_ref = out_ref.to_vector();
  auto g_ref = grads_of(*net);
  auto gx_ref = Xr.grad().to_vector();
  const float l_ref = loss_ref.item();

  struct Cut {
    std::vector<size_t> starts;
    std::vector<Device> devices;
  };
  for (const Cut& cut : {Cut{{0, 3}, {cpu(0), cpu(1)}}, Cut{{0, 2, 4}, {cpu(1), cpu(2), cpu(0)}}})
    for (int64_t split : {int64_t{1}, int64_t{3}, n}) {
      auto stages = place(*net, cut.starts, cut.devices);
      CAPTURE(cut.starts.size());
      CAPTURE(split);
      {  // forward, and a backward through its result
        net->collect_params().zero_grad();
        Tensor x = X.clone().detach();
        x.attach_grad();
        Tensor y = forward(stages, x, split);
        CHECK(y.device() == cut.devices.back());
        CHECK(test::close(y_ref, y.to_vector(), 1e-6, 1e-4, "forward"));
        mse_sum(y, T.to(y.device())).backward();
        for (auto& [name, g] : grads_of(*net)) CHECK_MESSAGE(test::close(g_ref[name], g, 1e-5, 1e-4, name.c_str()), name);
        CHECK(test::close(gx_ref, x.grad().to_vector(), 1e-6, 1e-4, "x grad"));
      }
      for (Schedule sched : {Schedule::gpipe, Schedule::one_f_one_b, Schedule::zb_h1})
      for (Checkpoint ckpt : {Checkpoint::never, Checkpoint::except_last, Checkpoint::always}) {
        CAPTURE(name(sched));
        CAPTURE(name(ckpt));
        net->collect_params().zero_grad();
        Tensor x = X.clone().detach();
        x.attach_grad();
        Tensor l = forward_backward(stages, x, T, split, sched, mse_sum, ckpt);
        CHECK(l.device() == cut.devices.back());
        CHECK(l.item() == doctest::Approx(l_ref).epsilon(1e-5));
        for (auto& [name, g] : grads_of(*net)) CHECK_MESSAGE(test::close(g_ref[name], g, 1e-5, 1e-4, name.c_str()), name);
        CHECK(test::close(gx_ref, x.grad().to_vector(), 1e-6, 1e-4, "x grad"));
      }
    }
}

TEST_CASE("forward_backward's gradient against central finite differences of the pipelined loss") {
  use_devices({cpu(0), cpu(1)});
  auto net = two_layer_mlp(5, 5, 3, cpu(0));
  Tensor X = Tensor::from_vector(test::lcg_data(6 * 4, 11), {6, 4}, cpu(0));
  std::vector<float> t = test::lcg_data(6 * 3, 12);
  Tensor T = Tensor::from_vector(t, {6, 3}, cpu(0));
  auto stages = place(*net, {0, 1}, {cpu(0), cpu(1)});
  net->collect_params().zero_grad();
  forward_backward(stages, X, T, 2, Schedule::one_f_one_b, mse_sum);
  Parameter& w = net->collect_params()["0.weight"];
  auto analytic = w.grad(cpu(0)).to_vector();
  auto w0 = w.data(cpu(0)).to_vector();
  auto loss_at = [&](const std::vector<double>& wd) {  // d2l's squared loss summed, in double
    w.set_data(Tensor::from_vector(std::vector<float>(wd.begin(), wd.end()), w.shape(), cpu(0)));
    NoGrad ng;
    auto y = forward(stages, X, 2).to_vector();
    double l = 0;
    for (size_t k = 0; k < y.size(); ++k) l += 0.5 * (double(y[k]) - t[k]) * (double(y[k]) - t[k]);
    return l;
  };
  auto fd = test::numeric_grad(w0, [&](const std::vector<float>& v) { return loss_at({v.begin(), v.end()}); }, 1e-3f);
  CHECK(test::close(fd, analytic, 2e-3, 2e-2, "fd"));
  w.set_data(Tensor::from_vector(w0, w.shape(), cpu(0)));
}

TEST_CASE("the trace shows the overlap, GPipe's bubble and each device's 1F1B order") {
  using namespace std::chrono_literals;
  use_devices({cpu(0), cpu(1), cpu(2)});
  // Forward 40 ms, backward 80 ms: long beside a thread's wake-up jitter (~1 ms), so the bubble
  // measured over a 200 ms forward phase is within its 10% even on a busy machine.
  const auto F_ms = 40ms, B_ms = 80ms;
  struct Run {
    Schedule sched;
    size_t K, M;
  };
  // The first run only warms up the devices' threads and caches.
  for (Run run : {Run{Schedule::gpipe, 2, 2}, Run{Schedule::gpipe, 2, 4}, Run{Schedule::gpipe, 3, 5},
                  Run{Schedule::one_f_one_b, 3, 5}}) {
    CAPTURE(name(run.sched));
    CAPTURE(run.K);
    std::vector<Stage> stages;
    for (size_t s = 0; s < run.K; ++s) stages.push_back({std::make_shared<Sleep>(F_ms, B_ms), cpu(static_cast<int>(s))});
    const int64_t n = static_cast<int64_t>(run.M) * 2;
    Tensor x = Tensor::from_vector(test::lcg_data(n * 3, 4), {n, 3}, cpu(0));
    x.attach_grad();
    Tensor t = Tensor::zeros({n, 3}, cpu(0));
    waitall();
    trace::start();
    Tensor l = forward_backward(stages, x, t, 2, run.sched, mse_sum);
    waitall();
    trace::stop();
    auto ev = trace::events();
    if (run.M == 2) continue;
    // The stage is the identity, so the input's gradient is d(sum (x - 0)^2 / 2)/dx = x.
    CHECK(test::close(x.detach().to_vector(), x.grad().to_vector(), 1e-6, 1e-6, "identity grad"));

    // Each device's sleeping tasks, in the order they ran: that stage's schedule.
    std::map<std::pair<size_t, std::string>, trace::Record> rec;  // (stage, "F(s,i)") -> record
    for (size_t s = 0; s < run.K; ++s) {
      std::vector<Step> ran;
      for (auto& e : ev)
        if (e.device == cpu(static_cast<int>(s)) && e.stream == "compute" && (e.name == "sleep fwd" || e.name == "sleep bwd")) {
          REQUIRE(e.tag.has_value());
          Step st{e.name == "sleep fwd" ? Step::forward : Step::backward, s, static_cast<size_t>(*e.tag)};
          CHECK(e.label == "stage " + std::to_string(s) + (st.kind == Step::forward ? " fwd" : " bwd") + " mb " + std::to_string(*e.tag));
          ran.push_back(st);
          rec[{s, str(st)}] = e;
        }
      CHECK(ran == stage_order(run.sched, run.K, run.M, s));
    }
    auto F = [&](size_t s, size_t i) { return rec.at({s, str(Step{Step::forward, s, i})}); };
    auto B = [&](size_t s, size_t i) { return rec.at({s, str(Step{Step::backward, s, i})}); };
    // GPipe: device 0's forward of micro-batch i+1 runs while device 1 runs micro-batch i.
    for (size_t i = 0; run.sched == Schedule::gpipe && i + 1 < run.M; ++i) {
      double overlap = std::min(F(0, i + 1).end_us, F(1, i).end_us) - std::max(F(0, i + 1).start_us, F(1, i).start_us);
      CHECK_MESSAGE(overlap > 0.5 * 40e3, "mb " << i << " overlap " << overlap << " us");
    }
    // Stages of equal cost run the simulated timeline: (M + K - 1) (F + B) for both schedules.
    double first = 1e300, last = 0;
    for (auto& [key, e] : rec) first = std::min(first, e.start_us), last = std::max(last, e.end_us);
    double ideal = static_cast<double>(run.M + run.K - 1) * 120e3;
    MESSAGE(name(run.sched) << " K=" << run.K << " M=" << run.M << " step " << (last - first) / 1e3 << " ms (ideal "
                            << ideal / 1e3 << " ms)");
    CHECK((last - first) < 1.1 * ideal);
    if (run.sched == Schedule::gpipe) {  // the forward phase's idle fraction is GPipe's bubble
      double t0 = F(0, 0).start_us, t1 = F(run.K - 1, run.M - 1).end_us;
      double want = gpipe_bubble(run.K, run.M);
      for (size_t s = 0; s < run.K; ++s) {
        double idle = trace::idle_fraction(ev, cpu(static_cast<int>(s)), t0, t1);
        MESSAGE(name(run.sched) << " K=" << run.K << " M=" << run.M << " device " << s << " forward idle " << idle
                                << " (bubble " << want << ")");
        CHECK(idle == doctest::Approx(want).epsilon(0.1));
      }
    } else {  // 1F1B: device 0 starts a backward before its last forward
      CHECK(B(0, 0).start_us < F(0, run.M - 1).start_us);
    }
  }
}

TEST_CASE("zb-h1 runs W in 1f1b's bubble: its idle fraction, from the trace, is below 1f1b's") {
  using namespace std::chrono_literals;
  use_devices({cpu(0), cpu(1), cpu(2)});
  const size_t K = 3, M = 6;
  std::map<Schedule, double> idle;
  for (Schedule sched : {Schedule::one_f_one_b, Schedule::one_f_one_b, Schedule::zb_h1}) {  // the first warms up
    CAPTURE(name(sched));
    std::vector<Stage> stages;
    std::vector<std::shared_ptr<SleepW>> blocks;
    for (size_t s = 0; s < K; ++s) {
      blocks.push_back(std::make_shared<SleepW>(30ms, 30ms, 30ms, cpu(static_cast<int>(s))));
      stages.push_back({blocks.back(), cpu(static_cast<int>(s))});
    }
    const int64_t n = static_cast<int64_t>(M) * 2;
    Tensor x = Tensor::from_vector(test::lcg_data(n * 3, 4), {n, 3}, cpu(0));
    x.attach_grad();
    Tensor t = Tensor::zeros({n, 3}, cpu(0));
    waitall();
    trace::start();
    forward_backward(stages, x, t, 2, sched, mse_sum);
    waitall();
    trace::stop();
    auto ev = trace::events();
    CHECK(test::close(x.detach().to_vector(), x.grad().to_vector(), 1e-6, 1e-6, "identity grad"));
    for (auto& b : blocks) CHECK(b->weight().grad().defined());  // every W ran
    size_t wgrads = 0;
    double first = 1e300, last = 0;
    for (auto& e : ev)
      if (e.name.rfind("sleep", 0) == 0) {
        first = std::min(first, e.start_us), last = std::max(last, e.end_us);
        if (e.name == "sleep wgrad") {
          ++wgrads;
          CHECK(e.label == (sched == Schedule::zb_h1 ? "stage " + std::to_string(e.device.index) + " wgrad mb " + std::to_string(*e.tag)
                                                     : "stage " + std::to_string(e.device.index) + " bwd mb " + std::to_string(*e.tag)));
        }
      }
    CHECK(wgrads == K * M);
    double mean = 0;
    for (size_t s = 0; s < K; ++s) mean += trace::idle_fraction(ev, cpu(static_cast<int>(s)), first, last) / K;
    idle[sched] = mean;
  }
  const double f_1f1b = bubble_fraction(Schedule::one_f_one_b, K, M, 1, 1, 1), f_zb = bubble_fraction(Schedule::zb_h1, K, M, 1, 1, 1);
  MESSAGE("mean idle fraction: 1f1b " << idle[Schedule::one_f_one_b] << " (formula " << f_1f1b << "), zb-h1 "
                                      << idle[Schedule::zb_h1] << " (formula " << f_zb << ")");
  CHECK(idle[Schedule::zb_h1] < idle[Schedule::one_f_one_b] - 0.05);
  CHECK(idle[Schedule::one_f_one_b] == doctest::Approx(f_1f1b).epsilon(0.25));
}

TEST_CASE("a short pipelined step on [emu(0), emu(1)] equals the single-device model") {
  use_devices({emu(0), emu(1)});
  auto net = two_layer_mlp(9, 4, 2, emu(0));
  Tensor X = Tensor::from_vector(test::lcg_data(5 * 3, 21), {5, 3}, emu(0));
  Tensor T = Tensor::from_vector(test::lcg_data(5 * 2, 22), {5, 2}, emu(0));
  Tensor loss_ref = mse_sum(net->forward(X), T);
  loss_ref.backward();
  auto g_ref = grads_of(*net);
  for (Schedule sched : {Schedule::gpipe, Schedule::one_f_one_b}) {
    auto stages = place(*net, {0, 1}, {emu(0), emu(1)});
    net->collect_params().zero_grad();
    Tensor l = forward_backward(stages, X, T, 2, sched, mse_sum);
    CHECK(l.device() == emu(1));
    CHECK(l.item() == doctest::Approx(loss_ref.item()).epsilon(1e-5));
    for (auto& [name, g] : grads_of(*net)) CHECK_MESSAGE(test::close(g_ref[name], g, 1e-5, 1e-4, name.c_str()), name);
  }
}
