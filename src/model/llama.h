// Layer model: the model's configuration, its parameter layout in flat units, initialization and
// the forward and backward. It must not know how parameters are sharded or communicated (it sees
// a ParamSource), nor checkpoints, optimizers or processes.
//
// Llama 2 forward and backward, written op by op (no autograd), over parameters that a ParamSource
// provides unit by unit, on a kernels::Backend (the CPU's, or one GPU's: then the parameters,
// gradients and activations are all in its memory, and only token ids and losses cross to the
// host). Every activation buffer is planned from the config and allocated once, in the
// constructor, from the backend; forward and backward never call the allocator. Under tensor
// parallelism (the layout's TensorParallel) it computes its block's heads, hidden units and
// vocabulary and completes the partial sums through the source's tp collectives
// (docs/design.md, "Tensor parallelism"); with sequence parallelism on top, the residual stream,
// the norms and their saved outputs hold this rank's rows only (R = N / tp of the N = B x T).
#pragma once

#include <cstdint>
#include <vector>

#include "core/arena.h"
#include "kernels/backend.h"
#include "model/layout.h"
#include "model/param_source.h"
#include "model/unit_params.h"

namespace tessera::model {

// A micro-batch's cross-entropy: summed over its valid (non-negative) targets, and their count.
// Sums, not means, so that micro-batches and ranks with different numbers of valid targets
// combine into the mean over the whole batch (a mean of means weights them wrongly).
struct LossSum {
  double sum = 0.0;
  int64_t count = 0;
  double mean() const { return count > 0 ? sum / static_cast<double>(count) : 0.0; }
};

// Targets >= 0 among n: those the loss counts.
int64_t count_valid_targets(const int32_t* targets, int64_t n);

class Llama {
 public:
  // micro_batch: sequences per forward (B); sequences are config.seq_len tokens (T).
  // recompute_every: 0 keeps every block's activations; k > 0 keeps only the input of blocks
  // 0, k, 2k, ... and recomputes the rest of their activations in backward (activation
  // checkpointing). Results are bitwise identical either way.
  // bf16: mixed precision. The model asks the source for bf16 images of its units
  // (ParamSource::acquire_bf16) and, for each unit it gets one of, runs the unit's weight GEMMs
  // (fused qkv, wo, fused w1|w3, w2, LM head) on bf16 weights and bf16 copies of their inputs,
  // accumulating in fp32, forward and backward; everything else stays fp32 (PyTorch's autocast
  // to bf16 draws the same line). Off, or with a source that offers no bf16, the model is fp32.
  // backend: where the model runs (it outlives the model). Tensor and pipeline parallelism and
  // forward_logits run on the CPU backend only (their collectives and outputs are host memory).
  Llama(const ModelLayout& layout, int64_t micro_batch, int threads, int64_t recompute_every = 0, bool bf16 = false,
        kernels::Backend& backend = kernels::cpu_backend());

  const ModelLayout& layout() const { return layout_; }
  int64_t micro_batch() const { return B_; }
  size_t activation_bytes() const { return arena_.capacity(); }
  // Activation bytes the constructor would allocate, without allocating them.
  static size_t planned_activation_bytes(const ModelLayout& layout, int64_t micro_batch, int threads,
                                         int64_t recompute_every = 0, bool bf16 = false,
                                         const kernels::Backend& backend = kernels::cpu_backend());

  // One micro-batch: inputs, targets (B, T), in host memory; a negative target is ignored. Adds the
  // gradient of
  // grad_scale x (the sum of the losses of the valid targets) to the source's gradient buffers
  // (grad_scale = 1 / count_valid_targets gives the gradient of the micro-batch's mean loss).
  LossSum forward_backward(ParamSource& params, const int32_t* inputs, const int32_t* targets, float grad_scale);
  // forward_backward in two halves, for timing them apart (call forward then backward, same inputs).
  // forward: the loss and, fused with it chunk by chunk, the LM head's backward, whose seconds
  // head_backward_seconds() returns; backward: the blocks' and the embedding's backward.
  LossSum forward(ParamSource& params, const int32_t* inputs, const int32_t* targets, float grad_scale);
  void backward(ParamSource& params, const int32_t* inputs);
  double head_backward_seconds() const { return head_backward_seconds_; }
  // The loss without gradients.
  LossSum forward_loss(ParamSource& params, const int32_t* inputs, const int32_t* targets);
  // logits (B, T, V) for every position (CPU backend only).
  void forward_logits(ParamSource& params, const int32_t* inputs, float* logits);

  // Pipeline parallelism (the layout's PipelineStage): a stage runs its blocks only. Without the
  // embedding, forward reads its input from stage_input() (the previous stage's output, written
  // there first); without the head, forward returns no loss and leaves its output in
  // stage_output(), and backward reads the gradient of that output from stage_output_grad() and
  // leaves the gradient of its input there (what the previous stage needs). inputs are still
  // passed (the first stage looks them up) and targets (the last stage's loss). stage_floats()
  // each: (N, C), or this rank's (R, C) rows under sequence parallelism.
  int64_t stage_floats() const { return R_ * layout_.config().dim; }
  float* stage_input() { return b_.blocks.front().x; }
  const float* stage_output() const { return b_.x_final; }
  float* stage_output_grad() { return b_.dx; }
  const float* stage_input_grad() const { return b_.dx; }

  // Rows of logits the LM head computes at a time, of N (the planner counts its kernels by it).
  static int64_t loss_chunk_rows(int64_t vocab, int64_t N);

 private:
  // N = B x T rows; R = N, or N / tp rows under sequence parallelism (this rank's).
  struct BlockActs {
    bool recompute;  // the fields below x point into the shared recompute set
    float* x;        // (R, C) block input: all a recompute needs
    // xn1, xn2 and g are only ever read by their weight GEMMs: where the block's unit is a bf16
    // image, the producing kernel writes the bf16 rounding those GEMMs read, in the first half of
    // the slot, and nothing reads them in fp32 (saved()). The slots keep their fp32 size, as a
    // model planned for bf16 runs in fp32 over a source without bf16 images.
    float* xn1;      // (R, C) attention-norm output
    float* rstd1;    // (R)
    float* qkv;      // (N, qkv_dim) after RoPE on q and k
    float* att;      // (N, H*D) attention output before wo
    float* lse;      // (B, H, T)
    float* xmid;     // (R, C) residual after attention
    float* xn2;      // (R, C)
    float* rstd2;    // (R)
    float* h13;      // (N, 2F) gate | up
    float* g;        // (N, F) SwiGLU output
  };
  struct Buffers {
    std::vector<BlockActs> blocks;
    float* x_final;     // (R, C) output of the last block
    float* xn_final;    // (R, C), a saved() slot as BlockActs' xn1
    float* rstd_final;  // (R)
    float* rope;        // (T, D/2, 2)
    float* attn_ws;
    float* norm_ws;        // the backend's RMSNorm backward workspace
    int32_t* tokens;       // (N) this micro-batch's inputs, in the backend's memory
    int32_t* targets;      // (N) and its targets
    int32_t* embed_ws;     // the backend's embedding backward workspace
    float* logits;         // (chunk, V), V this rank's block of the vocabulary
    float* losses;         // (N) every row's loss, brought to the host once per micro-batch
    float* ce_max;         // tensor parallelism only (null otherwise): (chunk) row maxima,
    float* ce_sums;        // (2, chunk) sums of exp and target logits,
    float* ce_maxima;      // (tp, chunk) every rank's row maxima
    float* dx;             // (R, C) gradient of the residual stream
    float* dxn;            // (N, C) gradient of a norm's output (sequence parallel: before its
                           // reduce-scatter; also a row-parallel product before its reduce-scatter)
    float* dqkv;           // (N, qkv_dim)
    float* datt;           // (N, H*D)
    float* dh13;           // (N, 2F); units of bf16 images write it rounded into dy16 instead
    float* dg;             // (N, F)
    float* recompute_out;  // (R, C) where a recomputed block writes its (already known) output
    // Sequence parallelism only (null otherwise): every rank's rows of a norm's output or of dx,
    // all-gathered for a product; this rank's rows of a norm's output gradient; the norm gains'
    // partial gradients (over this rank's rows) that the group sums.
    float* gathered;  // (N, C)
    float* dxn_rows;  // (R, C)
    float* dgain;     // (C)
    // bf16 only (null otherwise): a GEMM's activation input and its output gradient rounded to
    // bf16 just before the GEMM where no kernel wrote them rounded (attention's output, in
    // backward again rather than saved per block; the residual stream's gradient; dqkv); SwiGLU's
    // backward writes its gradient rounded into dy16 itself. And norm gains widened from a bf16
    // image.
    uint16_t* x16;   // (N, max(C, H*D, F))
    uint16_t* dy16;  // (max(N max(C, qkv_dim, 2F), head_group_rows V))
    float* norm_w;   // (2, C)
    // bf16 on a backend that packs weights (Backend::packed_weight_bytes; null otherwise): a
    // product's weight packed for the forward and for dx's product, each large enough for the
    // model's largest. A block's product packs its weight just before it runs (the weight changes
    // between its uses: gathered anew, or updated); the LM head packs once for all its chunks.
    void* pack_fwd;
    void* pack_dx;
  };
  static void plan(Arena& arena, Buffers& b, const ModelLayout& layout, int64_t B, int threads, int64_t recompute_every,
                   bool bf16, const kernels::Backend& backend);
  static int64_t head_group_rows(int64_t vocab, int64_t N);  // bf16: rows per LM-head backward
  bool tensor_parallel() const { return layout_.tensor_parallel().size > 1; }
  bool sequence_parallel() const { return tensor_parallel() && layout_.tensor_parallel().sequence; }
  // A weight GEMM's input rows: fp32, or (mixed precision) already rounded to bf16.
  struct Rows {
    const float* f32 = nullptr;
    const uint16_t* bf16 = nullptr;
  };
  // A saved GEMM input (BlockActs' xn1, xn2, g; the head's norm output) as its slot holds it for
  // unit p: bf16 where p is a bf16 image, else fp32.
  static Rows saved(const float* slot, const UnitParams& p);
  // Sequence parallelism: this rank's (R, C) rows -> every rank's (N, C) rows, in b_.gathered;
  // without it, rows itself.
  const float* gather_rows(ParamSource& params, const float* rows);
  Rows gather_rows(ParamSource& params, Rows rows);
  // b_.dxn holds a product's input gradient (N, C), a partial sum under tensor parallelism: the
  // group's sum, of all rows (all-reduce, in place) or of this rank's (reduce-scatter into
  // b_.dxn_rows) under sequence parallelism.
  const float* complete_dxn(ParamSource& params);
  // RMSNorm backward over this rank's rows into dx and the gain gradient dgain; under sequence
  // parallelism the rows' partial gain gradient is summed over the group first.
  void norm_backward(ParamSource& params, float* dgain, const float* dxn, const float* x, const float* gain,
                     const float* rstd);

  UnitParams acquire(ParamSource& params, int unit) const;
  // y (M, N) = x (M, K) . W^T + beta y, W the (N, K) tensor at `offset` in the unit; bf16 inputs
  // (x rounded here unless it comes rounded) when the unit is a bf16 image.
  void linear(float* y, Rows x, const UnitParams& p, int64_t offset, int64_t M, int64_t N, int64_t K, float beta);
  // Its backward: dx (M, K) = dy . W (skipped when null), dw (N, K) += dy^T . x, accumulated in
  // fp32 (on dy and x rounded to bf16, here unless they come rounded, for a bf16 image).
  void linear_backward(float* dx, float* dw, Rows dy, Rows x, const UnitParams& p, int64_t offset, int64_t M, int64_t N,
                       int64_t K);
  // RMSNorm of this rank's R rows into out's slot, rounded to bf16 as written where bf16.
  void norm_forward(float* out, float* rstd, const float* x, const float* gain, bool bf16);
  // The C norm gains at `offset` in fp32: in place, or widened into norm_w row `slot`.
  const float* norm_weight(const UnitParams& p, int64_t offset, int slot);

  void forward_blocks(ParamSource& params, const int32_t* inputs);
  // Copies N token ids from the host into dst (the backend's memory), through `staging` (host_io_).
  void upload_ids(int32_t* dst, const int32_t* ids, int32_t* staging);
  void embed(ParamSource& params);  // b_.tokens into blocks[0].x
  // Forward of block l from acts.x, filling the rest of acts and writing the output to `out`.
  void block_forward(ParamSource& params, const UnitParams& w, const BlockActs& acts, float* out);
  // out (R, C) = residual + x (N, K) . W^T, W the (C, K) tensor at `offset`; with tensor
  // parallelism W is a row-parallel block and the group's sum completes the product (all-reduce,
  // or reduce-scatter to this rank's rows under sequence parallelism).
  void residual_linear(ParamSource& params, float* out, const float* residual, Rows x, const UnitParams& w,
                       int64_t offset, int64_t K);
  // Backward of block l: b_.dx holds d(out) on entry and d(acts.x) on return.
  void block_backward(ParamSource& params, const UnitParams& w, float* dw, const BlockActs& acts);
  // losses (and, with grads, the gradient in place) of b_.logits' first `rows` rows, this rank's
  // vocabulary block, with the tensor-parallel group.
  void vocab_parallel_loss(ParamSource& params, float* losses, const int32_t* targets, int64_t rows, bool with_grads,
                           float grad_scale);
  // Final norm, head and loss over all rows; with grads, also their backward into b_.dx. targets
  // on the host (their count); b_.targets holds them in the backend's memory.
  LossSum head_loss(ParamSource& params, const int32_t* targets, bool with_grads, float grad_scale);

  ModelLayout layout_;
  int64_t B_, T_, N_, R_;  // R_: the rows of the residual stream this rank holds
  int threads_;
  int64_t recompute_every_;
  bool bf16_;
  kernels::Backend& be_;
  kernels::Memory memory_;  // the arena's
  Arena arena_;
  // Host memory the backend copies at full speed (pinned on a GPU): the token ids and targets on
  // their way in, the per-row losses on their way out, N each.
  kernels::Memory host_io_;
  int32_t *host_tokens_, *host_targets_;
  float* host_losses_;
  Buffers b_{};
  double head_backward_seconds_ = 0.0;  // in the last head_loss with gradients
};

}  // namespace tessera::model
