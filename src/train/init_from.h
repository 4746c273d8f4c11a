// train.init_from: the weights a run starts from instead of its seeded random init.
#pragma once

#include <vector>

#include "checkpoint/safetensors.h"
#include "config/config.h"

namespace tessera::train {

// Reads config.train.init_from (a Hugging Face Llama directory, a run directory or a weights file
// written by `tessera train`) and returns its tensors under Tessera's names. Throws ConfigError
// naming the key when the path does not exist or its model differs from config.model in a key
// that changes the computation (seq_len may differ: it is only the training context), and
// DataError naming the file and tensor when the weights are malformed.
std::vector<checkpoint::NamedTensor> load_init_weights(const config::Config& config);

}  // namespace tessera::train
