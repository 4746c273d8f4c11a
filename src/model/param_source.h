// The seam between the model and whatever holds its parameters (ARCHITECTURE.md): the model runs
// unit by unit and asks for each unit's full parameters before using them, and hands back that
// unit's gradients when its backward is done. A single process and every sharding strategy are
// implementations of this one interface.
#pragma once

#include <cstdint>

#include "core/check.h"

namespace tessera::model {

class ParamSource {
 public:
  virtual ~ParamSource() = default;
  // Full parameters of `unit` (the unit's padded flat buffer); may block on a prefetched gather.
  virtual const float* acquire(int unit) = 0;
  // Mixed precision: the unit's full parameters rounded to bf16 (bit patterns, core/bf16.h), when
  // the source hands out a bf16 image; then the model reads nothing else of the unit until its
  // release. Acquires as acquire() does. Returns nullptr, acquiring nothing, when the source has
  // no bf16 image, and the model then calls acquire().
  virtual const uint16_t* acquire_bf16(int /*unit*/) { return nullptr; }
  // The model no longer reads `unit`'s parameters until the next acquire.
  virtual void release(int unit) = 0;
  // Full-size gradient buffer of `unit`; the model adds into it (it is zeroed by the source).
  virtual float* grads(int unit) = 0;
  // The model has finished adding `unit`'s gradients for this micro-batch.
  virtual void grads_ready(int unit) = 0;

  // Tensor parallelism (layout.h, TensorParallel): the sum over this rank's tensor-parallel group
  // in place (row-parallel partial products, the input gradients of column-parallel ones), and
  // the gather of `count` floats from every rank of it into out (size x count, in rank order),
  // and (sequence parallelism) the sum over the group of in (size x count) of which this rank
  // keeps block `rank` (count floats) in out. Every rank must get the same bits of what they
  // share. The model calls them only when its layout's group is larger than one.
  virtual void tp_all_reduce(float* /*data*/, int64_t /*count*/) { CHECK_MSG(false, "no tensor-parallel group"); }
  virtual void tp_all_gather(const float* /*in*/, float* /*out*/, int64_t /*count*/) {
    CHECK_MSG(false, "no tensor-parallel group");
  }
  // The same gather of `count` bf16 values (bit patterns): the rows a bf16 GEMM reads.
  virtual void tp_all_gather_bf16(const uint16_t* /*in*/, uint16_t* /*out*/, int64_t /*count*/) {
    CHECK_MSG(false, "no tensor-parallel group");
  }
  virtual void tp_reduce_scatter(const float* /*in*/, float* /*out*/, int64_t /*count*/) {
    CHECK_MSG(false, "no tensor-parallel group");
  }
};

}  // namespace tessera::model
