// Fuzzes checkpoint::parse_manifest: an accepted manifest names one file per (tp rank, shard
// rank), inside the step directory, every tensor lies inside its unit, and a tensor's whole shape
// is its block's with the split dimension tensor_parallel times as long.
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
  m.units = {{"embedding", 10, 32, {{"tok_embeddings.weight", {2, 5}, 0, -1, {2, 5}}}},
             {"head", 3, 32, {{"norm.weight", {3}, 0, -1, {3}}}}};
  m.files = {{"shard_00000.bin", 0, 0, 100, 0xabc}, {"shard_00001.bin", 0, 1, 200, 0xdef}};
  write_file_atomic(dir + "/manifest.json", checkpoint::to_json(m));
  // Tensor-parallel: 2 tp ranks x 2 shard ranks, a tensor cut along each dimension.
  m.tensor_parallel = 2;
  m.world = 4;
  m.units = {{"embedding", 10, 32, {{"tok_embeddings.weight", {2, 5}, 0, 0, {4, 5}}}},
             {"head", 9, 32, {{"output.weight", {3, 2}, 0, 1, {3, 4}}, {"norm.weight", {3}, 6, -1, {3}}}}};
  m.files = {{"tp00_shard_00000.bin", 0, 0, 100, 0xabc},
             {"tp00_shard_00001.bin", 0, 1, 200, 0xdef},
             {"tp01_shard_00000.bin", 1, 0, 100, 0x123},
             {"tp01_shard_00001.bin", 1, 1, 200, 0x456}};
  write_file_atomic(dir + "/manifest_tp.json", checkpoint::to_json(m));
}

}  // namespace tessera::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  checkpoint::Manifest m;
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (!fuzz::parses([&] { m = checkpoint::parse_manifest(text, "fuzz"); })) return 0;
  FUZZ_CHECK(m.shard_size >= 1 && m.tensor_parallel >= 1 && m.world % (m.shard_size * m.tensor_parallel) == 0);
  FUZZ_CHECK(m.files.size() == static_cast<size_t>(m.shard_size * m.tensor_parallel));
  for (int t = 0; t < m.tensor_parallel; ++t) {
    for (int k = 0; k < m.shard_size; ++k) FUZZ_CHECK(m.file_of(t, k) != nullptr);
  }
  for (const auto& f : m.files) FUZZ_CHECK(!f.name.empty() && f.name.find('/') == std::string::npos);
  for (const auto& u : m.units) {
    FUZZ_CHECK(0 <= u.numel && u.numel <= u.padded && u.padded % m.shard_size == 0);
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
