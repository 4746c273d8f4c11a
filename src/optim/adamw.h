// Layer optim: the optimizer and its state, the learning-rate schedule and clipping. It must not
// know processes or communication.
//
// AdamW over a unit's flat fp32 master buffer (or any slice of it, such as a rank's shard), with
// weight decay on the tensors that take it; the moments it keeps for a rank's slices; and the
// global gradient-norm clip factor. Nothing here communicates: whoever holds the slices (fsdp)
// reduces the gradients first.
#pragma once

#include <cstdint>
#include <vector>

#include "core/arena.h"
#include "kernels/backend.h"
#include "kernels/ref/adamw.h"
#include "model/layout.h"

namespace tessera::optim {

struct AdamWConfig {
  double lr = 3e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

// How one update reads its gradient and what else it writes.
struct UpdateOptions {
  double grad_scale = 1.0;     // the gradient is multiplied by it first (the clip factor)
  uint16_t* image = nullptr;   // optional: the updated parameters rounded to bf16, written too
};

// Updates elements [begin, end) of `unit` on `backend`: p, g, m, v (and options.image) point at
// element `begin`, in the backend's memory. Padding is left untouched; tensors without decay (norm
// gains) get weight_decay 0. step is 1-based.
void adamw_update(kernels::Backend& backend, const model::UnitLayout& unit, int64_t begin, int64_t end, float* p,
                  const float* g, float* m, float* v, const AdamWConfig& config, double lr, int64_t step,
                  const UpdateOptions& options = {});

// AdamW's state for one rank: the fp32 first and second moments (exp_avg, exp_avg_sq) of its
// slice of each unit, zero at the start, planned in one arena in the backend's memory.
class AdamW {
 public:
  // slice_sizes[u]: how many elements of unit u this rank updates (its shard of the padded unit).
  // backend: where the moments live and the update runs (it outlives this object).
  AdamW(const AdamWConfig& config, const std::vector<int64_t>& slice_sizes,
        kernels::Backend& backend = kernels::cpu_backend());

  // Updates this rank's slice of unit u, which starts at element `begin` of the unit (the
  // tensors it overlaps decide the weight decay): master and grad hold slice_sizes[u] elements.
  // step: the 1-based update count (bias correction).
  void update(const model::UnitLayout& unit, int u, int64_t begin, float* master, const float* grad, double lr,
              int64_t step, const UpdateOptions& options = {});

  // The moments of unit u's slice, in the backend's memory.
  float* exp_avg(int u) { return m_[u]; }
  float* exp_avg_sq(int u) { return v_[u]; }
  uint64_t bytes() const;  // of both moments
  // The arena the constructor allocates for these slices (the moments and their alignment), and
  // the one it did.
  static uint64_t planned_bytes(const std::vector<int64_t>& slice_sizes);
  uint64_t arena_bytes() const { return arena_.capacity(); }

 private:
  AdamWConfig config_;
  std::vector<int64_t> sizes_;
  kernels::Backend& backend_;
  kernels::Memory memory_;  // the arena's
  Arena arena_;
  std::vector<float*> m_, v_;
};

// The factor torch.nn.utils.clip_grad_norm_ applies: min(1, max_norm / (norm + 1e-6)); 1 when
// max_norm <= 0 (clipping off).
double clip_factor(double grad_norm, double max_norm);

}  // namespace tessera::optim
