// Times Tessera's CUDA attention, forward and backward, at one shape and prints one JSON line:
// milliseconds a call (median of the timed calls, each bracketed by CUDA events) and TFLOP/s by
// FlashAttention's count of causal attention's products (forward 2 products, backward 5, each 2 B H
// D T(T+1)/2 multiply-adds' worth of FLOPs; Tessera's backward computes two of them twice).
// In bf16 it also times the forward at each of its tilings (attention.h: 16 or 32 query rows per
// warp; forward_ms is the default's). bench/attention_gpu.sh runs it beside PyTorch's
// scaled_dot_product_attention on the same shape.
//
//   tessera_attention_bench [--batch 8] [--seq 2048] [--heads 16] [--kv-heads 8] [--head-dim 128]
//                           [--iters 20] [--precision bf16|fp32]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/check.h"

namespace {

using namespace tessera::kernels::cuda;

struct Options {
  int64_t B = 8, T = 2048, H = 16, Hkv = 8, D = 128;
  int iters = 20;
  bool bf16 = true;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "tessera_attention_bench: %s\nusage: tessera_attention_bench [--batch N] [--seq N] [--heads N] "
               "[--kv-heads N] [--head-dim N] [--iters N] [--precision bf16|fp32]\n",
               why);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) usage("every option takes a value");
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--precision") {
      if (value != "bf16" && value != "fp32") usage("--precision is bf16 or fp32");
      o.bf16 = value == "bf16";
      continue;
    }
    char* end = nullptr;
    const long long v = std::strtoll(value.c_str(), &end, 10);
    if (*end != '\0' || v <= 0) usage(("not a positive integer: " + key + " " + value).c_str());
    if (key == "--batch")
      o.B = v;
    else if (key == "--seq")
      o.T = v;
    else if (key == "--heads")
      o.H = v;
    else if (key == "--kv-heads")
      o.Hkv = v;
    else if (key == "--head-dim")
      o.D = v;
    else if (key == "--iters")
      o.iters = static_cast<int>(v);
    else
      usage(("unknown option " + key).c_str());
  }
  if (o.H % o.Hkv != 0) usage("--heads must be a multiple of --kv-heads");
  return o;
}

float* device_normals(size_t n, unsigned seed) {
  std::vector<float> host(n);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  for (float& v : host) v = normal(rng);
  float* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, n * sizeof(float)));
  CUDA_CHECK(cudaMemcpy(p, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  return p;
}

// Median milliseconds of `iters` calls of f after two untimed ones.
template <typename F>
double median_ms(int iters, F f) {
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  f();
  f();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    CUDA_CHECK(cudaEventRecord(start));
    f();
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const size_t qkv_n = static_cast<size_t>(o.B * o.T * (o.H + 2 * o.Hkv) * o.D);
  const size_t out_n = static_cast<size_t>(o.B * o.T * o.H * o.D), lse_n = static_cast<size_t>(o.B * o.H * o.T);
  float* qkv = device_normals(qkv_n, 1);
  float* dout = device_normals(out_n, 2);
  float *out, *lse, *dqkv, *work;
  CUDA_CHECK(cudaMalloc(&out, out_n * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&lse, lse_n * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&dqkv, qkv_n * sizeof(float)));
  CUDA_CHECK(
      cudaMalloc(&work, static_cast<size_t>(attention_backward_workspace_floats(o.B, o.T, o.H)) * sizeof(float)));

  // The default tiling, then (bf16) each of the forward's two: 16 and 32 query rows per warp.
  auto forward_ms_with = [&](int rows_per_warp) {
    return median_ms(
        o.iters, [&] { attention_forward(out, lse, qkv, o.B, o.T, o.H, o.Hkv, o.D, o.bf16, nullptr, rows_per_warp); });
  };
  const double forward_ms = forward_ms_with(0);
  std::string tilings;
  if (o.bf16) {
    for (int rows : {16, 32})
      tilings += ", \"forward_ms_rows" + std::to_string(rows) + "\": " + std::to_string(forward_ms_with(rows));
  }
  const double backward_ms = median_ms(o.iters, [&] {
    attention_backward(dqkv, dout, qkv, out, lse, o.B, o.T, o.H, o.Hkv, o.D, o.bf16, work, nullptr);
  });
  CUDA_CHECK(cudaGetLastError());

  const double product_flops = 2.0 * o.B * o.H * o.D * (static_cast<double>(o.T) * (o.T + 1) / 2);
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf(
      "{\"impl\": \"tessera\", \"device\": \"%s\", \"precision\": \"%s\", \"batch\": %lld, \"seq\": %lld, "
      "\"heads\": %lld, \"kv_heads\": %lld, \"head_dim\": %lld, \"forward_ms\": %.4f, \"backward_ms\": %.4f, "
      "\"forward_tflops\": %.2f, \"backward_tflops\": %.2f%s}\n",
      prop.name, o.bf16 ? "bf16" : "fp32", static_cast<long long>(o.B), static_cast<long long>(o.T),
      static_cast<long long>(o.H), static_cast<long long>(o.Hkv), static_cast<long long>(o.D), forward_ms, backward_ms,
      2 * product_flops / forward_ms * 1e-9, 5 * product_flops / backward_ms * 1e-9, tilings.c_str());
  for (float* p : {qkv, dout, out, lse, dqkv, work}) CUDA_CHECK(cudaFree(p));
  return 0;
}
