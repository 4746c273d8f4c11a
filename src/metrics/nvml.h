// NVML, the NVIDIA driver's management library (what nvidia-smi and DCGM read), loaded at run time
// from the driver's own libnvidia-ml.so.1: nothing to build against, nothing missing on a machine
// without a GPU. Readings are metrics/gpu.h's; a sampler thread keeps the latest off the step loop.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "metrics/gpu.h"

namespace tessera::metrics {

class Nvml {
 public:
  // The library initialised, or null with *why saying what is missing (no driver library, no GPU).
  static std::unique_ptr<Nvml> open(std::string* why);
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  // NVML's index of the GPU on this PCI bus id ("0000:19:00.0", as the CUDA runtime writes it;
  // case and the domain's width do not matter), or -1.
  int index_of_pci_bus_id(const std::string& bus_id) const;

  // GPU `index` now; XID events that arrived since the last call are added to its counts.
  GpuReading read(int index);

  struct Api;  // the entry points, resolved once (nvml.cc)

 private:
  Nvml(void* library, std::unique_ptr<Api> api);
  GpuReading identify(int index) const;  // the fields that never change
  void drain_xids();
  void* library_;
  std::unique_ptr<Api> api_;
  std::vector<void*> devices_;
  std::vector<GpuReading> identities_;  // each GPU's index, name, UUID, serial and PCI bus id, read once
  void* events_ = nullptr;  // XID critical-error event set, null where NVML offers none
  std::vector<uint64_t> xid_count_;
  std::vector<int> last_xid_;
};

// Reads one GPU every `period` on a thread of its own, so the step loop never waits on the driver.
class GpuSampler {
 public:
  GpuSampler(std::unique_ptr<Nvml> nvml, int index, std::chrono::milliseconds period);
  ~GpuSampler();
  GpuSampler(const GpuSampler&) = delete;
  GpuSampler& operator=(const GpuSampler&) = delete;

  GpuReading latest() const;  // the first reading is taken before the constructor returns

 private:
  void loop();
  std::unique_ptr<Nvml> nvml_;
  const int index_;
  const std::chrono::milliseconds period_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  GpuReading latest_;
  std::thread thread_;
};

}  // namespace tessera::metrics
