// Llama model shape and its named presets (BENCHMARKS.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::model {

// How the rotary frequencies are scaled. kLlama3: Llama 3.1's long-context scaling (transformers'
// rope_type "llama3"): wavelengths longer than original_seq_len / low_freq_factor are stretched
// by `factor`, those shorter than original_seq_len / high_freq_factor kept, and the ones between
// blended smoothly.
enum class RopeScaling { kNone, kLlama3 };

// Shape letters used across the model: B batch, T sequence, C dim, H query heads, Hkv key/value
// heads, D head dim (C/H), F SwiGLU hidden, V vocabulary, L layers, N = B*T rows.
struct ModelConfig {
  std::string preset = "default";
  int64_t vocab_size = 0;
  int64_t dim = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t ffn_hidden = 0;
  int64_t seq_len = 0;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling = RopeScaling::kNone;
  double rope_scaling_factor = 8.0;  // the rope_scaling = "llama3" keys, at Llama 3.1's values
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int64_t rope_original_seq_len = 8192;
  double norm_eps = 1e-5;
  bool tied_embeddings = false;
  double init_std = 0.02;
  // Not part of the shape: fp32 GEMMs on a GPU may run on TF32 tensor cores (10-bit mantissa
  // inputs, fp32 accumulation), as torch.backends.cuda.matmul.allow_tf32. Off by default.
  bool allow_tf32 = false;

  int64_t head_dim() const { return dim / n_heads; }
  int64_t qkv_dim() const { return (n_heads + 2 * n_kv_heads) * head_dim(); }
};

// The D/2 rotary frequencies of a head (D = head_dim()): theta^(-2i/D), scaled per rope_scaling.
std::vector<double> rope_inv_freq(const ModelConfig& c);

// The model shape of a preset; false when the name is unknown.
bool model_preset(std::string_view name, ModelConfig* out);
std::vector<std::string> model_preset_names();
// The micro-batch per rank that benchmarks run a preset at (BENCHMARKS.md): 8 for gpu-1b, 4 otherwise.
int64_t bench_micro_batch(std::string_view preset);

// Counts derived from the shape (parameters, FLOPs, the layout's offsets, activation sizes) are
// int64 products of its positive sizes. A shape whose parameter count and L x T x C stay under
// kMaxShapeCount, computed in double, keeps every partial product in range; a shape read from
// outside (config, Hugging Face) is refused otherwise.
constexpr double kMaxShapeCount = 0x1p62;
struct ShapeTotals {
  double parameters;   // as parameter_count, with tied embeddings counted twice
  double layer_cells;  // L x T x C
};
ShapeTotals shape_totals(const ModelConfig& c);

// Parameters, and those BENCHMARKS.md counts for model FLOPs: everything but the embedding table.
int64_t parameter_count(const ModelConfig& c);
int64_t matmul_parameter_count(const ModelConfig& c);
// Model FLOPs per trained token: 6 x matmul params + 12 x L x T x C (attention scores and values),
// the sum of L blocks' and the head's:
double flops_per_token(const ModelConfig& c);
double block_flops_per_token(const ModelConfig& c);  // 6 x one block's matmul params + 12 T C
double head_flops_per_token(const ModelConfig& c);   // 6 x (C + V C): the final norm and LM head

}  // namespace tessera::model
