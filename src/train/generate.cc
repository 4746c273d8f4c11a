// Sampling text from a trained model.
#include "train/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_set>

#include "core/check.h"
#include "core/rng.h"
#include "core/threads.h"
#include "model/decoder.h"
#include "model/llama.h"

namespace tessera::train {

namespace {

using StopTokens = std::unordered_set<int32_t>;

// Generation reads the same weights for every token, so each unit is acquired from the source
// once and held until the call ends: a sharded source would otherwise gather every unit again
// for every token.
class HeldParams final : public model::ParamSource {
 public:
  HeldParams(model::ParamSource& source, int units)
      : source_(source), f32_(units, nullptr), bf16_(units, nullptr), asked_bf16_(units, false) {}
  ~HeldParams() override {
    for (size_t u = 0; u < f32_.size(); ++u) {
      if (f32_[u] != nullptr) source_.release(static_cast<int>(u));
      if (bf16_[u] != nullptr) source_.release(static_cast<int>(u));
    }
  }
  HeldParams(const HeldParams&) = delete;
  HeldParams& operator=(const HeldParams&) = delete;

  const float* acquire(int unit) override {
    if (f32_[unit] == nullptr) f32_[unit] = source_.acquire(unit);
    return f32_[unit];
  }
  const uint16_t* acquire_bf16(int unit) override {
    if (!asked_bf16_[unit]) bf16_[unit] = source_.acquire_bf16(unit);
    asked_bf16_[unit] = true;
    return bf16_[unit];
  }
  void release(int /*unit*/) override {}
  float* grads(int /*unit*/) override {
    CHECK_MSG(false, "generation computes no gradients");
    return nullptr;
  }
  void grads_ready(int /*unit*/) override { CHECK_MSG(false, "generation computes no gradients"); }

 private:
  model::ParamSource& source_;
  std::vector<const float*> f32_;
  std::vector<const uint16_t*> bf16_;
  std::vector<bool> asked_bf16_;
};

// log softmax(z)[token] over the V logits z, in double.
double log_probability(const float* z, int64_t V, int32_t token) {
  const double top = *std::max_element(z, z + V);
  double sum = 0.0;
  for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(z[v]) - top);
  return static_cast<double>(z[token]) - top - std::log(sum);
}

// The last seq_len tokens of a context: what the model sees of it.
std::span<const int32_t> window(const std::vector<int32_t>& context, int64_t T) {
  const int64_t n = std::min<int64_t>(T, static_cast<int64_t>(context.size()));
  return {context.data() + context.size() - n, static_cast<size_t>(n)};
}

// Without a cache: a full forward over each prompt's window for every token, one prompt at a time.
void generate_uncached(const model::ModelLayout& layout, model::ParamSource& params,
                       std::vector<std::vector<int32_t>>& contexts, const StopTokens& stop,
                       const SamplingOptions& options, const TokenCallback& on_token) {
  const model::ModelConfig& c = layout.config();
  const int64_t T = c.seq_len, V = c.vocab_size;
  model::Llama model(layout, 1, num_threads(), 0, options.bf16);
  Sampler sampler(V, options);
  std::vector<int32_t> padded(T, 0);
  std::vector<float> logits(T * V);
  for (size_t b = 0; b < contexts.size(); ++b) {
    for (int64_t i = 0; i < options.max_tokens; ++i) {
      // Positions after the last real token hold padding that causal attention keeps from it.
      const std::span<const int32_t> w = window(contexts[b], T);
      std::copy(w.begin(), w.end(), padded.begin());
      model.forward_logits(params, padded.data(), logits.data());
      const float* z = logits.data() + (w.size() - 1) * V;
      const int32_t next = sampler.next(z, static_cast<int64_t>(b), i);
      if (stop.contains(next)) break;
      contexts[b].push_back(next);
      on_token(static_cast<int64_t>(b), next, log_probability(z, V, next));
    }
  }
}

void generate_cached(const model::ModelLayout& layout, model::ParamSource& params,
                     std::vector<std::vector<int32_t>>& contexts, const StopTokens& stop,
                     const SamplingOptions& options, const TokenCallback& on_token, kernels::Backend& backend) {
  const model::ModelConfig& c = layout.config();
  const int64_t T = c.seq_len, V = c.vocab_size, B = static_cast<int64_t>(contexts.size());
  std::vector<std::span<const int32_t>> feed(B);
  int64_t longest = 0;
  for (int64_t b = 0; b < B; ++b) {
    feed[b] = window(contexts[b], T);
    longest = std::max<int64_t>(longest, static_cast<int64_t>(feed[b].size()));
  }
  // A cache as long as any context gets, up to seq_len.
  model::Decoder decoder(layout, B, std::min(T, longest + options.max_tokens), num_threads(), options.bf16, backend);
  Sampler sampler(V, options);
  std::vector<bool> done(B, false);
  const float* logits = decoder.append(params, feed);
  for (int64_t i = 0; i < options.max_tokens; ++i) {
    bool all_done = true;
    for (int64_t b = 0; b < B; ++b) {
      feed[b] = {};
      if (done[b]) continue;
      const int32_t next = sampler.next(logits + b * V, b, i);
      if (stop.contains(next)) {
        done[b] = true;
        continue;
      }
      contexts[b].push_back(next);
      on_token(b, next, log_probability(logits + b * V, V, next));
      all_done = false;
      if (decoder.length(b) < decoder.max_context()) {
        feed[b] = {&contexts[b].back(), 1};
      } else {  // at seq_len: the last seq_len tokens from position 0, as the uncached path runs them
        decoder.reset(b);
        feed[b] = window(contexts[b], T);
      }
    }
    if (all_done || i + 1 == options.max_tokens) break;
    logits = decoder.append(params, feed);
  }
}

}  // namespace

Sampler::Sampler(int64_t vocab, const SamplingOptions& options)
    : V_(vocab), options_(options), order_(vocab), probs_(vocab) {}

int32_t Sampler::next(const float* z, int64_t seq, int64_t i) {
  if (options_.temperature <= 0.0) return static_cast<int32_t>(std::max_element(z, z + V_) - z);
  std::iota(order_.begin(), order_.end(), 0);
  int64_t k = options_.top_k > 0 ? std::min(options_.top_k, V_) : V_;
  // Highest logits first; ties broken by id so the order is deterministic.
  std::partial_sort(order_.begin(), order_.begin() + k, order_.end(),
                    [&](int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); });
  const double top = z[order_[0]];
  double sum = 0.0;
  for (int64_t j = 0; j < k; ++j) sum += probs_[j] = std::exp((z[order_[j]] - top) / options_.temperature);
  if (options_.top_p < 1.0) {  // the nucleus: the fewest that hold top_p of the mass (top_p > 0: one at least)
    double kept = 0.0;
    int64_t n = 0;
    while (n < k && kept < options_.top_p * sum) kept += probs_[n++];
    k = n;
    sum = kept;
  }
  // One stream per prompt; prompt 0's is the stream single-prompt generation always used.
  const uint64_t stream = kStream ^ (static_cast<uint64_t>(seq) << 32);
  double u = rng::uniform(options_.seed, stream, static_cast<uint64_t>(i)) * sum;
  for (int64_t j = 0; j < k; ++j) {
    if ((u -= probs_[j]) <= 0.0) return order_[j];
  }
  return order_[k - 1];
}

std::vector<std::vector<int32_t>> generate(const model::ModelLayout& layout, model::ParamSource& params,
                                           const std::vector<std::vector<int32_t>>& prompts,
                                           const std::vector<int32_t>& stop_tokens, const SamplingOptions& options,
                                           const TokenCallback& on_token, kernels::Backend& backend) {
  CHECK(!prompts.empty());
  for (const std::vector<int32_t>& p : prompts) CHECK(!p.empty());
  std::vector<std::vector<int32_t>> contexts = prompts;
  const StopTokens stop(stop_tokens.begin(), stop_tokens.end());
  if (options.max_tokens > 0) {
    HeldParams held(params, layout.num_units());
    if (options.kv_cache) {
      generate_cached(layout, held, contexts, stop, options, on_token, backend);
    } else {
      CHECK_MSG(backend.device() == kernels::Device::kCpu, "generation without the cache runs on the CPU only");
      generate_uncached(layout, held, contexts, stop, options, on_token);
    }
  }
  std::vector<std::vector<int32_t>> out(prompts.size());
  for (size_t b = 0; b < prompts.size(); ++b) out[b].assign(contexts[b].begin() + prompts[b].size(), contexts[b].end());
  return out;
}

}  // namespace tessera::train
