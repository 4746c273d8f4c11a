// A 16 x 16 block of 32-bit units transposed in AVX-512 registers: the attention tiles' dK and dV,
// and the VNNI packs of a transposed bf16 B (a unit there is a pair of bf16s).
#pragma once

#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>

namespace tessera::kernels::cpu {

using Unit32 = uint32_t __attribute__((__may_alias__));  // any operand's memory, a unit at a time

// The 16 x 16 units at in (row stride ld_in), transposed into out (row stride ld) in registers, as
// floats (moves keep any bits): pairs of rows interleaved, then fours, then the 128-bit lanes of
// the four groups of four. The shuffles are the masked forms with every lane selected: GCC 12's
// plain ones pass an "undefined" vector that its own (maybe-)uninitialized warnings flag.
inline void transpose16(Unit32* out, int64_t ld, const Unit32* in, int64_t ld_in) {
  constexpr __mmask16 kAll = 0xffff;
  auto unpacklo = [](__m512 a, __m512 b) { return _mm512_mask_unpacklo_ps(a, kAll, a, b); };
  auto unpackhi = [](__m512 a, __m512 b) { return _mm512_mask_unpackhi_ps(a, kAll, a, b); };
  __m512 r[16], t[16];
  for (int k = 0; k < 16; ++k) r[k] = _mm512_loadu_ps(in + k * ld_in);
  for (int k = 0; k < 16; k += 2) {
    t[k] = unpacklo(r[k], r[k + 1]);
    t[k + 1] = unpackhi(r[k], r[k + 1]);
  }
  // r[4g + m]: lane L holds column 4L + m of rows 4g .. 4g + 3.
  for (int g = 0; g < 16; g += 4) {
    r[g] = _mm512_mask_shuffle_ps(t[g], kAll, t[g], t[g + 2], 0x44);
    r[g + 1] = _mm512_mask_shuffle_ps(t[g], kAll, t[g], t[g + 2], 0xee);
    r[g + 2] = _mm512_mask_shuffle_ps(t[g + 1], kAll, t[g + 1], t[g + 3], 0x44);
    r[g + 3] = _mm512_mask_shuffle_ps(t[g + 1], kAll, t[g + 1], t[g + 3], 0xee);
  }
  // 128-bit lanes 0 and 2 (even) or 1 and 3 (odd) of a, then the same of b.
  auto even = [](__m512 a, __m512 b) { return _mm512_mask_shuffle_f32x4(a, kAll, a, b, 0x88); };
  auto odd = [](__m512 a, __m512 b) { return _mm512_mask_shuffle_f32x4(a, kAll, a, b, 0xdd); };
  for (int m = 0; m < 4; ++m) {
    const __m512 even01 = even(r[m], r[4 + m]), odd01 = odd(r[m], r[4 + m]);
    const __m512 even23 = even(r[8 + m], r[12 + m]), odd23 = odd(r[8 + m], r[12 + m]);
    _mm512_storeu_ps(out + m * ld, even(even01, even23));
    _mm512_storeu_ps(out + (4 + m) * ld, even(odd01, odd23));
    _mm512_storeu_ps(out + (8 + m) * ld, odd(even01, even23));
    _mm512_storeu_ps(out + (12 + m) * ld, odd(odd01, odd23));
  }
}

}  // namespace tessera::kernels::cpu

#endif
