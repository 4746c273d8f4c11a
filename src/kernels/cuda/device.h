// CUDA device discovery, for `tessera info` and for choosing a device per local rank.
#pragma once

#include <string>
#include <vector>

namespace tessera::kernels::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int major = 0, minor = 0;  // compute capability
  size_t total_memory = 0;   // bytes
  int multiprocessors = 0;
};

// Versions of the CUDA runtime this binary links and of the installed driver ("none" if absent).
std::string runtime_version();
std::string driver_version();
// The visible devices; an empty list with `error` set when there are none or no driver.
std::vector<DeviceInfo> devices(std::string* error);

}  // namespace tessera::kernels::cuda
