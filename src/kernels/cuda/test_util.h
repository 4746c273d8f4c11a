// What the CUDA kernel tests share: device buffers that upload and download host vectors, the skip
// when no device is present (ctest reports it as skipped, never passed), and the comparison with
// the reference kernels' outputs.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/check.h"

namespace tessera::kernels::cuda::testing {

// The number of visible devices, or 0 with the runtime's reason in *why.
inline int device_count(std::string* why) {
  int n = 0;
  const cudaError_t st = cudaGetDeviceCount(&n);
  if (st != cudaSuccess) {
    *why = cudaGetErrorString(st);
    return 0;
  }
  if (n == 0) *why = "the runtime sees no device";
  return n;
}

#define REQUIRE_CUDA_DEVICE()                                                                                    \
  do {                                                                                                           \
    std::string why_;                                                                                            \
    if (::tessera::kernels::cuda::testing::device_count(&why_) == 0) GTEST_SKIP() << "no CUDA device: " << why_; \
  } while (0)

// Whether the devices are tools/cuda_emu's emulation, whose memory in use counts exactly the bytes
// the process allocated (a real GPU's also holds the runtime's and the libraries' own buffers, and
// rounds allocations to pages).
inline bool devices_are_emulated() {
  cudaDeviceProp p{};
  return cudaGetDeviceProperties(&p, 0) == cudaSuccess && std::string(p.name).starts_with("CPU emulation");
}

// Device bytes a run holds after its steps (nothing is allocated during a step, so the peak)
// against the arenas planned at start-up: equal where `exact` (devices_are_emulated(), asked where
// CUDA is in use), at least the plan on a real GPU.
inline void expect_held_as_planned(int64_t held, int64_t planned, bool exact, const std::string& what) {
  if (exact) {
    EXPECT_EQ(held, planned) << "device bytes held against the plan, " << what;
  } else {
    EXPECT_GE(held, planned) << "device bytes held against the plan, " << what;
  }
}

// A device allocation of n T's, freed on destruction.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) { CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T))); }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(p_); }

  T* get() { return p_; }
  const T* get() const { return p_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    CUDA_CHECK(cudaMemcpy(p_, host.data(), std::min(n_, host.size()) * sizeof(T), cudaMemcpyHostToDevice));
  }
  // Waits for all work on the device first.
  std::vector<T> download() const {
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<T> host(n_);
    CUDA_CHECK(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Every element within atol + rtol * |expected|; the first mismatches are named by index.
inline ::testing::AssertionResult all_close(const std::vector<float>& got, const std::vector<float>& want, float atol,
                                            float rtol) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "sizes differ: " << got.size() << " vs " << want.size();
  }
  int bad = 0;
  double worst = 0.0;
  std::string where;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double tol = atol + rtol * std::fabs(static_cast<double>(want[i]));
    if (!(err <= tol)) {  // NaN fails too
      if (bad < 5) where += " [" + std::to_string(i) + "] " + std::to_string(got[i]) + " vs " + std::to_string(want[i]);
      ++bad;
    }
    worst = std::max(worst, err);
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " elements off (max abs error " << worst
                                       << "):" << where;
}

}  // namespace tessera::kernels::cuda::testing
