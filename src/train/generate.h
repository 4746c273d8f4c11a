// Sampling text from a trained model.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/llama.h"

namespace tessera::train {

struct SamplingOptions {
  int64_t max_tokens = 200;
  double temperature = 0.8;  // 0: greedy
  int64_t top_k = 40;        // 0: the whole vocabulary
  uint64_t seed = 0;
};

// Continues `prompt` (token ids, at least one) one token at a time until max_tokens or `eos`,
// calling on_token for each new token; returns the new tokens. The model must have micro-batch 1.
// Each token runs a full forward over the last seq_len tokens (no key/value cache: generation is
// for looking at a model, not for serving it). Deterministic for a seed and thread count.
std::vector<int32_t> generate(model::Llama& model, model::ParamSource& params, std::vector<int32_t> prompt, int32_t eos,
                              const SamplingOptions& options, const std::function<void(int32_t)>& on_token);

}  // namespace tessera::train
