// Tessera's own pack into oneDNN's VNNI weight layout: see vnni_pack.h.
#include "kernels/cpu/vnni_pack.h"

#include <algorithm>

#include "core/threads.h"
#include "kernels/cpu/transpose16.h"

#if defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#endif

namespace tessera::kernels::cpu {

namespace {

constexpr int64_t kRows = 32;  // K per block: 16 pairs

int64_t blocks(int64_t n, int64_t size) { return (n + size - 1) / size; }

// B's element (k, n), zero outside K x N.
uint16_t element(bool trans_b, const uint16_t* B, int64_t ldb, int64_t K, int64_t N, int64_t k, int64_t n) {
  if (k >= K || n >= N) return 0;
  return trans_b ? B[n * ldb + k] : B[k * ldb + n];
}

// Block (kb, jb), an element at a time.
void block_scalar(uint16_t* dst, int64_t nb, bool trans_b, const uint16_t* B, int64_t ldb, int64_t K, int64_t N,
                  int64_t kb, int64_t jb) {
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t c = 0; c < nb; ++c) {
      dst[(r / 2) * 2 * nb + c * 2 + r % 2] = element(trans_b, B, ldb, K, N, kb * kRows + r, jb * nb + c);
    }
  }
}

#if defined(__AVX512BW__) && defined(__AVX512VL__)

// Block (kb, jb) of a row-major B: for each pair of rows, 16 columns at a time, the even row's
// values widened into the low halves of 32-bit lanes and the odd row's shifted into the high
// halves. Rows past K read as zeros, columns past N through masked loads.
void block_rows(uint16_t* dst, int64_t nb, const uint16_t* B, int64_t ldb, int64_t K, int64_t N, int64_t kb,
                int64_t jb) {
  const int64_t n0 = jb * nb;
  // The zero-masking forms with every lane selected: GCC 12's plain ones pass an "undefined"
  // vector that its own (maybe-)uninitialized warnings flag.
  constexpr __mmask16 kAll = 0xffff;
  auto row_part = [&](int64_t k, int64_t j, __mmask16 mask) {
    if (k >= K) return _mm512_setzero_si512();
    return _mm512_maskz_cvtepu16_epi32(kAll, _mm256_maskz_loadu_epi16(mask, B + k * ldb + n0 + j));
  };
  for (int64_t p = 0; p < kRows / 2; ++p) {
    const int64_t k = kb * kRows + 2 * p;
    for (int64_t j = 0; j < nb; j += 16) {
      const int64_t left = std::clamp<int64_t>(N - n0 - j, 0, 16);
      const __mmask16 mask = static_cast<__mmask16>((1u << left) - 1);
      const __m512i pair =
          _mm512_or_si512(row_part(k, j, mask), _mm512_maskz_slli_epi32(kAll, row_part(k + 1, j, mask), 16));
      _mm512_storeu_si512(dst + p * 2 * nb + 2 * j, pair);
    }
  }
}

// Block (kb, jb) of a B stored transposed (N x K): a pair of B's rows for one column is a 32-bit
// unit of the stored row, so the block is the stored rows' units transposed, 16 x 16 at a time.
// Only whole blocks with an even row stride come here.
void block_transposed(uint16_t* dst, int64_t nb, const uint16_t* B, int64_t ldb, int64_t kb, int64_t jb) {
  const auto* in = reinterpret_cast<const Unit32*>(B + jb * nb * ldb + kb * kRows);
  auto* out = reinterpret_cast<Unit32*>(dst);
  for (int64_t j = 0; j < nb; j += 16) transpose16(out + j, nb, in + j * (ldb / 2), ldb / 2);
}

#endif

}  // namespace

bool vnni_pack_vectorized() {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
  return true;
#else
  return false;
#endif
}

void vnni_pack_scalar(uint16_t* out, const VnniLayout& l, bool trans_b, const uint16_t* B, int64_t ldb, int64_t K,
                      int64_t N) {
  for (int64_t jb = 0; jb < blocks(N, l.nb); ++jb) {
    for (int64_t kb = 0; kb < blocks(K, kRows); ++kb) {
      block_scalar(out + kb * l.k_stride + jb * l.n_stride, l.nb, trans_b, B, ldb, K, N, kb, jb);
    }
  }
}

void vnni_pack(uint16_t* out, const VnniLayout& l, bool trans_b, const uint16_t* B, int64_t ldb, int64_t K, int64_t N) {
  const int64_t kblocks = blocks(K, kRows), nblocks = blocks(N, l.nb);
  // Consecutive blocks read along B's stored rows: a row-major B's 32 rows are read whole (across
  // its column blocks), a transposed one's 64 stored rows likewise (across the row blocks).
  parallel_for(kblocks * nblocks, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t kb = trans_b ? i % kblocks : i / nblocks, jb = trans_b ? i / kblocks : i % nblocks;
      uint16_t* dst = out + kb * l.k_stride + jb * l.n_stride;
#if defined(__AVX512BW__) && defined(__AVX512VL__)
      if (!trans_b) {
        block_rows(dst, l.nb, B, ldb, K, N, kb, jb);
        continue;
      }
      const bool whole = (kb + 1) * kRows <= K && (jb + 1) * l.nb <= N && ldb % 2 == 0;
      if (whole) {
        block_transposed(dst, l.nb, B, ldb, kb, jb);
        continue;
      }
#endif
      block_scalar(dst, l.nb, trans_b, B, ldb, K, N, kb, jb);
    }
  });
}

}  // namespace tessera::kernels::cpu
