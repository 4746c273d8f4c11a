// For the safetensors and Hugging Face tests: a safetensors file of 16-bit tensors (F16 or BF16)
// written from raw element bits, as other programs write them.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/json.h"

namespace tessera::checkpoint::test_util {

inline void write_16bit(const std::string& path, const std::string& dtype,
                        const std::vector<std::pair<NamedTensor, std::vector<uint16_t>>>& tensors,
                        const std::map<std::string, std::string>& metadata = {}) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const auto& [t, bits] : tensors) {
    header[t.name] = {{"dtype", dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + 2 * bits.size()}}};
    offset += 2 * bits.size();
  }
  const std::string json = dump_json(header);
  const uint64_t n = json.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << json;
  for (const auto& [t, bits] : tensors) out.write(reinterpret_cast<const char*>(bits.data()), 2 * bits.size());
}

}  // namespace tessera::checkpoint::test_util
