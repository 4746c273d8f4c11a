// Sampling text from a trained model.
#include "train/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"
#include "core/rng.h"

namespace tessera::train {

std::vector<int32_t> generate(model::Llama& model, model::ParamSource& params, std::vector<int32_t> prompt, int32_t eos,
                              const SamplingOptions& options, const std::function<void(int32_t)>& on_token) {
  CHECK(model.micro_batch() == 1 && !prompt.empty());
  const model::ModelConfig& c = model.layout().config();
  const int64_t T = c.seq_len, V = c.vocab_size;
  std::vector<int32_t> window(T, 0), out;
  std::vector<float> logits(T * V);
  std::vector<int32_t> order(V);
  std::vector<double> probs(V);
  for (int64_t i = 0; i < options.max_tokens; ++i) {
    // The last T tokens; positions after the last real one hold padding that causal attention
    // keeps from influencing it.
    const int64_t n = std::min<int64_t>(T, static_cast<int64_t>(prompt.size()));
    std::copy(prompt.end() - n, prompt.end(), window.begin());
    model.forward_logits(params, window.data(), logits.data());
    const float* z = logits.data() + (n - 1) * V;

    int32_t next = 0;
    if (options.temperature <= 0.0) {
      next = static_cast<int32_t>(std::max_element(z, z + V) - z);
    } else {
      std::iota(order.begin(), order.end(), 0);
      const int64_t k = options.top_k > 0 ? std::min(options.top_k, V) : V;
      // Highest logits first; ties broken by id so the order is deterministic.
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); });
      const double top = z[order[0]];
      double sum = 0.0;
      for (int64_t j = 0; j < k; ++j) sum += probs[j] = std::exp((z[order[j]] - top) / options.temperature);
      double u = rng::uniform(options.seed, 0x67656e, static_cast<uint64_t>(i)) * sum;
      next = order[k - 1];
      for (int64_t j = 0; j < k; ++j) {
        if ((u -= probs[j]) <= 0.0) {
          next = order[j];
          break;
        }
      }
    }
    if (next == eos) break;
    prompt.push_back(next);
    out.push_back(next);
    on_token(next);
  }
  return out;
}

}  // namespace tessera::train
