// Llama 2 forward and backward, op by op, on a backend.
#include "model/llama.h"

#include <algorithm>
#include <vector>

#include "core/check.h"
#include "core/threads.h"
#include "core/timer.h"

namespace tessera::model {

int64_t count_valid_targets(const int32_t* targets, int64_t n) {
  return std::count_if(targets, targets + n, [](int32_t t) { return t >= 0; });
}

namespace {
// The rows of the residual stream one rank holds (llama.h, R).
int64_t residual_rows(const ModelLayout& layout, int64_t N) {
  const TensorParallel& tp = layout.tensor_parallel();
  if (tp.size == 1 || !tp.sequence) return N;
  CHECK_MSG(N % tp.size == 0, "sequence parallelism needs the micro-batch's tokens divisible by the tp size");
  return N / tp.size;
}
}  // namespace

int64_t Llama::loss_chunk_rows(int64_t vocab, int64_t N) {
  // Logits for a chunk of rows at a time (~32 MB): never the whole (N, V) tensor. Past 128 rows, a
  // whole number of 128-row blocks, the row tile of GPU GEMMs: 262 rows (V = 32000) would leave
  // a third tile of 6 rows and run at two thirds of the rate of 256.
  int64_t rows = (int64_t{1} << 23) / vocab;
  if (rows > 128) rows -= rows % 128;
  return std::clamp<int64_t>(rows, 1, N);
}

int64_t Llama::head_group_rows(int64_t vocab, int64_t N) {
  // Whole chunks, about 1024 rows: the weight-gradient GEMM of 32000 x 512 at 1048 rows deep runs
  // ~30% faster than at 262 (oneDNN bf16, Zen 5), for a (rows, V) bf16 buffer of ~64 MB.
  const int64_t chunk = loss_chunk_rows(vocab, N);
  return std::min(N, chunk * std::max<int64_t>(1, 1024 / chunk));
}

void Llama::plan(Arena& arena, Buffers& b, const ModelLayout& layout, int64_t B, int threads, int64_t recompute_every,
                 bool bf16, const kernels::Backend& backend) {
  const ModelConfig& c = layout.config();
  const LocalSizes& l = layout.local();  // this rank's share under tensor parallelism
  const int64_t T = c.seq_len, N = B * T, C = c.dim, F = l.ffn_hidden, H = l.heads, D = c.head_dim();
  const int64_t Q = (l.heads + 2 * l.kv_heads) * D, V = l.vocab, R = residual_rows(layout, N);
  auto take = [&](int64_t n) { return arena.take<float>(static_cast<size_t>(n)); };
  auto take_saved = [&](BlockActs& a) {
    a.xn1 = take(R * C);
    a.rstd1 = take(R);
    a.qkv = take(N * Q);
    a.att = take(N * H * D);
    a.lse = take(B * H * T);
    a.xmid = take(R * C);
    a.xn2 = take(R * C);
    a.rstd2 = take(R);
    a.h13 = take(N * 2 * F);
    a.g = take(N * F);
  };
  b.blocks.resize(layout.num_layers());
  BlockActs shared{};  // what recomputed blocks fill in turn
  shared.recompute = true;
  bool any_recompute = false;
  for (int64_t i = 0; i < layout.num_layers(); ++i) {
    BlockActs& a = b.blocks[i];
    // By the block's index in the whole model, so a pipeline stage recomputes the blocks one
    // process would.
    a.recompute = recompute_every > 0 && (layout.first_layer() + i) % recompute_every == 0;
    if (a.recompute && !any_recompute) {
      take_saved(shared);
      b.recompute_out = take(R * C);
      any_recompute = true;
    }
    if (a.recompute) {
      a = shared;
    } else {
      take_saved(a);
    }
    a.x = take(R * C);
  }
  b.x_final = take(R * C);
  b.xn_final = take(R * C);
  b.rstd_final = take(R);
  b.rope = take(T * D);
  b.attn_ws = take(backend.attention_workspace_floats(B, T, l.heads, D, threads));
  b.norm_ws = take(backend.rms_norm_workspace_floats(R, C));
  b.tokens = arena.take<int32_t>(static_cast<size_t>(N));
  b.targets = arena.take<int32_t>(static_cast<size_t>(N));
  b.embed_ws = arena.take<int32_t>(static_cast<size_t>(backend.embedding_workspace_ints(N)));
  const int64_t chunk = loss_chunk_rows(V, N);
  b.logits = take(chunk * V);
  b.losses = take(N);
  if (layout.tensor_parallel().size > 1) {
    b.ce_max = take(chunk);
    b.ce_sums = take(2 * chunk);
    b.ce_maxima = take(layout.tensor_parallel().size * chunk);
  }
  b.dx = take(R * C);
  b.dxn = take(N * C);
  if (R < N) {
    b.gathered = take(N * C);
    b.dxn_rows = take(R * C);
    b.dgain = take(C);
  }
  b.dqkv = take(N * Q);
  b.datt = take(N * H * D);
  b.dh13 = take(N * 2 * F);
  b.dg = take(N * F);
  if (bf16) {
    b.x16 = arena.take<uint16_t>(static_cast<size_t>(N * std::max({C, H * D, F})));
    b.dy16 =
        arena.take<uint16_t>(static_cast<size_t>(std::max(N * std::max({C, Q, 2 * F}), head_group_rows(V, N) * V)));
    b.norm_w = take(2 * C);
    int64_t fwd = 0, dx = 0;
    auto fit = [&](int64_t rows, int64_t cols) {
      fwd = std::max(fwd, backend.packed_weight_bytes(rows, cols, kernels::WeightUse::kForward));
      dx = std::max(dx, backend.packed_weight_bytes(rows, cols, kernels::WeightUse::kInputGrad));
    };
    if (layout.num_layers() > 0) {
      fit(Q, C);
      fit(C, H * D);
      fit(2 * F, C);
      fit(C, F);
    }
    if (layout.has_head()) fit(V, C);
    b.pack_fwd = fwd > 0 ? arena.take_bytes(static_cast<size_t>(fwd)) : nullptr;
    b.pack_dx = dx > 0 ? arena.take_bytes(static_cast<size_t>(dx)) : nullptr;
  }
}

size_t Llama::planned_activation_bytes(const ModelLayout& layout, int64_t micro_batch, int threads,
                                       int64_t recompute_every, bool bf16, const kernels::Backend& backend) {
  Arena measure;
  Buffers b;
  plan(measure, b, layout, micro_batch, threads, recompute_every, bf16, backend);
  return measure.used();
}

Llama::Llama(const ModelLayout& layout, int64_t micro_batch, int threads, int64_t recompute_every, bool bf16,
             kernels::Backend& backend)
    : layout_(layout),
      B_(micro_batch),
      T_(layout.config().seq_len),
      N_(micro_batch * layout.config().seq_len),
      R_(residual_rows(layout, N_)),
      threads_(threads),
      recompute_every_(recompute_every),
      bf16_(bf16),
      be_(backend),
      memory_(backend.allocate(planned_activation_bytes(layout, micro_batch, threads, recompute_every, bf16, backend))),
      arena_(memory_.get(), planned_activation_bytes(layout, micro_batch, threads, recompute_every, bf16, backend)),
      host_io_(backend.allocate_host(3 * sizeof(int32_t) * static_cast<size_t>(N_))),
      host_tokens_(reinterpret_cast<int32_t*>(host_io_.get())),
      host_targets_(host_tokens_ + N_),
      host_losses_(reinterpret_cast<float*>(host_targets_ + N_)) {
  CHECK(micro_batch > 0 && threads > 0 && recompute_every >= 0);
  plan(arena_, b_, layout_, B_, threads_, recompute_every_, bf16_, be_);
  const ModelConfig& c = layout_.config();
  kernels::write_rope_table(be_, b_.rope, T_, c.head_dim(), rope_inv_freq(c));
}

UnitParams Llama::acquire(ParamSource& params, int unit) const { return acquire_unit(params, unit, bf16_); }

Llama::Rows Llama::saved(const float* slot, const UnitParams& p) {
  if (p.bf16 == nullptr) return {slot};
  return {nullptr, reinterpret_cast<const uint16_t*>(slot)};
}

void Llama::linear(float* y, Rows x, const UnitParams& p, int64_t offset, int64_t M, int64_t N, int64_t K, float beta) {
  if (x.bf16 == nullptr) {
    unit_linear(be_, y, x.f32, p, offset, M, N, K, beta, b_.x16, b_.pack_fwd);
  } else {
    unit_linear_bf16(be_, y, x.bf16, p, offset, M, N, K, beta, b_.pack_fwd);
  }
}

void Llama::linear_backward(float* dx, float* dw, Rows dy, Rows x, const UnitParams& p, int64_t offset, int64_t M,
                            int64_t N, int64_t K) {
  if (p.bf16 == nullptr) {
    CHECK_MSG(dy.f32 != nullptr && x.f32 != nullptr, "bf16 rows for a unit without a bf16 image");
    be_.linear_backward(dx, dw, dy.f32, x.f32, p.f32 + offset, M, N, K);
    return;
  }
  auto rounded = [&](Rows r, uint16_t* scratch, int64_t n) {
    if (r.bf16 != nullptr) return r.bf16;
    be_.to_bf16(scratch, r.f32, n);
    return static_cast<const uint16_t*>(scratch);
  };
  const uint16_t* w = p.bf16 + offset;
  be_.linear_backward_bf16(dx, dw, rounded(dy, b_.dy16, M * N), rounded(x, b_.x16, M * K),
                           dx != nullptr ? bf16_weight(be_, w, N, K, kernels::WeightUse::kInputGrad, b_.pack_dx) : w, M,
                           N, K);
}

void Llama::norm_forward(float* out, float* rstd, const float* x, const float* gain, bool bf16) {
  const ModelConfig& c = layout_.config();
  const float eps = static_cast<float>(c.norm_eps);
  if (bf16) {
    be_.rms_norm_forward_bf16(reinterpret_cast<uint16_t*>(out), rstd, x, gain, R_, c.dim, eps);
  } else {
    be_.rms_norm_forward(out, rstd, x, gain, R_, c.dim, eps);
  }
}

const float* Llama::norm_weight(const UnitParams& p, int64_t offset, int slot) {
  if (p.bf16 == nullptr) return p.f32 + offset;
  const int64_t C = layout_.config().dim;
  float* w = b_.norm_w + slot * C;
  be_.from_bf16(w, p.bf16 + offset, C);
  return w;
}

void Llama::residual_linear(ParamSource& params, float* out, const float* residual, Rows x, const UnitParams& w,
                            int64_t offset, int64_t K) {
  const int64_t C = layout_.config().dim;
  if (sequence_parallel()) {  // this rank's rows of the group's sum, then their residual
    linear(b_.dxn, x, w, offset, N_, C, K, 0.0f);
    params.tp_reduce_scatter(b_.dxn, out, R_ * C);
    be_.add_inplace(out, residual, R_ * C);
    return;
  }
  // The residual add rides on the GEMM (beta = 1) instead of a separate pass. A row-parallel
  // product is a partial sum: the first rank of the group adds the residual, the group's sum the
  // rest.
  const bool adds_residual = !tensor_parallel() || layout_.tensor_parallel().rank == 0;
  if (adds_residual) be_.copy(out, residual, sizeof(float) * N_ * C);
  linear(out, x, w, offset, N_, C, K, adds_residual ? 1.0f : 0.0f);
  if (tensor_parallel()) params.tp_all_reduce(out, N_ * C);
}

void Llama::block_forward(ParamSource& params, const UnitParams& w, const BlockActs& a, float* out) {
  const ModelConfig& c = layout_.config();
  const LocalSizes& l = layout_.local();
  const BlockOffsets& o = layout_.block();
  const int64_t C = c.dim, F = l.ffn_hidden, H = l.heads, Hkv = l.kv_heads, D = c.head_dim(), Q = (H + 2 * Hkv) * D;
  const bool bf16 = w.bf16 != nullptr;  // xn1, xn2 and g are saved as the bf16 their GEMMs read
  norm_forward(a.xn1, a.rstd1, a.x, norm_weight(w, o.attention_norm, 0), bf16);
  linear(a.qkv, gather_rows(params, saved(a.xn1, w)), w, o.wqkv, N_, Q, C, 0.0f);
  be_.rope_forward(a.qkv, b_.rope, B_, T_, H, D, Q);
  be_.rope_forward(a.qkv + H * D, b_.rope, B_, T_, Hkv, D, Q);
  be_.attention_forward(a.att, a.lse, a.qkv, B_, T_, H, Hkv, D, bf16, b_.attn_ws);
  residual_linear(params, a.xmid, a.x, Rows{a.att}, w, o.wo, H * D);
  norm_forward(a.xn2, a.rstd2, a.xmid, norm_weight(w, o.ffn_norm, 1), bf16);
  linear(a.h13, gather_rows(params, saved(a.xn2, w)), w, o.w13, N_, 2 * F, C, 0.0f);
  if (bf16) {
    be_.swiglu_forward_bf16(reinterpret_cast<uint16_t*>(a.g), a.h13, N_, F);
  } else {
    be_.swiglu_forward(a.g, a.h13, N_, F);
  }
  residual_linear(params, out, a.xmid, saved(a.g, w), w, o.w2, F);
}

void Llama::block_backward(ParamSource& params, const UnitParams& w, float* dw, const BlockActs& a) {
  const ModelConfig& c = layout_.config();
  const LocalSizes& l = layout_.local();
  const BlockOffsets& o = layout_.block();
  const int64_t C = c.dim, F = l.ffn_hidden, H = l.heads, Hkv = l.kv_heads, D = c.head_dim(), Q = (H + 2 * Hkv) * D;
  // MLP branch; dx enters as d(out) = d(xmid) through the residual, and the norm adds its part.
  // Under tensor parallelism dx is the same on every rank of the group (or, sequence parallel,
  // its rows are gathered), and the input gradient of a column-parallel product is a partial sum
  // the group completes.
  linear_backward(b_.dg, dw + o.w2, Rows{gather_rows(params, b_.dx)}, saved(a.g, w), w, o.w2, N_, C, F);
  Rows dh13{b_.dh13};
  if (w.bf16 != nullptr) {  // rounded as written: w13's products read nothing else of it
    be_.swiglu_backward_bf16(b_.dy16, b_.dg, a.h13, N_, F);
    dh13 = {nullptr, b_.dy16};
  } else {
    be_.swiglu_backward(b_.dh13, b_.dg, a.h13, N_, F);
  }
  linear_backward(b_.dxn, dw + o.w13, dh13, gather_rows(params, saved(a.xn2, w)), w, o.w13, N_, 2 * F, C);
  norm_backward(params, dw + o.ffn_norm, complete_dxn(params), a.xmid, norm_weight(w, o.ffn_norm, 1), a.rstd2);
  // Attention branch.
  linear_backward(b_.datt, dw + o.wo, Rows{gather_rows(params, b_.dx)}, Rows{a.att}, w, o.wo, N_, C, H * D);
  be_.attention_backward(b_.dqkv, b_.datt, a.qkv, a.att, a.lse, B_, T_, H, Hkv, D, w.bf16 != nullptr, b_.attn_ws);
  be_.rope_backward(b_.dqkv, b_.rope, B_, T_, H, D, Q);
  be_.rope_backward(b_.dqkv + H * D, b_.rope, B_, T_, Hkv, D, Q);
  linear_backward(b_.dxn, dw + o.wqkv, Rows{b_.dqkv}, gather_rows(params, saved(a.xn1, w)), w, o.wqkv, N_, Q, C);
  norm_backward(params, dw + o.attention_norm, complete_dxn(params), a.x, norm_weight(w, o.attention_norm, 0), a.rstd1);
}

const float* Llama::gather_rows(ParamSource& params, const float* rows) {
  if (!sequence_parallel()) return rows;
  params.tp_all_gather(rows, b_.gathered, R_ * layout_.config().dim);
  return b_.gathered;
}

Llama::Rows Llama::gather_rows(ParamSource& params, Rows rows) {
  if (!sequence_parallel()) return rows;
  if (rows.bf16 == nullptr) return {gather_rows(params, rows.f32)};
  auto* out = reinterpret_cast<uint16_t*>(b_.gathered);
  params.tp_all_gather_bf16(rows.bf16, out, R_ * layout_.config().dim);
  return {nullptr, out};
}

const float* Llama::complete_dxn(ParamSource& params) {
  const int64_t C = layout_.config().dim;
  if (sequence_parallel()) {
    params.tp_reduce_scatter(b_.dxn, b_.dxn_rows, R_ * C);
    return b_.dxn_rows;
  }
  if (tensor_parallel()) params.tp_all_reduce(b_.dxn, N_ * C);
  return b_.dxn;
}

void Llama::norm_backward(ParamSource& params, float* dgain, const float* dxn, const float* x, const float* gain,
                          const float* rstd) {
  const int64_t C = layout_.config().dim;
  if (!sequence_parallel()) {
    be_.rms_norm_backward(b_.dx, dgain, dxn, x, gain, rstd, R_, C, b_.norm_ws);
    return;
  }
  // A replicated gain's gradient sums over all N rows: each rank's rows, then the group.
  be_.zero(b_.dgain, sizeof(float) * C);
  be_.rms_norm_backward(b_.dx, b_.dgain, dxn, x, gain, rstd, R_, C, b_.norm_ws);
  params.tp_all_reduce(b_.dgain, C);
  be_.add_inplace(dgain, b_.dgain, C);
}

void Llama::upload_ids(int32_t* dst, const int32_t* ids, int32_t* staging) {
  // On a device, through pinned memory: the copy is one DMA, not staged by the driver.
  if (be_.device() != kernels::Device::kCpu) {
    std::copy_n(ids, N_, staging);
    ids = staging;
  }
  be_.to_device(dst, ids, sizeof(int32_t) * N_);
}

void Llama::forward_blocks(ParamSource& params, const int32_t* inputs) {
  CHECK(num_threads() <= threads_);
  upload_ids(b_.tokens, inputs, host_tokens_);
  if (layout_.has_embedding()) embed(params);  // otherwise the stage's input is in place
  const int64_t L = layout_.num_layers();
  for (int64_t l = 0; l < L; ++l) {
    const int unit = layout_.block_unit(l);
    float* out = l + 1 < L ? b_.blocks[l + 1].x : b_.x_final;
    block_forward(params, acquire(params, unit), b_.blocks[l], out);
    params.release(unit);
  }
}

void Llama::embed(ParamSource& params) {
  const ModelConfig& c = layout_.config();
  const int emb = layout_.embedding_unit();
  const UnitParams table = acquire(params, emb);
  // Vocabulary-parallel under tensor parallelism: each rank looks up the tokens of its block, the
  // group's sum gives every rank every row (or, sequence parallel, its own rows).
  const LocalSizes& v = layout_.local();
  float* x = sequence_parallel() ? b_.dxn : b_.blocks[0].x;
  if (table.bf16 != nullptr) {
    be_.embedding_forward_bf16(x, b_.tokens, table.bf16, N_, c.dim, v.vocab_begin, v.vocab);
  } else {
    be_.embedding_forward(x, b_.tokens, table.f32, N_, c.dim, v.vocab_begin, v.vocab);
  }
  params.release(emb);
  if (sequence_parallel()) {
    params.tp_reduce_scatter(x, b_.blocks[0].x, R_ * c.dim);
  } else if (tensor_parallel()) {
    params.tp_all_reduce(x, N_ * c.dim);
  }
}

LossSum Llama::head_loss(ParamSource& params, const int32_t* targets, bool with_grads, float grad_scale) {
  const ModelConfig& c = layout_.config();
  const int64_t C = c.dim, V = layout_.local().vocab;
  const int head = layout_.head_unit(), emb = layout_.embedding_unit();
  const UnitParams w = acquire(params, head);
  const float* norm_w = norm_weight(w, layout_.head_norm_offset(), 0);
  // The output projection: the head's own weight, or the embedding table when tied.
  const UnitParams w_out = c.tied_embeddings ? acquire(params, emb) : w;
  const int64_t out_offset = c.tied_embeddings ? 0 : layout_.head_weight_offset();
  float* dw_out = nullptr;
  head_backward_seconds_ = 0.0;
  if (with_grads) dw_out = c.tied_embeddings ? params.grads(emb) : params.grads(head) + layout_.head_weight_offset();

  // Logits, loss and (with grads) the head's backward, one chunk of rows at a time. In bf16 the
  // norm rounds the rows as it writes them, and the chunks' logit gradients, rounded, gather into
  // groups of head_group_rows whose two backward GEMMs run at once: a deeper weight-gradient
  // product runs at a higher rate than one per chunk (it reads and writes the whole V x C gradient
  // each time).
  const int64_t chunk = loss_chunk_rows(V, N_);
  const bool bf16 = w_out.bf16 != nullptr;
  norm_forward(b_.xn_final, b_.rstd_final, b_.x_final, norm_w, bf16);
  const Rows xn_all = gather_rows(params, saved(b_.xn_final, w_out));
  const int64_t group = bf16 ? head_group_rows(V, N_) : chunk;
  const uint16_t* w16 = bf16 ? w_out.bf16 + out_offset : nullptr;
  kernels::Bf16Weight w_fwd = w16, w_dx = w16;  // packed once for all chunks where the backend packs
  if (bf16) {
    w_fwd = bf16_weight(be_, w16, V, C, kernels::WeightUse::kForward, b_.pack_fwd);
    if (with_grads) w_dx = bf16_weight(be_, w16, V, C, kernels::WeightUse::kInputGrad, b_.pack_dx);
  }
  for (int64_t r0 = 0; r0 < N_; r0 += chunk) {
    const int64_t rows = std::min(chunk, N_ - r0);
    if (bf16) {
      be_.linear_bf16(b_.logits, xn_all.bf16 + r0 * C, w_fwd, rows, V, C, 0.0f);
    } else {
      linear(b_.logits, Rows{xn_all.f32 + r0 * C}, w_out, out_offset, rows, V, C, 0.0f);
    }
    // bf16: the chunk's logit gradients go to their rows of the group, rounded as they are written.
    const int64_t g0 = r0 / group * group, end = std::min(N_, r0 + rows);
    uint16_t* dy16 = bf16 ? b_.dy16 + (r0 - g0) * V : nullptr;
    float* losses = b_.losses + r0;
    const int32_t* chunk_targets = b_.targets + r0;
    if (tensor_parallel()) {
      vocab_parallel_loss(params, losses, chunk_targets, rows, with_grads, grad_scale);
      if (with_grads && bf16) be_.to_bf16(dy16, b_.logits, rows * V);
    } else if (with_grads && bf16) {
      be_.softmax_cross_entropy_bf16(dy16, losses, b_.logits, chunk_targets, rows, V, grad_scale);
    } else {
      be_.softmax_cross_entropy(with_grads ? b_.logits : nullptr, losses, b_.logits, chunk_targets, rows, V,
                                grad_scale);
    }
    if (!with_grads) continue;
    const double t0 = now_seconds();
    if (!bf16) {
      linear_backward(b_.dxn + r0 * C, dw_out, Rows{b_.logits}, Rows{xn_all.f32 + r0 * C}, w_out, out_offset, rows, V,
                      C);
    } else {
      if (end == N_ || end - g0 == group) {
        be_.linear_backward_bf16(b_.dxn + g0 * C, dw_out, b_.dy16, xn_all.bf16 + g0 * C, w_dx, end - g0, V, C);
      }
    }
    head_backward_seconds_ += now_seconds() - t0;
  }
  if (with_grads) {
    const double t0 = now_seconds();
    // The head's input gradient: a partial sum over the vocabulary blocks under tensor parallelism.
    const float* dxn = complete_dxn(params);
    be_.zero(b_.dx, sizeof(float) * R_ * C);
    norm_backward(params, params.grads(head) + layout_.head_norm_offset(), dxn, b_.x_final, norm_w, b_.rstd_final);
    head_backward_seconds_ += now_seconds() - t0;
    params.grads_ready(head);
    if (c.tied_embeddings && !layout_.has_embedding()) params.grads_ready(emb);  // the tied copy's are complete
  }
  if (c.tied_embeddings) params.release(emb);
  params.release(head);
  // The losses cross to the host once, and sum in row order (the same bits on every backend's
  // losses).
  be_.to_host(host_losses_, b_.losses, sizeof(float) * N_);
  double loss_sum = 0.0;
  for (int64_t i = 0; i < N_; ++i) loss_sum += host_losses_[i];
  return {loss_sum, count_valid_targets(targets, N_)};
}

void Llama::vocab_parallel_loss(ParamSource& params, float* losses, const int32_t* targets, int64_t rows,
                                bool with_grads, float grad_scale) {
  const LocalSizes& v = layout_.local();
  const int T = layout_.tensor_parallel().size;
  // Megatron-LM's vocabulary-parallel cross-entropy: the row maxima over the group (gathered, as
  // the groups reduce by sum only), then the sums of exp and the target logits, then each rank's
  // block of the gradient. The whole (rows, V) logits are never in one place.
  be_.vocab_parallel_max(b_.ce_max, b_.logits, targets, rows, v.vocab);
  params.tp_all_gather(b_.ce_max, b_.ce_maxima, rows);
  be_.max_of_blocks(b_.ce_max, b_.ce_maxima, T, rows);
  be_.vocab_parallel_sums(b_.ce_sums, b_.ce_sums + rows, b_.logits, b_.ce_max, targets, rows, v.vocab, v.vocab_begin);
  params.tp_all_reduce(b_.ce_sums, 2 * rows);
  be_.vocab_parallel_loss(with_grads ? b_.logits : nullptr, losses, b_.logits, b_.ce_max, b_.ce_sums, b_.ce_sums + rows,
                          targets, rows, v.vocab, v.vocab_begin, grad_scale);
}

LossSum Llama::forward_backward(ParamSource& params, const int32_t* inputs, const int32_t* targets, float grad_scale) {
  const LossSum loss = forward(params, inputs, targets, grad_scale);
  backward(params, inputs);
  return loss;
}

LossSum Llama::forward(ParamSource& params, const int32_t* inputs, const int32_t* targets, float grad_scale) {
  if (layout_.has_head()) upload_ids(b_.targets, targets, host_targets_);
  forward_blocks(params, inputs);
  head_backward_seconds_ = 0.0;
  return layout_.has_head() ? head_loss(params, targets, true, grad_scale) : LossSum{};
}

void Llama::backward(ParamSource& params, const int32_t* inputs) {
  const ModelConfig& c = layout_.config();
  for (int64_t l = layout_.num_layers() - 1; l >= 0; --l) {
    const int unit = layout_.block_unit(l);
    const UnitParams w = acquire(params, unit);
    // A block marked for recompute rebuilds its activations from its saved input; the same kernels on
    // the same inputs give the same bits, so gradients do not change.
    if (b_.blocks[l].recompute) block_forward(params, w, b_.blocks[l], b_.recompute_out);
    block_backward(params, w, params.grads(unit), b_.blocks[l]);
    params.grads_ready(unit);
    params.release(unit);
  }
  if (!layout_.has_embedding()) return;  // b_.dx holds the gradient of the stage's input
  const int emb = layout_.embedding_unit();
  be_.embedding_backward(params.grads(emb), gather_rows(params, b_.dx), b_.tokens, inputs, N_, c.dim,
                         layout_.local().vocab_begin, layout_.local().vocab, b_.embed_ws);
  params.grads_ready(emb);
}

LossSum Llama::forward_loss(ParamSource& params, const int32_t* inputs, const int32_t* targets) {
  if (layout_.has_head()) upload_ids(b_.targets, targets, host_targets_);
  forward_blocks(params, inputs);
  return layout_.has_head() ? head_loss(params, targets, false, 0.0f) : LossSum{};
}

void Llama::forward_logits(ParamSource& params, const int32_t* inputs, float* logits) {
  CHECK_MSG(!tensor_parallel(), "whole logits under tensor parallelism (generation) are not built yet");
  CHECK_MSG(layout_.stage().size == 1, "whole logits under pipeline parallelism (generation) are not built yet");
  CHECK_MSG(be_.device() == kernels::Device::kCpu, "whole logits are written to host memory: the CPU backend only");
  forward_blocks(params, inputs);
  const ModelConfig& c = layout_.config();
  const int head = layout_.head_unit(), emb = layout_.embedding_unit();
  const UnitParams w = acquire(params, head);
  const UnitParams w_out = c.tied_embeddings ? acquire(params, emb) : w;
  const int64_t out_offset = c.tied_embeddings ? 0 : layout_.head_weight_offset();
  be_.rms_norm_forward(b_.xn_final, b_.rstd_final, b_.x_final, norm_weight(w, layout_.head_norm_offset(), 0), N_, c.dim,
                       static_cast<float>(c.norm_eps));
  linear(logits, Rows{b_.xn_final}, w_out, out_offset, N_, c.vocab_size, c.dim, 0.0f);
  if (c.tied_embeddings) params.release(emb);
  params.release(head);
}

}  // namespace tessera::model
