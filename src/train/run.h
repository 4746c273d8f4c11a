// `tessera train`: the step loop with progress lines, RUN/metrics.jsonl and final weights.
#pragma once

#include <string>

#include "config/config.h"

namespace tessera::train {

// Trains to train.max_steps (or train.max_tokens), writing RUN_DIR/config.toml,
// RUN_DIR/metrics.jsonl and, when checkpoint.save_final, RUN_DIR/model.safetensors. Throws
// tessera::Error subclasses for faults.
void run_training(const config::Config& config, const std::string& run_dir);

}  // namespace tessera::train
