#include "parallel/shard_range.h"

#include <gtest/gtest.h>

namespace tessera::parallel {
namespace {

TEST(ShardRange, RanksTileTheBufferInOrderAndOwnTheirElements) {
  for (int shards : {1, 2, 3, 4, 8}) {
    const int64_t padded = 48 * shards;
    int64_t next = 0;
    for (int r = 0; r < shards; ++r) {
      const ShardRange range = shard_range(padded, shards, r);
      EXPECT_EQ(range.begin, next) << "S " << shards << " rank " << r;
      EXPECT_EQ(range.size, padded / shards);
      EXPECT_EQ(shard_owner(padded, shards, range.begin), r);
      EXPECT_EQ(shard_owner(padded, shards, range.end() - 1), r);
      next = range.end();
    }
    EXPECT_EQ(next, padded);
  }
}

}  // namespace
}  // namespace tessera::parallel
