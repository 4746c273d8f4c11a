// The key/value-cache decoder on the CUDA backend against the same decoder on the CPU backend (the
// reference path, itself tested against Llama::forward_logits): a batch of prompts of different
// lengths prefilled, then steps fed the CPU's greedy tokens, every row of logits compared; fp32
// and bf16 weights, grouped-query attention. Skipped without a device.
//
// Bounds as model/decoder_test.cc: fp32 rows within 1e-5 of the row's largest logit (two blocks
// and the head, different summation orders); bf16 within 1e-2 (each weight GEMM's inputs rounded
// on both backends, the roundings differing where the fp32 values differ in their last bits).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <span>
#include <vector>

#include "core/rng.h"
#include "fsdp/sharded_params.h"
#include "kernels/backend.h"
#include "kernels/cuda/test_util.h"
#include "model/decoder.h"
#include "model/decoder_test_util.h"
#include "model/layout.h"

namespace tessera::model {
namespace {

using testing::random_tokens;
using testing::row_error;

class DecoderOnCuda : public ::testing::TestWithParam<bool> {};

TEST_P(DecoderOnCuda, MatchesTheCpuDecoder) {
  REQUIRE_CUDA_DEVICE();
  const bool bf16 = GetParam();
  const double bound = bf16 ? 1e-2 : 1e-5;
  auto gpu = kernels::make_cuda_backend({});
  ModelConfig c;
  ASSERT_TRUE(model_preset("tiny", &c));  // 4 query heads on 2 key/value heads
  c.init_std = 0.2;                       // logits spread well beyond rounding
  const ModelLayout layout(c);
  const int64_t T = c.seq_len, V = c.vocab_size;
  const comm::DType dtype = bf16 ? comm::DType::kBF16 : comm::DType::kF32;
  fsdp::ShardedParams on_cpu(layout, 42, fsdp::Strategy::kNoShard, parallel::Mesh::single(), 1, comm::Millis(0), dtype);
  fsdp::ShardedParams on_gpu(layout, 0, fsdp::Strategy::kNoShard, parallel::Mesh::single(), 1, comm::Millis(0), dtype,
                             comm::DType::kF32, *gpu);
  on_gpu.load_tensors(on_cpu.gather_named_tensors(), "the CPU's parameters");

  const std::vector<std::vector<int32_t>> prompts = {random_tokens(5, V, 1), random_tokens(21, V, 2),
                                                     random_tokens(T - 12, V, 3)};
  const int64_t B = static_cast<int64_t>(prompts.size());
  Decoder cpu(layout, B, T, 2, bf16), cuda(layout, B, T, 2, bf16, *gpu);
  const float* a = cpu.prefill(on_cpu, prompts);
  const float* b = cuda.prefill(on_gpu, prompts);
  for (int64_t s = 0; s < B; ++s) EXPECT_LE(row_error(b + s * V, a + s * V, V), bound) << "prefill, sequence " << s;
  std::vector<int32_t> next(B);
  for (int step = 0; step < 8; ++step) {
    for (int64_t s = 0; s < B; ++s)
      next[s] = static_cast<int32_t>(std::max_element(a + s * V, a + (s + 1) * V) - (a + s * V));
    a = cpu.step(on_cpu, next.data());
    b = cuda.step(on_gpu, next.data());
    for (int64_t s = 0; s < B; ++s) {
      EXPECT_LE(row_error(b + s * V, a + s * V, V), bound) << "step " << step << ", sequence " << s;
    }
  }
  EXPECT_EQ(cuda.length(2), T - 12 + 8);
}

INSTANTIATE_TEST_SUITE_P(Weights, DecoderOnCuda, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "bf16" : "fp32"; });

}  // namespace
}  // namespace tessera::model
