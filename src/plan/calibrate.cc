// The `cpu` hardware: this machine measured with the kernels training runs (docs/plan.md).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>
#include <vector>

#include "comm/process_group.h"
#include "comm/store.h"
#include "core/error.h"
#include "core/threads.h"
#include "core/timer.h"
#include "kernels/backend.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"
#include "metrics/mfu.h"
#include "model/unit_params.h"
#include "plan/hardware.h"

namespace tessera::plan {
namespace {

// Seconds of the fastest of `repeats` calls of f after one warm-up.
double best_seconds(const std::function<void()>& f, int repeats) {
  f();
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    const double t0 = now_seconds();
    f();
    best = std::min(best, now_seconds() - t0);
  }
  return best;
}

// AdamW over 4M elements: 28 bytes of its four streams per element, per second.
double measure_memory_bandwidth() {
  const int64_t n = int64_t{4} << 20;
  std::vector<float> p(static_cast<size_t>(n), 0.5f), g(static_cast<size_t>(n), 1e-3f), m(static_cast<size_t>(n)),
      v(static_cast<size_t>(n));
  kernels::AdamWParams params;
  const double s =
      best_seconds([&] { kernels::cpu::adamw_step(p.data(), g.data(), m.data(), v.data(), n, params); }, 5);
  return 28.0 * static_cast<double>(n) / s;
}

// Causal attention forward and backward at the model's sequence length and head size, one
// sequence of one head per thread: FLOP/s in MFU's count (12 T C per token, C = heads x D).
double measure_attention(const model::ModelConfig& model, int threads) {
  const int64_t T = model.seq_len, D = model.head_dim(), H = threads;
  const int64_t q = T * 3 * H * D;  // (T, qkv) with as many kv heads as heads
  std::vector<float> qkv(static_cast<size_t>(q)), dqkv(static_cast<size_t>(q)), out(static_cast<size_t>(T * H * D)),
      dout(out.size(), 1e-3f), lse(static_cast<size_t>(H * T)),
      ws(static_cast<size_t>(kernels::cpu::attention_workspace_floats(T, D, threads)));
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<float>(i % 13) * 0.01f - 0.06f;
  const double s = best_seconds(
      [&] {
        kernels::cpu::attention_forward(out.data(), lse.data(), qkv.data(), 1, T, H, H, D, ws.data());
        kernels::cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), 1, T, H, H, D,
                                         ws.data());
      },
      3);
  return 12.0 * static_cast<double>(T) * static_cast<double>(H * D) * static_cast<double>(T) / s;
}

struct LinkFigures {
  double bandwidth = 0.0, latency = 0.0;
};

// Two ranks of a host group over `transport`, one thread each (as two local processes talk): the
// all-gather's bandwidth, (S - 1) / S x bytes / seconds, on 32 MiB, and the seconds per step of a
// one-float all-reduce.
LinkFigures measure_link(comm::HostTransport transport) {
  char tmpl[] = "/tmp/tessera_plan_XXXXXX";
  const char* dir = ::mkdtemp(tmpl);
  if (dir == nullptr) throw IoError("cannot create a temporary directory for the collectives' calibration");
  LinkFigures out;
  std::vector<std::thread> ranks;
  std::exception_ptr failure;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      try {
        const std::unique_ptr<comm::Store> store = comm::make_file_store(dir, "plan", "calibrate");
        const comm::Millis timeout(30000);
        const std::unique_ptr<comm::ProcessGroup> group =
            comm::make_host_group(*store, r, 2, "127.0.0.1", timeout, transport);
        const int64_t shard = int64_t{4} << 20;  // floats per rank: 32 MiB gathered
        std::vector<float> mine(static_cast<size_t>(shard), 1.0f), all(static_cast<size_t>(2 * shard));
        const comm::CollectiveOptions options{timeout};
        const double gather = best_seconds(
            [&] { group->all_gather(mine.data(), all.data(), shard, comm::DType::kF32, options)->wait(); }, 3);
        float one = 1.0f;
        const double tiny = best_seconds([&] { group->all_reduce(&one, 1, comm::DType::kF32, options)->wait(); }, 20);
        if (r == 0) {
          out.bandwidth = 0.5 * 2.0 * 4.0 * static_cast<double>(shard) / gather;
          out.latency = tiny / 2.0;  // a two-rank all-reduce is two ring steps
        }
      } catch (...) {
        failure = std::current_exception();
      }
    });
  }
  for (std::thread& t : ranks) t.join();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (failure) std::rethrow_exception(failure);
  return out;
}

uint64_t mem_total_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  while (in >> key >> kib) {
    if (key == "MemTotal:") return kib * 1024;
    in.ignore(1 << 10, '\n');
  }
  return 0;
}

// The model's GEMMs at its shapes, forward and backward as Llama runs them (one block's four
// products on `rows` rows, and the LM head's chunks over as many rows): FLOP/s. Small or skinny
// products run below the 1024^3 peak.
double measure_gemm_rate(const model::ModelConfig& m, bool bf16) {
  const int64_t C = m.dim, F = m.ffn_hidden, HD = m.n_heads * m.head_dim(),
                Q = (m.n_heads + 2 * m.n_kv_heads) * m.head_dim(), V = m.vocab_size;
  const double block_params = static_cast<double>(C * Q + HD * C + C * 2 * F + F * C);
  // At most ~20 GFLOP per block pass (seconds on a CPU), at most 2048 rows.
  const int64_t rows = std::clamp<int64_t>(static_cast<int64_t>(20e9 / (6.0 * block_params)) / 64 * 64, 64, 2048);
  const int64_t chunk = std::clamp<int64_t>((int64_t{1} << 23) / V, 1, rows);
  struct Shape {
    int64_t M, N, K, repeat;
  };
  const Shape block[] = {{rows, Q, C, 1}, {rows, C, HD, 1}, {rows, 2 * F, C, 1}, {rows, C, F, 1}};
  const Shape head[] = {{chunk, V, C, (rows + chunk - 1) / chunk}};
  size_t most = 0;
  for (const Shape& s : block)
    most = std::max<size_t>(most, static_cast<size_t>(std::max({s.M * s.N, s.M * s.K, s.N * s.K})));
  most = std::max<size_t>(most, static_cast<size_t>(std::max({chunk * V, chunk * C, V * C})));
  std::vector<float> x(most, 0.01f), w(most, 0.02f), y(most), dx(most), dw(most);
  std::vector<uint16_t> x16(bf16 ? most : 0, 0x3c00), w16(bf16 ? most : 0, 0x3c00), dy16(bf16 ? most : 0, 0x3c00);
  // bf16 weights packed as Llama packs them (Backend::pack_weight_bf16): a block's before each
  // product, the LM head's once for all its chunks.
  kernels::Backend& be = kernels::cpu_backend();
  int64_t pack_bytes = 0;
  for (const Shape& s : {block[0], block[1], block[2], block[3], head[0]}) {
    for (const auto use : {kernels::WeightUse::kForward, kernels::WeightUse::kInputGrad}) {
      pack_bytes = std::max(pack_bytes, bf16 ? be.packed_weight_bytes(s.N, s.K, use) : 0);
    }
  }
  std::vector<std::byte> pack_fwd(static_cast<size_t>(pack_bytes)), pack_dx(static_cast<size_t>(pack_bytes));
  auto pass = [&](const Shape& s) {
    const kernels::Bf16Weight w_fwd = model::bf16_weight(be, w16.data(), s.N, s.K, kernels::WeightUse::kForward,
                                                         pack_bytes ? pack_fwd.data() : nullptr);
    const kernels::Bf16Weight w_dx = model::bf16_weight(be, w16.data(), s.N, s.K, kernels::WeightUse::kInputGrad,
                                                        pack_bytes ? pack_dx.data() : nullptr);
    for (int64_t r = 0; r < s.repeat; ++r) {
      if (bf16) {
        be.linear_bf16(y.data(), x16.data(), w_fwd, s.M, s.N, s.K, 0.0f);
        be.linear_backward_bf16(dx.data(), dw.data(), dy16.data(), x16.data(), w_dx, s.M, s.N, s.K);
      } else {
        kernels::cpu::linear_forward(y.data(), x.data(), w.data(), s.M, s.N, s.K);
        kernels::cpu::linear_backward(dx.data(), dw.data(), y.data(), x.data(), w.data(), s.M, s.N, s.K, false);
      }
    }
  };
  double block_s = 0.0, head_s = 0.0, block_flops = 0.0, head_flops = 0.0;
  for (const Shape& s : block) {
    block_s += best_seconds([&] { pass(s); }, 3);
    block_flops += 6.0 * static_cast<double>(s.M * s.N * s.K);
  }
  for (const Shape& s : head) {
    head_s = best_seconds([&] { pass(s); }, 3);
    head_flops = 6.0 * static_cast<double>(s.M * s.N * s.K * s.repeat);
  }
  const double L = static_cast<double>(m.n_layers);
  return (L * block_flops + head_flops) / (L * block_s + head_s);
}

// f() measured by `ranks` copies at once, each on its own `threads` threads (ranks of a job share
// caches, memory bandwidth and clocks): the copies' mean.
double concurrently(int ranks, int threads, const std::function<double()>& f) {
  std::vector<double> results(static_cast<size_t>(ranks));
  std::vector<std::thread> copies;
  for (int r = 0; r < ranks; ++r) {
    copies.emplace_back([&, r] {
      set_num_threads(threads);  // this thread's OpenMP team
      results[static_cast<size_t>(r)] = f();
    });
  }
  for (std::thread& t : copies) t.join();
  double sum = 0.0;
  for (double v : results) sum += v;
  return sum / ranks;
}

}  // namespace

Hardware calibrate_cpu(int ranks, int threads, const model::ModelConfig& model, bool bf16) {
  Hardware h;
  h.name = "cpu";
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  h.devices_per_node = ranks;  // a "device" here is a rank, sharing the machine's memory
  h.description = fmt::format("this machine: {} core(s), {} rank(s) of {} thread(s)", cores, ranks, threads);
  h.memory_bytes = mem_total_bytes() / static_cast<uint64_t>(h.devices_per_node);
  const int before = num_threads();
  set_num_threads(threads);
  metrics::calibrate_cpu_peak("fp32", 0.1);  // warm-up: threads, clocks, page faults
  h.peak_fp32 = metrics::calibrate_cpu_peak("fp32");
  h.peak_bf16 = metrics::calibrate_cpu_peak("bf16");
  // The rates the plan uses are the measured ones; a peak measured below them (a noisy moment)
  // is raised to the best seen, so efficiencies stay <= 1.
  const double gemm = concurrently(ranks, threads, [&] { return measure_gemm_rate(model, bf16); });
  const double attention = concurrently(ranks, threads, [&] { return measure_attention(model, threads); });
  double& peak = bf16 ? h.peak_bf16 : h.peak_fp32;
  peak = std::max({peak, gemm, attention});
  h.gemm_efficiency = gemm / peak;
  h.attention_efficiency = attention / peak;  // fp32 kernels
  h.memory_bandwidth = concurrently(ranks, threads, measure_memory_bandwidth);
  h.kernel_overhead = best_seconds(
                          [] {
                            for (int i = 0; i < 100; ++i) parallel_for(1 << 12, [](int64_t, int64_t) {});
                          },
                          5) /
                      100;
  set_num_threads(before);
  // Inside a node the ranks' groups share memory (parallel.host_transport = auto); between nodes
  // they talk TCP, which loopback stands for.
  const LinkFigures shm = measure_link(comm::HostTransport::kShm), tcp = measure_link(comm::HostTransport::kTcp);
  h.intra_bandwidth = shm.bandwidth;
  h.intra_latency = shm.latency;
  h.inter_bandwidth = tcp.bandwidth;
  h.inter_latency = tcp.latency;
  h.calibrated = true;
  h.gloo = true;
  h.source = "measured on this machine just now";
  return h;
}

}  // namespace tessera::plan
