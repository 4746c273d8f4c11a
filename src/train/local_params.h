// The single-process ParamSource: every unit's full fp32 parameters, gradients and AdamW moments
// in one arena. The sharded engine implements the same seam with slices and collectives.
#pragma once

#include <cstdint>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/arena.h"
#include "model/layout.h"
#include "model/param_source.h"

namespace tessera::train {

class LocalParams final : public model::ParamSource {
 public:
  // Parameters initialized from `seed` (model/init.h); gradients and moments zero.
  LocalParams(const model::ModelLayout& layout, uint64_t seed);

  const float* acquire(int unit) override { return params_[unit]; }
  void release(int /*unit*/) override {}
  float* grads(int unit) override { return grads_[unit]; }
  void grads_ready(int /*unit*/) override {}

  float* params(int unit) { return params_[unit]; }
  float* m(int unit) { return m_[unit]; }
  float* v(int unit) { return v_[unit]; }
  void zero_grads();
  // Sum over units of the squared gradient elements, in a fixed order.
  double grad_sum_squares() const;
  void scale_grads(float s);
  size_t bytes() const { return arena_.capacity(); }
  // Every parameter tensor by its Llama name, copied out of the unit buffers.
  std::vector<checkpoint::NamedTensor> named_tensors() const;
  // Sets every parameter from `tensors` by name. Throws DataError naming `origin` and the tensor
  // when one is missing or has another shape.
  void load_tensors(const std::vector<checkpoint::NamedTensor>& tensors, const std::string& origin);

  const model::ModelLayout& layout() const { return layout_; }

 private:
  model::ModelLayout layout_;
  Arena arena_;
  std::vector<float*> params_, grads_, m_, v_;
};

}  // namespace tessera::train
