// Start-up memory plan: one aligned allocation carved into buffers, sized before any work.
// Layout code runs twice: once on a measuring arena (no memory, only sizes), then on the real
// one, so the plan and the allocation can never disagree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace tessera {

class Arena {
 public:
  static constexpr size_t kAlign = 64;  // one cache line, one AVX-512 register

  // A measuring arena: take() hands out null pointers and only counts bytes.
  Arena() = default;
  // A real arena of `bytes` (zero-filled); take() fails with CHECK past the end.
  explicit Arena(size_t bytes);
  // A real arena over `bytes` at `base`, which someone else owns (a backend's device memory).
  Arena(std::byte* base, size_t bytes) : base_(base), capacity_(bytes) {}

  template <typename T>
  T* take(size_t count) {
    return static_cast<T*>(take_bytes(count * sizeof(T)));
  }
  void* take_bytes(size_t bytes);

  size_t used() const { return used_; }
  size_t capacity() const { return capacity_; }
  bool measuring() const { return base_ == nullptr; }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<std::byte, Free> owned_;
  std::byte* base_ = nullptr;
  size_t capacity_ = 0;
  size_t used_ = 0;
};

}  // namespace tessera
