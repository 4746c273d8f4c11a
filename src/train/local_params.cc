// The single-process ParamSource.
#include "train/local_params.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "core/error.h"
#include "kernels/cpu/vector.h"
#include "model/init.h"

namespace tessera::train {

namespace {
size_t state_bytes(const model::ModelLayout& layout) {
  Arena measure;
  for (const model::UnitLayout& u : layout.units()) measure.take<float>(4 * static_cast<size_t>(u.padded));
  return measure.used();
}
}  // namespace

LocalParams::LocalParams(const model::ModelLayout& layout, uint64_t seed)
    : layout_(layout), arena_(state_bytes(layout)) {
  for (int u = 0; u < layout_.num_units(); ++u) {
    const int64_t n = layout_.units()[u].padded;
    float* block = arena_.take<float>(4 * static_cast<size_t>(n));
    params_.push_back(block);
    grads_.push_back(block + n);
    m_.push_back(block + 2 * n);
    v_.push_back(block + 3 * n);
    model::init_unit_slice(layout_, u, seed, 0, n, params_[u]);
  }
}

void LocalParams::zero_grads() {
  for (int u = 0; u < layout_.num_units(); ++u) std::memset(grads_[u], 0, sizeof(float) * layout_.units()[u].padded);
}

double LocalParams::grad_sum_squares() const {
  double s = 0.0;
  for (int u = 0; u < layout_.num_units(); ++u) s += kernels::cpu::sum_squares(grads_[u], layout_.units()[u].padded);
  return s;
}

std::vector<checkpoint::NamedTensor> LocalParams::named_tensors() const {
  std::vector<checkpoint::NamedTensor> out;
  for (int u = 0; u < layout_.num_units(); ++u) {
    for (const model::TensorSpec& t : layout_.units()[u].tensors) {
      const float* p = params_[u] + t.offset;
      out.push_back({t.name, t.shape, std::vector<float>(p, p + t.numel())});
    }
  }
  return out;
}

void LocalParams::load_tensors(const std::vector<checkpoint::NamedTensor>& tensors, const std::string& origin) {
  std::map<std::string, const checkpoint::NamedTensor*> by_name;
  for (const auto& t : tensors) by_name[t.name] = &t;
  for (int u = 0; u < layout_.num_units(); ++u) {
    for (const model::TensorSpec& spec : layout_.units()[u].tensors) {
      auto it = by_name.find(spec.name);
      if (it == by_name.end()) throw DataError(fmt::format("{}: tensor {} is missing", origin, spec.name));
      if (it->second->shape != spec.shape) {
        throw DataError(fmt::format("{}: tensor {} has shape [{}], the model expects [{}]", origin, spec.name,
                                    fmt::join(it->second->shape, ", "), fmt::join(spec.shape, ", ")));
      }
      std::copy(it->second->data.begin(), it->second->data.end(), params_[u] + spec.offset);
    }
  }
}

void LocalParams::scale_grads(float s) {
  for (int u = 0; u < layout_.num_units(); ++u) kernels::cpu::scale_inplace(grads_[u], layout_.units()[u].padded, s);
}

}  // namespace tessera::train
