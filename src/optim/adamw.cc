// AdamW over flat unit buffers.
#include "optim/adamw.h"

#include <algorithm>
#include <vector>

#include "core/check.h"

namespace tessera::optim {

void adamw_update(kernels::Backend& backend, const model::UnitLayout& unit, int64_t begin, int64_t end, float* p,
                  const float* g, float* m, float* v, const AdamWConfig& config, double lr, int64_t step,
                  const UpdateOptions& options) {
  kernels::AdamWParams ap;
  ap.lr = static_cast<float>(lr);
  ap.beta1 = static_cast<float>(config.beta1);
  ap.beta2 = static_cast<float>(config.beta2);
  ap.eps = static_cast<float>(config.eps);
  ap.step = step;
  ap.grad_scale = static_cast<float>(options.grad_scale);
  ap.weight_decay = static_cast<float>(config.weight_decay);
  // The slice [begin, end) as runs of tensors that take weight decay or not, adjacent runs of one
  // kind merged: one backend call for the whole slice.
  std::vector<kernels::AdamWSegment> segments;
  for (const model::TensorSpec& t : unit.tensors) {
    const int64_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel());
    if (lo >= hi) continue;
    // A unit's tensors lie end to end from its start (its padding after them: left untouched).
    CHECK_MSG(lo - begin == (segments.empty() ? 0 : segments.back().end), "AdamW: a unit's tensors must tile it");
    if (!segments.empty() && segments.back().decay == t.decay) {
      segments.back().end = hi - begin;
    } else {
      segments.push_back({hi - begin, t.decay});
    }
  }
  if (segments.empty()) return;
  backend.adamw_update(p, g, m, v, segments.data(), static_cast<int>(segments.size()), ap, options.image);
}

uint64_t AdamW::planned_bytes(const std::vector<int64_t>& slice_sizes) {
  uint64_t bytes = 0;
  for (int64_t n : slice_sizes) bytes += 2 * (sizeof(float) * static_cast<uint64_t>(n) + Arena::kAlign);
  return bytes;
}

AdamW::AdamW(const AdamWConfig& config, const std::vector<int64_t>& slice_sizes, kernels::Backend& backend)
    : config_(config),
      sizes_(slice_sizes),
      backend_(backend),
      memory_(backend.allocate(planned_bytes(slice_sizes))),
      arena_(memory_.get(), planned_bytes(slice_sizes)) {
  for (int64_t n : sizes_) {
    m_.push_back(arena_.take<float>(static_cast<size_t>(n)));
    v_.push_back(arena_.take<float>(static_cast<size_t>(n)));
  }
}

void AdamW::update(const model::UnitLayout& unit, int u, int64_t begin, float* master, const float* grad, double lr,
                   int64_t step, const UpdateOptions& options) {
  adamw_update(backend_, unit, begin, begin + sizes_[u], master, grad, m_[u], v_[u], config_, lr, step, options);
}

uint64_t AdamW::bytes() const {
  uint64_t bytes = 0;
  for (int64_t n : sizes_) bytes += 2 * sizeof(float) * static_cast<uint64_t>(n);
  return bytes;
}

double clip_factor(double grad_norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0;
  return std::min(1.0, max_norm / (grad_norm + 1e-6));
}

}  // namespace tessera::optim
