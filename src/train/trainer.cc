// One training process: the optimizer step.
#include "train/trainer.h"

#include <fmt/format.h>

#include <cmath>

#include "core/error.h"
#include "core/parallel.h"
#include "core/timer.h"
#include "optim/adamw.h"

namespace tessera::train {

int configure_threads(const config::Config& config) {
  set_num_threads(static_cast<int>(config.train.threads));
  return num_threads();
}

Trainer::Trainer(const config::Config& config)
    : config_(config),
      layout_(config.model),
      params_(layout_, static_cast<uint64_t>(config.train.seed)),
      model_(layout_, config.micro_batch(), configure_threads(config)),
      data_(static_cast<uint64_t>(config.train.seed), config.model.vocab_size, config.model.seq_len),
      inputs_(config.micro_batch() * config.model.seq_len),
      targets_(config.micro_batch() * config.model.seq_len) {
  schedule_.lr = config.train.lr;
  schedule_.min_lr = config.train.min_lr;
  schedule_.warmup_steps = config.train.warmup_steps;
  schedule_.total_steps = config.train.max_steps;
}

StepStats Trainer::step() {
  const double t0 = now_seconds();
  const int64_t accum = config_.accumulation_steps(), mb = config_.micro_batch();
  params_.zero_grads();
  double loss = 0.0;
  for (int64_t a = 0; a < accum; ++a) {
    data_.fill(step_ * config_.train.batch_size + a * mb, mb, inputs_.data(), targets_.data());
    loss += model_.forward_backward(params_, inputs_.data(), targets_.data(), 1.0f / static_cast<float>(accum));
  }
  loss /= static_cast<double>(accum);
  const double grad_norm = std::sqrt(params_.grad_sum_squares());
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
    throw NonFiniteError(fmt::format("step {}: loss {} and gradient norm {}; parameters are unchanged (try a lower "
                                     "train.lr or train.grad_clip)",
                                     step_ + 1, loss, grad_norm));
  }
  const double clip = optim::clip_factor(grad_norm, config_.train.grad_clip);
  if (clip < 1.0) params_.scale_grads(static_cast<float>(clip));

  ++step_;
  const double lr = schedule_.at(step_);
  optim::AdamWConfig adam;
  adam.beta1 = config_.train.beta1;
  adam.beta2 = config_.train.beta2;
  adam.eps = config_.train.eps;
  adam.weight_decay = config_.train.weight_decay;
  for (int u = 0; u < layout_.num_units(); ++u) {
    const model::UnitLayout& unit = layout_.units()[u];
    optim::adamw_update(unit, 0, unit.padded, params_.params(u), params_.grads(u), params_.m(u), params_.v(u), adam,
                        lr, step_);
  }
  return {step_, loss, lr, grad_norm, now_seconds() - t0, config_.tokens_per_step()};
}

}  // namespace tessera::train
