// Sampling text from a trained model.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/backend.h"
#include "model/layout.h"
#include "model/param_source.h"

namespace tessera::train {

struct SamplingOptions {
  int64_t max_tokens = 200;
  double temperature = 0.8;  // 0: greedy
  int64_t top_k = 40;        // 0: the whole vocabulary
  double top_p = 1.0;        // in (0, 1]: the fewest likeliest tokens holding this much of the mass; 1: all
  uint64_t seed = 0;
  // The key/value-cache decoder (model/decoder.h); false: a full forward over the last seq_len
  // tokens for every token (Llama::forward_logits), the reference the decoder is tested against.
  bool kv_cache = true;
  bool bf16 = false;  // weight GEMMs on the source's bf16 images (when it has them)
};

// Draws each new token from the logits: the k likeliest (top_k), of them the fewest whose
// probabilities at the temperature sum to at least top_p of theirs (the nucleus: the order
// transformers' warpers apply), then one of those in proportion to its probability. Greedy at
// temperature 0. Each prompt index draws from a stream of its own, seeded by options.seed.
class Sampler {
 public:
  Sampler(int64_t vocab, const SamplingOptions& options);

  // The token after logits z (vocab of them) for prompt `seq`'s `i`-th new token.
  int32_t next(const float* z, int64_t seq, int64_t i);

 private:
  static constexpr uint64_t kStream = 0x67656e;  // the streams' base: prompt 0's
  int64_t V_;
  SamplingOptions options_;
  std::vector<int32_t> order_;
  std::vector<double> probs_;
};

// Called for each new token: the prompt's index, the token and its log-probability under the
// model (the log-softmax of its logits over the whole vocabulary, at temperature 1 whatever the
// sampling options; computed in double from the fp32 logits).
using TokenCallback = std::function<void(int64_t prompt, int32_t token, double logprob)>;

// Continues each prompt (token ids, at least one each) one token at a time until max_tokens or
// one of `stop_tokens` (the EOS, and a chat model's end of turn; not kept), calling on_token for
// each new token; returns the new tokens per prompt. The prompts run as one batch. A
// context longer than seq_len is cut to its last seq_len tokens, as a model trained at seq_len saw them (RoPE positions
// are absolute): with the cache, a sequence that reaches seq_len re-runs its last seq_len tokens for every further
// token, which is what the uncached path does for every token, so both give the same tokens throughout. Sampling draws
// from a stream per prompt index (prompt 0's is the single-prompt stream), so a prompt's continuation does not depend
// on the others in the batch, up to the rounding of the batched GEMMs (which could flip a draw that lands within ~1e-7
// of a boundary). Deterministic for a seed and thread count. backend: where the key/value-cache
// decoder runs, params in its memory (the uncached reference path runs on the CPU only).
std::vector<std::vector<int32_t>> generate(const model::ModelLayout& layout, model::ParamSource& params,
                                           const std::vector<std::vector<int32_t>>& prompts,
                                           const std::vector<int32_t>& stop_tokens, const SamplingOptions& options,
                                           const TokenCallback& on_token,
                                           kernels::Backend& backend = kernels::cpu_backend());

}  // namespace tessera::train
