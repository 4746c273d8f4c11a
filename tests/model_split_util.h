// What the tests of a model split across processes (tensor_parallel_test.cc, pipeline_test.cc)
// share: weights that are a pure function of the tensor's name and element, a parameter source
// holding a rank's units whole (its tp blocks of them), and a rank's loss and gradients written
// to files and read back for the comparison with the whole model.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "comm/process_group.h"
#include "core/rng.h"
#include "model/layout.h"
#include "model/llama.h"
#include "model/param_source.h"

namespace tessera::test_util {

// Element i of whole tensor t: the same on every rank, stage and tp size. Norm gains are
// jittered away from 1 so that a gain read for the wrong norm shows.
inline float weight(const model::TensorSpec& t, int64_t i, uint64_t seed) {
  const uint64_t stream = std::hash<std::string>{}(t.name);
  if (!t.decay) return 1.0f + 0.5f * static_cast<float>(rng::uniform(seed, stream, i) - 0.5);
  return 0.08f * static_cast<float>(rng::normal(seed, stream, i));
}

// A rank's units whole (no sharding): its tp blocks of `weight`'s tensors, with the tp group's
// collectives when there is one.
class WholeUnitsSource final : public model::ParamSource {
 public:
  WholeUnitsSource(const model::ModelLayout& layout, uint64_t seed, comm::ProcessGroup* tp = nullptr) : tp_(tp) {
    for (const model::UnitLayout& u : layout.units()) {
      params_.emplace_back(u.padded, 0.0f);
      grads_.emplace_back(u.padded, 0.0f);
      for (const model::TensorSpec& t : u.tensors) {
        std::vector<float> whole(static_cast<size_t>(t.full_numel()));
        for (size_t i = 0; i < whole.size(); ++i) whole[i] = weight(t, static_cast<int64_t>(i), seed);
        copy_block_out(t, layout.tensor_parallel().rank, whole.data(), params_.back().data() + t.offset);
      }
    }
  }
  const float* acquire(int unit) override { return params_[unit].data(); }
  void release(int) override {}
  float* grads(int unit) override { return grads_[unit].data(); }
  void grads_ready(int) override {}
  void tp_all_reduce(float* data, int64_t count) override {
    tp_->all_reduce(data, count, comm::DType::kF32, {comm::Millis(20000)})->wait();
  }
  void tp_all_gather(const float* in, float* out, int64_t count) override {
    tp_->all_gather(in, out, count, comm::DType::kF32, {comm::Millis(20000)})->wait();
  }
  void tp_reduce_scatter(const float* in, float* out, int64_t count) override {
    tp_->reduce_scatter(in, out, count, comm::DType::kF32, {comm::Millis(20000)})->wait();
  }
  const std::vector<float>& unit_grads(int unit) const { return grads_[unit]; }

 private:
  comm::ProcessGroup* tp_;
  std::vector<std::vector<float>> params_, grads_;
};

// PATH.safetensors (the source's gradients, by tensor name) and PATH.loss (sum and count).
inline void write_result(const std::filesystem::path& path, const model::ModelLayout& layout,
                         const WholeUnitsSource& source, const model::LossSum& loss) {
  std::vector<checkpoint::NamedTensor> grads;
  for (int u = 0; u < layout.num_units(); ++u) {
    for (const model::TensorSpec& t : layout.units()[u].tensors) {
      const float* g = source.unit_grads(u).data() + t.offset;
      grads.push_back({t.name, t.shape, std::vector<float>(g, g + t.numel())});
    }
  }
  checkpoint::write_safetensors(path.string() + ".safetensors", grads);
  FILE* f = std::fopen((path.string() + ".loss").c_str(), "w");
  std::fprintf(f, "%.17g %lld\n", loss.sum, static_cast<long long>(loss.count));
  std::fclose(f);
}

inline std::pair<double, int64_t> read_loss(const std::filesystem::path& path) {
  double sum = NAN;
  long long count = 0;
  FILE* f = std::fopen((path.string() + ".loss").c_str(), "r");
  EXPECT_NE(f, nullptr) << path;
  if (f == nullptr) return {sum, 0};
  EXPECT_EQ(std::fscanf(f, "%lf %lld", &sum, &count), 2);
  std::fclose(f);
  return {sum, count};
}

inline std::map<std::string, std::vector<float>> read_grads(const std::filesystem::path& path) {
  std::map<std::string, std::vector<float>> out;
  for (auto& t : checkpoint::read_safetensors(path.string() + ".safetensors")) out[t.name] = std::move(t.data);
  return out;
}

// got within 1e-5 of want's largest magnitude, element by element.
inline void expect_close_to_whole(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  double scale = 0, err = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, static_cast<double>(std::abs(want[i])));
    err = std::max(err, static_cast<double>(std::abs(got[i] - want[i])));
  }
  EXPECT_GT(scale, 0.0);
  EXPECT_LE(err, 1e-5 * scale) << "max |difference| " << err << " against max |gradient| " << scale;
}

}  // namespace tessera::test_util
