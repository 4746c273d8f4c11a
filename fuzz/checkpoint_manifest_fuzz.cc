// Fuzzes checkpoint::parse_manifest: an accepted manifest names one file per (stage, tp rank,
// shard rank), inside the step directory, units have distinct names and a stage, every tensor
// lies inside its unit, and a tensor's whole shape is its block's with the split dimension
// tensor_parallel times as long.
#include <string>

#include "checkpoint/manifest.h"
#include "core/file_io.h"
#include "harness.h"

namespace tessera::fuzz {

void write_seeds(const std::string& dir) {
  checkpoint::Manifest m;
  m.step = 12;
  m.tokens = 4096;
  m.sampler_position = 48;
  m.world = 4;
  m.shard_size = 2;
  m.strategy = "hybrid_shard";
  m.config_toml = "[model]\npreset = \"tiny\"\n";
  m.created = "2026-01-01T00:00:00Z";
  m.units = {{"embedding", 0, 10, 32, {{"tok_embeddings.weight", {2, 5}, 0, -1, {2, 5}}}},
             {"head", 0, 3, 32, {{"norm.weight", {3}, 0, -1, {3}}}}};
  m.files = {{"shard_00000.bin", 0, 0, 0, 100, 0xabc}, {"shard_00001.bin", 0, 0, 1, 200, 0xdef}};
  write_file_atomic(dir + "/manifest.json", checkpoint::to_json(m));
  // Tensor-parallel: 2 tp ranks x 2 shard ranks, a tensor cut along each dimension.
  m.tensor_parallel = 2;
  m.world = 4;
  m.units = {{"embedding", 0, 10, 32, {{"tok_embeddings.weight", {2, 5}, 0, 0, {4, 5}}}},
             {"head", 0, 9, 32, {{"output.weight", {3, 2}, 0, 1, {3, 4}}, {"norm.weight", {3}, 6, -1, {3}}}}};
  m.files = {{"tp00_shard_00000.bin", 0, 0, 0, 100, 0xabc},
             {"tp00_shard_00001.bin", 0, 0, 1, 200, 0xdef},
             {"tp01_shard_00000.bin", 0, 1, 0, 100, 0x123},
             {"tp01_shard_00001.bin", 0, 1, 1, 200, 0x456}};
  write_file_atomic(dir + "/manifest_tp.json", checkpoint::to_json(m));
  // Pipeline: 2 stages x 2 shard ranks, the head on stage 1.
  m.tensor_parallel = 1;
  m.pipeline_parallel = 2;
  m.units = {{"embedding", 0, 10, 32, {{"tok_embeddings.weight", {2, 5}, 0, -1, {2, 5}}}},
             {"head", 1, 3, 32, {{"norm.weight", {3}, 0, -1, {3}}}}};
  m.files = {{"pp00_tp00_shard_00000.bin", 0, 0, 0, 100, 0xabc},
             {"pp00_tp00_shard_00001.bin", 0, 0, 1, 200, 0xdef},
             {"pp01_tp00_shard_00000.bin", 1, 0, 0, 100, 0x123},
             {"pp01_tp00_shard_00001.bin", 1, 0, 1, 200, 0x456}};
  write_file_atomic(dir + "/manifest_pp.json", checkpoint::to_json(m));
}

}  // namespace tessera::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  checkpoint::Manifest m;
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (!fuzz::parses([&] { m = checkpoint::parse_manifest(text, "fuzz"); })) return 0;
  const int P = m.pipeline_parallel, T = m.tensor_parallel, S = m.shard_size;
  FUZZ_CHECK(S >= 1 && T >= 1 && P >= 1 && m.world % (S * T * P) == 0);
  FUZZ_CHECK(m.files.size() == static_cast<size_t>(P * T * S));
  for (int p = 0; p < P; ++p) {
    for (int t = 0; t < T; ++t) {
      for (int k = 0; k < S; ++k) FUZZ_CHECK(m.file_of(p, t, k) != nullptr);
    }
  }
  for (const auto& f : m.files) FUZZ_CHECK(!f.name.empty() && f.name.find('/') == std::string::npos);
  for (size_t i = 0; i < m.units.size(); ++i) {
    const auto& u = m.units[i];
    FUZZ_CHECK(0 <= u.numel && u.numel <= u.padded && u.padded % m.shard_size == 0);
    FUZZ_CHECK(u.pp_rank >= 0 && u.pp_rank < P);
    for (size_t j = 0; j < i; ++j) FUZZ_CHECK(m.units[j].name != u.name);
    for (const auto& t : u.tensors) {
      int64_t n = 1;
      for (const int64_t d : t.shape) {
        FUZZ_CHECK(d >= 0);
        FUZZ_CHECK(!__builtin_mul_overflow(n, d, &n));
      }
      FUZZ_CHECK(t.offset >= 0 && n <= u.numel - t.offset);
      FUZZ_CHECK(t.full_shape.size() == t.shape.size() && t.split_dim >= -1 &&
                 t.split_dim < static_cast<int>(t.shape.size()));
      for (size_t d = 0; d < t.shape.size(); ++d) {
        const int64_t cut = static_cast<int>(d) == t.split_dim ? m.tensor_parallel : 1;
        FUZZ_CHECK(t.full_shape[d] == t.shape[d] * cut);
      }
    }
  }
  return 0;
}
