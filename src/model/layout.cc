// Parameter layout: units of named tensors over flat buffers.
#include "model/layout.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/check.h"

namespace tessera::model {
namespace {

constexpr int kReplicated = -1;

int64_t product(const std::vector<int64_t>& shape, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t i = begin; i < end; ++i) n *= shape[i];
  return n;
}

class UnitBuilder {
 public:
  UnitBuilder(std::string name, int tp_size) : tp_size_(tp_size) { unit_.name = std::move(name); }
  // A tensor of `full_shape`, of which this rank holds 1 / tp_size along `split_dim`.
  int64_t add(std::string name, std::vector<int64_t> full_shape, bool decay, int split_dim = kReplicated) {
    std::vector<int64_t> shape = full_shape;
    if (split_dim != kReplicated) {
      CHECK(shape[split_dim] % tp_size_ == 0);
      shape[split_dim] /= tp_size_;
    }
    TensorSpec t{std::move(name), std::move(shape), unit_.numel, decay, split_dim, std::move(full_shape), full_numel_};
    unit_.numel += t.numel();
    full_numel_ += t.full_numel();
    unit_.tensors.push_back(std::move(t));
    return unit_.tensors.back().offset;
  }
  UnitLayout finish(int64_t pad_multiple) {
    unit_.padded = (unit_.numel + pad_multiple - 1) / pad_multiple * pad_multiple;
    return std::move(unit_);
  }

 private:
  int tp_size_;
  UnitLayout unit_;
  int64_t full_numel_ = 0;  // the unit's floats at tp = 1 so far
};

// Calls copy(whole_offset, block_offset, floats) for each contiguous run of rank's block.
template <typename Copy>
void for_each_block_run(const TensorSpec& spec, int rank, Copy copy) {
  if (spec.split_dim == kReplicated) {
    copy(0, 0, spec.numel());
    return;
  }
  const auto d = static_cast<size_t>(spec.split_dim);
  const int64_t outer = product(spec.full_shape, 0, d), inner = product(spec.full_shape, d + 1, spec.full_shape.size());
  const int64_t full_len = spec.full_shape[d], len = spec.shape[d], run = len * inner;
  for (int64_t o = 0; o < outer; ++o) copy((o * full_len + rank * len) * inner, o * run, run);
}

}  // namespace

int64_t TensorSpec::numel() const { return product(shape, 0, shape.size()); }
int64_t TensorSpec::full_numel() const { return product(full_shape, 0, full_shape.size()); }

void copy_block_out(const TensorSpec& spec, int rank, const float* whole, float* block) {
  for_each_block_run(spec, rank, [&](int64_t w, int64_t b, int64_t n) { std::copy_n(whole + w, n, block + b); });
}

void copy_block_in(const TensorSpec& spec, int rank, const float* block, float* whole) {
  for_each_block_run(spec, rank, [&](int64_t w, int64_t b, int64_t n) { std::copy_n(block + b, n, whole + w); });
}

std::vector<BlockRun> block_runs(const TensorSpec& spec, int rank) {
  std::vector<BlockRun> runs;
  for_each_block_run(spec, rank, [&](int64_t w, int64_t b, int64_t n) { runs.push_back({w, b, n}); });
  return runs;
}

std::vector<Reblock> reblock(const TensorSpec& spec, int rank, int from_size) {
  if (spec.split_dim == kReplicated) return {{0, 0, 0, spec.numel()}};
  const auto d = static_cast<size_t>(spec.split_dim);
  const int64_t outer = product(spec.full_shape, 0, d), inner = product(spec.full_shape, d + 1, spec.full_shape.size());
  const int64_t len = spec.shape[d];
  CHECK(spec.full_shape[d] % from_size == 0);
  const int64_t from_len = spec.full_shape[d] / from_size;
  std::vector<Reblock> out;
  for (int64_t o = 0; o < outer; ++o) {
    // Indices [rank len, (rank + 1) len) along the split dimension, cut where the from-blocks end.
    for (int64_t j = rank * len; j < (rank + 1) * len;) {
      const int r = static_cast<int>(j / from_len);
      const int64_t stop = std::min((rank + 1) * len, (r + 1) * from_len);
      out.push_back(
          {r, (o * from_len + j - r * from_len) * inner, (o * len + j - rank * len) * inner, (stop - j) * inner});
      j = stop;
    }
  }
  return out;
}

const TensorSpec& UnitLayout::tensor(const std::string& tensor_name) const {
  for (const TensorSpec& t : tensors) {
    if (t.name == tensor_name) return t;
  }
  CHECK_MSG(false, tensor_name.c_str());
}

std::vector<int64_t> balanced_stage_layers(const ModelConfig& c, int stages) {
  CHECK(stages >= 1 && stages <= c.n_layers);
  // The FLOPs MFU counts (model_config.h): a block's, and the final norm and LM head's.
  const double block = block_flops_per_token(c), head = head_flops_per_token(c);
  const int64_t L = c.n_layers;
  // best[s][l]: the smallest largest-stage cost of the first l blocks in s stages (the head on
  // the last stage overall, added when s == stages).
  const double kInf = 1e300;
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(L + 1, kInf));
  std::vector<std::vector<int64_t>> cut(stages + 1, std::vector<int64_t>(L + 1, 0));
  best[0][0] = 0;
  for (int s = 1; s <= stages; ++s) {
    for (int64_t l = s; l <= L; ++l) {
      for (int64_t k = s - 1; k < l; ++k) {  // stage s holds blocks [k, l)
        const double cost = static_cast<double>(l - k) * block + (s == stages ? head : 0.0);
        const double worst = std::max(best[s - 1][k], cost);
        if (worst < best[s][l]) best[s][l] = worst, cut[s][l] = k;
      }
    }
  }
  std::vector<int64_t> layers(stages);
  for (int64_t s = stages, l = L; s >= 1; l = cut[s][l], --s) layers[s - 1] = l - cut[s][l];
  return layers;
}

std::vector<int64_t> stage_layers(const ModelConfig& c, int stages, const std::vector<int64_t>& layers) {
  return layers.empty() ? balanced_stage_layers(c, stages) : layers;
}

PipelineStage pipeline_stage(const ModelConfig& c, int stages, int rank, const std::vector<int64_t>& given) {
  const std::vector<int64_t> layers = stage_layers(c, stages, given);
  CHECK(std::ssize(layers) == stages && rank >= 0 && rank < stages);
  int64_t first = 0;
  for (int s = 0; s < rank; ++s) first += layers[s];
  return {stages, rank, first, layers[rank]};
}

ModelLayout::ModelLayout(const ModelConfig& c, int64_t pad_multiple, TensorParallel tp, PipelineStage stage)
    : config_(c), tp_(tp), stage_(stage) {
  CHECK(pad_multiple > 0 && tp.size > 0 && tp.rank >= 0 && tp.rank < tp.size);
  if (stage_.layers < 0) stage_ = {1, 0, 0, c.n_layers};
  CHECK(stage_.size >= 1 && stage_.rank >= 0 && stage_.rank < stage_.size && stage_.first_layer >= 0 &&
        stage_.layers >= 1 && stage_.first_layer + stage_.layers <= c.n_layers);
  CHECK((stage_.rank == 0) == (stage_.first_layer == 0));
  CHECK((stage_.rank == stage_.size - 1) == (stage_.first_layer + stage_.layers == c.n_layers));
  const int64_t T = tp.size;
  CHECK(c.n_heads % T == 0 && c.n_kv_heads % T == 0 && c.ffn_hidden % T == 0 && c.vocab_size % T == 0);
  local_ = {c.n_heads / T, c.n_kv_heads / T, c.ffn_hidden / T, c.vocab_size / T, tp.rank * (c.vocab_size / T)};
  const int64_t C = c.dim, D = c.head_dim(), F = c.ffn_hidden;
  constexpr int kOut = 0, kIn = 1;  // column-parallel: outputs cut; row-parallel: inputs cut
  auto embedding = [&] {
    UnitBuilder emb("embedding", tp.size);
    emb.add("tok_embeddings.weight", {c.vocab_size, C}, true, kOut);
    return emb.finish(pad_multiple);
  };
  if (has_embedding()) units_.push_back(embedding());

  for (int64_t l = stage_.first_layer; l < stage_.first_layer + stage_.layers; ++l) {
    // Matrices first, in the order the fused GEMMs read them: wq|wk|wv is one (qkv_dim, C)
    // matrix and w1|w3 one (2F, C) matrix.
    UnitBuilder b(fmt::format("block.{}", l), tp.size);
    const std::string p = fmt::format("layers.{}.", l);
    BlockOffsets o{};
    o.wqkv = b.add(p + "attention.wq.weight", {c.n_heads * D, C}, true, kOut);
    b.add(p + "attention.wk.weight", {c.n_kv_heads * D, C}, true, kOut);
    b.add(p + "attention.wv.weight", {c.n_kv_heads * D, C}, true, kOut);
    o.wo = b.add(p + "attention.wo.weight", {C, c.n_heads * D}, true, kIn);
    o.w13 = b.add(p + "feed_forward.w1.weight", {F, C}, true, kOut);
    b.add(p + "feed_forward.w3.weight", {F, C}, true, kOut);
    o.w2 = b.add(p + "feed_forward.w2.weight", {C, F}, true, kIn);
    o.attention_norm = b.add(p + "attention_norm.weight", {C}, false);
    o.ffn_norm = b.add(p + "ffn_norm.weight", {C}, false);
    block_ = o;
    units_.push_back(b.finish(pad_multiple));
  }

  if (has_head()) {
    if (c.tied_embeddings && !has_embedding()) tied_copy_ = embedding();
    UnitBuilder head("head", tp.size);
    if (!c.tied_embeddings) head_weight_ = head.add("output.weight", {c.vocab_size, C}, true, kOut);
    head_norm_ = head.add("norm.weight", {C}, false);
    units_.push_back(head.finish(pad_multiple));
  }
}

const UnitLayout& ModelLayout::unit(int unit) const {
  if (unit == num_units() && tied_copy_.has_value()) return *tied_copy_;
  CHECK(unit >= 0 && unit < num_units());
  return units_[unit];
}

int64_t ModelLayout::total_padded() const {
  int64_t n = 0;
  for (const UnitLayout& u : units_) n += u.padded;
  return n;
}

}  // namespace tessera::model
