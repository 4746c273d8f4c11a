// Parameter layout: the model's tensors grouped into units (embedding; each block; final norm +
// LM head), each unit one flat buffer that sharding slices. Tensors are named as in Meta's Llama
// checkpoints and live at fixed offsets in their unit.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/model_config.h"

namespace tessera::model {

// Tensor parallelism, Megatron-LM's split: rank `rank` of a tensor-parallel group of `size`
// holds block `rank` of every split tensor, cut evenly along one dimension. Column-parallel
// matrices (wq, wk, wv by heads; w1, w3 by hidden units) are cut along their outputs (dim 0), so
// a rank computes its heads or hidden units whole; row-parallel ones (wo, w2) along their inputs
// (dim 1), so each rank's product is a partial sum that the tp group all-reduces. The embedding
// and the LM head are cut along the vocabulary (dim 0); norm gains are replicated.
// sequence: Megatron-LM's sequence parallelism on top (the model's business only: the parameters
// are cut the same). The residual stream and the norms hold 1/size of the rows (tokens), rank r
// rows [r N/size, (r+1) N/size); a column-parallel product's input is all-gathered and a
// row-parallel product is reduce-scattered instead of all-reduced (llama.h). No effect at size 1.
struct TensorParallel {
  int size = 1, rank = 0;
  bool sequence = false;
};

// Pipeline parallelism: stage `rank` of `size` holds `layers` consecutive blocks from
// first_layer, the first stage also the embedding and the last the final norm and LM head
// (layers = -1: every block, one stage).
struct PipelineStage {
  int size = 1, rank = 0;
  int64_t first_layer = 0, layers = -1;
  bool first() const { return rank == 0; }
  bool last() const { return rank == size - 1; }
};
// Blocks per stage, balanced by cost: a block's FLOPs per token, the LM head's on the last stage
// (block_flops_per_token, head_flops_per_token; the embedding's lookup is free), contiguous, each
// stage at least one block, the largest stage cost as small as can be.
std::vector<int64_t> balanced_stage_layers(const ModelConfig& config, int stages);
// Blocks per stage: `layers` when given, else balanced_stage_layers.
std::vector<int64_t> stage_layers(const ModelConfig& config, int stages, const std::vector<int64_t>& layers);
// Stage `rank` of `stages`: `layers` blocks per stage when given (one count per stage, each at
// least 1, adding up to n_layers: config validation names parallel.pipeline_layers), as
// balanced_stage_layers cuts them otherwise.
PipelineStage pipeline_stage(const ModelConfig& config, int stages, int rank, const std::vector<int64_t>& layers = {});

struct TensorSpec {
  std::string name;                 // e.g. "layers.3.attention.wq.weight"
  std::vector<int64_t> shape;       // this rank's block; row-major; linear weights are (out, in)
  int64_t offset = 0;               // in floats from the start of the unit's buffer
  bool decay = false;               // weight decay applies (matrices, not norm gains)
  int split_dim = -1;               // the dimension cut among tensor-parallel ranks; -1: replicated
  std::vector<int64_t> full_shape;  // the whole tensor (shape when not split or tp = 1)
  int64_t full_offset = 0;          // the whole tensor's offset in the unit at tp = 1
  int64_t numel() const;
  int64_t full_numel() const;
};

// Rank `rank`'s block of a whole tensor (spec.full_shape) into `block` (spec.numel() floats), and
// back; a replicated tensor's block is the whole tensor.
void copy_block_out(const TensorSpec& spec, int rank, const float* whole, float* block);
void copy_block_in(const TensorSpec& spec, int rank, const float* block, float* whole);
// Rank `rank`'s block as contiguous runs: floats [block, block + count) of the block are
// [whole, whole + count) of the whole tensor (one run for a replicated tensor or a cut along
// dim 0, one per row for a cut along dim 1).
struct BlockRun {
  int64_t whole, block, count;
};
std::vector<BlockRun> block_runs(const TensorSpec& spec, int rank);
// Rank `rank`'s block of `spec` as pieces of the blocks of the same tensor cut among `from_size`
// ranks instead (a checkpoint saved at another tensor-parallel size): floats [to, to + count) of
// the block are [from, from + count) of rank from_rank's block. A replicated tensor is one piece
// of rank 0's. from_size must divide the split dimension.
struct Reblock {
  int from_rank;
  int64_t from, to, count;
};
std::vector<Reblock> reblock(const TensorSpec& spec, int rank, int from_size);

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

// The sizes tensor parallelism divides, as one rank holds them.
struct LocalSizes {
  int64_t heads, kv_heads, ffn_hidden, vocab;
  int64_t vocab_begin;  // the first token id of this rank's vocabulary block
};

class ModelLayout {
 public:
  // pad_multiple: every unit's buffer length is a multiple of it (16 x shard group size).
  // tp: this rank's place in its tensor-parallel group; its size must divide the query and
  // key/value heads, the hidden units and the vocabulary (CHECKed here; config validation names
  // the keys).
  // stage: the pipeline stage whose units this layout holds (all of them by default); unit
  // indices are local to it, unit names global ("block.7").
  ModelLayout(const ModelConfig& config, int64_t pad_multiple = 16, TensorParallel tp = {}, PipelineStage stage = {});

  const ModelConfig& config() const { return config_; }
  const TensorParallel& tensor_parallel() const { return tp_; }
  const PipelineStage& stage() const { return stage_; }
  const LocalSizes& local() const { return local_; }
  const std::vector<UnitLayout>& units() const { return units_; }
  int num_units() const { return static_cast<int>(units_.size()); }
  // This stage's blocks: first_layer() + i for i < num_layers().
  int64_t first_layer() const { return stage_.first_layer; }
  int64_t num_layers() const { return stage_.layers; }
  bool has_embedding() const { return stage_.first(); }
  bool has_head() const { return stage_.last(); }
  // The embedding's unit: 0 on the first stage, the tied copy's (num_units()) on a last stage
  // that has one; nothing elsewhere.
  int embedding_unit() const { return has_embedding() ? 0 : num_units(); }
  // Tied embeddings under pipeline parallelism: the last stage's copy of the embedding unit, which
  // its LM head reads (null elsewhere). Not one of units(), so never saved, gathered or counted
  // in the gradient norm: the first stage owns and trains the table, the copy's gradient joins
  // the table's and the copy gets the table's values after each update (fsdp::ShardedParams). A
  // ParamSource serves it as unit num_units().
  const UnitLayout* tied_copy() const { return tied_copy_.has_value() ? &*tied_copy_ : nullptr; }
  // units()[unit], or the tied copy at num_units().
  const UnitLayout& unit(int unit) const;
  // The unit of this stage's i-th block (block first_layer() + i).
  int block_unit(int64_t i) const { return static_cast<int>((has_embedding() ? 1 : 0) + i); }
  int head_unit() const { return num_units() - 1; }  // has_head() only
  // A unit's index in the whole model's layout (embedding 0, block l at 1 + l, head last): what
  // initialization draws by.
  // The tied copy draws as the embedding (0).
  int global_unit(int unit) const {
    if (unit == num_units()) return 0;
    return static_cast<int>(unit + (has_embedding() ? 0 : 1 + first_layer()));
  }
  const BlockOffsets& block() const { return block_; }
  int64_t head_norm_offset() const { return head_norm_; }
  int64_t head_weight_offset() const { return head_weight_; }  // -1 when tied to the embedding
  int64_t total_padded() const;

 private:
  ModelConfig config_;
  TensorParallel tp_;
  PipelineStage stage_;
  LocalSizes local_{};
  std::vector<UnitLayout> units_;
  std::optional<UnitLayout> tied_copy_;
  BlockOffsets block_{};
  int64_t head_norm_ = 0, head_weight_ = -1;
};

}  // namespace tessera::model
