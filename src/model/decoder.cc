// Llama inference with a key/value cache: llama.cc's forward for new rows only.
#include "model/decoder.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "core/error.h"
#include "core/threads.h"

namespace tessera::model {

int64_t Decoder::pass_rows(int64_t batch, int64_t max_context) {
  // Enough rows for a step of every sequence; a longer prefill runs in passes of this many rows
  // (the cache carries one pass into the next), which bounds the activations of a long prompt.
  return std::max(batch, std::min(batch * max_context, kMaxPassRows));
}

void Decoder::plan(Arena& arena, Buffers& b, const ModelLayout& layout, int64_t B, int64_t Tc, int threads, bool bf16,
                   const kernels::Backend& backend) {
  const ModelConfig& c = layout.config();
  const int64_t C = c.dim, F = c.ffn_hidden, H = c.n_heads, D = c.head_dim(), KV = c.n_kv_heads * D;
  const int64_t P = pass_rows(B, Tc), L = c.n_layers, V = c.vocab_size;
  auto take = [&](int64_t n) { return arena.take<float>(static_cast<size_t>(n)); };
  b.x = take(P * C);
  b.xn = take(P * C);
  b.rstd = take(P);
  b.qkv = take(P * c.qkv_dim());
  b.att = take(P * H * D);
  b.h13 = take(P * 2 * F);
  b.g = take(P * F);
  b.k_cache = take(L * B * Tc * KV);
  b.v_cache = take(L * B * Tc * KV);
  b.rope = take(c.seq_len * D);
  b.attn_ws = take(backend.attention_cached_workspace_floats(Tc, threads));
  b.last = take(B * C);
  b.logits = take(B * V);
  b.pass_out = take(B * V);
  b.tokens = arena.take<int32_t>(static_cast<size_t>(P));
  b.rows = arena.take<int64_t>(static_cast<size_t>(B + 1));
  b.start = arena.take<int64_t>(static_cast<size_t>(B));
  if (bf16) {
    b.x16 = arena.take<uint16_t>(static_cast<size_t>(P * std::max({C, H * D, F})));
    b.norm_w = take(C);
  }
}

size_t Decoder::planned_bytes(const ModelLayout& layout, int64_t batch, int64_t max_context, int threads, bool bf16,
                              const kernels::Backend& backend) {
  Arena measure;
  Buffers b;
  plan(measure, b, layout, batch, max_context, threads, bf16, backend);
  return measure.used();
}

namespace {
const ModelLayout& whole_model(const ModelLayout& layout) {
  if (layout.tensor_parallel().size > 1 || layout.stage().size > 1) {
    throw ConfigError(
        "generation runs the whole model in one process: tensor and pipeline parallel layouts are not supported");
  }
  return layout;
}
}  // namespace

Decoder::Decoder(const ModelLayout& layout, int64_t batch, int64_t max_context, int threads, bool bf16,
                 kernels::Backend& backend)
    : layout_(whole_model(layout)),
      B_(batch),
      Tc_(max_context),
      P_(pass_rows(batch, max_context)),
      V_(layout.config().vocab_size),
      threads_(threads),
      bf16_(bf16),
      be_(backend),
      memory_(backend.allocate(planned_bytes(layout, batch, max_context, threads, bf16, backend))),
      arena_(memory_.get(), planned_bytes(layout, batch, max_context, threads, bf16, backend)),
      host_tokens_(P_),
      host_rows_(batch + 1),
      host_start_(batch),
      host_logits_(batch * V_),
      length_(batch, 0),
      taken_(batch, 0),
      spans_(batch) {
  const ModelConfig& c = layout_.config();
  CHECK(batch > 0 && threads > 0);
  CHECK_MSG(max_context > 0 && max_context <= c.seq_len, "the cache holds 1 to seq_len positions");
  plan(arena_, b_, layout_, B_, Tc_, threads_, bf16_, be_);
  kernels::write_rope_table(be_, b_.rope, c.seq_len, c.head_dim(), rope_inv_freq(c));
}

const float* Decoder::prefill(ParamSource& params, const std::vector<std::vector<int32_t>>& prompts) {
  CHECK(static_cast<int64_t>(prompts.size()) == B_);
  for (int64_t b = 0; b < B_; ++b) {
    CHECK(!prompts[b].empty());
    reset(b);
    spans_[b] = prompts[b];
  }
  return append(params, spans_);
}

const float* Decoder::step(ParamSource& params, const int32_t* tokens) {
  for (int64_t b = 0; b < B_; ++b) spans_[b] = {tokens + b, 1};
  return append(params, spans_);
}

const float* Decoder::append(ParamSource& params, std::span<const std::span<const int32_t>> tokens) {
  CHECK(static_cast<int64_t>(tokens.size()) == B_);
  for (int64_t b = 0; b < B_; ++b) {
    CHECK_MSG(length_[b] + static_cast<int64_t>(tokens[b].size()) <= Tc_, "the key/value cache is full");
    taken_[b] = 0;
  }
  for (;;) {
    int64_t r = 0;
    for (int64_t b = 0; b < B_; ++b) {
      const int64_t n = std::min(static_cast<int64_t>(tokens[b].size()) - taken_[b], P_ - r);
      host_rows_[b] = r;
      host_start_[b] = length_[b];
      std::copy_n(tokens[b].data() + taken_[b], n, host_tokens_.data() + r);
      taken_[b] += n;
      r += n;
    }
    host_rows_[B_] = r;
    if (r == 0) return host_logits_.data();
    pass(params);
  }
}

UnitParams Decoder::acquire(ParamSource& params, int unit) const { return acquire_unit(params, unit, bf16_); }

void Decoder::linear(float* y, const float* x, const UnitParams& p, int64_t offset, int64_t M, int64_t N, int64_t K,
                     float beta) {
  unit_linear(be_, y, x, p, offset, M, N, K, beta, b_.x16);
}

const float* Decoder::norm_weight(const UnitParams& p, int64_t offset) {
  if (p.bf16 == nullptr) return p.f32 + offset;
  be_.from_bf16(b_.norm_w, p.bf16 + offset, layout_.config().dim);
  return b_.norm_w;
}

void Decoder::pass(ParamSource& params) {
  CHECK(num_threads() <= threads_);
  const ModelConfig& c = layout_.config();
  const int64_t n = host_rows_[B_];
  be_.to_device(b_.tokens, host_tokens_.data(), sizeof(int32_t) * n);
  be_.to_device(b_.rows, host_rows_.data(), sizeof(int64_t) * (B_ + 1));
  be_.to_device(b_.start, host_start_.data(), sizeof(int64_t) * B_);
  const int emb = layout_.embedding_unit();
  const UnitParams table = acquire(params, emb);
  if (table.bf16 != nullptr) {
    be_.embedding_forward_bf16(b_.x, b_.tokens, table.bf16, n, c.dim, 0, V_);
  } else {
    be_.embedding_forward(b_.x, b_.tokens, table.f32, n, c.dim, 0, V_);
  }
  params.release(emb);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const int unit = layout_.block_unit(l);
    block(acquire(params, unit), l, n);
    params.release(unit);
  }
  for (int64_t b = 0; b < B_; ++b) length_[b] += host_rows_[b + 1] - host_rows_[b];
  head(params);
  be_.to_host(host_logits_.data(), b_.logits, sizeof(float) * host_logits_.size());
}

void Decoder::block(const UnitParams& w, int64_t layer, int64_t n) {
  const ModelConfig& c = layout_.config();
  const BlockOffsets& o = layout_.block();
  const int64_t C = c.dim, F = c.ffn_hidden, H = c.n_heads, Hkv = c.n_kv_heads, D = c.head_dim(), Q = c.qkv_dim();
  const float eps = static_cast<float>(c.norm_eps);
  const int64_t cache = layer * B_ * Tc_ * Hkv * D;
  be_.rms_norm_forward(b_.xn, b_.rstd, b_.x, norm_weight(w, o.attention_norm), n, C, eps);
  linear(b_.qkv, b_.xn, w, o.wqkv, n, Q, C, 0.0f);
  rope_and_cache(layer);
  be_.attention_cached(b_.att, b_.qkv, Q, b_.k_cache + cache, b_.v_cache + cache, Hkv * D, Tc_, b_.rows, b_.start,
                       host_rows_.data(), host_start_.data(), B_, H, Hkv, D, b_.attn_ws);
  // The residual adds ride on the GEMMs (beta = 1), in place in x.
  linear(b_.x, b_.att, w, o.wo, n, C, H * D, 1.0f);
  be_.rms_norm_forward(b_.xn, b_.rstd, b_.x, norm_weight(w, o.ffn_norm), n, C, eps);
  linear(b_.h13, b_.xn, w, o.w13, n, 2 * F, C, 0.0f);
  be_.swiglu_forward(b_.g, b_.h13, n, F);
  linear(b_.x, b_.g, w, o.w2, n, C, F, 1.0f);
}

void Decoder::rope_and_cache(int64_t layer) {
  const ModelConfig& c = layout_.config();
  const int64_t H = c.n_heads, D = c.head_dim(), KV = c.n_kv_heads * D, Q = c.qkv_dim();
  for (int64_t b = 0; b < B_; ++b) {
    const int64_t n = host_rows_[b + 1] - host_rows_[b];
    if (n == 0) continue;
    // rope_forward reads table row (row % T): with T = n rows and the table from start[b] on,
    // row i gets position start[b] + i.
    float* r = b_.qkv + host_rows_[b] * Q;
    const float* table = b_.rope + host_start_[b] * D;
    be_.rope_forward(r, table, 1, n, H, D, Q);
    be_.rope_forward(r + H * D, table, 1, n, c.n_kv_heads, D, Q);
    const int64_t at = ((layer * B_ + b) * Tc_ + host_start_[b]) * KV;
    be_.copy_rows(b_.k_cache + at, KV, r + H * D, Q, n, KV);
    be_.copy_rows(b_.v_cache + at, KV, r + H * D + KV, Q, n, KV);
  }
}

void Decoder::head(ParamSource& params) {
  const ModelConfig& c = layout_.config();
  const int64_t C = c.dim;
  int64_t m = 0;  // sequences with rows in this pass, in order
  for (int64_t b = 0; b < B_; ++b) {
    if (host_rows_[b + 1] == host_rows_[b]) continue;
    be_.copy(b_.last + m * C, b_.x + (host_rows_[b + 1] - 1) * C, sizeof(float) * C);
    ++m;
  }
  const int head = layout_.head_unit(), emb = layout_.embedding_unit();
  const UnitParams w = acquire(params, head);
  const UnitParams w_out = c.tied_embeddings ? acquire(params, emb) : w;
  const int64_t out_offset = c.tied_embeddings ? 0 : layout_.head_weight_offset();
  be_.rms_norm_forward(b_.xn, b_.rstd, b_.last, norm_weight(w, layout_.head_norm_offset()), m, C,
                       static_cast<float>(c.norm_eps));
  float* out = m == B_ ? b_.logits : b_.pass_out;
  linear(out, b_.xn, w_out, out_offset, m, V_, C, 0.0f);
  if (c.tied_embeddings) params.release(emb);
  params.release(head);
  if (m == B_) return;
  for (int64_t b = 0, i = 0; b < B_; ++b) {
    if (host_rows_[b + 1] > host_rows_[b]) be_.copy(b_.logits + b * V_, out + i++ * V_, sizeof(float) * V_);
  }
}

}  // namespace tessera::model
