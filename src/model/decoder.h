// Llama inference with a key/value cache, for generation: the forward of llama.h for new tokens
// only, each attending the keys and values its sequence's earlier tokens left in the cache.
//
// A batch of B sequences, each with its own length: a pass packs every sequence's new tokens
// into rows (no padding), gives each row its own absolute RoPE position, and attends each
// sequence to its own cache only, so a sequence's results do not depend on the others in the
// batch (up to the GEMMs' rounding, which may vary with the number of rows). Keys and values are
// cached at Hkv heads (grouped-query attention is not expanded), per layer, for up to
// max_context positions; every buffer is planned in the constructor and no pass allocates.
// Parameters come from a ParamSource unit by unit, as Llama takes them, in the memory of the
// backend the decoder runs on (a GPU's too); token ids go in and logits come out through the
// host once per pass. Tensor and pipeline parallel layouts are refused.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/arena.h"
#include "kernels/backend.h"
#include "model/layout.h"
#include "model/param_source.h"
#include "model/unit_params.h"

namespace tessera::model {

class Decoder {
 public:
  // batch: sequences (B); max_context: cached positions per sequence, at most seq_len (RoPE
  // positions are absolute and the model knows none past seq_len). bf16: the weight GEMMs take
  // the units' bf16 images when the source has them (Llama's bf16, forward only).
  Decoder(const ModelLayout& layout, int64_t batch, int64_t max_context, int threads, bool bf16 = false,
          kernels::Backend& backend = kernels::cpu_backend());

  int64_t batch() const { return B_; }
  int64_t max_context() const { return Tc_; }
  int64_t vocab() const { return V_; }
  // Tokens in sequence b's cache.
  int64_t length(int64_t b) const { return length_[b]; }
  size_t bytes() const { return arena_.capacity(); }
  static size_t planned_bytes(const ModelLayout& layout, int64_t batch, int64_t max_context, int threads, bool bf16,
                              const kernels::Backend& backend = kernels::cpu_backend());

  // Empties sequence b's cache; its next tokens start at position 0.
  void reset(int64_t b) { length_[b] = 0; }
  // Runs tokens[b] (B spans, any may be empty) after what sequence b's cache holds and caches
  // them; needs length(b) + tokens[b].size() <= max_context. Returns logits (B, V) in host
  // memory: row b those after the last of tokens[b] (a sequence given no tokens keeps its row
  // from before).
  const float* append(ParamSource& params, std::span<const std::span<const int32_t>> tokens);
  // Empties every cache and appends prompts[b] (B prompts, each at least one token).
  const float* prefill(ParamSource& params, const std::vector<std::vector<int32_t>>& prompts);
  // Appends one token to every sequence: tokens (B).
  const float* step(ParamSource& params, const int32_t* tokens);

 private:
  // Rows: the tokens of one pass, at most P = max(B, min(B x max_context, kMaxPassRows)). In the
  // backend's memory.
  struct Buffers {
    float* x;         // (P, C) residual stream
    float* xn;        // (P, C) a norm's output
    float* rstd;      // (P)
    float* qkv;       // (P, qkv_dim) after RoPE on q and k
    float* att;       // (P, H*D)
    float* h13;       // (P, 2F)
    float* g;         // (P, F)
    float* k_cache;   // (L, B, max_context, Hkv*D)
    float* v_cache;   // (L, B, max_context, Hkv*D)
    float* rope;      // (seq_len, D/2, 2)
    float* attn_ws;   // attention_cached_workspace_floats
    float* last;      // (B, C) normed last rows of the sequences in a pass
    float* logits;    // (B, V) copied out by each pass
    float* pass_out;  // (B, V) a pass's logits, by active sequence
    int32_t* tokens;  // (P)
    int64_t* rows;    // (B + 1) first row of each sequence in a pass
    int64_t* start;   // (B) position of each sequence's first row in a pass
    uint16_t* x16;    // bf16 only: (P, max(C, H*D, F)) a GEMM's input rounded
    float* norm_w;    // bf16 only: (C) a norm gain widened
  };
  static constexpr int64_t kMaxPassRows = 512;
  static int64_t pass_rows(int64_t batch, int64_t max_context);
  static void plan(Arena& arena, Buffers& b, const ModelLayout& layout, int64_t B, int64_t Tc, int threads, bool bf16,
                   const kernels::Backend& backend);

  // One pass over the rows set up in b_.tokens, b_.rows, b_.start; caches them and writes the
  // logits of each sequence's last row (sequences with rows) into b_.logits.
  void pass(ParamSource& params);
  void block(const UnitParams& w, int64_t layer, int64_t n);
  // RoPE at each row's position, then the row's key and value into the layer's cache.
  void rope_and_cache(int64_t layer);
  void head(ParamSource& params);
  UnitParams acquire(ParamSource& params, int unit) const;
  // y (M, N) = x (M, K) . W^T + beta y, W the (N, K) tensor at `offset` in the unit.
  void linear(float* y, const float* x, const UnitParams& p, int64_t offset, int64_t M, int64_t N, int64_t K,
              float beta);
  const float* norm_weight(const UnitParams& p, int64_t offset);

  ModelLayout layout_;
  int64_t B_, Tc_, P_, V_;
  int threads_;
  bool bf16_;
  kernels::Backend& be_;
  kernels::Memory memory_;  // the arena's
  Arena arena_;
  Buffers b_{};
  // A pass's rows as the host sets them up (uploaded into b_.tokens, b_.rows, b_.start), and the
  // logits as returned.
  std::vector<int32_t> host_tokens_;
  std::vector<int64_t> host_rows_, host_start_;
  std::vector<float> host_logits_;
  std::vector<int64_t> length_;
  std::vector<int64_t> taken_;                   // (B) of append's tokens, those run so far
  std::vector<std::span<const int32_t>> spans_;  // (B) prefill's and step's arguments to append
};

}  // namespace tessera::model
