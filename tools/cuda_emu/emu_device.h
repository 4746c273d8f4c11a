// CPU emulation of the CUDA device subset tessera's kernels use. Prepended (by transform.py) to each
// .cu file, which is otherwise compiled unchanged by g++ against the real CUDA headers (types,
// enums, runtime declarations); emu_runtime.cc implements the runtime and cuBLASLt entry points.
//
// Execution model: blocks run one at a time; each CUDA thread of a block is either a fiber
// (EMU_MODE=fiber, the default: ucontext coroutines, fast, deterministic, deadlocks reported) or an
// OS thread (EMU_MODE=threads: std::barrier, real interleavings, for TSan). __syncthreads is a
// barrier of the whole block, __syncwarp and the shuffles barriers of the 32 lanes of a warp; both
// are strict: every thread of the block (warp) must reach the same barrier, exited threads do not
// count as arrived (the emulation reports the deadlock instead of hanging, in fiber mode).
// Shared memory: the dynamic (extern) array is a heap block of exactly the launch's bytes and the
// static __shared__ arrays a per-block arena keyed by declaration site, all filled with 0xff bytes
// (NaN as float and double) so that reads of unwritten shared memory show.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <type_traits>

#include "emu_warp.h"

// Device code that must differ here (inline PTX: kernels/cuda/mma.cuh) tests this.
#define TESSERA_CUDA_EMULATION 1

#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

namespace emu {

struct Block;  // emu_runtime.cc
extern thread_local uint3 tid, bid;
extern thread_local Block* cur;
extern dim3 bdim, gdim;

[[noreturn]] void fatal(const char* fmt, ...);
void block_sync();
void* dynamic_smem();
void* static_smem(const void* key, size_t bytes, size_t align);

template <typename T, typename Tag>
T& static_shared(Tag) {
  static const char key = 0;  // one per declaration site (and per template instantiation)
  return *static_cast<T*>(static_smem(&key, sizeof(T), alignof(T)));
}

// Launch machinery (emu_runtime.cc).
using Body = void (*)(void*);
cudaError_t launch(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Body body, void* ctx);
void check_kernel_pointer(const void* kernel, int index, const void* p);

template <typename T>
void check_arg(const void* kernel, int index, const T& v) {
  if constexpr (std::is_pointer_v<T>) check_kernel_pointer(kernel, index, (const void*)v);
}

// Copy-initialisation, as passing an argument to a function.
template <typename T>
T implicit(std::type_identity_t<T> v) {
  return v;
}

struct Launch {
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
  Launch(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = nullptr) : grid(g), block(b), smem(s), stream(st) {}

  template <typename... P, typename... A>
  void run(void (*k)(P...), A&&... a) {
    static_assert(sizeof...(P) == sizeof...(A), "kernel argument count");
    // The launch converts the arguments to the parameter types and copies them, as <<<>>> does.
    struct Args {
      void (*k)(P...);
      std::tuple<std::decay_t<P>...> v;
    } args{k, std::tuple<std::decay_t<P>...>(implicit<std::decay_t<P>>(std::forward<A>(a))...)};
    int i = 0;
    std::apply([&](const auto&... v) { (check_arg(reinterpret_cast<const void*>(k), i++, v), ...); }, args.v);
    launch(
        reinterpret_cast<const void*>(k), grid, block, smem, stream,
        [](void* c) {
          auto* x = static_cast<Args*>(c);
          std::apply([&](auto... v) { x->k(v...); }, x->v);  // each thread its own copy
        },
        &args);
  }
};

}  // namespace emu

#define threadIdx ::emu::tid
#define blockIdx ::emu::bid
#define blockDim ::emu::bdim
#define gridDim ::emu::gdim
inline constexpr int warpSize = 32;

// What cuda_runtime.h declares for nvcc only (under __CUDACC__): the kernel-pointer overload.
template <class T>
static inline cudaError_t cudaFuncSetAttribute(T* entry, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(entry), attr, value);
}

inline void __syncthreads() { ::emu::block_sync(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::emu::warp_sync(mask); }

template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  static_assert(sizeof(T) == 4, "emulated shuffles move 4-byte values");
  if (mask != 0xffffffffu) ::emu::fatal("__shfl_xor_sync: only full-warp masks are emulated (mask %#x)", mask);
  if (width != 32) ::emu::fatal("__shfl_xor_sync: only width 32 is emulated");
  uint32_t u;
  std::memcpy(&u, &v, 4);
  u = ::emu::warp_exchange(u, ::emu::lane_id() ^ (static_cast<unsigned>(lane_mask) & 31u));
  std::memcpy(&v, &u, 4);
  return v;
}

inline float4 __ldg(const float4* p) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) ::emu::fatal("__ldg: misaligned float4 load at %p", (const void*)p);
  return *p;
}
inline float __ldg(const float* p) { return *p; }

inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Correctly rounded IEEE operations that are never contracted: the empty asm makes each result
// opaque, so not even -ffp-contract=fast can fuse it into a neighbouring add (as nvcc's __*_rn).
#define EMU_OPAQUE(r) asm volatile("" : "+x"(r))
inline float __fmul_rn(float a, float b) {
  float r = a * b;
  EMU_OPAQUE(r);
  return r;
}
inline float __fadd_rn(float a, float b) {
  EMU_OPAQUE(a);
  EMU_OPAQUE(b);
  float r = a + b;
  EMU_OPAQUE(r);
  return r;
}
inline float __fsub_rn(float a, float b) {
  EMU_OPAQUE(a);
  EMU_OPAQUE(b);
  float r = a - b;
  EMU_OPAQUE(r);
  return r;
}
inline float __fdiv_rn(float a, float b) {
  float r = a / b;
  EMU_OPAQUE(r);
  return r;
}
inline float __fsqrt_rn(float a) {
  float r = std::sqrt(a);
  EMU_OPAQUE(r);
  return r;
}

// CUDA's device min/max overloads (integer and floating), on the operands' common type.
template <typename A, typename B>
requires(std::is_arithmetic_v<A>&& std::is_arithmetic_v<B>) inline std::common_type_t<A, B> min(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(b) < static_cast<C>(a) ? static_cast<C>(b) : static_cast<C>(a);
}
template <typename A, typename B>
requires(std::is_arithmetic_v<A>&& std::is_arithmetic_v<B>) inline std::common_type_t<A, B> max(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(a) < static_cast<C>(b) ? static_cast<C>(b) : static_cast<C>(a);
}

#include "emu_mma.h"  // mma.sync and ldmatrix, after ::emu::fatal
