// One training process: model, parameters and optimizer state, data, and the optimizer step
// (gradient accumulation, global grad-norm clipping, AdamW, learning-rate schedule).
#pragma once

#include <cstdint>
#include <vector>

#include "config/config.h"
#include "model/llama.h"
#include "optim/schedule.h"
#include "train/local_params.h"
#include "train/synthetic.h"

namespace tessera::train {

struct StepStats {
  int64_t step = 0;         // 1-based index of the step just taken
  double loss = 0.0;        // mean over the global batch
  double lr = 0.0;
  double grad_norm = 0.0;   // before clipping
  double seconds = 0.0;
  int64_t tokens = 0;       // tokens in this step (global)
};

class Trainer {
 public:
  explicit Trainer(const config::Config& config);

  // One optimizer step over the next global batch. Throws NonFiniteError on a non-finite loss or
  // gradient norm (parameters are left as they were before the step).
  StepStats step();

  const config::Config& config() const { return config_; }
  const model::ModelLayout& layout() const { return layout_; }
  model::Llama& model() { return model_; }
  LocalParams& params() { return params_; }
  int64_t steps_done() const { return step_; }
  // Bytes of parameters, gradients and optimizer state, and of activations.
  size_t state_bytes() const { return params_.bytes(); }
  size_t activation_bytes() const { return model_.activation_bytes(); }

 private:
  config::Config config_;
  model::ModelLayout layout_;
  LocalParams params_;
  model::Llama model_;
  SyntheticData data_;
  optim::Schedule schedule_;
  std::vector<int32_t> inputs_, targets_;  // one micro-batch
  int64_t step_ = 0;
};

// Sets the process's thread count from the config and returns it.
int configure_threads(const config::Config& config);

}  // namespace tessera::train
