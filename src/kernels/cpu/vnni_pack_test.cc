// Tessera's VNNI pack (vnni_pack: what pack_b runs) against oneDNN's own reorder into the layout
// oneDNN picked, byte for byte, for both storage orders, ragged K and N, odd row strides and 1
// and 2 threads; and the element-at-a-time pack the ragged blocks and non-AVX-512 builds use.
#include "kernels/cpu/vnni_pack.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/threads.h"
#include "kernels/cpu/matmul.h"

namespace tessera::kernels::cpu {
namespace {

struct Shape {
  int64_t K, N;
};

// Every element a distinct finite bf16 (no NaN or infinity, which a reorder might rewrite).
std::vector<uint16_t> distinct_values(int64_t rows, int64_t ld) {
  std::vector<uint16_t> v(static_cast<size_t>(rows * ld));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint16_t>(0x3c00 + (i * 2654435761u >> 7) % 0x3e00);
  return v;
}

TEST(VnniPack, MatchesOneDnnReorderByteForByte) {
  if (!bf16_gemm_native()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU: nothing packs";
  if (!vnni_pack_vectorized()) GTEST_SKIP() << "a build without AVX-512: pack_b is oneDNN's reorder itself";
  const Shape shapes[] = {{512, 2816}, {2816, 512}, {786, 512}, {476, 512}, {100, 37}, {33, 17},
                          {5, 700},    {1, 1},      {64, 64},   {31, 65},   {2, 130}};
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (const Shape& s : shapes) {
      for (bool trans_b : {false, true}) {
        for (int64_t extra : {0, 1, 2}) {  // an odd stride keeps the transposed blocks element-wise
          const int64_t ldb = (trans_b ? s.K : s.N) + extra;
          const std::vector<uint16_t> B = distinct_values(trans_b ? s.N : s.K, ldb);
          const size_t count = static_cast<size_t>(packed_b_bytes(s.K, s.N)) / 2;
          // Different fill patterns: an element one pack wrote and the other did not differs.
          std::vector<uint16_t> reference(count, 0x5555), mine(count, 0xaaaa);
          pack_b_reorder(reference.data(), trans_b, B.data(), ldb, s.K, s.N);
          pack_b(mine.data(), trans_b, B.data(), ldb, s.K, s.N);
          const std::string where = "K " + std::to_string(s.K) + " N " + std::to_string(s.N) + " trans_b " +
                                    std::to_string(trans_b) + " ldb " + std::to_string(ldb) + " threads " +
                                    std::to_string(threads);
          size_t first = count;
          for (size_t i = 0; i < count && first == count; ++i) {
            if (mine[i] != reference[i]) first = i;
          }
          EXPECT_EQ(first, count) << where << ": first differing element " << first;
        }
      }
    }
  }
  set_num_threads(0);
}

// The element-at-a-time pack (the ragged blocks) writes what the
// vector one does, in the layout of the 64-column blocks oneDNN picks here (the test above ties
// that to oneDNN's reorder).
TEST(VnniPack, ElementAtATimeMatchesTheVectorPack) {
  if (!vnni_pack_vectorized()) GTEST_SKIP() << "a build without AVX-512: vnni_pack is the element-wise pack itself";
  for (const Shape s : {Shape{512, 192}, Shape{96, 512}, Shape{100, 37}, Shape{5, 70}}) {
    for (bool trans_b : {false, true}) {
      const int64_t ldb = trans_b ? s.K : s.N, padded_k = (s.K + 31) / 32 * 32, padded_n = (s.N + 63) / 64 * 64;
      const VnniLayout layout{64, 32 * 64, padded_k * 64};
      const std::vector<uint16_t> B = distinct_values(trans_b ? s.N : s.K, ldb);
      std::vector<uint16_t> scalar(static_cast<size_t>(padded_k * padded_n), 0x5555), vector(scalar.size(), 0xaaaa);
      vnni_pack_scalar(scalar.data(), layout, trans_b, B.data(), ldb, s.K, s.N);
      vnni_pack(vector.data(), layout, trans_b, B.data(), ldb, s.K, s.N);
      EXPECT_EQ(scalar, vector) << "K " << s.K << " N " << s.N << " trans_b " << trans_b;
    }
  }
}

}  // namespace
}  // namespace tessera::kernels::cpu
