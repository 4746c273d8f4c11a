// Helpers over any ProcessGroup.
#include "comm/process_group.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <vector>

namespace tessera::comm {

namespace {

// Done when every one of its works is; the first failure is the one rethrown, after the others
// are waited for (their buffers stay in use until then).
class AllOf final : public Work {
 public:
  explicit AllOf(std::vector<std::unique_ptr<Work>> works) : works_(std::move(works)) {}
  void wait() override {
    std::exception_ptr first;
    for (auto& w : works_) {
      try {
        w->wait();
      } catch (const CollectiveError&) {
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
  }

 private:
  std::vector<std::unique_ptr<Work>> works_;
};

}  // namespace

std::unique_ptr<Work> ProcessGroup::send_recv(const std::vector<PointToPoint>& batch,
                                              const CollectiveOptions& options) {
  std::vector<std::unique_ptr<Work>> works;
  for (const PointToPoint& t : batch) {
    works.push_back(t.send ? send(t.data, t.count, t.dtype, t.peer, t.tag, options)
                           : recv(t.data, t.count, t.dtype, t.peer, t.tag, options));
  }
  return std::make_unique<AllOf>(std::move(works));
}

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
