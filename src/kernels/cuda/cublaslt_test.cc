// cuBLASLt opened at run time (cublaslt.h): the whole table resolves from the library itself. No
// device is needed to load a library, so this runs in CI, where nothing else makes a GEMM plan
// and a misspelt or missing entry point would otherwise first show on a GPU machine.
#include "kernels/cuda/cublaslt.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>

namespace tessera::kernels::cuda {
namespace {

TEST(CublasLt, EveryEntryPointResolvesFromTheLibrary) {
  const CublasLt& lt = cublaslt();
  const std::string library = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
#define TESSERA_EXPECT_FROM_LIBRARY(name)                                                                           \
  {                                                                                                                 \
    Dl_info info{};                                                                                                 \
    ASSERT_NE(lt.name, nullptr) << #name;                                                                           \
    ASSERT_NE(dladdr(reinterpret_cast<void*>(lt.name), &info), 0) << #name;                                         \
    EXPECT_NE(std::string(info.dli_fname).find(library), std::string::npos) << #name << " from " << info.dli_fname; \
    EXPECT_STREQ(info.dli_sname, #name);                                                                            \
  }
  TESSERA_CUBLASLT_FUNCTIONS(TESSERA_EXPECT_FROM_LIBRARY)
#undef TESSERA_EXPECT_FROM_LIBRARY
  EXPECT_EQ(&cublaslt(), &lt);  // resolved once
}

// `tessera info`'s line: the version the library reports (this build's headers are 13.x) and its file.
TEST(CublasLt, DescriptionNamesVersionAndFile) {
  const std::string d = cublaslt_description();
  EXPECT_EQ(d.rfind(std::to_string(CUBLAS_VER_MAJOR) + ".", 0), 0u) << d;
  EXPECT_NE(d.find("/libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR) + ")"), std::string::npos) << d;
}

}  // namespace
}  // namespace tessera::kernels::cuda
