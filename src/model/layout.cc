// Parameter layout: units of named tensors over flat buffers.
#include "model/layout.h"

#include <fmt/format.h>

#include "core/check.h"

namespace tessera::model {
namespace {

class UnitBuilder {
 public:
  explicit UnitBuilder(std::string name) { unit_.name = std::move(name); }
  int64_t add(std::string name, std::vector<int64_t> shape, bool decay) {
    TensorSpec t{std::move(name), std::move(shape), unit_.numel, decay};
    unit_.numel += t.numel();
    unit_.tensors.push_back(std::move(t));
    return unit_.tensors.back().offset;
  }
  UnitLayout finish(int64_t pad_multiple) {
    unit_.padded = (unit_.numel + pad_multiple - 1) / pad_multiple * pad_multiple;
    return std::move(unit_);
  }

 private:
  UnitLayout unit_;
};

}  // namespace

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const TensorSpec& UnitLayout::tensor(const std::string& tensor_name) const {
  for (const TensorSpec& t : tensors) {
    if (t.name == tensor_name) return t;
  }
  CHECK_MSG(false, tensor_name.c_str());
}

ModelLayout::ModelLayout(const ModelConfig& c, int64_t pad_multiple) : config_(c) {
  CHECK(pad_multiple > 0);
  const int64_t C = c.dim, D = c.head_dim(), F = c.ffn_hidden;
  UnitBuilder emb("embedding");
  emb.add("tok_embeddings.weight", {c.vocab_size, C}, true);
  units_.push_back(emb.finish(pad_multiple));

  for (int64_t l = 0; l < c.n_layers; ++l) {
    // Matrices first, in the order the fused GEMMs read them: wq|wk|wv is one (qkv_dim, C)
    // matrix and w1|w3 one (2F, C) matrix.
    UnitBuilder b(fmt::format("block.{}", l));
    const std::string p = fmt::format("layers.{}.", l);
    BlockOffsets o{};
    o.wqkv = b.add(p + "attention.wq.weight", {c.n_heads * D, C}, true);
    b.add(p + "attention.wk.weight", {c.n_kv_heads * D, C}, true);
    b.add(p + "attention.wv.weight", {c.n_kv_heads * D, C}, true);
    o.wo = b.add(p + "attention.wo.weight", {C, c.n_heads * D}, true);
    o.w13 = b.add(p + "feed_forward.w1.weight", {F, C}, true);
    b.add(p + "feed_forward.w3.weight", {F, C}, true);
    o.w2 = b.add(p + "feed_forward.w2.weight", {C, F}, true);
    o.attention_norm = b.add(p + "attention_norm.weight", {C}, false);
    o.ffn_norm = b.add(p + "ffn_norm.weight", {C}, false);
    block_ = o;
    units_.push_back(b.finish(pad_multiple));
  }

  UnitBuilder head("head");
  if (!c.tied_embeddings) head_weight_ = head.add("output.weight", {c.vocab_size, C}, true);
  head_norm_ = head.add("norm.weight", {C}, false);
  units_.push_back(head.finish(pad_multiple));
}

int64_t ModelLayout::total_padded() const {
  int64_t n = 0;
  for (const UnitLayout& u : units_) n += u.padded;
  return n;
}

}  // namespace tessera::model
