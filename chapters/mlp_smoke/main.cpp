// mlp_smoke: trains a two-layer MLP data-parallel on a generated 10-class problem.
//   mlp_smoke --num-gpus 2          (CPU devices stand in when there is no GPU)
//   mlp_smoke --devices cpu:0,cpu:1 --batch-size 128 --lr 0.5 --num-epochs 10
#include <CLI/CLI.hpp>
#include <cstdio>

#include "chapters/mlp_smoke/mlp_smoke.hpp"
#include "core/cli.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Data-parallel MLP on a generated 10-class problem (the runtime's smoke test)"};
  d2l::DeviceFlags dev;
  dev.num_gpus = 2;
  d2l::smoke::Config cfg;
  bool quick = false;
  d2l::add_device_flags(app, dev);
  app.add_option("--batch-size", cfg.batch_size, "minibatch size, split over the devices")->capture_default_str();
  app.add_option("--lr", cfg.lr, "learning rate")->capture_default_str();
  app.add_option("--num-epochs", cfg.num_epochs, "epochs")->capture_default_str();
  app.add_option("--seed", cfg.seed, "random seed (data and initial parameters)")
      ->check([](const std::string& v) { return v.find('-') == std::string::npos ? "" : "expected a number >= 0"; })
      ->capture_default_str();
  app.add_flag("--quick", quick, "a small, fast run (tests)");
  d2l::install_interrupt_handlers();  // Ctrl-C / SIGTERM: stop after the current minibatch, exit 130 / 143
  return d2l::guarded_main(app, argc, argv, [&] {
    d2l::require_positive("--batch-size", static_cast<double>(cfg.batch_size));
    // An example's features, hidden units and their gradients: well under 4 kB.
    d2l::require_memory("--batch-size", static_cast<double>(cfg.batch_size), 4e3 * static_cast<double>(cfg.batch_size));
    d2l::require_positive("--lr", cfg.lr);
    d2l::require_positive("--num-epochs", cfg.num_epochs);
    cfg.devices = d2l::choose_devices(dev);
    if (quick) cfg.n_train = 1000, cfg.n_test = 500, cfg.num_epochs = std::min(cfg.num_epochs, 3);
    auto r = d2l::smoke::run(cfg);
    std::printf("test acc: %.2f, %.2f sec/epoch on %s\n", r.test_acc, r.sec_per_epoch, d2l::str(cfg.devices).c_str());
    return 0;
  });
}
