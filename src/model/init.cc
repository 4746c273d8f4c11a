// Parameter initialization as a pure function of (seed, unit, element).
#include "model/init.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include "core/rng.h"
#include "core/threads.h"

namespace tessera::model {

void init_unit_slice(const ModelLayout& layout, int unit, uint64_t seed, int64_t begin, int64_t end, float* out) {
  const UnitLayout& u = layout.unit(unit);
  const ModelConfig& c = layout.config();
  const int tp_rank = layout.tensor_parallel().rank;
  const int global = layout.global_unit(unit);  // draws do not depend on the pipeline stage either
  std::fill(out, out + (end - begin), 0.0f);
  for (const TensorSpec& t : u.tensors) {
    if (std::max(begin, t.offset) >= std::min(end, t.offset + t.numel())) continue;
    const std::string_view name = t.name;
    double std = c.init_std;
    if (name.ends_with("wo.weight") || name.ends_with("w2.weight")) std /= std::sqrt(2.0 * c.n_layers);
    // An element's value is drawn by its index in the whole model's unit (tp = 1), so a
    // tensor-parallel block holds exactly its part of the whole initialization.
    for (const BlockRun& run : block_runs(t, tp_rank)) {
      const int64_t lo = std::max(begin, t.offset + run.block), hi = std::min(end, t.offset + run.block + run.count);
      if (lo >= hi) continue;
      if (!t.decay) {  // norm gains
        std::fill(out + (lo - begin), out + (hi - begin), 1.0f);
        continue;
      }
      const int64_t shift = t.full_offset + run.whole - (t.offset + run.block);  // unit index -> whole unit index
      parallel_for(hi - lo, [&](int64_t i0, int64_t i1) {
        for (int64_t i = lo + i0; i < lo + i1; ++i) {
          out[i - begin] = static_cast<float>(std * rng::normal(seed, global, i + shift));
        }
      });
    }
  }
}

}  // namespace tessera::model
