// The book's train(num_gpus, batch_size, lr) (d2l "Concise Implementation for Multiple GPUs", "Training"): the net
// initialised on every device, a Trainer that sums the replicas' gradients, each minibatch split
// over the devices, recorded, its losses' backward on each device and one trainer.step; the training
// time and test accuracy after every epoch. What the loop needs around it (checks, data, --resume,
// dist_sync's processes) is run.cpp's; the progress line, the minibatches in flight and the
// checkpoint files are chapters/harness's.
#include <cmath>
#include <cstdio>

#include "chapters/harness/harness.hpp"
#include "chapters/multi_gpu_concise/run.hpp"
#include "core/autograd.hpp"
#include "core/cli.hpp"
#include "core/ops.hpp"
#include "core/rng.hpp"
#include "core/runtime.hpp"

namespace d2l::concise {

Result train(const Config& cfg) {
  // train_iter, test_iter = gb.load_data_fashion_mnist(batch_size); print('running on:', ctx)
  Run run(cfg);  // (and the checked flags, each process's shards with dist_sync)
  const std::vector<Device>& devices = cfg.devices;  // ctx = [mx.gpu(i) for i in range(num_gpus)]
  Result r = run.result();
  if (run.speak && cfg.autocast != DType::f32)
    std::printf("mixed precision: %s under autocast (GEMMs and convolutions), float32 master weights%s\n", dtype_name(cfg.autocast),
                cfg.autocast == DType::f16 ? ", dynamic loss scaling" : "");
  // --precision fp16 (torch.cuda.amp.GradScaler()): the losses scaled before backward, the step
  // skipped and the scale halved on an inf or NaN in any gradient (disabled otherwise: the plain step)
  optim::GradScaler scaler({.enabled = cfg.autocast == DType::f16});
  // net.initialize(init=init.Normal(sigma=0.01), ctx=ctx, force_reinit=True)
  manual_seed(cfg.seed);
  r.net = make_net(cfg.model, cfg.sync_bn);
  nn::Sequential& net = *r.net;
  net.initialize(default_init(cfg.model), devices, /*force_reinit=*/true);
  // trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': lr}); loss: concise::loss
  optim::Trainer trainer(net.collect_params(), "sgd", {cfg.lr}, cfg.kvstore);
  r.first_epoch = run.before_training(net, trainer) + 1;  // --resume, dist_sync's rank 0 parameters

  for (int epoch = r.first_epoch - 1; epoch < cfg.num_epochs; ++epoch) {
    harness::Progress timer(epoch + 1, run.train_iter.num_batches(), run.speak);  // start = time.time()
    // Each minibatch's losses are read once the host is --in-flight minibatches ahead (harness.hpp):
    // a NaN or infinite one stops training, naming its epoch and step.
    // A step the GradScaler skipped may have a loss that overflowed: it is left out.
    double loss_sum = 0;
    int64_t step = 0, skipped = 0;
    struct Losses {
      std::vector<HostValue> ls;
      bool stepped;
    };
    harness::InFlight<Losses> flight(cfg.in_flight, [&](Losses& s) {
      double step_loss = 0;
      for (auto& l : s.ls) step_loss += l.value();
      ++step;
      if (!s.stepped && !std::isfinite(step_loss)) return;
      loss_sum += step_loss;
      check_loss(step_loss, epoch + 1, step);
    });
    for (const Batch& b : run.train_iter.epoch(epoch)) {  // for X, y in train_iter:
      flight.wait_for_room();
      check_interrupt();  // Ctrl-C / SIGTERM: stop between minibatches (the last checkpoint stays)
      // gpu_Xs = gutils.split_and_load(X, ctx); gpu_ys = gutils.split_and_load(y, ctx)
      // with autograd.record(): ls = [loss(net(gpu_X), gpu_y) for gpu_X, gpu_y in zip(gpu_Xs, gpu_ys)]
      // for l in ls: l.backward()   (dist_sync: a process whose share of a short last minibatch is
      // empty only takes the step: its zero gradients take part in the sums, as an empty device's do)
      std::vector<Tensor> ls;
      if (b.n > 0) {
        nn::BatchShards shards = split_and_load(b, devices, run.split_weights);
        // --precision bf16 (with torch.autocast(dtype=torch.bfloat16)): the GEMMs and convolutions in
        // bfloat16, the rest in float32 (core/ops.hpp's list); the parameters stay float32 (master weights)
        Autocast mixed(cfg.autocast);
        ls = forward_backward(net, shards.X, shards.y, scaler);
      }
      // trainer.step(batch_size): the kvstore sums every replica's gradient (fp16: scaler.step skips
      // a step with an inf or NaN anywhere; scaler.update() then halves or doubles the scale)
      const bool stepped = scaler.step(trainer, b.size());
      scaler.update();
      skipped += !stepped;
      flight.push({read_later(ls), stepped});
      timer.step();
    }
    flight.drain();
    waitall();  // nd.waitall()
    r.train_seconds.push_back(timer.seconds());  // train_time = time.time() - start
    check_loss(loss_sum, epoch + 1, run.train_iter.num_batches());
    loss_sum = run.loss_over_processes(loss_sum, net);
    r.train_loss.push_back(loss_sum / static_cast<double>(run.train_iter.size()));
    // test_acc = gb.evaluate_accuracy(test_iter, net, ctx[0]) (or every device: --eval-all-devices)
    double test_acc = evaluate_accuracy(run.test_iter, net, cfg.eval_all_devices ? devices : std::vector<Device>{devices[0]});
    r.test_acc.push_back(run.accuracy_over_processes(test_acc));
    if (run.speak)
      std::printf("epoch %d, training time: %.1f sec, test_acc %.2f\n", epoch + 1, r.train_seconds.back(), r.test_acc.back());
    if (scaler.is_enabled()) {
      r.skipped_steps.push_back(skipped);
      r.loss_scale.push_back(scaler.get_scale());
      if (run.speak)
        std::printf("loss scaling: %lld of %lld steps skipped (an inf or NaN in a gradient), scale now %g\n",
                    static_cast<long long>(skipped), static_cast<long long>(step), static_cast<double>(scaler.get_scale()));
    }
    std::fflush(stdout);
    if (run.rank == 0) harness::save_checkpoint(cfg.checkpoint, net, trainer, epoch + 1);
  }
  run.save_params(net);
  return r;
}

std::vector<std::vector<float>> trained_values(const Result& r) {
  std::vector<std::vector<float>> out;
  for (auto& [name, p] : r.net->collect_params()) out.push_back(p->data(r.devices[0]).to_vector());
  return out;
}

}  // namespace d2l::concise
