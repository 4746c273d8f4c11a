// Llama model shape and its named presets.
#include "model/model_config.h"

#include <cmath>
#include <numbers>

namespace tessera::model {
namespace {

struct Preset {
  const char* name;
  int64_t vocab, dim, layers, heads, kv_heads, ffn, seq;
};

constexpr Preset kPresets[] = {
    // ~5M parameters: learns the bundled corpus in minutes on two cores.
    {"default", 4096, 256, 4, 8, 4, 688, 256},
    {"tiny", 512, 64, 2, 4, 2, 192, 64},
    {"bench", 32000, 512, 8, 8, 8, 1408, 512},
    // ~0.89B parameters, for GPU benchmarks (BENCHMARKS.md).
    {"gpu-1b", 32000, 2048, 16, 16, 8, 5632, 2048},
    {"llama2-7b", 32000, 4096, 32, 32, 32, 11008, 4096},
    {"llama2-13b", 32000, 5120, 40, 40, 40, 13824, 4096},
    {"llama2-70b", 32000, 8192, 80, 64, 8, 28672, 4096},
};

}  // namespace

std::vector<double> rope_inv_freq(const ModelConfig& c) {
  const int64_t D = c.head_dim();
  // theta through float, as the table was always computed (bitwise the same tables as before).
  const double theta = static_cast<float>(c.rope_theta);
  std::vector<double> inv_freq(static_cast<size_t>(D / 2));
  for (int64_t i = 0; i < D / 2; ++i) inv_freq[static_cast<size_t>(i)] = std::pow(theta, -2.0 * i / D);
  if (c.rope_scaling == RopeScaling::kNone) return inv_freq;
  // Llama 3.1's scaling, as transformers' _compute_llama3_parameters computes it.
  const double old_len = static_cast<double>(c.rope_original_seq_len);
  const double low_wavelen = old_len / c.rope_low_freq_factor, high_wavelen = old_len / c.rope_high_freq_factor;
  for (double& f : inv_freq) {
    const double wavelen = 2.0 * std::numbers::pi / f;
    if (wavelen > low_wavelen) {
      f /= c.rope_scaling_factor;  // low frequencies: stretched
    } else if (wavelen >= high_wavelen) {
      const double smooth =
          (old_len / wavelen - c.rope_low_freq_factor) / (c.rope_high_freq_factor - c.rope_low_freq_factor);
      f = (1.0 - smooth) * f / c.rope_scaling_factor + smooth * f;
    }  // high frequencies: kept
  }
  return inv_freq;
}

bool model_preset(std::string_view name, ModelConfig* out) {
  for (const Preset& p : kPresets) {
    if (name == p.name) {
      ModelConfig c;
      c.preset = p.name;
      c.vocab_size = p.vocab;
      c.dim = p.dim;
      c.n_layers = p.layers;
      c.n_heads = p.heads;
      c.n_kv_heads = p.kv_heads;
      c.ffn_hidden = p.ffn;
      c.seq_len = p.seq;
      *out = c;
      return true;
    }
  }
  return false;
}

int64_t bench_micro_batch(std::string_view preset) { return preset == "gpu-1b" ? 8 : 4; }

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

namespace {
int64_t block_parameter_count(const ModelConfig& c) {
  return c.dim * c.qkv_dim() + c.n_heads * c.head_dim() * c.dim + 3 * c.dim * c.ffn_hidden + 2 * c.dim;
}
int64_t head_parameter_count(const ModelConfig& c) { return c.dim + c.vocab_size * c.dim; }  // final norm, LM head
}  // namespace

int64_t matmul_parameter_count(const ModelConfig& c) {
  return c.n_layers * block_parameter_count(c) + head_parameter_count(c);
}

ShapeTotals shape_totals(const ModelConfig& c) {
  const auto d = [](int64_t v) { return static_cast<double>(v); };
  const double qkv = (d(c.n_heads) + 2 * d(c.n_kv_heads)) * d(c.head_dim());
  const double block = d(c.dim) * qkv + d(c.dim) * d(c.dim) + 3 * d(c.dim) * d(c.ffn_hidden) + 2 * d(c.dim);
  return {d(c.n_layers) * block + d(c.dim) + 2 * d(c.vocab_size) * d(c.dim), d(c.n_layers) * d(c.seq_len) * d(c.dim)};
}

int64_t parameter_count(const ModelConfig& c) {
  // The embedding table counts separately unless the head shares it.
  return matmul_parameter_count(c) + (c.tied_embeddings ? 0 : c.vocab_size * c.dim);
}

double block_flops_per_token(const ModelConfig& c) {
  return 6.0 * static_cast<double>(block_parameter_count(c)) + 12.0 * static_cast<double>(c.seq_len * c.dim);
}

double head_flops_per_token(const ModelConfig& c) { return 6.0 * static_cast<double>(head_parameter_count(c)); }

double flops_per_token(const ModelConfig& c) {
  return static_cast<double>(c.n_layers) * block_flops_per_token(c) + head_flops_per_token(c);
}

}  // namespace tessera::model
