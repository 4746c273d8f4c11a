// Fuzzes Shard::open and Shard::read on token shard files. Each input is tried as it is and with
// both xxh64 checksums recomputed, so that mutations reach the checks behind them.
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "data/shard.h"
#include "harness.h"

namespace tessera::fuzz {

void write_seeds(const std::string& dir) {
  {
    data::ShardWriter w(dir + "/small-vocab.bin", 300, 0x1234abcdu, 2);
    const std::vector<int32_t> a = {5, 6, 7, 299, 0}, b = {42};
    w.add_document(a);
    w.add_document(b);
    w.add_document({});
    w.finish();
  }
  {
    data::ShardWriter w(dir + "/large-vocab.bin", 70000, 7, 69999);  // 4-byte tokens
    const std::vector<int32_t> a = {65536, 1, 69998};
    w.add_document(a);
    w.finish();
  }
  data::ShardWriter(dir + "/empty.bin", 16, 0, 1).finish();
}

namespace {

void check(const std::string& path) {
  std::optional<data::Shard> shard;
  if (!parses([&] { shard.emplace(data::Shard::open(path)); })) return;
  const data::ShardInfo& info = shard->info();
  FUZZ_CHECK(info.documents <= info.tokens);
  std::vector<int32_t> chunk(std::min<uint64_t>(info.tokens, 4096));
  for (uint64_t begin = 0; begin < info.tokens; begin += chunk.size()) {
    const uint64_t n = std::min<uint64_t>(chunk.size(), info.tokens - begin);
    shard->read(begin, n, chunk.data());
    for (uint64_t i = 0; i < n; ++i) FUZZ_CHECK(chunk[i] >= 0 && static_cast<uint32_t>(chunk[i]) < info.vocab_size);
  }
}

}  // namespace
}  // namespace tessera::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  fuzz::check(fuzz::write_input("input.bin", data, size));
  if (size < data::kShardHeaderBytes) return 0;
  std::vector<uint8_t> fixed(data, data + size);
  const uint64_t payload = XXH64(fixed.data() + data::kShardHeaderBytes, size - data::kShardHeaderBytes, 0);
  std::memcpy(fixed.data() + 48, &payload, 8);  // header layout: data/shard.h
  const uint64_t header = XXH64(fixed.data(), 56, 0);
  std::memcpy(fixed.data() + 56, &header, 8);
  fuzz::check(fuzz::write_input("fixed.bin", fixed.data(), fixed.size()));
  return 0;
}
