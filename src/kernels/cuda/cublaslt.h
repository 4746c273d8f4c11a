// cuBLASLt, opened when the CUDA backend makes its GEMM handle (Blas) rather than linked. Loading
// libcublasLt runs its static initialisation: 0.3 to 0.4 s of CPU on the build machines, paid by
// every process that links it whether it uses a GPU or not (each CPU run and worker, twice for
// cli/main.cc's re-exec; each of the ~600 test processes). The GEMMs (matmul.cc) call it through
// this table.
#pragma once

#include <cublasLt.h>

#include <string>

namespace tessera::kernels::cuda {

// The entry points the GEMMs use, one place: the table's members and what is resolved.
#define TESSERA_CUBLASLT_FUNCTIONS(X)     \
  X(cublasLtGetVersion)                   \
  X(cublasLtCreate)                       \
  X(cublasLtDestroy)                      \
  X(cublasLtMatmulDescCreate)             \
  X(cublasLtMatmulDescDestroy)            \
  X(cublasLtMatmulDescSetAttribute)       \
  X(cublasLtMatrixLayoutCreate)           \
  X(cublasLtMatrixLayoutDestroy)          \
  X(cublasLtMatmulPreferenceCreate)       \
  X(cublasLtMatmulPreferenceDestroy)      \
  X(cublasLtMatmulPreferenceSetAttribute) \
  X(cublasLtMatmulAlgoGetHeuristic)       \
  X(cublasLtMatmul)

// Each member has the name and type of the cuBLASLt function it points to.
struct CublasLt {
#define TESSERA_CUBLASLT_MEMBER(name) decltype(&::name) name = nullptr;
  TESSERA_CUBLASLT_FUNCTIONS(TESSERA_CUBLASLT_MEMBER)
#undef TESSERA_CUBLASLT_MEMBER
};

// The table, resolved at the first call (thread-safe) from the cuBLASLt already in the process if
// there is one (a program that links it; the CUDA emulation, tools/cuda_emu), otherwise from
// libcublasLt.so.<major> found as the dynamic loader finds libraries (LD_LIBRARY_PATH, the system's
// cache, the binary's run path). Throws std::runtime_error naming the library and the loader's
// reason when it cannot be opened or lacks an entry point; the next call tries again.
const CublasLt& cublaslt();

// What `tessera info` prints of it, e.g. "13.1.0 (/usr/local/cuda/lib/libcublasLt.so.13)": the
// version the library reports and the file it was resolved from. Opens it; throws as cublaslt().
std::string cublaslt_description();

}  // namespace tessera::kernels::cuda
