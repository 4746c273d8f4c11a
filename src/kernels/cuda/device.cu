// CUDA device discovery through the runtime API.
#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/device.h"

namespace tessera::kernels::cuda {
namespace {
std::string version_string(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }
}  // namespace

std::string runtime_version() {
  int v = 0;
  return cudaRuntimeGetVersion(&v) == cudaSuccess ? version_string(v) : "unknown";
}

std::string driver_version() {
  int v = 0;
  return cudaDriverGetVersion(&v) == cudaSuccess && v > 0 ? version_string(v) : "none";
}

std::vector<DeviceInfo> devices(std::string* error) {
  std::vector<DeviceInfo> out;
  int count = 0;
  const cudaError_t st = cudaGetDeviceCount(&count);
  if (st != cudaSuccess) {
    if (error) *error = cudaGetErrorString(st);
    return out;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    out.push_back({i, p.name, p.major, p.minor, p.totalGlobalMem, p.multiProcessorCount});
  }
  return out;
}

}  // namespace tessera::kernels::cuda
