// A bf16 B (K x N) written into the blocked layout oneDNN's bf16 matmul reads its weights in
// ("BA16a64b2a": pairs of rows interleaved, "VNNI"), by Tessera's own loops. oneDNN's reorder
// into it ran at 20-27 GB/s on a 2-core Zen 5, these loops at 50-110 on weights in cache; a bf16
// `bench` step's packs (every weight twice, and the activations the weight gradients read), from
// sources out of cache, 19 ms -> 15 ms.
#pragma once

#include <cstdint>

namespace tessera::kernels::cpu {

// The layout: K in blocks of 32 rows (16 pairs), N in blocks of `nb` columns; block (kb, jb)
// starts at kb k_stride + jb n_stride elements, and inside it row k, column n sits at
// ((k % 32) / 2) (2 nb) + (n % nb) 2 + k % 2. K pads to a multiple of 32 and N to one of nb,
// itself a multiple of 16.
struct VnniLayout {
  int64_t nb = 0, k_stride = 0, n_stride = 0;
};

// Writes every element of the padded blocks of `out` in layout l: B's (row-major, row stride ldb;
// stored transposed, N x K, where trans_b) and zeros in the padding. Threads over OpenMP.
void vnni_pack(uint16_t* out, const VnniLayout& l, bool trans_b, const uint16_t* B, int64_t ldb, int64_t K, int64_t N);

// Whether vnni_pack runs vector loops (a build for AVX-512: TESSERA_NATIVE on such a CPU). A
// portable build would pack element by element, slower than oneDNN's reorder: pack_b keeps the
// reorder there.
bool vnni_pack_vectorized();

// The same, an element at a time on one thread: what vnni_pack does at the blocks' ragged edges
// and in builds without AVX-512, and its reference in the tests.
void vnni_pack_scalar(uint16_t* out, const VnniLayout& l, bool trans_b, const uint16_t* B, int64_t ldb, int64_t K,
                      int64_t N);

}  // namespace tessera::kernels::cpu
