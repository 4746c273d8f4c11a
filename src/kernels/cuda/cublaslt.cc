#include "kernels/cuda/cublaslt.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace tessera::kernels::cuda {

namespace {
const std::string& library_name() {
  static const std::string name = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
  return name;
}

void* open_library() {
  // RTLD_DEFAULT searches the program and what it loaded: a cuBLASLt there is used as it is.
  if (dlsym(RTLD_DEFAULT, "cublasLtMatmul") != nullptr) return RTLD_DEFAULT;
  void* lib = dlopen(library_name().c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    throw std::runtime_error(fmt::format(
        "cannot load cuBLASLt, which the CUDA GEMMs need: {}; install the CUDA {} toolkit's cuBLAS, or add the "
        "directory holding {} to LD_LIBRARY_PATH",
        why != nullptr ? why : library_name(), CUBLAS_VER_MAJOR, library_name()));
  }
  return lib;
}

void* entry_point(void* lib, const char* name) {
  dlerror();
  void* f = dlsym(lib, name);
  if (f == nullptr) {
    const char* why = dlerror();
    throw std::runtime_error(fmt::format("{} has no {}: {} (a cuBLASLt older than CUDA {}?)", library_name(), name,
                                         why != nullptr ? why : "null address", CUBLAS_VER_MAJOR));
  }
  return f;
}

CublasLt load() {
  void* lib = open_library();
  CublasLt lt;
#define TESSERA_CUBLASLT_RESOLVE(name) lt.name = reinterpret_cast<decltype(&::name)>(entry_point(lib, #name));
  TESSERA_CUBLASLT_FUNCTIONS(TESSERA_CUBLASLT_RESOLVE)
#undef TESSERA_CUBLASLT_RESOLVE
  return lt;
}
}  // namespace

const CublasLt& cublaslt() {
  static const CublasLt lt = load();
  return lt;
}

std::string cublaslt_description() {
  const CublasLt& lt = cublaslt();
  const size_t v = lt.cublasLtGetVersion();  // major * 10000 + minor * 100 + patch, as CUBLAS_VERSION
  Dl_info info{};
  const bool found = dladdr(reinterpret_cast<void*>(lt.cublasLtMatmul), &info) != 0 && info.dli_fname != nullptr;
  return fmt::format("{}.{}.{} ({})", v / 10000, v / 100 % 100, v % 100, found ? info.dli_fname : "file unknown");
}

}  // namespace tessera::kernels::cuda
