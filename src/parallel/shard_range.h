// The one rule that cuts a unit's padded flat buffer among the S ranks of a shard group: rank r
// owns the contiguous range [r * padded / S, (r + 1) * padded / S). FSDP shards by it, checkpoint
// shard files hold it, and resharding re-cuts by it, so a checkpoint written at one S reads back
// at another.
#pragma once

#include <cstdint>

#include "core/check.h"

namespace tessera::parallel {

struct ShardRange {
  int64_t begin = 0, size = 0;
  int64_t end() const { return begin + size; }
};

// Rank `rank`'s range of a buffer of `padded` elements cut among `shards` ranks; padded must be a
// multiple of shards (the layout pads for it).
inline ShardRange shard_range(int64_t padded, int shards, int rank) {
  CHECK(shards >= 1 && rank >= 0 && rank < shards && padded % shards == 0);
  const int64_t size = padded / shards;
  return {rank * size, size};
}

// The rank whose range holds element `pos` of such a buffer.
inline int shard_owner(int64_t padded, int shards, int64_t pos) {
  CHECK(shards >= 1 && padded % shards == 0 && pos >= 0 && pos < padded);
  return static_cast<int>(pos / (padded / shards));
}

}  // namespace tessera::parallel
