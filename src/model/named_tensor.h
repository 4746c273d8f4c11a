// A tensor of the model's layout by its name, whole and in fp32: what sharded parameters gather
// and load, and what checkpoint formats (safetensors, Hugging Face) read and write.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::model {

struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;  // F32, row-major
};

}  // namespace tessera::model
