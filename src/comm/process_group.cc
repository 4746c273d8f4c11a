// Helpers over any ProcessGroup.
#include "comm/process_group.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace tessera::comm {

std::string broadcast_string(ProcessGroup& group, const std::string& text, int root, const CollectiveOptions& options) {
  float length_slot = 0.0f;
  const auto length = static_cast<uint32_t>(text.size());
  std::memcpy(&length_slot, &length, 4);
  group.broadcast(&length_slot, 1, DType::kF32, root, options)->wait();
  uint32_t n = 0;
  std::memcpy(&n, &length_slot, 4);
  if (n == 0) return "";
  std::vector<float> slots((n + 3) / 4);
  if (group.rank() == root) std::memcpy(slots.data(), text.data(), n);
  group.broadcast(slots.data(), static_cast<int64_t>(slots.size()), DType::kF32, root, options)->wait();
  return std::string(reinterpret_cast<const char*>(slots.data()), n);
}

}  // namespace tessera::comm
