// Start-up memory plan: one aligned allocation carved into buffers.
#include "core/arena.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "core/check.h"

namespace tessera {

void Arena::Free::operator()(void* p) const { std::free(p); }

Arena::Arena(size_t bytes) : capacity_(bytes) {
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded == 0 ? kAlign : rounded);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, rounded);
  owned_.reset(static_cast<std::byte*>(p));
  base_ = owned_.get();
}

void* Arena::take_bytes(size_t bytes) {
  const size_t offset = used_;
  used_ += (bytes + kAlign - 1) / kAlign * kAlign;
  if (measuring()) return nullptr;
  CHECK(used_ <= capacity_);
  return base_ + offset;
}

}  // namespace tessera
