// A Hugging Face export against an independent HF-convention PyTorch Llama (tests/torch_ref/
// hf_llama.py): the exported weights, read by HF names and rotated the rotate_half way, give
// Tessera's logits.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "checkpoint/hf.h"
#include "core/rng.h"
#include "core/threads.h"
#include "fsdp/sharded_params.h"
#include "model/llama.h"
#include "npy.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

struct Variant {
  const char* name;
  int64_t n_heads, n_kv_heads;
  bool tied;
  double rope_theta;
  uint64_t max_shard_bytes;
  // Llama 3.1's scaling with an original length of 64 (the tiny model's seq_len): at head dim 16,
  // base 5e5, channel pair 0 is kept, pair 1 blended and the rest divided by 8.
  bool llama3 = false;
};

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

class HfParity : public ::testing::TestWithParam<Variant> {};

TEST_P(HfParity, ExportGivesTesseraLogitsInAnHfLlama) {
  const Variant& v = GetParam();
  model::ModelConfig c;
  ASSERT_TRUE(model::model_preset("tiny", &c));
  c.n_heads = v.n_heads;
  c.n_kv_heads = v.n_kv_heads;
  c.tied_embeddings = v.tied;
  c.rope_theta = v.rope_theta;
  if (v.llama3) {
    c.rope_scaling = model::RopeScaling::kLlama3;
    c.rope_original_seq_len = 64;
  }
  const int64_t B = 2, T = c.seq_len;
  set_num_threads(2);

  const model::ModelLayout layout(c);
  fsdp::ShardedParams params(layout, 17, fsdp::Strategy::kNoShard, parallel::Mesh::single(), 1, comm::Millis(0));
  model::Llama llama(layout, B, num_threads());
  // Norm gains start at exactly 1: jitter them so that a swapped norm would show. At init scale
  // attention is nearly uniform and barely depends on the rotation: sharpen it by scaling q and k.
  for (int u = 0; u < layout.num_units(); ++u) {
    for (const auto& t : layout.units()[u].tensors) {
      float* p = params.master_shard(u) + t.offset;
      if (!t.decay) {
        for (int64_t i = 0; i < t.numel(); ++i) p[i] = 1.0f + 0.5f * static_cast<float>(rng::uniform(4, u, i) - 0.5);
      } else if (t.name.ends_with("attention.wq.weight") || t.name.ends_with("attention.wk.weight")) {
        for (int64_t i = 0; i < t.numel(); ++i) p[i] *= 8.0f;
      }
    }
  }

  const fs::path dir = fs::path(::testing::TempDir()) / fmt::format("hf_parity_{}_{}", v.name, ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  checkpoint::HfExportOptions options;
  options.max_shard_bytes = v.max_shard_bytes;
  checkpoint::export_hf(c, params.gather_named_tensors(), "test", (dir / "hf").string(), options);
  ASSERT_EQ(fs::exists(dir / "hf" / "model.safetensors.index.json"), v.max_shard_bytes < 1000000);

  std::vector<int32_t> inputs(B * T);
  for (int64_t i = 0; i < B * T; ++i) inputs[i] = static_cast<int32_t>(rng::bits(5, 1, i) % c.vocab_size);
  std::vector<float> logits(B * T * c.vocab_size);
  llama.forward_logits(params, inputs.data(), logits.data());
  testing::write_npy(dir / "inputs.npy", inputs, {B, T});
  testing::write_npy(dir / "logits.npy", logits, {B, T, c.vocab_size});

  const std::string cmd = fmt::format("{} {}/tests/torch_ref/hf_llama.py {}", TESSERA_TORCH_PYTHON, TESSERA_SOURCE_DIR,
                                      dir.string());
  const int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << "HF parity failed for " << v.name << " (data kept in " << dir << "): " << cmd;
  if (rc == 0) fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Variants, HfParity,
                         ::testing::Values(Variant{"gqa_untied", 4, 2, false, 10000.0, 5'000'000'000},
                                           Variant{"gqa_untied_sharded", 8, 2, false, 500000.0, 100'000},
                                           Variant{"mha_tied", 4, 4, true, 10000.0, 5'000'000'000},
                                           Variant{"gqa_tied", 4, 2, true, 500000.0, 5'000'000'000},
                                           Variant{"gqa_llama3_scaling", 4, 2, true, 500000.0, 5'000'000'000, true}),
                         [](const auto& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace tessera
