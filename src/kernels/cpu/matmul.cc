// CPU GEMM through oneDNN's sgemm (JIT AVX-512 kernels; threads from OpenMP).
#include "kernels/cpu/matmul.h"

#include <oneapi/dnnl/dnnl.h>

#include "core/check.h"

namespace tessera::kernels::cpu {

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  // dnnl_sgemm is row-major; with K == 0 it still scales C by beta, as BLAS does.
  const dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb,
                                      beta, C, ldc);
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

const char* gemm_library() {
  static char name[64];
  if (name[0] == 0) {
    const dnnl_version_t* v = dnnl_version();
    std::snprintf(name, sizeof(name), "oneDNN %d.%d.%d (sgemm, %s)", v->major, v->minor, v->patch,
                  v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other runtime");
  }
  return name;
}

}  // namespace tessera::kernels::cpu
