// The health check before step 0: known all-reduce, its bandwidth, a GEMM against ref.
#include "train/health.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/fault.h"
#include "core/host.h"
#include "core/log.h"
#include "core/rng.h"
#include "core/timer.h"
#include "kernels/cpu/matmul.h"
#include "kernels/ref/matmul.h"

namespace tessera::train {
namespace {

// Odd, so that it does not split evenly into ring segments.
constexpr int64_t kCheckCount = 4099;
// Enough to measure bandwidth rather than latency, small enough to cost milliseconds.
constexpr int64_t kBandwidthBytes = 4 << 20;
constexpr int kBandwidthIters = 3;
// A GEMM shape no kernel special-cases (none a multiple of another's block).
constexpr int64_t kM = 96, kN = 80, kK = 72;

// Value i of rank r: small integers, so every partial sum in any order is exact in fp32.
float known_value(int rank, int64_t i) { return static_cast<float>((i % 13) * (rank + 1) + rank); }

// The exact sum over W ranks of known_value.
float known_sum(int world, int64_t i) {
  return static_cast<float>((i % 13) * world * (world + 1) / 2 + world * (world - 1) / 2);
}

// y = x w^T through kernels::cpu against kernels::ref (double accumulation). A K-term fp32 dot
// product computed in any order, FMA or not, is within gamma_K sum_k |x_k w_k| of the exact
// one, gamma_K = K u / (1 - K u), u = 2^-24 (Higham, Accuracy and Stability, 3.1); the double
// reference is exact to far below that.
bool check_gemm(bool corrupt, double* worst) {
  std::vector<float> x(kM * kK), w(kN * kK), y(kM * kN), ref(kM * kN), abs_ref(kM * kN), ax(kM * kK), aw(kN * kK);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(rng::normal(7, 1, i));
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(rng::normal(7, 2, i));
  for (size_t i = 0; i < x.size(); ++i) ax[i] = std::fabs(x[i]);
  for (size_t i = 0; i < w.size(); ++i) aw[i] = std::fabs(w[i]);
  kernels::cpu::linear_forward(y.data(), x.data(), w.data(), kM, kN, kK);
  kernels::ref::linear_forward(ref.data(), x.data(), w.data(), kM, kN, kK);
  kernels::ref::linear_forward(abs_ref.data(), ax.data(), aw.data(), kM, kN, kK);
  if (corrupt) y[kM * kN / 2] += 1.0f;  // what a faulty core would do
  const double u = std::ldexp(1.0, -24);
  const double gamma = kK * u / (1 - kK * u);
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

HealthFigures health_check(const parallel::Distributed& dist, const config::Config& config,
                           const std::optional<metrics::GpuReading>& gpu, std::vector<double>* bus_gbps_per_rank) {
  const double t0 = now_seconds();
  const int rank = dist.rank(), world = dist.world_size();
  const comm::CollectiveOptions options{comm::Millis(config.parallel.timeout_ms)};
  HealthFigures f;
  const fault::Kind injected = fault::point("health", rank, 0);
  f.gemm_ok = check_gemm(injected == fault::Kind::kFail, &f.gemm_worst);
  const std::string gpu_failure = check_gpu(gpu, injected == fault::Kind::kGpu, rank);
  f.gpu_ok = gpu_failure.empty();
  // Every rank's GPU failure text, NUL-padded.
  std::vector<char> gpu_texts(kGpuTextBytes * static_cast<size_t>(world), '\0');
  if (!f.gemm_ok) {
    log::error(
        "health check: rank {}: GEMM {}x{}x{} differs from the reference (worst error {:.3g} x the "
        "tolerance)",
        rank, kM, kN, kK, f.gemm_worst);
  }
  std::vector<float> all(3 * static_cast<size_t>(world));
  if (dist.world() != nullptr && world > 1) {
    std::vector<float> v(kCheckCount);
    for (int64_t i = 0; i < kCheckCount; ++i) v[i] = known_value(rank, i);
    dist.world()->all_reduce(v.data(), kCheckCount, comm::DType::kF32, options)->wait();
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < kCheckCount; ++i) {
      if (v[i] != known_sum(world, i) && bad++ == 0) first = i;
    }
    f.all_reduce_ok = bad == 0;
    if (!f.all_reduce_ok) {
      log::error("health check: rank {}: all-reduce of {} known values: {} wrong, the first at {} ({} instead of {})",
                 rank, kCheckCount, bad, first, v[first], known_sum(world, first));
    }
    const int64_t n = kBandwidthBytes / 4;
    std::vector<float> b(n, 1.0f);
    dist.world()->all_reduce(b.data(), n, comm::DType::kF32, options)->wait();  // warm: buffers, scratch
    const double tb = now_seconds();
    for (int it = 0; it < kBandwidthIters; ++it)
      dist.world()->all_reduce(b.data(), n, comm::DType::kF32, options)->wait();
    const double per = (now_seconds() - tb) / kBandwidthIters;
    f.bus_gbps = 2.0 * (world - 1) / world * kBandwidthBytes / per / 1e9;
    const float mine[3] = {f.all_reduce_ok ? 1.0f : 0.0f, f.gemm_ok ? 1.0f : 0.0f, static_cast<float>(f.bus_gbps)};
    dist.world()->all_gather(mine, all.data(), 3, comm::DType::kF32, options)->wait();
    std::vector<char> text(kGpuTextBytes, '\0');
    std::copy(gpu_failure.begin(), gpu_failure.end(), text.begin());
    dist.world()->all_gather(text.data(), gpu_texts.data(), kGpuTextBytes / 4, comm::DType::kF32, options)->wait();
  } else {
    all = {1.0f, f.gemm_ok ? 1.0f : 0.0f, 0.0f};
    std::copy(gpu_failure.begin(), gpu_failure.end(), gpu_texts.begin());
  }
  f.seconds = now_seconds() - t0;
  std::vector<std::string> failures;
  std::vector<double> gbps(world);
  for (int r = 0; r < world; ++r) {
    std::string what;
    if (all[3 * r] != 1.0f) what = "all-reduce result";
    if (all[3 * r + 1] != 1.0f) what += std::string(what.empty() ? "" : " and ") + "GEMM against the reference";
    const char* gpu_text = gpu_texts.data() + kGpuTextBytes * static_cast<size_t>(r);
    if (gpu_text[0] != '\0') what += std::string(what.empty() ? "" : " and ") + gpu_text;
    if (!what.empty()) failures.push_back(fmt::format("rank {} ({})", r, what));
    gbps[r] = all[3 * r + 2];
  }
  if (bus_gbps_per_rank != nullptr) *bus_gbps_per_rank = gbps;
  if (!failures.empty()) {
    std::string list;
    for (const std::string& s : failures) list += (list.empty() ? "" : ", ") + s;
    throw HealthError(
        fmt::format("health check before step 0 failed on {} of {} rank(s): {}; the job stops "
                    "before training (exit code {}: a restart on the same machines would fail again)",
                    failures.size(), world, list, static_cast<int>(kExitHealth)));
  }
  if (world > 1) {
    const auto [lo, hi] = std::minmax_element(gbps.begin(), gbps.end());
    log::info(
        "health check passed on {} ranks in {:.0f} ms: all-reduce of {} known values exact; all-reduce of "
        "{} MiB at {:.2f} GB/s bus bandwidth (ranks {:.2f}..{:.2f}); GEMM {}x{}x{} within tolerance (worst "
        "{:.3f} of it)",
        world, f.seconds * 1e3, kCheckCount, kBandwidthBytes >> 20, f.bus_gbps, *lo, *hi, kM, kN, kK, f.gemm_worst);
  } else {
    log::info("health check passed in {:.0f} ms: GEMM {}x{}x{} within tolerance (worst {:.3f} of it)", f.seconds * 1e3,
              kM, kN, kK, f.gemm_worst);
  }
  return f;
}

}  // namespace tessera::train
