// Fuzzes read_safetensors: every input is read into tensors that match their shapes and fit the
// file's data together, or rejected with a tessera::Error. Each input is tried twice: as a file,
// which exercises the JSON header parser, and as the recipe for a well-formed header whose
// dimensions and offsets come from edge cases (zero, 2^31, 2^63, 2^64 - 1, overlapping and
// out-of-range ranges), which byte mutations of JSON text rarely reach.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstring>
#include <map>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/json.h"
#include "harness.h"

namespace tessera::fuzz {

void write_seeds(const std::string& dir) {
  using checkpoint::write_safetensors;
  write_safetensors(dir + "/three.safetensors",
                    {{"tok_embeddings.weight", {4, 3}, {1, -2, 3.5f, 1e-30f, -0.0f, 7, 8, 9, 10, 11, 12, 13}},
                     {"norm.weight", {3}, {1, 1, 1}},
                     {"empty", {0, 5}, {}}},
                    {{"tessera_config", "[model]\npreset = \"tiny\"\n"}, {"format", "pt"}});
  write_safetensors(dir + "/scalar.safetensors", {{"s", {}, {2.5f}}});
  write_safetensors(dir + "/none.safetensors", {});
}

namespace {

void check(const std::string& path, const uint8_t* data, size_t size) {
  std::vector<checkpoint::NamedTensor> tensors;
  std::map<std::string, std::string> metadata;
  if (!parses([&] { tensors = checkpoint::read_safetensors(path, &metadata); })) return;
  uint64_t bytes = 0;
  for (const checkpoint::NamedTensor& t : tensors) {
    int64_t numel = 1;
    for (const int64_t d : t.shape) {
      FUZZ_CHECK(d >= 0);
      FUZZ_CHECK(!__builtin_mul_overflow(numel, d, &numel));  // in any order of the dimensions
    }
    FUZZ_CHECK(static_cast<uint64_t>(numel) == t.data.size());
    bytes += t.data.size() * 2;  // every element takes at least 2 bytes in the file (BF16, F16)
  }
  uint64_t header_len = 0;  // accepted, so the file holds the 8-byte length and that much header
  std::memcpy(&header_len, data, 8);
  FUZZ_CHECK(bytes <= size - 8 - header_len);  // no two tensors share bytes
}

uint64_t edge_value(FuzzedDataProvider& p) {
  // clang-format off
  static constexpr uint64_t kEdges[] = {0, 1, 2, 3, 4, 7, 16, uint64_t{1} << 31, uint64_t{1} << 32, uint64_t{1} << 62,
                                        (uint64_t{1} << 63) - 1, uint64_t{1} << 63, ~uint64_t{0}};
  // clang-format on
  return p.ConsumeBool() ? p.PickValueInArray(kEdges) : p.ConsumeIntegral<uint64_t>();
}

// A syntactically valid file whose numbers are chosen to break the semantic checks.
std::string recipe_file(FuzzedDataProvider& p) {
  const size_t data_size = p.ConsumeIntegralInRange<size_t>(0, 512);
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  uint64_t next = 0;  // where a contiguous writer would put the next tensor
  for (int i = 0, n = p.ConsumeIntegralInRange(0, 5); i < n; ++i) {
    nlohmann::ordered_json shape = nlohmann::ordered_json::array();
    uint64_t numel = 1;
    for (int r = 0, rank = p.ConsumeIntegralInRange(0, 4); r < rank; ++r) {
      const uint64_t d = p.ConsumeBool() ? p.ConsumeIntegralInRange<uint64_t>(0, 8) : edge_value(p);
      shape.push_back(d);
      numel *= d;  // wraps on purpose: a reader that trusts the product is what we are after
    }
    // After the previous tensor (as a writer puts it), at 0 (overlapping it), near the data, or
    // anywhere at all.
    const int where = p.ConsumeIntegralInRange(0, 3);
    const uint64_t begin = where == 0   ? next
                           : where == 1 ? 0
                           : where == 2 ? p.ConsumeIntegralInRange<uint64_t>(0, data_size + 8)
                                        : edge_value(p);
    const uint64_t end = p.ConsumeBool() ? begin + numel * 4 : edge_value(p);
    next = end;
    static constexpr const char* kDtypes[] = {"F32", "F32", "F32", "F16", "BF16", ""};
    header[p.ConsumeBool() ? "t" + std::to_string(i) : p.ConsumeRandomLengthString(12)] = {
        {"dtype", p.PickValueInArray(kDtypes)}, {"shape", shape}, {"data_offsets", {begin, end}}};
  }
  if (p.ConsumeBool()) header["__metadata__"] = {{"k", p.ConsumeRandomLengthString(8)}};
  const std::string json = dump_json(header, -1, /*replace_invalid_utf8=*/true);
  const uint64_t len = p.ConsumeBool() ? json.size() : edge_value(p);
  std::string file(8, '\0');
  std::memcpy(file.data(), &len, 8);
  return file + json + std::string(data_size, '\x01');
}

}  // namespace
}  // namespace tessera::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  fuzz::check(fuzz::write_input("input.safetensors", data, size), data, size);
  FuzzedDataProvider provider(data, size);
  const std::string file = fuzz::recipe_file(provider);
  const auto* bytes = reinterpret_cast<const uint8_t*>(file.data());
  fuzz::check(fuzz::write_input("recipe.safetensors", bytes, file.size()), bytes, file.size());
  return 0;
}
