// Dynamic loss scaling for float16 training (torch.cuda.amp.GradScaler's rule and constants;
// Micikevicius et al. 2018, "Mixed Precision Training", https://arxiv.org/abs/1710.03740).
// float16's smallest normal is 6.1e-5: many gradients of a net run under Autocast(DType::f16) are
// smaller and would round to zero. The loss is multiplied by a scale S before backward, so every
// gradient is S times larger (exactly: S is a power of two); the step divides it out again
// (Trainer::step_scaled). Too large an S overflows: an inf or a NaN in some gradient, on any device
// or any rank, and the step is skipped and S halved. After growth_interval clean steps in a row S is
// doubled, so it stays near the largest value that does not overflow. bfloat16 has float32's range
// and needs none of this.
//
//   GradScaler scaler;                                 // S = 2^16
//   { Autocast mixed(DType::f16); scaler.scale(loss(net(X), y)).backward(); }
//   scaler.step(trainer, batch_size);                  // the step, or none (skipped_steps() + 1)
//   scaler.update();                                   // halve after a skip, double after 2000 clean steps
//
// Parameters here are float32 by construction (Parameter::initialize): the master weights PyTorch's
// unscale_ insists on ("Attempting to unscale FP16 gradients") are the only kind there is.
#pragma once
#include <cstdint>

#include "core/optim/trainer.hpp"
#include "core/tensor.hpp"

namespace d2l::optim {

// torch.cuda.amp.GradScaler's defaults.
struct GradScalerOptions {
  float init_scale = 65536.0f;  // 2^16
  float growth_factor = 2.0f;   // S times this after growth_interval clean steps in a row
  float backoff_factor = 0.5f;  // S times this after a step with an inf or a NaN
  int64_t growth_interval = 2000;
  // false: scale() returns the loss itself, step() is trainer.step(), update() does nothing (PyTorch's
  // GradScaler(enabled=False)), so one loop serves float32, bfloat16 and float16.
  bool enabled = true;
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});  // ConfigError for a value out of range

  // loss * S, recorded (backward of it gives S times the gradients); disabled: the loss.
  Tensor scale(const Tensor& loss) const;
  // trainer.step_scaled(batch_size, S): the step with the gradients divided by S, or none where one
  // holds an inf or a NaN. Returns whether it stepped. Over processes a collective, as the Trainer's
  // step is.
  bool step(Trainer& trainer, int64_t batch_size);
  // For a loop that applies its own update (chapter 5's tensor-parallel SGD): squares is the sum of
  // the squares of every gradient that update reads, over every device and rank it trains with (as
  // Trainer::step_scaled finds it). Returns whether to update, the gradients then divided by the
  // scale the loss was multiplied by; false (a skipped step) when they hold an inf or a NaN.
  // Disabled: true. update() follows as after step().
  bool unscale(double squares);
  // After each step: S * backoff_factor if that step was skipped, S * growth_factor after
  // growth_interval clean steps in a row, else S.
  void update();

  float get_scale() const { return scale_; }  // 1 when disabled
  bool is_enabled() const { return options_.enabled; }
  int64_t skipped_steps() const { return skipped_; }    // since construction
  int64_t growth_tracker() const { return clean_; }     // clean steps since the last change of S
  const GradScalerOptions& options() const { return options_; }

 private:
  GradScalerOptions options_;
  float scale_;
  int64_t clean_ = 0, skipped_ = 0;
  bool found_inf_ = false;  // the last step's
};

}  // namespace d2l::optim
