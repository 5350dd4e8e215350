#include "core/optim/grad_scaler.hpp"

#include <cmath>
#include <sstream>

#include "core/ops.hpp"
#include "core/optim/kvstore.hpp"

namespace d2l::optim {

namespace {
// A setting as the error line shows it.
std::string setting(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}
}  // namespace

GradScaler::GradScaler(GradScalerOptions options) : options_(options), scale_(options.enabled ? options.init_scale : 1.0f) {
  if (!(std::isfinite(options.init_scale) && options.init_scale > 0))
    throw ConfigError("GradScaler: init_scale must be a finite number > 0, got " + setting(options.init_scale));
  if (!(std::isfinite(options.growth_factor) && options.growth_factor > 1))
    throw ConfigError("GradScaler: growth_factor must be a finite number > 1, got " + setting(options.growth_factor));
  if (!(options.backoff_factor > 0 && options.backoff_factor < 1))
    throw ConfigError("GradScaler: backoff_factor must be in (0, 1), got " + setting(options.backoff_factor));
  if (options.growth_interval < 1)
    throw ConfigError("GradScaler: growth_interval must be >= 1, got " + std::to_string(options.growth_interval));
}

Tensor GradScaler::scale(const Tensor& loss) const { return options_.enabled ? d2l::scale(loss, scale_) : loss; }

bool GradScaler::step(Trainer& trainer, int64_t batch_size) {
  if (!options_.enabled) {
    trainer.step(batch_size);
    return true;
  }
  found_inf_ = !trainer.step_scaled(batch_size, scale_);
  if (found_inf_) ++skipped_;
  return !found_inf_;
}

bool GradScaler::unscale(double squares) {
  if (!options_.enabled) return true;
  // The Trainer's own check (GradClip's squares), so both loops decide alike.
  GradClip check{.loss_scale = scale_};
  check.apply(SGDStep{}, squares);
  found_inf_ = check.found_inf;
  if (found_inf_) ++skipped_;
  return !found_inf_;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  if (found_inf_) {
    scale_ *= options_.backoff_factor;
    clean_ = 0;
  } else if (++clean_ == options_.growth_interval) {
    scale_ *= options_.growth_factor;
    clean_ = 0;
  }
  found_inf_ = false;
}

}  // namespace d2l::optim
