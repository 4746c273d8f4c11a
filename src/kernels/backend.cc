// The backend factory: the one place that knows whether this build has CUDA.
#include "kernels/backend.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/rope.h"
#include "tessera/build_config.h"

#if TESSERA_CUDA
#include "kernels/cuda/backend.h"
#include "kernels/cuda/device.h"
#endif

namespace tessera::kernels {

const char* device_name(Device device) { return device == Device::kCuda ? "cuda" : "cpu"; }

void Backend::pack_weight_bf16(void*, const uint16_t*, int64_t, int64_t, WeightUse) {
  const std::string why = std::string("the ") + device_name(device()) + " backend packs no weights";
  CHECK_MSG(false, why.c_str());
}

void write_rope_table(Backend& backend, float* table, int64_t T, int64_t D, const std::vector<double>& inv_freq) {
  CHECK(static_cast<int64_t>(inv_freq.size()) == D / 2);
  std::vector<float> host(static_cast<size_t>(T * D));
  cpu::rope_table(host.data(), T, D, inv_freq.data());
  backend.to_device(table, host.data(), sizeof(float) * host.size());
}

std::vector<std::string> cuda_device_names(std::string* why) {
  std::vector<std::string> names;
#if TESSERA_CUDA
  for (const cuda::DeviceInfo& d : cuda::devices(why)) names.push_back(d.name);
  if (names.empty()) *why = why->empty() ? "no CUDA device is visible" : "no usable CUDA device (" + *why + ")";
#else
  *why = "this tessera was built without CUDA";
#endif
  return names;
}

std::unique_ptr<Backend> make_cuda_backend(const CudaOptions& options) {
#if TESSERA_CUDA
  return cuda::make_backend(options);
#else
  (void)options;
  throw std::runtime_error("this tessera was built without CUDA (TESSERA_CUDA off: no nvcc at configure time)");
#endif
}

}  // namespace tessera::kernels
