#include "fsdp/row_sparse.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/rng.h"

namespace tessera::fsdp {
namespace {

// A rows x width gradient with the given rows written (random values) and the rest zero.
std::vector<float> gradient(int64_t rows, int64_t width, const std::vector<int64_t>& written, uint64_t seed) {
  std::vector<float> g(static_cast<size_t>(rows * width), 0.0f);
  for (int64_t r : written) {
    for (int64_t j = 0; j < width; ++j) g[r * width + j] = rng::uniform(seed, r, j) - 0.5f;
  }
  return g;
}

TEST(RowSparse, MaskNamesTheRowsWithAnyBitSet) {
  constexpr int64_t kRows = 70, kWidth = 40;
  std::vector<float> g = gradient(kRows, kWidth, {0, 31, 32, 69}, 1);
  g[5 * kWidth + 39] = -0.0f;    // only the sign bit, in the row's last float: still written
  g[40 * kWidth + 17] = 1e-45f;  // a subnormal past the first 16 floats
  const std::vector<uint32_t> mask = nonzero_rows(g.data(), kRows, kWidth);
  ASSERT_EQ(mask.size(), 3u);
  EXPECT_EQ(union_rows(mask.data(), 1, 3, kRows), (std::vector<int64_t>{0, 5, 31, 32, 40, 69}));
}

TEST(RowSparse, UnionOfRanksMasks) {
  constexpr int64_t kRows = 100;
  std::vector<uint32_t> masks;
  for (const auto& rows : {std::vector<int64_t>{3, 64}, std::vector<int64_t>{}, std::vector<int64_t>{3, 4, 99}}) {
    const std::vector<float> g = gradient(kRows, 2, rows, 2);
    const std::vector<uint32_t> m = nonzero_rows(g.data(), kRows, 2);
    masks.insert(masks.end(), m.begin(), m.end());
  }
  EXPECT_EQ(union_rows(masks.data(), 3, 4, kRows), (std::vector<int64_t>{3, 4, 64, 99}));
}

TEST(RowSparse, PackThenUnpackRestoresTheGradient) {
  constexpr int64_t kRows = 257, kWidth = 24;
  for (const std::vector<int64_t>& rows :
       {std::vector<int64_t>{}, std::vector<int64_t>{0}, std::vector<int64_t>{256}, std::vector<int64_t>{0, 1, 2},
        std::vector<int64_t>{1, 7, 8, 100, 200, 255, 256}}) {
    const std::vector<float> want = gradient(kRows, kWidth, rows, 3);
    std::vector<float> g = want;
    pack_rows(g.data(), rows, kWidth);
    for (size_t k = 0; k < rows.size(); ++k) {
      ASSERT_EQ(std::memcmp(&g[k * kWidth], &want[rows[k] * kWidth], sizeof(float) * kWidth), 0) << "packed row " << k;
    }
    // What the reduction leaves in the rows past the packed ones is garbage: unpacking zeroes it.
    for (size_t i = rows.size() * kWidth; i < g.size(); ++i) g[i] = std::nanf("");
    unpack_rows(g.data(), rows, kWidth, kRows);
    EXPECT_EQ(std::memcmp(g.data(), want.data(), sizeof(float) * g.size()), 0) << rows.size() << " rows";
  }
}

TEST(RowSparse, EveryRowWritten) {
  constexpr int64_t kRows = 33, kWidth = 3;
  std::vector<int64_t> all(kRows);
  for (int64_t r = 0; r < kRows; ++r) all[r] = r;
  const std::vector<float> want = gradient(kRows, kWidth, all, 4);
  std::vector<float> g = want;
  const std::vector<uint32_t> mask = nonzero_rows(g.data(), kRows, kWidth);
  ASSERT_EQ(union_rows(mask.data(), 1, 2, kRows), all);
  pack_rows(g.data(), all, kWidth);
  unpack_rows(g.data(), all, kWidth, kRows);
  EXPECT_EQ(g, want);
}

}  // namespace
}  // namespace tessera::fsdp
