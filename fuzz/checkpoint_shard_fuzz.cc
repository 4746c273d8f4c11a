// Fuzzes checkpoint::ShardFile (open and read of every tensor). Each input is tried as it is and
// with its header checksum recomputed, so that mutations of the JSON header reach the range checks
// behind the checksum.
#include <xxhash.h>

#include <cstring>
#include <optional>
#include <vector>

#include "checkpoint/shard_file.h"
#include "harness.h"

namespace tessera::fuzz {

void write_seeds(const std::string& dir) {
  const std::vector<float> a = {1, -2, 3.5f, 0}, b(37, 0.25f);
  checkpoint::write_shard_file(dir + "/two.bin", {{"block.0.param", a.data(), a.size()},
                                                  {"block.0.exp_avg", b.data(), b.size()},
                                                  {"empty", nullptr, 0}});
  checkpoint::write_shard_file(dir + "/none.bin", {});
}

namespace {

void check(const std::string& path, size_t size) {
  std::optional<checkpoint::ShardFile> shard;
  if (!parses([&] { shard.emplace(path); })) return;
  uint64_t total = 0;
  for (const checkpoint::ShardEntry& e : shard->entries()) {
    FUZZ_CHECK(e.bytes % sizeof(float) == 0);
    FUZZ_CHECK(e.offset <= size && e.bytes <= size - e.offset);
    total += e.bytes;
    std::vector<float> out(e.bytes / sizeof(float));
    parses([&] { shard->read(e, out.data()); });  // a checksum mismatch is a rejection
  }
  FUZZ_CHECK(total <= size);  // tensors do not overlap
}

}  // namespace
}  // namespace tessera::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  fuzz::check(fuzz::write_input("input.bin", data, size), size);
  if (size < 32) return 0;
  uint64_t header = 0;
  std::memcpy(&header, data + 16, 8);
  if (header > size - 32) return 0;
  std::vector<uint8_t> fixed(data, data + size);
  const uint64_t sum = XXH64(fixed.data() + 32, header, 0);  // layout: checkpoint/shard_file.h
  std::memcpy(fixed.data() + 24, &sum, 8);
  fuzz::check(fuzz::write_input("fixed.bin", fixed.data(), fixed.size()), size);
  return 0;
}
