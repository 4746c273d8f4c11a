// CPU GEMM through oneDNN: sgemm for fp32 (JIT AVX-512 kernels; threads from OpenMP), and the
// matmul primitive for bf16 inputs (avx512_bf16 or AMX kernels where the CPU has them; on a CPU
// oneDNN has no bf16 kernels for, such as AVX2 only, sgemm on fp32 copies of the inputs).
#include "kernels/cpu/matmul.h"

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "core/bf16.h"
#include "core/check.h"
#include "core/threads.h"
#include "kernels/cpu/vnni_pack.h"

namespace tessera::kernels::cpu {

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  // dnnl_sgemm is row-major; with K == 0 it still scales C by beta, as BLAS does.
  const dnnl_status_t st =
      dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  CHECK(st == dnnl_success);
}

void linear_forward(float* y, const float* x, const float* w, int64_t M, int64_t N, int64_t K) {
  gemm(false, true, M, N, K, 1.0f, x, K, w, K, 0.0f, y, N);
}

void linear_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, int64_t M, int64_t N,
                     int64_t K, bool accumulate_dx) {
  if (dx != nullptr) gemm(false, false, M, K, N, 1.0f, dy, N, w, K, accumulate_dx ? 1.0f : 0.0f, dx, K);
  gemm(true, false, N, K, M, 1.0f, dy, N, x, K, 1.0f, dw, K);
}

namespace {

// oneDNN 2.x has no bf16 counterpart of dnnl_sgemm in its API, so bf16 goes through the matmul
// primitive. Building one JIT-compiles its kernels (milliseconds), so each shape's primitive is
// built once and kept, with memory objects whose data handles are swapped per call and its own
// scratchpad: in oneDNN's default (library) scratchpad mode every execution would allocate and
// free the scratchpad, and the training step allocates nothing.
//
// Where oneDNN has no bf16 matmul for the CPU (it needs AVX-512; AVX2-only parts such as Zen 3
// get "could not create a primitive descriptor"), the entry keeps fp32 buffers instead, the
// inputs are widened into them (exact: a bf16 value is an fp32 value) and sgemm runs: the same
// contract (bf16 inputs, fp32 products and sums) at fp32 speed plus the widening pass.
struct Bf16Gemm {
  dnnl::matmul primitive;
  dnnl::memory a, b, c, scratchpad;
  std::vector<uint8_t> scratch_bytes;
  std::vector<float> a32, b32;  // the fallback's widened inputs; empty with a primitive
};

// (trans_a, trans_b, M, N, K, lda, ldb, ldc, alpha, beta, threads, B packed); a packed B has
// trans_b false and ldb 0.
using Bf16Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, float, int, bool>;

// A reorder from B as stored into the packed layout, kept as the products are.
struct Packer {
  dnnl::reorder primitive;
  dnnl::memory from, to, scratchpad;
  std::vector<uint8_t> scratch_bytes;
};
using PackerKey = std::tuple<bool, int64_t, int64_t, int64_t, int>;  // (trans_b, K, N, ldb, threads)

struct Bf16Cache {
  std::mutex mutex;  // held through execution: entries own their scratchpad
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Bf16Key, std::unique_ptr<Bf16Gemm>> entries;
  std::map<std::pair<int64_t, int64_t>, dnnl::memory::desc> packed_layouts;  // by (K, N)
  std::map<PackerKey, std::unique_ptr<Packer>> packers;
};

Bf16Cache& bf16_cache() {
  static Bf16Cache* cache = new Bf16Cache;  // never destroyed: no teardown order with oneDNN's statics
  return *cache;
}

using md = dnnl::memory::desc;
using dims = dnnl::memory::dims;
using dt = dnnl::memory::data_type;

dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// The layout oneDNN's matmul picks for a (K, N) bf16 B it may choose freely. It depends on K and
// N, not on M (checked for M from 1 to 4096), so one pack serves every row count; the caller holds
// the cache's mutex.
const md& packed_layout(Bf16Cache& cache, int64_t K, int64_t N) {
  auto it = cache.packed_layouts.find({K, N});
  if (it == cache.packed_layouts.end()) {
    const int64_t M = 256;
    const md a_md({M, K}, dt::bf16, dims{K, 1}), b_md({K, N}, dt::bf16, dnnl::memory::format_tag::any),
        c_md({M, N}, dt::f32, dims{N, 1});
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), user_scratchpad(), cache.engine);
    it = cache.packed_layouts.emplace(std::make_pair(K, N), pd.weights_desc()).first;
  }
  return it->second;
}

// The packed layout as vnni_pack writes it, where oneDNN chose one of that family (blocked, inner
// blocks 16a, nb b, 2a with nb a multiple of 16, no offset); nullopt otherwise (oneDNN's reorder
// packs then).
std::optional<VnniLayout> vnni_layout(const md& layout) {
  const dnnl_memory_desc_t& d = layout.data;
  if (d.format_kind != dnnl_blocked || d.ndims != 2 || d.offset0 != 0) return std::nullopt;
  const dnnl_blocking_desc_t& b = d.format_desc.blocking;
  const bool vnni = b.inner_nblks == 3 && b.inner_idxs[0] == 0 && b.inner_blks[0] == 16 && b.inner_idxs[1] == 1 &&
                    b.inner_blks[1] % 16 == 0 && b.inner_idxs[2] == 0 && b.inner_blks[2] == 2;
  if (!vnni) return std::nullopt;
  return VnniLayout{b.inner_blks[1], b.strides[0], b.strides[1]};
}

std::unique_ptr<Bf16Gemm> build_bf16_gemm(const Bf16Key& key, Bf16Cache& cache) {
  const auto [trans_a, trans_b, M, N, K, lda, ldb, ldc, alpha, beta, threads, packed] = key;
  const dnnl::engine& engine = cache.engine;
  // Row-major with row strides; a transpose is the same matrix with its strides swapped.
  const md a_md({M, K}, dt::bf16, trans_a ? dims{1, lda} : dims{lda, 1});
  const md b_md = packed ? packed_layout(cache, K, N) : md({K, N}, dt::bf16, trans_b ? dims{1, ldb} : dims{ldb, 1});
  const md c_md({M, N}, dt::f32, dims{ldc, 1});
  dnnl::primitive_attr attr = user_scratchpad();
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);  // C = alpha A B + beta C, C read before it is written
    attr.set_post_ops(ops);
  }
  auto g = std::make_unique<Bf16Gemm>();
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), attr, engine);
  } catch (const dnnl::error& e) {
    if (e.status != dnnl_unimplemented) throw;
    CHECK_MSG(!packed, ("oneDNN has no bf16 matmul reading a packed B (M=" + std::to_string(M) +
                        " N=" + std::to_string(N) + " K=" + std::to_string(K) + ")")
                           .c_str());
    g->a32.resize(static_cast<size_t>(M * K));
    g->b32.resize(static_cast<size_t>(K * N));
    return g;
  }
  g->primitive = dnnl::matmul(pd);
  g->a = dnnl::memory(a_md, engine, nullptr);
  g->b = dnnl::memory(b_md, engine, nullptr);
  g->c = dnnl::memory(c_md, engine, nullptr);
  g->scratch_bytes.resize(pd.scratchpad_desc().get_size());
  g->scratchpad = dnnl::memory(pd.scratchpad_desc(), engine, g->scratch_bytes.data());
  return g;
}

// A rows x cols bf16 matrix of row stride ld, widened into a dense fp32 one.
void widen(float* out, const uint16_t* in, int64_t rows, int64_t cols, int64_t ld) {
  parallel_for(rows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) bf16_to_f32(in + r * ld, out + r * cols, cols);
  });
}

// The cached product for `key`, built on first use; the caller holds the cache's mutex.
Bf16Gemm& bf16_gemm(Bf16Cache& cache, const Bf16Key& key) {
  auto it = cache.entries.find(key);
  if (it == cache.entries.end()) it = cache.entries.emplace(key, build_bf16_gemm(key, cache)).first;
  return *it->second;
}

void execute(Bf16Cache& cache, Bf16Gemm& g, const uint16_t* A, const void* B, float* C) {
  g.a.set_data_handle(const_cast<uint16_t*>(A));
  g.b.set_data_handle(const_cast<void*>(B));
  g.c.set_data_handle(C);
  // A plain array of arguments: the C++ execute() would build an unordered_map per call.
  const dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, g.a.get()},
                                  {DNNL_ARG_WEIGHTS, g.b.get()},
                                  {DNNL_ARG_DST, g.c.get()},
                                  {DNNL_ARG_SCRATCHPAD, g.scratchpad.get()}};
  CHECK(dnnl_primitive_execute(g.primitive.get(), cache.stream.get(), 4, args) == dnnl_success);
  CHECK(dnnl_stream_wait(cache.stream.get()) == dnnl_success);
}

void check_pack(int64_t K, int64_t N) {
  CHECK_MSG(K > 0 && N > 0 && bf16_gemm_native(), "pack_b: nothing packs here (see packed_b_bytes)");
  CHECK_MSG(!omp_in_parallel(), "pack_b inside a parallel region");
}

}  // namespace

bool bf16_gemm_native() {
  static const bool native = [] {
    Bf16Cache& cache = bf16_cache();
    std::lock_guard<std::mutex> lock(cache.mutex);
    const Bf16Key key{false, true, 16, 16, 16, 16, 16, 16, 1.0f, 0.0f, 1, false};
    return build_bf16_gemm(key, cache)->a32.empty();
  }();
  return native;
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t lda,
               const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // as BLAS: C = beta C (oneDNN has no empty reductions)
    for (int64_t m = 0; m < M; ++m) {
      float* row = C + m * ldc;
      for (int64_t n = 0; n < N; ++n) row[n] = beta == 0.0f ? 0.0f : beta * row[n];
    }
    return;
  }
  CHECK_MSG(!omp_in_parallel(), "gemm_bf16 inside a parallel region");
  Bf16Cache& cache = bf16_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  // The thread count is part of the key: a primitive partitions its work when it is built.
  const Bf16Key key{trans_a, trans_b, M, N, K, lda, ldb, ldc, alpha, beta, omp_get_max_threads(), false};
  Bf16Gemm& g = bf16_gemm(cache, key);
  if (!g.a32.empty()) {
    // Stored as op() reads them: A is K x M when transposed, B N x K.
    widen(g.a32.data(), A, trans_a ? K : M, trans_a ? M : K, lda);
    widen(g.b32.data(), B, trans_b ? N : K, trans_b ? K : N, ldb);
    gemm(trans_a, trans_b, M, N, K, alpha, g.a32.data(), trans_a ? M : K, g.b32.data(), trans_b ? K : N, beta, C, ldc);
    return;
  }
  execute(cache, g, A, B, C);
}

int64_t packed_b_bytes(int64_t K, int64_t N) {
  if (K <= 0 || N <= 0 || !bf16_gemm_native()) return 0;
  Bf16Cache& cache = bf16_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  return static_cast<int64_t>(packed_layout(cache, K, N).get_size());
}

void pack_b(void* packed, bool trans_b, const uint16_t* B, int64_t ldb, int64_t K, int64_t N) {
  check_pack(K, N);
  std::optional<VnniLayout> layout;
  if (vnni_pack_vectorized()) {
    Bf16Cache& cache = bf16_cache();
    std::lock_guard<std::mutex> lock(cache.mutex);
    layout = vnni_layout(packed_layout(cache, K, N));
  }
  if (layout) {
    vnni_pack(static_cast<uint16_t*>(packed), *layout, trans_b, B, ldb, K, N);
  } else {
    pack_b_reorder(packed, trans_b, B, ldb, K, N);
  }
}

void pack_b_reorder(void* packed, bool trans_b, const uint16_t* B, int64_t ldb, int64_t K, int64_t N) {
  check_pack(K, N);
  Bf16Cache& cache = bf16_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  const PackerKey key{trans_b, K, N, ldb, omp_get_max_threads()};
  auto it = cache.packers.find(key);
  if (it == cache.packers.end()) {
    auto p = std::make_unique<Packer>();
    const md from_md({K, N}, dt::bf16, trans_b ? dims{1, ldb} : dims{ldb, 1});
    const md& to_md = packed_layout(cache, K, N);
    const dnnl::reorder::primitive_desc pd(cache.engine, from_md, cache.engine, to_md, user_scratchpad());
    p->primitive = dnnl::reorder(pd);
    p->from = dnnl::memory(from_md, cache.engine, nullptr);
    p->to = dnnl::memory(to_md, cache.engine, nullptr);
    p->scratch_bytes.resize(pd.scratchpad_desc().get_size());
    p->scratchpad = dnnl::memory(pd.scratchpad_desc(), cache.engine, p->scratch_bytes.data());
    it = cache.packers.emplace(key, std::move(p)).first;
  }
  Packer& p = *it->second;
  p.from.set_data_handle(const_cast<uint16_t*>(B));
  p.to.set_data_handle(packed);
  const dnnl_exec_arg_t args[] = {
      {DNNL_ARG_FROM, p.from.get()}, {DNNL_ARG_TO, p.to.get()}, {DNNL_ARG_SCRATCHPAD, p.scratchpad.get()}};
  CHECK(dnnl_primitive_execute(p.primitive.get(), cache.stream.get(), 3, args) == dnnl_success);
  CHECK(dnnl_stream_wait(cache.stream.get()) == dnnl_success);
}

void gemm_bf16_packed(bool trans_a, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t lda,
                      const void* B_packed, float beta, float* C, int64_t ldc) {
  if (M == 0) return;
  CHECK_MSG(!omp_in_parallel(), "gemm_bf16_packed inside a parallel region");
  Bf16Cache& cache = bf16_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  const Bf16Key key{trans_a, false, M, N, K, lda, 0, ldc, alpha, beta, omp_get_max_threads(), true};
  execute(cache, bf16_gemm(cache, key), A, B_packed, C);
}

void linear_forward_bf16(float* y, const uint16_t* x, const uint16_t* w, int64_t M, int64_t N, int64_t K) {
  gemm_bf16(false, true, M, N, K, 1.0f, x, K, w, K, 0.0f, y, N);
}

void linear_backward_bf16(float* dx, float* dw, const uint16_t* dy, const uint16_t* x, const uint16_t* w, int64_t M,
                          int64_t N, int64_t K, bool accumulate_dx) {
  if (dx != nullptr) gemm_bf16(false, false, M, K, N, 1.0f, dy, N, w, K, accumulate_dx ? 1.0f : 0.0f, dx, K);
  // dw += dy^T x. oneDNN's matmul copies a plain B (here x, M x K) into its blocked layout for
  // each block of C's rows it computes; with dw's rows many (the MLP's and the LM head's
  // products), packing x once first is 7-20% faster with the pack included, with few (N = 512)
  // 4% slower (Zen 5, 2 threads, M = 2048 or 786). The pack lives per thread, as long as its
  // largest use.
  constexpr int64_t kPackRows = 1024;
  const int64_t pack_bytes = N >= kPackRows ? packed_b_bytes(M, K) : 0;
  if (pack_bytes == 0) return gemm_bf16(true, false, N, K, M, 1.0f, dy, N, x, K, 1.0f, dw, K);
  thread_local std::vector<std::byte> pack;
  if (pack.size() < static_cast<size_t>(pack_bytes)) pack.resize(static_cast<size_t>(pack_bytes));
  pack_b(pack.data(), false, x, K, M, K);
  gemm_bf16_packed(true, N, K, M, 1.0f, dy, N, pack.data(), 1.0f, dw, K);
}

const char* gemm_library() {
  static char name[96];
  if (name[0] == 0) {
    const dnnl_version_t* v = dnnl_version();
    std::snprintf(name, sizeof(name), "oneDNN %d.%d.%d (sgemm, %s, %s)", v->major, v->minor, v->patch,
                  bf16_gemm_native() ? "bf16 matmul" : "bf16 widened to sgemm",
                  v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other runtime");
  }
  return name;
}

}  // namespace tessera::kernels::cpu
