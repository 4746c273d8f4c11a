// nvcuda::wmma (mma.h) for the CPU emulation: the m16n16k16 shape on bf16 (and half) operands with
// fp32 accumulators, the subset tessera's tensor-core kernels use. Included by emu_device.h.
//
// Each thread holds a whole 16 x 16 tile, element i at row i / 16 and column i % 16 for every kind
// of fragment, so the warp-wide operations need no exchange between lanes. The device spreads a
// tile over the warp in an unspecified order; code that touches fragment elements one by one must
// learn their positions as portable code does (by loading a known matrix), never assume them, and
// then works here as on the device. The operations do not synchronise the warp, and a store writes
// only the storing lane's share: shared memory the other lanes wrote must be ordered by the
// kernel's own __syncwarp, as on the device, or the read here sees what the emulation filled
// shared memory with (NaN).
//
// Checked as the device requires: pointers 32-byte aligned, ldm a multiple of 16 bytes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace nvcuda::wmma {

struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulation has the m16n16k16 shape only");
  static_assert(std::is_same_v<Use, accumulator> == std::is_void_v<Layout>,
                "matrix_a and matrix_b fragments name a layout, accumulators none");
  using element_type = T;
  static constexpr int num_elements = 256;
  T x[num_elements];
};

namespace detail {

inline float widen(float v) { return v; }
inline float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
inline float widen(__half v) { return __half2float(v); }

template <typename T>
void check_access(const T* p, unsigned ldm, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0)
    ::emu::fatal("wmma::%s: pointer %p not 32-byte aligned", what, (const void*)p);
  if (ldm * sizeof(T) % 16 != 0) ::emu::fatal("wmma::%s: ldm %u is not a multiple of 16 bytes", what, ldm);
  if (ldm < 16) ::emu::fatal("wmma::%s: ldm %u is shorter than a tile's row", what, ldm);
}

// Element (r, c) of a tile at p in the given layout.
template <typename T>
T& at(T* p, unsigned ldm, bool row_major_layout, int r, int c) {
  return row_major_layout ? p[r * ldm + c] : p[c * ldm + r];
}

}  // namespace detail

template <typename Use, typename T, typename Layout>
requires(!std::is_same_v<Use, accumulator>) void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p,
                                                                  unsigned ldm) {
  detail::check_access(p, ldm, "load_matrix_sync");
  const bool rm = std::is_same_v<Layout, row_major>;
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 16; ++c) f.x[r * 16 + c] = detail::at(p, ldm, rm, r, c);
  }
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm,
                             layout_t layout) {
  detail::check_access(p, ldm, "load_matrix_sync");
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 16; ++c) f.x[r * 16 + c] = detail::at(p, ldm, layout == mem_row_major, r, c);
  }
}

// Each lane writes its share of the tile (elements lane, lane + 32, ...), as on the device, where
// no lane holds the whole tile: a lane that reads the tile before the warp's __syncwarp sees the
// other lanes' shares unwritten.
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm,
                              layout_t layout) {
  detail::check_access(p, ldm, "store_matrix_sync");
  const unsigned lane = (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32;
  for (unsigned i = lane; i < 256; i += 32) detail::at(p, ldm, layout == mem_row_major, i / 16, i % 16) = f.x[i];
}

template <typename Use, typename T, typename Layout, typename V>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, const V& v) {
  for (T& e : f.x) e = static_cast<T>(v);
}

// d = a b + c with fp32 products of the (exactly widened) operands summed over k in order. d may
// be c.
template <typename T, typename LA, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LB>& b, const fragment<accumulator, 16, 16, 16, float>& c) {
  float out[256];
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) {
      float s = c.x[i * 16 + j];
      for (int k = 0; k < 16; ++k) s += detail::widen(a.x[i * 16 + k]) * detail::widen(b.x[k * 16 + j]);
      out[i * 16 + j] = s;
    }
  }
  for (int i = 0; i < 256; ++i) d.x[i] = out[i];
}

}  // namespace nvcuda::wmma
