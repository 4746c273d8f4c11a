// The model on the CUDA backend against the same model on the CPU backend (the reference path,
// itself tested against PyTorch): one micro-batch's loss and every unit's gradient, fp32 and
// bf16, tied and untied embeddings; and the CUDA path's own determinism (the same step twice,
// and with activation recompute, gives the same bits). Skipped without a device;
// scripts/gpu_check.sh runs it on a GPU machine.
//
// Bounds. fp32 with TF32 off: both backends compute the same float operations in different
// orders (GEMM blocking, reductions), each sum erring by ~u sqrt(K) relative (u = 2^-24): the
// loss within 1e-5 relative and each gradient within 1e-4 of its norm (the bound; the
// expected error is ~1e-6). bf16: each GEMM input is rounded to bf16 on both backends, the
// roundings differing wherever the fp32 values they round differ in the last bits, and CUDA's
// attention takes its products on bf16 operands too (the CPU's stays fp32), so the two differ as
// bf16 differs from fp32: the loss within 1e-2 relative and each gradient's 1 - cosine
// within 1e-4 (model/mixed_precision_test.cc derives both). A wrong index, scale or missing term
// moves a gradient by a sizeable fraction of its norm.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/rng.h"
#include "kernels/backend.h"
#include "kernels/cuda/test_util.h"
#include "model/init.h"
#include "model/layout.h"
#include "model/llama.h"

namespace tessera::model {
namespace {

constexpr int64_t kB = 2;

// Every unit whole, in one backend's memory, with its gradient and (bf16) its bf16 image; the
// values the same on every backend: init_unit_slice with jittered norm gains.
class UnitsOn final : public ParamSource {
 public:
  UnitsOn(const ModelLayout& layout, kernels::Backend& be, bool bf16) : be_(be), bf16_(bf16) {
    for (int u = 0; u < layout.num_units(); ++u) {
      const UnitLayout& unit = layout.units()[u];
      std::vector<float> host(static_cast<size_t>(unit.padded));
      init_unit_slice(layout, u, 7, 0, unit.padded, host.data());
      for (const TensorSpec& t : unit.tensors) {
        if (t.decay) continue;  // a norm gain: jittered so that reading the wrong one shows
        for (int64_t i = 0; i < t.numel(); ++i)
          host[t.offset + i] = 1.0f + 0.5f * (rng::uniform(9, u, t.offset + i) - 0.5f);
      }
      std::vector<uint16_t> image(host.size());
      f32_to_bf16(host.data(), image.data(), unit.padded);
      params_.push_back(be.allocate(sizeof(float) * host.size()));
      grads_.push_back(be.allocate(sizeof(float) * host.size()));
      images_.push_back(be.allocate(sizeof(uint16_t) * host.size()));
      be.to_device(params_.back().get(), host.data(), sizeof(float) * host.size());
      be.to_device(images_.back().get(), image.data(), sizeof(uint16_t) * image.size());
      sizes_.push_back(unit.padded);
    }
  }
  const float* acquire(int unit) override { return reinterpret_cast<const float*>(params_[unit].get()); }
  const uint16_t* acquire_bf16(int unit) override {
    return bf16_ ? reinterpret_cast<const uint16_t*>(images_[unit].get()) : nullptr;
  }
  void release(int) override {}
  float* grads(int unit) override { return reinterpret_cast<float*>(grads_[unit].get()); }
  void grads_ready(int) override {}

  std::vector<float> unit_grads(int unit) {
    std::vector<float> g(static_cast<size_t>(sizes_[unit]));
    be_.to_host(g.data(), grads_[unit].get(), sizeof(float) * g.size());
    return g;
  }
  void zero_grads() {
    for (size_t u = 0; u < grads_.size(); ++u) be_.zero(grads_[u].get(), sizeof(float) * sizes_[u]);
  }

 private:
  kernels::Backend& be_;
  bool bf16_;
  std::vector<kernels::Memory> params_, grads_, images_;
  std::vector<int64_t> sizes_;
};

struct Step {
  double loss = 0.0;
  std::vector<std::vector<float>> grads;  // per unit
};

// One micro-batch on `be`: the mean loss and the gradient of the mean, as the trainer scales it.
Step run(const ModelLayout& layout, kernels::Backend& be, bool bf16, int64_t recompute_every,
         const std::vector<int32_t>& in, const std::vector<int32_t>& tgt) {
  UnitsOn source(layout, be, bf16);
  Llama model(layout, kB, 2, recompute_every, bf16, be);
  const int64_t n = static_cast<int64_t>(tgt.size());
  const float scale = 1.0f / static_cast<float>(count_valid_targets(tgt.data(), n));
  Step s;
  s.loss = model.forward_backward(source, in.data(), tgt.data(), scale).mean();
  for (int u = 0; u < layout.num_units(); ++u) s.grads.push_back(source.unit_grads(u));
  return s;
}

double norm(const std::vector<float>& a) {
  double s = 0.0;
  for (const float x : a) s += double{x} * x;
  return std::sqrt(s);
}

double relative_difference(const std::vector<float>& got, const std::vector<float>& want) {
  double d = 0.0;
  for (size_t i = 0; i < got.size(); ++i) d += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
  return std::sqrt(d) / norm(want);
}

double one_minus_cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double ab = 0.0;
  for (size_t i = 0; i < a.size(); ++i) ab += double{a[i]} * b[i];
  return 1.0 - ab / (norm(a) * norm(b));
}

class LlamaOnCuda : public ::testing::TestWithParam<bool> {  // tied embeddings
 protected:
  void SetUp() override {
    REQUIRE_CUDA_DEVICE();
    cuda_ = kernels::make_cuda_backend({});
    ModelConfig c;
    ASSERT_TRUE(model_preset("tiny", &c));
    c.tied_embeddings = GetParam();
    layout_ = std::make_unique<ModelLayout>(c);
    const int64_t n = kB * c.seq_len;
    for (int64_t i = 0; i < n; ++i) {
      in_.push_back(static_cast<int32_t>(rng::uniform(5, 0, i) * c.vocab_size) % c.vocab_size);
      tgt_.push_back(static_cast<int32_t>(rng::uniform(5, 1, i) * c.vocab_size) % c.vocab_size);
    }
    tgt_[3] = -1;  // ignored targets count for nothing
    tgt_[n - 1] = -1;
  }
  std::unique_ptr<kernels::Backend> cuda_;
  std::unique_ptr<ModelLayout> layout_;
  std::vector<int32_t> in_, tgt_;
};

TEST_P(LlamaOnCuda, Fp32MatchesCpu) {
  const Step cpu = run(*layout_, kernels::cpu_backend(), false, 0, in_, tgt_);
  const Step gpu = run(*layout_, *cuda_, false, 0, in_, tgt_);
  EXPECT_NEAR(gpu.loss, cpu.loss, 1e-5 * std::fabs(cpu.loss));
  for (size_t u = 0; u < cpu.grads.size(); ++u) {
    EXPECT_LE(relative_difference(gpu.grads[u], cpu.grads[u]), 1e-4) << "unit " << u;
  }
}

TEST_P(LlamaOnCuda, Bf16MatchesCpuWithinTheBf16Bound) {
  const Step cpu = run(*layout_, kernels::cpu_backend(), true, 0, in_, tgt_);
  const Step gpu = run(*layout_, *cuda_, true, 0, in_, tgt_);
  EXPECT_NEAR(gpu.loss, cpu.loss, 1e-2 * std::fabs(cpu.loss));
  for (size_t u = 0; u < cpu.grads.size(); ++u) {
    EXPECT_LE(one_minus_cosine(gpu.grads[u], cpu.grads[u]), 1e-4) << "unit " << u;
  }
}

TEST_P(LlamaOnCuda, SameBitsTwiceAndWithRecompute) {
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    const Step a = run(*layout_, *cuda_, bf16, 0, in_, tgt_);
    const Step b = run(*layout_, *cuda_, bf16, 0, in_, tgt_);
    const Step r = run(*layout_, *cuda_, bf16, 1, in_, tgt_);  // every block recomputed
    EXPECT_EQ(a.loss, b.loss);
    EXPECT_EQ(a.loss, r.loss);
    for (size_t u = 0; u < a.grads.size(); ++u) {
      EXPECT_EQ(a.grads[u], b.grads[u]) << "unit " << u;
      EXPECT_EQ(a.grads[u], r.grads[u]) << "unit " << u;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TiedEmbeddings, LlamaOnCuda, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "tied" : "untied"; });

}  // namespace
}  // namespace tessera::model
