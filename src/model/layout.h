// Parameter layout: the model's tensors grouped into units (embedding; each block; final norm +
// LM head), each unit one flat buffer that sharding slices. Tensors are named as in Meta's Llama
// checkpoints and live at fixed offsets in their unit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/model_config.h"

namespace tessera::model {

struct TensorSpec {
  std::string name;             // e.g. "layers.3.attention.wq.weight"
  std::vector<int64_t> shape;   // row-major; linear weights are (out, in)
  int64_t offset = 0;           // in floats from the start of the unit's buffer
  bool decay = false;           // weight decay applies (matrices, not norm gains)
  int64_t numel() const;
};

struct UnitLayout {
  std::string name;  // "embedding", "block.3", "head"
  std::vector<TensorSpec> tensors;
  int64_t numel = 0;       // sum of tensor sizes
  int64_t padded = 0;      // numel rounded up to the padding multiple
  const TensorSpec& tensor(const std::string& name) const;
};

// Offsets of a block's tensors, identical in every block.
struct BlockOffsets {
  int64_t wqkv, wo, w13, w2, attention_norm, ffn_norm;
};

class ModelLayout {
 public:
  // pad_multiple: every unit's buffer length is a multiple of it (16 x shard group size).
  ModelLayout(const ModelConfig& config, int64_t pad_multiple = 16);

  const ModelConfig& config() const { return config_; }
  const std::vector<UnitLayout>& units() const { return units_; }
  int num_units() const { return static_cast<int>(units_.size()); }
  int embedding_unit() const { return 0; }
  int block_unit(int64_t layer) const { return static_cast<int>(1 + layer); }
  int head_unit() const { return num_units() - 1; }
  const BlockOffsets& block() const { return block_; }
  int64_t head_norm_offset() const { return head_norm_; }
  int64_t head_weight_offset() const { return head_weight_; }  // -1 when tied to the embedding
  int64_t total_padded() const;

 private:
  ModelConfig config_;
  std::vector<UnitLayout> units_;
  BlockOffsets block_{};
  int64_t head_norm_ = 0, head_weight_ = -1;
};

}  // namespace tessera::model
