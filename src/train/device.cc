// Where a process computes.
#include "train/device.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/threads.h"
#include "tessera/build_config.h"

namespace tessera::train {

ComputeDevice::ComputeDevice(const config::Config& config, int world_size, int local_rank, int local_world) {
  const config::Device asked = config.train.device;
  if (asked == config::Device::kCpu) return;
  std::vector<std::string> names = kernels::cuda_device_names(&why_not_cuda_);
  const int gpus = static_cast<int>(names.size());
  if (why_not_cuda_.empty() && local_world > gpus) {
    why_not_cuda_ = fmt::format("{} processes of the job's {} run on this node, which shows {} GPU{} (one each)",
                                local_world, world_size, gpus, gpus == 1 ? "" : "s");
  }
  if (!why_not_cuda_.empty()) {
    if (asked == config::Device::kCuda) {
      throw ConfigError(
          fmt::format("config key train.device = \"cuda\": {}; set train.device = \"cpu\"", why_not_cuda_));
    }
    return;
  }
  try {
    owned_ = kernels::make_cuda_backend({local_rank, config.model.allow_tf32});
  } catch (const std::runtime_error& e) {
    why_not_cuda_ = e.what();
    if (asked == config::Device::kCuda) {
      throw ConfigError(fmt::format("config key train.device = \"cuda\": {}", why_not_cuda_));
    }
    return;
  }
  backend_ = owned_.get();
  gpu_name_ = names[static_cast<size_t>(local_rank)];
  description_ = fmt::format("cuda:{} ({}){}", local_rank, gpu_name_, config.model.allow_tf32 ? ", TF32 on" : "");
  watch_gpu();
}

void ComputeDevice::watch_gpu() {
  std::unique_ptr<metrics::Nvml> nvml = metrics::Nvml::open(&why_no_gpu_metrics_);
  if (nvml == nullptr) return;
  const std::string bus_id = backend_->pci_bus_id();
  const int index = nvml->index_of_pci_bus_id(bus_id);
  if (index < 0) {
    why_no_gpu_metrics_ = fmt::format("NVML lists no GPU at PCI bus id {}", bus_id);
    return;
  }
  gpu_sampler_ = std::make_unique<metrics::GpuSampler>(std::move(nvml), index, std::chrono::milliseconds(2000));
}

std::optional<metrics::GpuReading> ComputeDevice::gpu_reading() const {
  if (gpu_sampler_ == nullptr) return std::nullopt;
  return gpu_sampler_->latest();
}

void ComputeDevice::bind_cpus(const config::Config& config, int local_rank, int local_world) {
  if (config.parallel.cpu_bind == config::CpuBind::kNone || cuda() || local_world <= 1) return;
  const std::vector<int> cpus = allowed_cpus();
  const std::vector<int> block = cpu_block(cpus, local_rank, local_world);
  const auto threads = static_cast<size_t>(config.train.threads);
  std::string why_not;
  if (block.empty()) {
    why_not = fmt::format("{} CPUs for {} ranks on this node", cpus.size(), local_world);
  } else if (threads > block.size()) {
    why_not = fmt::format("train.threads = {} but a rank's block has {} CPU{}", threads, block.size(),
                          block.size() == 1 ? "" : "s");
  } else if (!bind_to_cpus(block)) {
    why_not = fmt::format("sched_setaffinity: {}", std::strerror(errno));
  }
  cpu_binding_ = why_not.empty() ? fmt::format("local rank {} of {} on CPUs {} (parallel.cpu_bind = auto)", local_rank,
                                               local_world, cpu_list(block))
                                 : fmt::format("none ({})", why_not);
}

void log_device(const config::Config& config, const ComputeDevice& device) {
  if (device.cuda() || config.train.device == config::Device::kCpu || !TESSERA_CUDA) {
    log::info("device: {}", device.description());
    if (device.cuda() && !device.why_no_gpu_metrics().empty()) {
      log::warn("no GPU metrics or NVML health check: {}", device.why_no_gpu_metrics());
    }
  } else {
    log::info("device: cpu (train.device = auto: {})", device.why_not_cuda());
  }
  if (!device.cpu_binding().empty()) log::info("CPU binding: {}", device.cpu_binding());
}

}  // namespace tessera::train
