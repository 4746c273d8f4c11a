// bf16 tensor-core products at warp level, the instructions FlashAttention-2 is built on:
// mma.sync m16n8k16 (bf16 operands, fp32 accumulators) and ldmatrix (8 x 8 tiles of 16-bit
// elements from shared memory, plain or transposed). Unlike wmma's, their fragments have documented
// layouts (NVIDIA's PTX ISA), so an accumulator's registers can become the next product's A operand
// without a trip through shared memory. With g = lane / 4 and t = lane % 4:
//
//   A (16 x 16, row-major)  a[0] = (row g, cols 2t, 2t+1)  a[1] = (g+8, 2t..)  a[2] = (g, 8+2t..)  a[3] = (g+8, 8+2t..)
//   B (16 x 8, k by n)      b[0] = (k 2t, 2t+1; n g)  b[1] = (k 8+2t, 8+2t+1; n g)
//   C, D (16 x 8, fp32)     c[0], c[1] = (g, 2t), (g, 2t+1)  c[2], c[3] = (g+8, 2t), (g+8, 2t+1)
//
// each register two bf16s, the lower index in the low half. Under the CPU emulation
// (tools/cuda_emu/emu_mma.h) the same layouts are computed by gathering the warp's operands.
// Included by .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

namespace tessera::kernels::cuda {

// Two floats rounded to bf16 (nearest even) in one register, a in the low half.
__device__ __forceinline__ uint32_t pack_bf16(float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  uint32_t r;
  memcpy(&r, &v, sizeof r);
  return r;
}

// d += a b for A (16 x 16) and B (16 x 8) fragments: every lane of the warp calls it together.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#ifdef TESSERA_CUDA_EMULATION
  ::emu::mma_m16n8k16_bf16(d, a, {b0, b1});
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Four 8 x 8 tiles of a bf16 matrix in shared memory: lane 8j + i passes the address of row i of
// tile j (16 bytes, 16-byte aligned), and r[j] receives its share of tile j as an A or B fragment
// register: (row g, elements 2t and 2t+1). ldmatrix_x4_trans gives each tile transposed: (elements
// g of rows 2t and 2t+1), which reads a row-major (k, n) tile as B's k-by-n fragment.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const __nv_bfloat16* row) {
#ifdef TESSERA_CUDA_EMULATION
  ::emu::ldmatrix_x4(r, row, false);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(row))));
#endif
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const __nv_bfloat16* row) {
#ifdef TESSERA_CUDA_EMULATION
  ::emu::ldmatrix_x4(r, row, true);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(row))));
#endif
}

}  // namespace tessera::kernels::cuda
