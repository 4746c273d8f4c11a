// The backend seam (ARCHITECTURE.md): the ops the model runs and the memory they run on, chosen
// once at start-up (train.device). The CPU backend runs kernels/cpu on host memory; the CUDA
// backend runs kernels/cuda on one device's memory, queued on its compute stream. The model calls
// only this interface, so it holds no #ifdefs and no backend's headers.
//
// Pointers passed to the ops are the backend's memory (from allocate()), except those named
// host_. Shape contracts are the reference kernels' (kernels/ref) and, for the bf16 variants,
// the CPU kernels' (kernels/cpu). Work may be queued: to_host() and synchronize() wait for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/ref/adamw.h"

namespace tessera::kernels {

enum class Device { kCpu, kCuda };
const char* device_name(Device device);

// An allocation of a backend's memory, freed on destruction.
struct MemoryFree {
  void (*free)(void*) = nullptr;
  void operator()(std::byte* p) const {
    if (p != nullptr) free(p);
  }
};
using Memory = std::unique_ptr<std::byte, MemoryFree>;

// What a bf16 weight GEMM reads of w: its plain image, or (Backend::pack_weight_bf16) a pack of it
// for the GEMM's use. A plain image converts.
enum class WeightUse { kForward, kInputGrad };  // y = x w^T; dx = dy w
struct Bf16Weight {
  Bf16Weight(const uint16_t* plain) : image(plain) {}  // NOLINT(google-explicit-constructor)
  static Bf16Weight packed(const void* pack) {
    Bf16Weight w(nullptr);
    w.pack = pack;
    return w;
  }
  const uint16_t* image = nullptr;
  const void* pack = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;

  // Memory: `bytes` zero-filled and aligned to at least 256 bytes.
  virtual Memory allocate(size_t bytes) = 0;
  // Host memory the backend copies to and from at full speed (pinned on CUDA), zero-filled: the
  // staging of checkpoints.
  virtual Memory allocate_host(size_t bytes) = 0;
  virtual void to_device(void* dst, const void* host_src, size_t bytes) = 0;
  // Waits for the work queued before it.
  virtual void to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // rows x cols floats from rows src_stride apart to rows dst_stride apart.
  virtual void copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t rows,
                         int64_t cols) = 0;
  virtual void zero(void* dst, size_t bytes) = 0;
  virtual void synchronize() = 0;
  // A device's memory in bytes: what it has in use now beyond what it had once the backend was made
  // (the runtime's context and the GEMM workspace before, what the process allocated since), and
  // its capacity. Zero on the CPU (its memory is the process's RSS).
  struct DeviceMemory {
    int64_t in_use = 0, total = 0;
  };
  virtual DeviceMemory device_memory() const { return {}; }
  // The device's PCI bus id as the CUDA runtime writes it ("0000:19:00.0"), how NVML finds the
  // same GPU; "" on the CPU.
  virtual std::string pci_bus_id() const { return {}; }
  // The CUDA stream (a cudaStream_t) its work runs on, in issue order, for a device collective to
  // follow (comm::CollectiveOptions::after); null on the CPU, where every op is done when it returns.
  virtual void* stream() const { return nullptr; }
  // The CUDA device it runs on; -1 on the CPU.
  virtual int device_index() const { return -1; }

  // y (M,N) = x (M,K) . w (N,K)^T + beta y, in fp32 or on bf16 inputs with fp32 accumulation.
  virtual void linear(float* y, const float* x, const float* w, int64_t M, int64_t N, int64_t K, float beta) = 0;
  virtual void linear_bf16(float* y, const uint16_t* x, Bf16Weight w, int64_t M, int64_t N, int64_t K, float beta) = 0;
  // dx (M,K) = dy . w (skipped when null), dw (N,K) += dy^T . x.
  virtual void linear_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, int64_t M,
                               int64_t N, int64_t K) = 0;
  virtual void linear_backward_bf16(float* dx, float* dw, const uint16_t* dy, const uint16_t* x, Bf16Weight w,
                                    int64_t M, int64_t N, int64_t K) = 0;
  // A weight w (N,K)'s bf16 image packed for one use in the layout the backend's bf16 GEMMs read
  // fastest (on the CPU oneDNN's blocked layout, which its matmul otherwise copies a plain weight
  // into on every call), into packed_weight_bytes of the backend's memory: for a weight read by
  // several products (the LM head over its chunks), or by one whose rows are many. 0 bytes: the
  // backend reads plain images at full speed and packs nothing (CUDA; CPUs without bf16 GEMMs).
  virtual int64_t packed_weight_bytes(int64_t /*N*/, int64_t /*K*/, WeightUse /*use*/) const { return 0; }
  virtual void pack_weight_bf16(void* packed, const uint16_t* w, int64_t N, int64_t K, WeightUse use);

  virtual void to_bf16(uint16_t* out, const float* in, int64_t n) = 0;
  virtual void from_bf16(float* out, const uint16_t* in, int64_t n) = 0;
  virtual void add_inplace(float* y, const float* x, int64_t n) = 0;

  virtual void rms_norm_forward(float* out, float* rstd, const float* x, const float* weight, int64_t n, int64_t C,
                                float eps) = 0;
  // out rounded to bf16 as it is written (rms_norm_forward's out, rounded as to_bf16 rounds): the
  // input of a bf16 GEMM, which reads nothing else of it.
  virtual void rms_norm_forward_bf16(uint16_t* out, float* rstd, const float* x, const float* weight, int64_t n,
                                     int64_t C, float eps) = 0;
  virtual int64_t rms_norm_workspace_floats(int64_t n, int64_t C) const = 0;
  virtual void rms_norm_backward(float* dx, float* dweight, const float* dout, const float* x, const float* weight,
                                 const float* rstd, int64_t n, int64_t C, float* workspace) = 0;

  // table: the CPU's rope_table (kernels/cpu/rope.h), in the backend's memory.
  virtual void rope_forward(float* x, const float* table, int64_t B, int64_t T, int64_t n_heads, int64_t D,
                            int64_t stride) = 0;
  virtual void rope_backward(float* dx, const float* table, int64_t B, int64_t T, int64_t n_heads, int64_t D,
                             int64_t stride) = 0;

  // threads: the host threads the model runs with (the CPU backend's workspace is per thread).
  // allow_bf16: the backend may take the products on bf16-rounded operands with fp32 accumulation,
  // as mixed precision does the weight GEMMs (the CUDA backend then runs them on tensor cores,
  // kernels/cuda/attention.h; the CPU backend with avx512_bf16's dot products, kernels/cpu/attention.h).
  virtual int64_t attention_workspace_floats(int64_t B, int64_t T, int64_t H, int64_t D, int threads) const = 0;
  virtual void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                                 int64_t D, bool allow_bf16, float* workspace) = 0;
  virtual void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                                  int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, bool allow_bf16,
                                  float* workspace) = 0;

  // Generation's attention of new rows over a key/value cache (kernels/cpu/attention.h's
  // attention_cached): rows (B + 1) and start (B) in the backend's memory, and the same on the host.
  virtual int64_t attention_cached_workspace_floats(int64_t max_context, int threads) const = 0;
  virtual void attention_cached(float* out, const float* q, int64_t q_stride, const float* k, const float* v,
                                int64_t kv_stride, int64_t max_context, const int64_t* rows, const int64_t* start,
                                const int64_t* host_rows, const int64_t* host_start, int64_t B, int64_t H, int64_t Hkv,
                                int64_t D, float* workspace) = 0;

  virtual void swiglu_forward(float* out, const float* h13, int64_t n, int64_t F) = 0;
  virtual void swiglu_backward(float* dh13, const float* dout, const float* h13, int64_t n, int64_t F) = 0;
  // Their outputs rounded to bf16 as they are written, as rms_norm_forward_bf16's.
  virtual void swiglu_forward_bf16(uint16_t* out, const float* h13, int64_t n, int64_t F) = 0;
  virtual void swiglu_backward_bf16(uint16_t* dh13, const float* dout, const float* h13, int64_t n, int64_t F) = 0;

  virtual void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t n, int64_t C,
                                 int64_t v0, int64_t Vb) = 0;
  virtual void embedding_forward_bf16(float* out, const int32_t* tokens, const uint16_t* table, int64_t n, int64_t C,
                                      int64_t v0, int64_t Vb) = 0;
  // tokens in the backend's memory and the same on the host (the CUDA backend orders its sums
  // from the host's copy).
  virtual int64_t embedding_workspace_ints(int64_t n) const = 0;
  virtual void embedding_backward(float* dtable, const float* dout, const int32_t* tokens, const int32_t* host_tokens,
                                  int64_t n, int64_t C, int64_t v0, int64_t Vb, int32_t* workspace) = 0;

  virtual void softmax_cross_entropy(float* dlogits, float* losses, const float* logits, const int32_t* targets,
                                     int64_t n, int64_t V, float dscale) = 0;
  virtual void softmax_cross_entropy_bf16(uint16_t* dlogits, float* losses, const float* logits, const int32_t* targets,
                                          int64_t n, int64_t V, float dscale) = 0;
  // Tensor parallelism's vocabulary-parallel cross-entropy (kernels/ref/cross_entropy.h).
  virtual void vocab_parallel_max(float* row_max, const float* logits, const int32_t* targets, int64_t n,
                                  int64_t Vb) = 0;
  virtual void vocab_parallel_sums(float* sum_exp, float* target_logit, const float* logits, const float* row_max,
                                   const int32_t* targets, int64_t n, int64_t Vb, int64_t v0) = 0;
  virtual void vocab_parallel_loss(float* dlogits, float* losses, const float* logits, const float* row_max,
                                   const float* sum_exp, const float* target_logit, const int32_t* targets, int64_t n,
                                   int64_t Vb, int64_t v0, float dscale) = 0;
  // out (n) = the elementwise maximum of `count` blocks of n floats (blocks: count x n, e.g. the
  // row maxima gathered from every rank of a tensor-parallel group).
  virtual void max_of_blocks(float* out, const float* blocks, int64_t count, int64_t n) = 0;

  // A flat unit's AdamW step over its `count` segments (kernels/ref/adamw.h), in one pass (on a GPU
  // one launch); param_bf16 optional (kernels/cpu/adamw.h).
  virtual void adamw_update(float* param, const float* grad, float* m, float* v, const AdamWSegment* segments,
                            int count, const AdamWParams& p, uint16_t* param_bf16) = 0;
  // sum of x[i]^2 in double, returned to the host (waits).
  virtual double sum_squares(const float* x, int64_t n) = 0;
};

// Writes the RoPE table for T positions of head dim D at the D/2 frequencies `inv_freq` (the
// CPU's rope_table, (T, D/2, 2); model::rope_inv_freq gives a model's) into `table`, T x D floats
// of the backend's memory: what rope_forward and rope_backward read.
void write_rope_table(Backend& backend, float* table, int64_t T, int64_t D, const std::vector<double>& inv_freq);

// The process's CPU backend (kernels/cpu over core/threads' pool).
Backend& cpu_backend();

// What a CUDA backend is made with.
struct CudaOptions {
  int device = 0;           // the visible device's index
  bool allow_tf32 = false;  // fp32 GEMMs on TF32 tensor cores (model.allow_tf32)
};
// The name of each visible CUDA device (empty with `why` set when this build has no CUDA, there is
// no driver or no device).
std::vector<std::string> cuda_device_names(std::string* why);
// A CUDA backend on `options.device`; throws std::runtime_error naming the reason when this build
// has no CUDA or the device cannot be used.
std::unique_ptr<Backend> make_cuda_backend(const CudaOptions& options);

}  // namespace tessera::kernels
