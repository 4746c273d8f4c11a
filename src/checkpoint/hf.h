// Hugging Face Llama interop: Tessera's Meta-named tensors to and from a transformers
// LlamaForCausalLM directory (config.json + model.safetensors, or shards + index).
//
// Tessera rotates channel pairs (2i, 2i+1) of each head (Meta's layout, kernels/ref/rope.h);
// transformers rotates channels (i, i + D/2) ("rotate_half"). The two agree when the rows of the
// q and k projections are permuted per head, as transformers' convert_llama_weights_to_hf does:
// HF row h*D + j*D/2 + i holds Meta row h*D + 2i + j (j in {0, 1}, i < D/2). q and k get the same
// permutation, so their dot products, and the logits, are unchanged; v and o are not permuted.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "model/model_config.h"

namespace tessera::checkpoint {

struct HfExportOptions {
  // Tensors go into model-0000i-of-0000n.safetensors files of at most this many bytes (a tensor
  // larger than the limit gets a file of its own) plus model.safetensors.index.json; everything
  // in one model.safetensors when it fits. transformers' default is 5 GB.
  uint64_t max_shard_bytes = 5'000'000'000;
  int64_t bos_token_id = -1;  // -1: unknown, left out of config.json
  int64_t eos_token_id = -1;
  // F32 (exact), or BF16 (each weight rounded to nearest even: half the bytes, as Llama
  // checkpoints are published); config.json's torch_dtype says which.
  StoredDtype dtype = StoredDtype::kF32;
};

// Writes config.json and the weights (options.dtype) into `dir`, creating it. `tensors` are Tessera's, named
// as model::ModelLayout(config) names them (ShardedParams::gather_named_tensors()); `origin` names
// them in errors. Throws DataError naming the tensor that is missing or has another shape,
// ConfigError when `dir` already holds an export, IoError when a file cannot be written.
void export_hf(const model::ModelConfig& config, const std::vector<NamedTensor>& tensors, const std::string& origin,
               const std::string& dir, const HfExportOptions& options = {});

struct HfModel {
  model::ModelConfig config;         // seq_len = max_position_embeddings
  std::vector<NamedTensor> tensors;  // Tessera names, in layout order, fp32
  int64_t bos_token_id = -1;         // -1 when config.json does not say
  int64_t eos_token_id = -1;
};

// Reads an HF Llama directory: config.json and model.safetensors or model.safetensors.index.json
// with the files it names (F32, BF16 or F16). Throws DataError naming the file and the key or
// tensor: a missing or malformed file, key or tensor, a tensor of the wrong shape, a tensor the
// model has no place for (biases), or a config Tessera cannot compute exactly (rotary scalings
// other than Llama 3.1's "llama3", partial rotary embeddings, attention or MLP bias, an activation
// other than silu, a head_dim other than hidden/heads). The rotary base and scaling are read as
// transformers 4 (rope_theta, rope_scaling) and 5 (rope_parameters) write them.
HfModel import_hf(const std::string& dir);

// The pieces of the above, for tests and for callers that hold the data already.
// config.json's content for a model.
std::string hf_config_json(const model::ModelConfig& config, const HfExportOptions& options = {});
// config.json's content to a ModelConfig; `origin` (the file) names it in errors.
HfModel hf_config_from_json(const std::string& json_text, const std::string& origin);
// Tessera tensors to HF names and row order, in HF's order (embedding, layers, norm, lm_head).
std::vector<NamedTensor> to_hf_tensors(const model::ModelConfig& config, const std::vector<NamedTensor>& tensors,
                                       const std::string& origin);

}  // namespace tessera::checkpoint
