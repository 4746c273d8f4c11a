// The health check before step 0: known all-reduce, its bandwidth, a GEMM against ref.
#include "train/health.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/fault.h"
#include "core/host.h"
#include "core/log.h"
#include "core/rng.h"
#include "core/timer.h"
#include "kernels/ref/matmul.h"

namespace tessera::train {
namespace {

// Odd, so that it does not split evenly into ring segments.
constexpr int64_t kCheckCount = 4099;
// Enough to measure bandwidth rather than latency, small enough to cost milliseconds: over Gloo
// (host memory), and over NCCL (device memory, where NVLink reaches its bus bandwidth only at
// tens of MiB).
constexpr int64_t kBandwidthBytes = 4 << 20, kDeviceBandwidthBytes = 64 << 20;
constexpr int kBandwidthIters = 3;
// A GEMM shape no kernel special-cases (none a multiple of another's block).
constexpr int64_t kM = 96, kN = 80, kK = 72;

// Value i of rank r: small integers, so every partial sum in any order is exact in fp32.
float known_value(int rank, int64_t i) { return static_cast<float>((i % 13) * (rank + 1) + rank); }

// The exact sum over W ranks of known_value.
float known_sum(int world, int64_t i) {
  return static_cast<float>((i % 13) * world * (world + 1) / 2 + world * (world - 1) / 2);
}

// y = x w^T on `backend` (kernels::cpu, or a device's GEMM) against kernels::ref (double
// accumulation). A K-term fp32 dot product computed in any order, FMA or not, is within
// gamma_K sum_k |x_k w_k| of the exact one, gamma_K = K u / (1 - K u), u = 2^-24 (Higham,
// Accuracy and Stability, 3.1); the double reference is exact to far below that. With TF32 each
// input is first rounded to 10 mantissa bits, each product then off by up to 2^-10 of |x_k w_k|.
bool check_gemm(kernels::Backend& backend, bool tf32, bool corrupt, double* worst) {
  std::vector<float> x(kM * kK), w(kN * kK), y(kM * kN), ref(kM * kN), abs_ref(kM * kN), ax(kM * kK), aw(kN * kK);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(rng::normal(7, 1, i));
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(rng::normal(7, 2, i));
  for (size_t i = 0; i < x.size(); ++i) ax[i] = std::fabs(x[i]);
  for (size_t i = 0; i < w.size(); ++i) aw[i] = std::fabs(w[i]);
  const kernels::Memory memory = backend.allocate(sizeof(float) * (x.size() + w.size() + y.size()));
  float* dx = reinterpret_cast<float*>(memory.get());
  float *dw = dx + x.size(), *dy = dw + w.size();
  backend.to_device(dx, x.data(), sizeof(float) * x.size());
  backend.to_device(dw, w.data(), sizeof(float) * w.size());
  backend.linear(dy, dx, dw, kM, kN, kK, 0.0f);
  backend.to_host(y.data(), dy, sizeof(float) * y.size());
  kernels::ref::linear_forward(ref.data(), x.data(), w.data(), kM, kN, kK);
  kernels::ref::linear_forward(abs_ref.data(), ax.data(), aw.data(), kM, kN, kK);
  if (corrupt) y[kM * kN / 2] += 1.0f;  // what a faulty core would do
  const double u = std::ldexp(1.0, -24);
  const double gamma = kK * u / (1 - kK * u) + (tf32 ? std::ldexp(1.0, -10) : 0.0);
  bool ok = true;
  *worst = 0.0;
  for (size_t i = 0; i < y.size(); ++i) {
    // abs_ref itself is rounded to fp32: one more u of slack, and a floor for denormal sums.
    const double tol = gamma * abs_ref[i] * (1 + 2 * u) + std::numeric_limits<float>::min();
    const double err = std::fabs(static_cast<double>(y[i]) - ref[i]);
    if (!(err <= tol)) ok = false;  // NaN fails too
    *worst = std::max(*worst, std::isfinite(err) ? err / tol : std::numeric_limits<double>::infinity());
  }
  return ok;
}

// A device's memory bandwidth: a 256 MiB device-to-device copy (bytes read + written per second),
// the best of three after a warm-up.
double measure_memory_gbps(kernels::Backend& backend) {
  constexpr size_t kBytes = size_t{256} << 20;
  const kernels::Memory memory = backend.allocate(2 * kBytes);
  std::byte *src = memory.get(), *dst = src + kBytes;
  backend.copy(dst, src, kBytes);
  backend.synchronize();
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < 3; ++i) {
    const double t0 = now_seconds();
    backend.copy(dst, src, kBytes);
    backend.synchronize();
    best = std::min(best, now_seconds() - t0);
  }
  return 2.0 * kBytes / best / 1e9;
}

// The known all-reduce checked exactly, then its bus bandwidth, 2 (W-1)/W x bytes / time, in
// the backend's memory over the group training uses for it: Gloo on the CPU, NCCL on GPUs.
void check_all_reduce(const parallel::Distributed& dist, kernels::Backend& backend, comm::CollectiveOptions options,
                      bool corrupt, HealthFigures* f) {
  const int rank = dist.rank(), world = dist.world_size();
  comm::ProcessGroup& group = *dist.mesh->device_group(parallel::Dim::kWorld);
  options.after = backend.stream();
  const int64_t n = f->bus_bytes / 4;
  const kernels::Memory memory = backend.allocate(sizeof(float) * std::max(n, kCheckCount));  // zeroed
  auto* data = reinterpret_cast<float*>(memory.get());
  std::vector<float> v(kCheckCount);
  for (int64_t i = 0; i < kCheckCount; ++i) v[i] = known_value(rank, i);
  if (corrupt) v[kCheckCount / 2] += 1.0f;  // what a bad link or a faulty reduction would do
  backend.to_device(data, v.data(), sizeof(float) * v.size());
  group.all_reduce(data, kCheckCount, comm::DType::kF32, options)->wait();
  backend.to_host(v.data(), data, sizeof(float) * v.size());
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < kCheckCount; ++i) {
    if (v[i] != known_sum(world, i) && bad++ == 0) first = i;
  }
  f->all_reduce_ok = bad == 0;
  if (!f->all_reduce_ok) {
    log::error("health check: rank {}: all-reduce of {} known values: {} wrong, the first at {} ({} instead of {})",
               rank, kCheckCount, bad, first, v[first], known_sum(world, first));
  }
  group.all_reduce(data, n, comm::DType::kF32, options)->wait();  // warm: buffers, scratch, connections
  const double tb = now_seconds();
  for (int it = 0; it < kBandwidthIters; ++it) group.all_reduce(data, n, comm::DType::kF32, options)->wait();
  const double per = (now_seconds() - tb) / kBandwidthIters;
  f->bus_gbps = 2.0 * (world - 1) / world * static_cast<double>(f->bus_bytes) / per / 1e9;
}

// Bytes of a failing GPU's description that travel to every rank (an all-gather copies them as
// they are, typed as floats).
constexpr size_t kGpuTextBytes = 512;

// "" if this rank's GPU is fine (or it has none); else what fails and which GPU, on which host.
// The gpu fault makes the GPU look fallen off the bus, on a CPU run a GPU made up for the purpose.
std::string check_gpu(std::optional<metrics::GpuReading> gpu, bool injected, int rank) {
  if (injected) {
    if (!gpu) {
      gpu.emplace();
      gpu->name = "none: a CPU run, failed by TESSERA_FAULT";
    }
    ++gpu->xid_count;
    gpu->last_xid = 79;
  }
  if (!gpu) return "";
  const metrics::GpuVerdict v = metrics::judge_gpu(*gpu);
  const std::string what = fmt::format("{} on host {}: {}", metrics::describe_gpu(*gpu), host_name(), v.summary());
  if (v.status == metrics::GpuStatus::kDegraded) log::warn("health check: rank {}: {}", rank, what);
  if (v.status != metrics::GpuStatus::kFailed) return "";
  log::error("health check: rank {}: {}", rank, what);
  return what.substr(0, kGpuTextBytes - 1);
}

}  // namespace

HealthFigures health_check(const parallel::Distributed& dist, const config::Config& config, kernels::Backend& backend,
                           const std::optional<metrics::GpuReading>& gpu, std::vector<double>* bus_gbps_per_rank) {
  const double t0 = now_seconds();
  const int rank = dist.rank(), world = dist.world_size();
  const comm::CollectiveOptions options{comm::Millis(config.parallel.timeout_ms)};
  const bool device = backend.device() != kernels::Device::kCpu;
  HealthFigures f;
  const fault::Kind injected = fault::point("health", rank, 0);
  f.gemm_ok = check_gemm(backend, device && config.model.allow_tf32, injected == fault::Kind::kFail, &f.gemm_worst);
  if (!f.gemm_ok) {
    log::error(
        "health check: rank {}: GEMM {}x{}x{} on {} differs from the reference (worst error {:.3g} x the "
        "tolerance)",
        rank, kM, kN, kK, kernels::device_name(backend.device()), f.gemm_worst);
  }
  if (device) {
    f.memory_gbps = measure_memory_gbps(backend);
    f.memory_ok = f.memory_gbps >= config.parallel.health_min_memory_gbps;
  }
  const std::string gpu_failure = check_gpu(gpu, injected == fault::Kind::kGpu, rank);
  f.gpu_ok = gpu_failure.empty();

  // Every rank's figures, and its GPU failure text (NUL-padded; an all-gather copies bytes).
  constexpr int kFigures = 5;
  const float mine[kFigures] = {1.0f, f.gemm_ok ? 1.0f : 0.0f, 0.0f, f.memory_ok ? 1.0f : 0.0f,
                                static_cast<float>(f.memory_gbps)};
  std::vector<float> all(mine, mine + kFigures);
  std::vector<char> gpu_texts(kGpuTextBytes * static_cast<size_t>(world), '\0');
  std::copy(gpu_failure.begin(), gpu_failure.end(), gpu_texts.begin());
  if (dist.world() != nullptr && world > 1) {
    f.bus_bytes = device ? kDeviceBandwidthBytes : kBandwidthBytes;
    check_all_reduce(dist, backend, options, injected == fault::Kind::kAllReduce, &f);
    float figures[kFigures] = {f.all_reduce_ok ? 1.0f : 0.0f, mine[1], static_cast<float>(f.bus_gbps), mine[3],
                               mine[4]};
    all.resize(kFigures * static_cast<size_t>(world));
    dist.world()->all_gather(figures, all.data(), kFigures, comm::DType::kF32, options)->wait();
    const std::vector<char> text(gpu_texts.begin(), gpu_texts.begin() + kGpuTextBytes);
    dist.world()->all_gather(text.data(), gpu_texts.data(), kGpuTextBytes / 4, comm::DType::kF32, options)->wait();
  }
  f.seconds = now_seconds() - t0;

  std::vector<std::string> failures;
  std::vector<double> gbps(world);
  for (int r = 0; r < static_cast<int>(all.size() / kFigures); ++r) {  // every rank's, or this one's
    const float* fig = all.data() + kFigures * r;
    std::vector<std::string> what;
    if (fig[0] != 1.0f) what.push_back("all-reduce result");
    if (fig[1] != 1.0f) what.push_back("GEMM against the reference");
    if (fig[3] != 1.0f) {
      what.push_back(fmt::format("device memory bandwidth {:.0f} GB/s below parallel.health_min_memory_gbps = {:.0f}",
                                 fig[4], config.parallel.health_min_memory_gbps));
    }
    const char* gpu_text = gpu_texts.data() + kGpuTextBytes * static_cast<size_t>(r);
    if (gpu_text[0] != '\0') what.push_back(gpu_text);
    if (!what.empty()) failures.push_back(fmt::format("rank {} ({})", r, fmt::join(what, " and ")));
    gbps[r] = fig[2];
  }
  if (bus_gbps_per_rank != nullptr) *bus_gbps_per_rank = gbps;
  if (!failures.empty()) {
    throw HealthError(
        fmt::format("health check before step 0 failed on {} of {} rank(s): {}; the job stops "
                    "before training (exit code {}: a restart on the same machines would fail again)",
                    failures.size(), world, fmt::join(failures, ", "), static_cast<int>(kExitHealth)));
  }
  const std::string memory = device ? fmt::format("; device memory {:.0f} GB/s", f.memory_gbps) : "";
  if (world > 1) {
    const auto [lo, hi] = std::minmax_element(gbps.begin(), gbps.end());
    log::info(
        "health check passed on {} ranks in {:.0f} ms: all-reduce of {} known values exact; all-reduce of "
        "{} MiB at {:.2f} GB/s bus bandwidth over {} (ranks {:.2f}..{:.2f}); GEMM {}x{}x{} within tolerance "
        "(worst {:.3f} of it){}",
        world, f.seconds * 1e3, kCheckCount, f.bus_bytes >> 20, f.bus_gbps, device ? "NCCL" : dist.world()->transport(),
        *lo, *hi, kM, kN, kK, f.gemm_worst, memory);
  } else {
    log::info("health check passed in {:.0f} ms: GEMM {}x{}x{} within tolerance (worst {:.3f} of it){}",
              f.seconds * 1e3, kM, kN, kK, f.gemm_worst, memory);
  }
  return f;
}

}  // namespace tessera::train
