// Layer train: where a process computes (train.device), resolved once at start-up.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "config/config.h"
#include "kernels/backend.h"
#include "metrics/gpu.h"
#include "metrics/nvml.h"

namespace tessera::train {

// The backend a training process runs its model and optimizer on, and what it is in words.
class ComputeDevice {
 public:
  // train.device for a job of `world_size` processes, `local_world` of them on this node, this
  // one the node's `local_rank`: "cuda" needs this build's CUDA, a GPU for every process of the
  // node (local rank i computes on CUDA device i; several processes talk over NCCL) and no tensor
  // or pipeline parallelism, and throws ConfigError naming the key and what is missing otherwise;
  // "auto" takes the GPU exactly where "cuda" would work and the CPU elsewhere, saying why in
  // why_not_cuda(). Every process of a node decides alike.
  ComputeDevice(const config::Config& config, int world_size, int local_rank = 0, int local_world = 1);
  kernels::Backend& backend() const { return *backend_; }
  bool cuda() const { return backend_->device() == kernels::Device::kCuda; }
  const std::string& description() const { return description_; }    // "cpu", "cuda:0 (NVIDIA H200)"
  const std::string& gpu_name() const { return gpu_name_; }          // the CUDA device name; "" on the CPU
  const std::string& why_not_cuda() const { return why_not_cuda_; }  // "" on a GPU
  // The CUDA device the job's NCCL groups use (parallel::Job's nccl_device); -1 on the CPU.
  int nccl_device() const { return backend_->device_index(); }

  // On a GPU, its latest NVML reading (metrics/nvml.h, sampled every 2 s off the step loop);
  // empty on the CPU, or where NVML cannot be had (why_no_gpu_metrics() says why).
  std::optional<metrics::GpuReading> gpu_reading() const;
  const std::string& why_no_gpu_metrics() const { return why_no_gpu_metrics_; }

  // parallel.cpu_bind for local rank `local_rank` of the `local_world` ranks on this node, called
  // by the thread that will start the compute threads and collectives, before it starts them: on
  // the CPU, with "auto", binds it to its block of the CPUs it may run on (core/threads.h);
  // otherwise, and where that cannot be done, leaves placement to the kernel. cpu_binding() says
  // which, in words ("" where nothing was asked), for log_device.
  void bind_cpus(const config::Config& config, int local_rank, int local_world);
  const std::string& cpu_binding() const { return cpu_binding_; }

 private:
  void watch_gpu();
  std::unique_ptr<kernels::Backend> owned_;
  kernels::Backend* backend_ = &kernels::cpu_backend();
  std::string description_ = "cpu", why_not_cuda_, gpu_name_, why_no_gpu_metrics_, cpu_binding_;
  std::unique_ptr<metrics::GpuSampler> gpu_sampler_;
};

// Logs where the process computes, and why not on a GPU when train.device = auto found none usable
// in a build that has CUDA (on a GPU, also why it has no GPU metrics, if it has none; on the CPU,
// the CPU binding).
void log_device(const config::Config& config, const ComputeDevice& device);

}  // namespace tessera::train
